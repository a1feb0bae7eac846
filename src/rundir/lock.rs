//! The out directory's lock: `DIR/.lock`, held with an OS advisory lock
//! ([`File::try_lock`], `flock` on Unix) for as long as the [`DirLock`] lives. The kernel
//! releases it when the process dies, however it dies, so a stale `.lock` left by `kill -9`
//! never blocks the next run; its text (the holder's pid and start time) only serves the
//! message a second opener gets.

use std::fs::{self, File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use super::error::{LockHolder, RunDirError};
use super::layout::LOCK;

/// A held lock on an out directory. Dropping it removes `.lock` and releases the lock.
#[derive(Debug)]
pub struct DirLock {
    path: PathBuf,
    // Held open for the lock; never read after acquiring.
    _file: File,
}

impl DirLock {
    /// Takes the lock of the existing directory `dir`, or fails with
    /// [`RunDirError::Locked`] naming the holder. Two opens in one process conflict too
    /// (the lock belongs to the open file, not to the process).
    pub fn acquire(dir: &Path) -> Result<DirLock, RunDirError> {
        let path = dir.join(LOCK);
        // A holder that is dropping its lock removes the file while still holding it; an
        // opener that opened the old file before the removal gets a lock on a file that no
        // longer has a name, sees that, and tries again with the new one.
        for _ in 0..100 {
            let mut file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)
                .map_err(|e| RunDirError::io(&path, "create the lock file", e))?;
            match file.try_lock() {
                Ok(()) => {}
                Err(TryLockError::WouldBlock) => {
                    return Err(RunDirError::Locked {
                        dir: dir.to_path_buf(),
                        holder: read_holder(&mut file),
                    })
                }
                Err(TryLockError::Error(e)) => {
                    return Err(RunDirError::io(&path, "lock", e));
                }
            }
            if !still_named(&file, &path) {
                continue;
            }
            let text = format!(
                "pid {}\nstarted {}\n",
                std::process::id(),
                utc(SystemTime::now())
            );
            file.set_len(0)
                .and_then(|()| file.seek(SeekFrom::Start(0)).map(|_| ()))
                .and_then(|()| file.write_all(text.as_bytes()))
                .map_err(|e| RunDirError::io(&path, "write the lock file", e))?;
            return Ok(DirLock { path, _file: file });
        }
        Err(RunDirError::io(
            &path,
            "lock",
            std::io::Error::other("the lock file kept being replaced while locking it"),
        ))
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for DirLock {
    fn drop(&mut self) {
        // Removed while still held (the file closes after this), so no other process can
        // hold a lock on a file that is still named `.lock` when this one goes.
        let _ = fs::remove_file(&self.path);
    }
}

#[cfg(unix)]
fn still_named(file: &File, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (file.metadata(), fs::metadata(path)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

#[cfg(not(unix))]
fn still_named(_file: &File, path: &Path) -> bool {
    path.exists()
}

fn read_holder(file: &mut File) -> LockHolder {
    let mut text = String::new();
    if file.read_to_string(&mut text).is_err() {
        return LockHolder::default();
    }
    parse_holder(&text)
}

/// Reads the `.lock` text `pid N\nstarted T\n`.
pub fn parse_holder(text: &str) -> LockHolder {
    let mut holder = LockHolder::default();
    for line in text.lines() {
        if let Some(p) = line.strip_prefix("pid ") {
            holder.pid = p.trim().parse().ok();
        } else if let Some(t) = line.strip_prefix("started ") {
            let t = t.trim();
            if !t.is_empty() {
                holder.started = Some(t.to_string());
            }
        }
    }
    holder
}

/// `t` as `YYYY-MM-DD HH:MM:SS UTC`.
pub fn utc(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Howard Hinnant's days-to-civil, for days since 1970-01-01.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn utc_dates() {
        let at = |s| utc(UNIX_EPOCH + Duration::from_secs(s));
        assert_eq!(at(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(at(951_782_400), "2000-02-29 00:00:00 UTC");
        assert_eq!(at(1_700_000_000), "2023-11-14 22:13:20 UTC");
        assert_eq!(at(4_102_444_799), "2099-12-31 23:59:59 UTC");
    }

    #[test]
    fn holder_text() {
        let h = parse_holder("pid 42\nstarted 2026-01-01 00:00:00 UTC\n");
        assert_eq!(h.pid, Some(42));
        assert_eq!(h.to_string(), "pid 42, started 2026-01-01 00:00:00 UTC");
        assert_eq!(parse_holder("").to_string(), "pid unknown");
        assert_eq!(parse_holder("pid 7").to_string(), "pid 7");
    }

    #[test]
    fn second_open_in_one_process_is_refused_and_drop_releases() {
        let dir = tempfile::tempdir().unwrap();
        let a = DirLock::acquire(dir.path()).unwrap();
        let text = fs::read_to_string(a.path()).unwrap();
        assert!(text.starts_with(&format!("pid {}\n", std::process::id())));
        match DirLock::acquire(dir.path()) {
            Err(RunDirError::Locked { dir: d, holder }) => {
                assert_eq!(d, dir.path());
                assert_eq!(holder.pid, Some(std::process::id()));
            }
            other => panic!("expected Locked, got {other:?}"),
        }
        drop(a);
        assert!(!dir.path().join(LOCK).exists());
        let b = DirLock::acquire(dir.path()).unwrap();
        drop(b);
    }

    #[test]
    fn a_stale_lock_file_does_not_block() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join(LOCK), "pid 1\nstarted long ago\n").unwrap();
        let l = DirLock::acquire(dir.path()).unwrap();
        let text = fs::read_to_string(l.path()).unwrap();
        assert!(
            text.starts_with(&format!("pid {}\n", std::process::id())),
            "{text}"
        );
    }
}
