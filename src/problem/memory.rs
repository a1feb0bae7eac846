//! How much host memory a problem needs, checked against what the machine has before
//! anything is allocated, so a config too large for the machine is a clear error instead
//! of an allocation-failure abort.
//!
//! What is available is `MemAvailable` from `/proc/meminfo`, lowered to what the process's
//! cgroup (v2 `memory.max` − `memory.current`, or v1 `memory.limit_in_bytes` −
//! `memory.usage_in_bytes`) still allows, since a container's limit is what kills the
//! process. Where neither can be read (not Linux) nothing is refused.

use std::fmt;
use std::path::Path;

use thiserror::Error;

/// Host bytes a problem's arrays need, by what they hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HostBytes {
    /// The f32 parameters.
    pub params: u64,
    /// The largest single leaf: drawing it holds one extra copy while it is scaled, and a
    /// checkpoint leaf is converted from its mapping into a fresh f32 array.
    pub largest_leaf: u64,
    /// The batch arrays (and, for token data, the host batch they are built from).
    pub batch: u64,
}

impl HostBytes {
    /// Everything at once: the peak while the problem is being built.
    pub fn total(&self) -> u64 {
        self.params
            .saturating_add(self.largest_leaf)
            .saturating_add(self.batch)
    }
}

/// Where a figure of available memory was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemorySource {
    /// `MemAvailable` in `/proc/meminfo`.
    MemInfo,
    /// The process's cgroup limit less its current usage.
    Cgroup,
}

impl fmt::Display for MemorySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MemorySource::MemInfo => "MemAvailable in /proc/meminfo",
            MemorySource::Cgroup => "the cgroup's memory limit less its usage",
        })
    }
}

/// A problem needs more host memory than the machine has available.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error(
    "{what} needs {} of host memory but {} is available ({source_of_available}); lower {lower}",
    human(*needed),
    human(*available)
)]
pub struct MemoryError {
    /// What needs the memory, e.g. `transformer_block with d_model = 100000 (parameters and
    /// batch)`.
    pub what: String,
    /// Bytes needed.
    pub needed: u64,
    /// Bytes available.
    pub available: u64,
    /// Where `available` was read.
    pub source_of_available: MemorySource,
    /// The settings to lower, e.g. `d_model (or batch, seq)`.
    pub lower: String,
}

/// `bytes` for people: `240.0 GB (240000000000 bytes)`.
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["bytes", "kB", "MB", "GB", "TB", "PB"];
    let mut v = bytes as f64;
    let mut unit = 0;
    while v >= 1000.0 && unit + 1 < UNITS.len() {
        v /= 1000.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} bytes")
    } else {
        format!("{v:.1} {} ({bytes} bytes)", UNITS[unit])
    }
}

/// Host bytes available to this process now, and where the figure comes from; `None` where
/// it cannot be read.
pub fn available() -> Option<(u64, MemorySource)> {
    let meminfo = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| mem_available(&t))
        .map(|b| (b, MemorySource::MemInfo));
    let cgroup = cgroup_headroom().map(|b| (b, MemorySource::Cgroup));
    match (meminfo, cgroup) {
        (Some(m), Some(c)) => Some(if c.0 < m.0 { c } else { m }),
        (m, c) => m.or(c),
    }
}

/// `MemAvailable` of a `/proc/meminfo` text, in bytes.
pub fn mem_available(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let mut words = line["MemAvailable:".len()..].split_whitespace();
    let value: u64 = words.next()?.parse().ok()?;
    let scale = match words.next() {
        Some("kB") => 1024,
        None => 1,
        Some(_) => return None,
    };
    Some(value.saturating_mul(scale))
}

/// What the process's cgroup still allows: limit less usage (`None` without a limit).
fn cgroup_headroom() -> Option<u64> {
    let cgroup = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    // v2: one line `0::/path`.
    if let Some(rel) = cgroup.lines().find_map(|l| l.strip_prefix("0::")) {
        let dir = Path::new("/sys/fs/cgroup").join(rel.trim_start_matches('/'));
        if let Some(h) = headroom(&dir.join("memory.max"), &dir.join("memory.current")) {
            return Some(h);
        }
    }
    // v1: the memory controller's line `N:memory:/path` (or one listing it with others).
    let rel = cgroup.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        controllers
            .split(',')
            .any(|c| c == "memory")
            .then_some(path)
    })?;
    let base = Path::new("/sys/fs/cgroup/memory");
    [base.join(rel.trim_start_matches('/')), base.to_path_buf()]
        .iter()
        .find_map(|dir| {
            headroom(
                &dir.join("memory.limit_in_bytes"),
                &dir.join("memory.usage_in_bytes"),
            )
        })
}

fn headroom(limit: &Path, usage: &Path) -> Option<u64> {
    let limit: u64 = std::fs::read_to_string(limit).ok()?.trim().parse().ok()?;
    let usage: u64 = std::fs::read_to_string(usage)
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(0);
    Some(limit.saturating_sub(usage))
}

/// Refuses `needed` bytes when the machine has less available (see [`available`]); `what`
/// and `lower` word the error.
pub fn require(needed: u64, what: impl FnOnce() -> String, lower: &str) -> Result<(), MemoryError> {
    match available() {
        Some((avail, source)) => require_within(needed, avail, source, what, lower),
        None => Ok(()),
    }
}

/// [`require`] against a given figure of available bytes.
pub fn require_within(
    needed: u64,
    available: u64,
    source: MemorySource,
    what: impl FnOnce() -> String,
    lower: &str,
) -> Result<(), MemoryError> {
    if needed <= available {
        return Ok(());
    }
    Err(MemoryError {
        what: what(),
        needed,
        available,
        source_of_available: source,
        lower: lower.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_is_read_in_bytes() {
        let text = "MemTotal:       32000000 kB\nMemFree:  100 kB\nMemAvailable:   24066772 kB\n";
        assert_eq!(mem_available(text), Some(24_066_772 * 1024));
        assert_eq!(mem_available("MemTotal: 5 kB\n"), None);
        assert_eq!(mem_available("MemAvailable: lots kB\n"), None);
        assert_eq!(
            mem_available("MemAvailable: 18446744073709551615 kB\n"),
            Some(u64::MAX)
        );
        // This machine reports something (the tests run on Linux).
        if cfg!(target_os = "linux") {
            let (bytes, _) = available().expect("Linux has /proc/meminfo");
            assert!(bytes > 0);
        }
    }

    #[test]
    fn the_error_names_both_figures_and_the_setting() {
        let e = require_within(
            240_000_000_000,
            24_000_000_000,
            MemorySource::MemInfo,
            || "transformer_block with d_model = 100000".into(),
            "d_model",
        )
        .expect_err("too much");
        let msg = e.to_string();
        for part in [
            "d_model = 100000 needs 240.0 GB (240000000000 bytes)",
            "24.0 GB (24000000000 bytes) is available",
            "MemAvailable",
            "lower d_model",
        ] {
            assert!(msg.contains(part), "{part:?} not in {msg}");
        }
        assert!(require_within(5, 5, MemorySource::Cgroup, String::new, "x").is_ok());
        assert_eq!(human(999), "999 bytes");
        assert_eq!(
            HostBytes {
                params: u64::MAX,
                largest_leaf: 1,
                batch: 1
            }
            .total(),
            u64::MAX
        );
    }
}
