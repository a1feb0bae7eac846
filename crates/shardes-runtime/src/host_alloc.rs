//! [`huge_pages_env`]: the CPU plugin's per-execution buffers faulted in as 2 MiB pages
//! instead of 4 KiB ones.
//!
//! The CPU plugin allocates every execution's temporaries (and Eigen's GEMM blocks) with
//! glibc's `posix_memalign`/`malloc` on its worker threads and frees them when the execution
//! ends. glibc serves a request above 32 MiB with its own `mmap` and unmaps it on `free`, so
//! each generation of a large model maps its gigabytes of temporaries afresh and the kernel
//! faults in and zeroes every 4 KiB page on first touch: at Qwen2.5-0.5B shapes about a
//! quarter of a generation's samples were page faults (`docs/performance.md`, "Host memory:
//! a generation's page faults"). glibc's `glibc.malloc.hugetlb=1` tunable makes it ask for
//! transparent huge pages (`madvise(MADV_HUGEPAGE)`) on the memory it maps, which takes
//! 512 times fewer faults, and the memory still goes back to the system when it is freed.
//!
//! glibc reads its tunables only when a process starts, so the `shardes` command runs
//! itself again with the tunable set ([`huge_pages_env`] says whether and with what value);
//! a program that links the library sets `GLIBC_TUNABLES` itself.

use std::ffi::OsString;

/// The glibc tunable this module sets.
pub const TUNABLE: &str = "glibc.malloc.hugetlb=1";

/// Set to `0` to keep a process's allocator as it is (no restart with [`TUNABLE`]).
pub const HUGE_PAGES_ENV: &str = "SHARDES_HUGE_PAGES";

/// The kernel's transparent-huge-page mode.
const THP_MODE: &str = "/sys/kernel/mm/transparent_hugepage/enabled";

/// The `GLIBC_TUNABLES` value a process should be started with to fault its large
/// allocations in as huge pages, or `None` when nothing is to be changed: not on Linux with
/// glibc, [`HUGE_PAGES_ENV`] is `0`, `GLIBC_TUNABLES` already sets `glibc.malloc.hugetlb`
/// (this process was restarted with it, or the user chose), or the kernel's mode is not
/// `madvise` (under `always` every large mapping gets huge pages anyway, under `never`
/// none can).
pub fn huge_pages_env() -> Option<OsString> {
    if !cfg!(all(target_os = "linux", target_env = "gnu")) {
        return None;
    }
    let mode = std::fs::read_to_string(THP_MODE).unwrap_or_default();
    tunables_for(
        std::env::var_os(HUGE_PAGES_ENV),
        std::env::var_os("GLIBC_TUNABLES"),
        &mode,
    )
}

/// Whether this process's large allocations get huge pages, in words for `shardes devices`:
/// `on (…)` or `off (…)` with the reason (the kernel's mode, the tunable, the switch).
pub fn huge_pages_state() -> String {
    if !cfg!(all(target_os = "linux", target_env = "gnu")) {
        return "off (not Linux with glibc)".into();
    }
    let mode = std::fs::read_to_string(THP_MODE).unwrap_or_default();
    state_of(
        std::env::var_os(HUGE_PAGES_ENV),
        std::env::var_os("GLIBC_TUNABLES"),
        &mode,
    )
}

/// [`huge_pages_state`] on the two variables' values and the kernel's mode.
fn state_of(switch: Option<OsString>, tunables: Option<OsString>, thp_mode: &str) -> String {
    let mode = selected(thp_mode);
    let hugetlb = hugetlb_of(tunables.as_ref());
    let hugetlb = hugetlb.as_deref();
    match (mode, hugetlb) {
        ("always", _) => "on (the kernel's transparent huge pages: always)".into(),
        ("madvise", Some(TUNABLE)) => format!("on ({TUNABLE}; the kernel's mode: madvise)"),
        ("madvise", Some(other)) => format!("off (GLIBC_TUNABLES sets {other})"),
        ("madvise", None) if switch.is_some_and(|s| s == "0") => {
            format!("off ({HUGE_PAGES_ENV}=0)")
        }
        ("madvise", None) => "off (not restarted with the tunable)".into(),
        (mode, _) => format!("off (the kernel's transparent huge pages: {mode})"),
    }
}

/// [`huge_pages_env`] on the two variables' values and the kernel's mode.
fn tunables_for(
    switch: Option<OsString>,
    tunables: Option<OsString>,
    thp_mode: &str,
) -> Option<OsString> {
    if switch.is_some_and(|s| s == "0") || selected(thp_mode) != "madvise" {
        return None;
    }
    if hugetlb_of(tunables.as_ref()).is_some() {
        return None;
    }
    match tunables.filter(|t| !t.is_empty()) {
        None => Some(TUNABLE.into()),
        Some(mut t) => {
            t.push(":");
            t.push(TUNABLE);
            Some(t)
        }
    }
}

/// The bracketed word of the kernel's mode file (`always [madvise] never`: `madvise`), or
/// `unknown`.
fn selected(thp_mode: &str) -> &str {
    thp_mode
        .split_whitespace()
        .find_map(|w| w.strip_prefix('[')?.strip_suffix(']'))
        .unwrap_or("unknown")
}

/// The `glibc.malloc.hugetlb=…` entry of a `GLIBC_TUNABLES` value, if it has one.
fn hugetlb_of(tunables: Option<&OsString>) -> Option<String> {
    let tunables = tunables?.to_string_lossy();
    tunables
        .split(':')
        .find(|t| t.starts_with("glibc.malloc.hugetlb="))
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(s: &str) -> Option<OsString> {
        Some(OsString::from(s))
    }

    #[test]
    fn the_tunable_is_added_once_under_madvise_only() {
        let madvise = "always [madvise] never\n";
        assert_eq!(tunables_for(None, None, madvise), os(TUNABLE));
        assert_eq!(tunables_for(None, os(""), madvise), os(TUNABLE));
        assert_eq!(
            tunables_for(None, os("glibc.malloc.arena_max=2"), madvise),
            os("glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1")
        );
        // Restarted with it, or the user's own value: left alone.
        assert_eq!(tunables_for(None, os(TUNABLE), madvise), None);
        assert_eq!(
            tunables_for(None, os("glibc.malloc.hugetlb=0"), madvise),
            None
        );
        assert_eq!(tunables_for(os("0"), None, madvise), None);
        assert_eq!(tunables_for(os("1"), None, madvise), os(TUNABLE));
        assert_eq!(tunables_for(None, None, "[always] madvise never"), None);
        assert_eq!(tunables_for(None, None, "always madvise [never]"), None);
        assert_eq!(tunables_for(None, None, ""), None);
    }

    #[test]
    fn the_state_names_its_reason() {
        let madvise = "always [madvise] never\n";
        assert!(state_of(None, os(TUNABLE), madvise).starts_with("on (glibc.malloc.hugetlb=1"));
        assert!(state_of(None, os("glibc.malloc.hugetlb=0"), madvise).contains("sets glibc"));
        assert!(state_of(os("0"), None, madvise).contains("SHARDES_HUGE_PAGES=0"));
        assert!(state_of(None, None, "[always] madvise never").starts_with("on ("));
        assert!(state_of(None, os(TUNABLE), "always madvise [never]").ends_with("never)"));
        assert!(state_of(None, None, "").ends_with("unknown)"));
    }
}
