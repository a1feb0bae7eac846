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

use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::UNIX_EPOCH;

use sha2::{Digest, Sha256};

use crate::client::Client;
use crate::executable::{CompileOptions, Executable};

/// The environment variable naming the cache directory ([`CompileCache::from_env`]).
pub const CACHE_ENV: &str = "SHARDES_COMPILE_CACHE";

/// The first bytes of every entry: the format, so that a future layout is never misread.
const MAGIC: &[u8] = b"shardes-compiled-v1\n";

/// A directory of compiled programs (see the module documentation for what an entry is
/// keyed by).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompileCache {
    dir: PathBuf,
}

impl CompileCache {
    /// A cache in `dir` (created on the first store).
    pub fn new(dir: impl Into<PathBuf>) -> CompileCache {
        CompileCache { dir: dir.into() }
    }

    /// The cache named by `SHARDES_COMPILE_CACHE`, if it is set and not empty and
    /// `XLA_FLAGS` is unset or empty.
    pub fn from_env() -> Option<CompileCache> {
        from_vars(std::env::var_os(CACHE_ENV), std::env::var_os("XLA_FLAGS"))
    }

    /// The file that holds (or would hold) `mlir` compiled with `options` on `client`;
    /// `None` when the plugin file cannot be identified, and then nothing is cached.
    pub fn entry_path(
        &self,
        client: &Client,
        mlir: &str,
        options: &CompileOptions,
    ) -> Option<PathBuf> {
        Some(self.path(&Self::key(client, mlir, &options.to_proto_bytes())?))
    }

    /// The directory the entries live in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The entry's file name for `mlir` compiled with `options` (serialized
    /// `CompileOptionsProto`) on `client`, or `None` when the plugin file cannot be
    /// identified (then nothing is cached).
    pub(crate) fn key(client: &Client, mlir: &str, options: &[u8]) -> Option<String> {
        let plugin = client.plugin();
        let meta = std::fs::metadata(plugin.path()).ok()?;
        let mtime = meta
            .modified()
            .ok()?
            .duration_since(UNIX_EPOCH)
            .ok()?
            .as_nanos();
        let mut h = Sha256::new();
        let mut field = |bytes: &[u8]| {
            h.update((bytes.len() as u64).to_le_bytes());
            h.update(bytes);
        };
        field(MAGIC);
        field(plugin.path().to_string_lossy().as_bytes());
        field(&meta.len().to_le_bytes());
        field(&mtime.to_le_bytes());
        let (major, minor) = plugin.api_version();
        field(&major.to_le_bytes());
        field(&minor.to_le_bytes());
        field(plugin.xla_version().unwrap_or_default().as_bytes());
        field(client.platform_name().as_bytes());
        field(&(client.device_count() as u64).to_le_bytes());
        for d in client.devices() {
            field(d.kind.as_bytes());
        }
        field(host_cpu().as_bytes());
        field(options);
        field(mlir.as_bytes());
        let digest = h.finalize();
        Some(digest.iter().map(|b| format!("{b:02x}")).collect())
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

    fn path(&self, key: &str) -> PathBuf {
        self.dir.join(format!("{key}.pjrt"))
    }

    /// The entry `key` loaded on `client`, or `None` when there is none or it is damaged
    /// or refused (the caller compiles then, and [`CompileCache::store`] replaces it).
    pub(crate) fn load(&self, client: &Client, key: &str) -> Option<Executable> {
        let file = std::fs::read(self.path(key)).ok()?;
        let rest = file.strip_prefix(MAGIC)?;
        if rest.len() < 32 {
            return None;
        }
        let (digest, payload) = rest.split_at(32);
        if Sha256::digest(payload).as_slice() != digest {
            return None;
        }
        client.deserialize(payload).ok()
    }

    /// Writes `exe` as entry `key`. Failing to write (a read-only or full disk) only
    /// means the next compile is not saved; the caller goes on with `exe`.
    pub(crate) fn store(&self, key: &str, exe: &Executable) -> std::io::Result<()> {
        let payload = exe
            .serialize()
            .map_err(|e| std::io::Error::other(e.to_string()))?;
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
            f.write_all(&Sha256::digest(&payload))?;
            f.write_all(&payload)?;
            f.sync_all()?;
            std::fs::rename(&tmp, self.path(key))
        })();
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        written
    }
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

/// [`CompileCache::from_env`] on the two variables' values.
fn from_vars(dir: Option<OsString>, xla_flags: Option<OsString>) -> Option<CompileCache> {
    let dir = dir.filter(|d| !d.is_empty())?;
    if xla_flags.is_some_and(|f| !f.is_empty()) {
        return None;
    }
    Some(CompileCache::new(dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(s: &str) -> Option<OsString> {
        Some(OsString::from(s))
    }

    #[test]
    fn the_cache_is_on_only_with_a_directory_and_no_xla_flags() {
        assert_eq!(from_vars(os("/c"), None), Some(CompileCache::new("/c")));
        assert_eq!(from_vars(os("/c"), os("")), Some(CompileCache::new("/c")));
        assert_eq!(from_vars(os("/c"), os("--xla_dump_to=/d")), None);
        assert_eq!(from_vars(os(""), None), None);
        assert_eq!(from_vars(None, None), None);
    }
}
