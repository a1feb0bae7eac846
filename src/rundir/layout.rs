//! The names in an out directory, the patterns that recognise our own files, and the atomic
//! write every file of the directory goes through.

use std::ffi::OsString;
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

/// The checkpoint's commit record.
pub const STATE: &str = "state.json";
/// The parameters under their Hugging Face tensor names, for users: a hard link to (or a
/// copy of) the committed per-generation file.
pub const PARAMS: &str = "params.safetensors";
/// One JSON object per generation.
pub const METRICS: &str = "metrics.jsonl";
/// The resolved config, written by the CLI.
pub const CONFIG: &str = "config.toml";
/// Marks the directory as a shardes run and records its config hash.
pub const MARKER: &str = ".shardes-run";
/// The advisory lock, holding the holder's pid and start time.
pub const LOCK: &str = ".lock";
/// Where a forced fresh start moves the previous run.
pub const PREVIOUS: &str = "previous";

/// The learning curves the CLI redraws at every checkpoint.
pub const CURVES: &str = "curves.svg";
/// TensorBoard event files (`run.tensorboard = true`).
pub const TENSORBOARD: &str = "tb";

/// The entries a run of ours may hold besides temporaries and per-generation files.
pub const OURS: [&str; 8] = [
    STATE,
    PARAMS,
    METRICS,
    CONFIG,
    MARKER,
    PREVIOUS,
    CURVES,
    TENSORBOARD,
];

/// The per-generation parameter file: `params.000042.9f86d081.safetensors` (the generation,
/// at least 6 digits, and the first 8 hex digits of the file's sha256, so two different
/// files of one generation never share a name).
pub fn generation_file(generation: u32, sha256: &str) -> String {
    let tag = sha256.get(..8).unwrap_or(sha256);
    format!("params.{generation:06}.{tag}.safetensors")
}

/// Whether `name` has the form [`generation_file`] gives.
pub fn is_generation_file(name: &str) -> bool {
    is_tagged(name, "params.")
}

/// The per-generation optimizer state file of an optimizer that keeps state:
/// `optimizer.000042.9f86d081.safetensors` (the generation and the first 8 hex digits of the
/// file's sha256, as [`generation_file`]).
pub fn optimizer_file(generation: u32, sha256: &str) -> String {
    let tag = sha256.get(..8).unwrap_or(sha256);
    format!("optimizer.{generation:06}.{tag}.safetensors")
}

/// Whether `name` has the form [`optimizer_file`] gives.
pub fn is_optimizer_file(name: &str) -> bool {
    is_tagged(name, "optimizer.")
}

/// `PREFIX` + at least 6 digits + `.` + 8 lowercase hex digits + `.safetensors`.
fn is_tagged(name: &str, prefix: &str) -> bool {
    let Some(mid) = name
        .strip_prefix(prefix)
        .and_then(|s| s.strip_suffix(".safetensors"))
    else {
        return false;
    };
    let Some((g, tag)) = mid.split_once('.') else {
        return false;
    };
    g.len() >= 6
        && g.bytes().all(|b| b.is_ascii_digit())
        && tag.len() == 8
        && tag.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Whether `name` is a temporary of an atomic write: `.NAME.tmpPID` (this module's and
/// [`crate::io`]'s pattern).
pub fn is_temporary(name: &str) -> bool {
    let Some(rest) = name.strip_prefix('.') else {
        return false;
    };
    match rest.rfind(".tmp") {
        Some(i) if i > 0 => {
            let pid = &rest[i + 4..];
            !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit())
        }
        _ => false,
    }
}

/// The temporary sibling an atomic write of `path` uses: `.NAME.tmpPID`.
pub fn temporary(path: &Path) -> PathBuf {
    let mut name = OsString::from(".");
    name.push(path.file_name().unwrap_or_default());
    name.push(format!(".tmp{}", std::process::id()));
    path.with_file_name(name)
}

/// Makes renames in `dir` durable. Not every platform can open a directory for syncing, so
/// a failure is not an error.
pub fn sync_dir(dir: &Path) {
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
}

/// Evaluates the failpoint `name`. With the `failpoints` feature, `fail::cfg(name,
/// "return")` makes it an I/O error and `fail::cfg(name, "panic")` a panic; without it this
/// is nothing.
#[allow(unused_variables)] // `name` is read only with the feature on
pub fn failpoint(name: &str) -> std::io::Result<()> {
    fail::fail_point!(name, |_| Err(std::io::Error::other(format!(
        "failpoint {name}"
    ))));
    Ok(())
}

/// What an atomic write was doing when it failed, for the message.
pub type Step = &'static str;

/// Writes `bytes` to `path` atomically: to [`temporary`]`(path)`, synced, renamed over
/// `path`, the directory synced. The failpoints `after_write` (temporary written, not
/// synced) and `after_sync` (synced, not renamed) sit between the steps. On an error the
/// temporary is removed; a panic or a kill leaves it for [`is_temporary`] to find.
pub fn write_atomic(
    path: &Path,
    bytes: &[u8],
    after_write: Option<&str>,
    after_sync: Option<&str>,
) -> Result<(), (Step, std::io::Error)> {
    let tmp = temporary(path);
    let result = (|| {
        let mut f = File::create(&tmp).map_err(|e| ("create", e))?;
        f.write_all(bytes).map_err(|e| ("write", e))?;
        if let Some(p) = after_write {
            failpoint(p).map_err(|e| ("write", e))?;
        }
        f.sync_all().map_err(|e| ("sync", e))?;
        drop(f);
        if let Some(p) = after_sync {
            failpoint(p).map_err(|e| ("sync", e))?;
        }
        fs::rename(&tmp, path).map_err(|e| ("rename into place", e))?;
        sync_dir(path.parent().unwrap_or(Path::new(".")));
        Ok(())
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns() {
        let sha = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
        let g = generation_file(42, sha);
        assert_eq!(g, "params.000042.9f86d081.safetensors");
        assert!(is_generation_file(&g));
        assert!(is_generation_file(&generation_file(u32::MAX, sha)));
        for not in [
            PARAMS,
            "params.42.9f86d081.safetensors",
            "params.000042.9F86D081.safetensors",
            "params.000042.safetensors",
            "params.000042.9f86d081.safetensors.bak",
            "my.params.000042.9f86d081.safetensors",
        ] {
            assert!(!is_generation_file(not), "{not}");
        }
        let o = optimizer_file(42, sha);
        assert_eq!(o, "optimizer.000042.9f86d081.safetensors");
        assert!(is_optimizer_file(&o) && !is_generation_file(&o));
        assert!(!is_optimizer_file(&g) && !is_optimizer_file("optimizer.42.9f86d081.safetensors"));
        assert!(is_temporary(".state.json.tmp123"));
        assert!(is_temporary(".params.000001.00000000.safetensors.tmp9"));
        for not in [
            ".lock",
            ".shardes-run",
            ".tmp12",
            "state.json.tmp1",
            ".x.tmp",
            ".x.tmp1a",
        ] {
            assert!(!is_temporary(not), "{not}");
        }
        let t = temporary(Path::new("out/state.json"));
        assert_eq!(
            t,
            Path::new(&format!("out/.state.json.tmp{}", std::process::id()))
        );
        assert!(is_temporary(&t.file_name().unwrap().to_string_lossy()));
    }
}
