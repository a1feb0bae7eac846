//! [`CompileCache`]: compiled programs kept on disk, so that compiling the same program
//! again (a `--resume`, a rerun, another test of the same model) loads it instead.
//!
//! An entry is keyed by everything that decides what the plugin builds: the program text,
//! the compile options, the plugin file (path, size and modification time) and its API and
//! XLA versions, the client's platform and device kinds and count, and the host CPU (model
//! and instruction-set flags, since the CPU plugin compiles for the machine it runs on).
//! `XLA_FLAGS` can change code generation and ask for dumps that a loaded program would
//! skip, so [`CompileCache::from_env`] turns the cache off while it is set. Each file holds
//! the SHA-256 of its payload, checked on load; a file that fails the check or that the
//! plugin refuses is compiled again and replaced. Writes go to a temporary file renamed into
//! place, so processes that compile the same program at once (the ranks of an `mpirun`, test
//! binaries) never read a partial entry. Within one process, threads that compile the same
//! program at once (the simulated processes of a threaded run) take turns
//! ([`CompileCache::claim`]): the first compiles and saves it, the others load it.
//!
//! The directory is bounded ([`CompileCache::max_bytes`], `SHARDES_COMPILE_CACHE_MAX_BYTES`,
//! [`DEFAULT_MAX_BYTES`] unless set): after each store the least recently used entries are
//! deleted until the entries fit. A load marks its entry used (its modification time),
//! so what a run keeps loading stays. An entry larger than the bound is not saved.

use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sha2::{Digest, Sha256};

use crate::error::RuntimeError;

/// The environment variable naming the cache directory ([`CompileCache::from_env`]).
pub const CACHE_ENV: &str = "SHARDES_COMPILE_CACHE";

/// The environment variable bounding the cache directory's size ([`CompileCache::from_env`]):
/// bytes, or a number with a `K`, `M`, `G` or `T` suffix (powers of 1024).
pub const MAX_BYTES_ENV: &str = "SHARDES_COMPILE_CACHE_MAX_BYTES";

/// The bound on the entries' total size when [`MAX_BYTES_ENV`] is not set: 4 GiB.
pub const DEFAULT_MAX_BYTES: u64 = 4 << 30;

/// A temporary file older than this was left by a process that died while writing it.
const STALE_TMP: Duration = Duration::from_secs(3600);

/// The first bytes of every entry: the format, so that a future layout is never misread.
const MAGIC: &[u8] = b"shardes-compiled-v1\n";

/// A directory of compiled programs (see the module documentation for what an entry is
/// keyed by).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompileCache {
    dir: PathBuf,
    max_bytes: u64,
}

impl CompileCache {
    /// A cache in `dir` (created on the first store), bounded by [`DEFAULT_MAX_BYTES`].
    pub fn new(dir: impl Into<PathBuf>) -> CompileCache {
        CompileCache {
            dir: dir.into(),
            max_bytes: DEFAULT_MAX_BYTES,
        }
    }

    /// This cache with its entries' total size bounded by `max_bytes`.
    pub fn with_max_bytes(mut self, max_bytes: u64) -> CompileCache {
        self.max_bytes = max_bytes;
        self
    }

    /// The bound on the entries' total size.
    pub fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    /// The cache named by `SHARDES_COMPILE_CACHE`, if it is set and not empty and
    /// `XLA_FLAGS` is unset or empty, bounded by `SHARDES_COMPILE_CACHE_MAX_BYTES`.
    ///
    /// # Errors
    ///
    /// [`RuntimeError::CacheBound`] for a bound that is not a size.
    pub fn from_env() -> Result<Option<CompileCache>, RuntimeError> {
        from_vars(
            std::env::var_os(CACHE_ENV),
            std::env::var_os("XLA_FLAGS"),
            std::env::var_os(MAX_BYTES_ENV),
        )
    }

    /// The directory the entries live in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The entry's file name for `mlir` compiled with `options` (serialized
    /// `CompileOptionsProto`) for `target` (the client's plugin and devices).
    pub(crate) fn key(target: &BuildTarget<'_>, mlir: &str, options: &[u8]) -> String {
        let mut h = Sha256::new();
        let mut field = |bytes: &[u8]| {
            h.update((bytes.len() as u64).to_le_bytes());
            h.update(bytes);
        };
        field(MAGIC);
        field(target.plugin_path.to_string_lossy().as_bytes());
        field(&target.plugin_len.to_le_bytes());
        field(&target.plugin_mtime_ns.to_le_bytes());
        let (major, minor) = target.api_version;
        field(&major.to_le_bytes());
        field(&minor.to_le_bytes());
        field(target.xla_version.as_bytes());
        field(target.platform.as_bytes());
        field(&(target.device_count as u64).to_le_bytes());
        for kind in &target.device_kinds {
            field(kind.as_bytes());
        }
        field(host_cpu().as_bytes());
        field(options);
        field(mlir.as_bytes());
        let digest = h.finalize();
        digest.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Waits until no other thread of this process is compiling entry `key`, then holds it
    /// until the returned claim is dropped.
    pub(crate) fn claim(key: &str) -> Claim {
        let (lock, turn) = &IN_FLIGHT;
        // A thread that panicked while holding the lock left the list consistent (its
        // claim's drop removed its key), so a poisoned lock is still usable.
        let mut keys = lock.lock().unwrap_or_else(|e| e.into_inner());
        while keys.iter().any(|k| k == key) {
            keys = turn.wait(keys).unwrap_or_else(|e| e.into_inner());
        }
        keys.push(key.to_string());
        Claim {
            key: key.to_string(),
        }
    }

    /// The file of entry `key`.
    pub(crate) fn path(&self, key: &str) -> PathBuf {
        self.dir.join(format!("{key}.pjrt"))
    }

    /// Entry `key`'s payload opened by `open` (the client's `deserialize`), or `None` when
    /// there is none, it is damaged, or `open` refuses it (the caller compiles then, and
    /// [`CompileCache::store`] replaces it).
    pub(crate) fn load<T>(&self, key: &str, open: impl FnOnce(&[u8]) -> Option<T>) -> Option<T> {
        let path = self.path(key);
        let file = std::fs::read(&path).ok()?;
        let rest = file.strip_prefix(MAGIC)?;
        if rest.len() < 32 {
            return None;
        }
        let (digest, payload) = rest.split_at(32);
        if Sha256::digest(payload).as_slice() != digest {
            return None;
        }
        let exe = open(payload)?;
        // Marks the entry used for the bound's eviction; failing to only makes it older.
        if let Ok(f) = std::fs::File::options().append(true).open(&path) {
            let _ = f.set_modified(SystemTime::now());
        }
        Some(exe)
    }

    /// Writes `payload` (a serialized executable) as entry `key`, then trims the directory
    /// to the bound ([`Self::trim`]). Failing to write (a read-only or full disk) only means
    /// the next compile is not saved; the caller goes on with its executable.
    pub(crate) fn store(&self, key: &str, payload: &[u8]) -> std::io::Result<()> {
        let size = (MAGIC.len() + 32 + payload.len()) as u64;
        if size > self.max_bytes {
            return Ok(());
        }
        std::fs::create_dir_all(&self.dir)?;
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let tmp = self.dir.join(format!(
            ".{key}.{}.{}.tmp",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let written = (|| {
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(MAGIC)?;
            f.write_all(&Sha256::digest(payload))?;
            f.write_all(payload)?;
            f.sync_all()?;
            std::fs::rename(&tmp, self.path(key))
        })();
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        written?;
        self.trim(key)
    }

    /// Deletes the least recently used entries other than `keep` until the entries'
    /// total size is within the bound, and temporary files that a process that died while
    /// writing left behind. An entry another process deletes first, or is reading, is
    /// skipped: a reader keeps its open file, and a later load finds none and compiles.
    fn trim(&self, keep: &str) -> std::io::Result<()> {
        let now = SystemTime::now();
        let mut entries = Vec::new();
        let mut total = 0u64;
        for e in std::fs::read_dir(&self.dir)? {
            let Ok(e) = e else { continue };
            let Ok(meta) = e.metadata() else { continue };
            let name = e.file_name();
            let name = name.to_string_lossy();
            let modified = meta.modified().unwrap_or(UNIX_EPOCH);
            if name.starts_with('.') && name.ends_with(".tmp") {
                if now
                    .duration_since(modified)
                    .is_ok_and(|age| age > STALE_TMP)
                {
                    let _ = std::fs::remove_file(e.path());
                }
                continue;
            }
            let Some(stem) = name.strip_suffix(".pjrt") else {
                continue;
            };
            total += meta.len();
            if stem != keep {
                entries.push((modified, meta.len(), e.path()));
            }
        }
        entries.sort();
        for (_, len, path) in entries {
            if total <= self.max_bytes {
                break;
            }
            if std::fs::remove_file(path).is_ok() {
                total -= len;
            }
        }
        Ok(())
    }
}

/// What, besides the program and its options, decides what a plugin builds: the plugin
/// file (path, size, modification time) and versions, the platform and the devices
/// (gathered from a client by `Client::build_target`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BuildTarget<'a> {
    /// The plugin file.
    pub plugin_path: &'a Path,
    /// Its size in bytes.
    pub plugin_len: u64,
    /// Its modification time, in nanoseconds since the Unix epoch.
    pub plugin_mtime_ns: u128,
    /// The PJRT API version it implements (major, minor).
    pub api_version: (i32, i32),
    /// Its XLA version (empty when it does not say).
    pub xla_version: String,
    /// The client's platform name.
    pub platform: String,
    /// The number of the client's devices.
    pub device_count: usize,
    /// The kind of each of the client's devices, in order.
    pub device_kinds: Vec<String>,
}

/// The entries being compiled by this process's threads, and the turn they wait on.
static IN_FLIGHT: (Mutex<Vec<String>>, Condvar) = (Mutex::new(Vec::new()), Condvar::new());

/// One thread's hold on an entry ([`CompileCache::claim`]); dropping it lets the next
/// thread in.
pub(crate) struct Claim {
    key: String,
}

impl Drop for Claim {
    fn drop(&mut self) {
        let (lock, turn) = &IN_FLIGHT;
        let mut keys = lock.lock().unwrap_or_else(|e| e.into_inner());
        keys.retain(|k| k != &self.key);
        turn.notify_all();
    }
}

/// The host CPU's model and instruction-set flags (Linux's `/proc/cpuinfo`, first
/// processor), or empty where that file does not exist.
fn host_cpu() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    info.lines()
        .take_while(|l| !l.trim().is_empty())
        .filter(|l| l.starts_with("model name") || l.starts_with("flags"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// [`CompileCache::from_env`] on the three variables' values.
fn from_vars(
    dir: Option<OsString>,
    xla_flags: Option<OsString>,
    max_bytes: Option<OsString>,
) -> Result<Option<CompileCache>, RuntimeError> {
    let Some(dir) = dir.filter(|d| !d.is_empty()) else {
        return Ok(None);
    };
    if xla_flags.is_some_and(|f| !f.is_empty()) {
        return Ok(None);
    }
    let cache = CompileCache::new(dir);
    Ok(Some(match max_bytes.filter(|m| !m.is_empty()) {
        None => cache,
        Some(m) => {
            let m = m.to_string_lossy();
            let bytes = parse_size(&m).ok_or_else(|| RuntimeError::CacheBound {
                value: m.to_string(),
            })?;
            cache.with_max_bytes(bytes)
        }
    }))
}

/// `s` as bytes: a whole number, optionally followed by `K`, `M`, `G` or `T` (powers of
/// 1024, either case, an optional `B` or `iB` after it).
fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let digits = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (number, unit) = s.split_at(digits);
    let number: u64 = number.parse().ok()?;
    let unit = unit.trim().to_ascii_uppercase();
    let unit = unit
        .strip_suffix("IB")
        .or_else(|| unit.strip_suffix('B'))
        .unwrap_or(&unit);
    let shift = match unit {
        "" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        "T" => 40,
        _ => return None,
    };
    number.checked_mul(1u64 << shift)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(s: &str) -> Option<OsString> {
        Some(OsString::from(s))
    }

    #[test]
    fn the_cache_is_on_only_with_a_directory_and_no_xla_flags() {
        let on = |dir, flags, max| from_vars(dir, flags, max).ok().flatten();
        assert_eq!(on(os("/c"), None, None), Some(CompileCache::new("/c")));
        assert_eq!(on(os("/c"), os(""), os("")), Some(CompileCache::new("/c")));
        assert_eq!(on(os("/c"), os("--xla_dump_to=/d"), None), None);
        assert_eq!(on(os(""), None, None), None);
        assert!(matches!(from_vars(None, None, os("junk")), Ok(None)));
    }

    #[test]
    fn the_bound_takes_bytes_or_a_binary_suffix_and_names_a_bad_value() {
        let bound = |m: &str| {
            from_vars(os("/c"), None, os(m))
                .map(|c| c.map(|c| c.max_bytes()))
                .map_err(|e| e.to_string())
        };
        assert_eq!(bound("1000"), Ok(Some(1000)));
        assert_eq!(bound("500M"), Ok(Some(500 << 20)));
        assert_eq!(bound("4g"), Ok(Some(4 << 30)));
        assert_eq!(bound("2GiB"), Ok(Some(2 << 30)));
        assert_eq!(bound("1 TB"), Ok(Some(1 << 40)));
        assert_eq!(bound("0"), Ok(Some(0)));
        assert_eq!(bound(""), Ok(Some(DEFAULT_MAX_BYTES)));
        for bad in ["lots", "4X", "-1", "1.5G", "99999999999T"] {
            let err = bound(bad).unwrap_err();
            assert!(err.contains(MAX_BYTES_ENV) && err.contains(bad), "{err}");
        }
    }
}
