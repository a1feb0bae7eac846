//! Facts about the running process that benchmarks and diagnostics report.

/// Peak resident set size of this process (`VmHWM` in `/proc/self/status`), bytes; 0
/// where the file does not exist.
pub fn peak_rss_bytes() -> u64 {
    let Ok(s) = std::fs::read_to_string("/proc/self/status") else {
        return 0;
    };
    s.lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}
