//! The errors of [`crate::rundir`]: each names the file or directory, says what is wrong and
//! how to fix it, and tells a user error (exit 2 in the CLI) from a failure (exit 1).

use std::fmt;
use std::path::{Path, PathBuf};

use crate::io::IoError;

/// Who holds an out directory's lock, as its `.lock` file says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LockHolder {
    /// The holder's process id; `None` when the file was empty or unreadable (the holder
    /// may still be writing it).
    pub pid: Option<u32>,
    /// When the holder took the lock, UTC (`2026-05-01 12:00:00 UTC`), as it wrote it.
    pub started: Option<String>,
}

impl fmt::Display for LockHolder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.pid, &self.started) {
            (Some(pid), Some(t)) => write!(f, "pid {pid}, started {t}"),
            (Some(pid), None) => write!(f, "pid {pid}"),
            (None, _) => write!(f, "pid unknown"),
        }
    }
}

/// Errors opening, checkpointing or reading an out directory.
///
/// `Display` is the whole message, "what is wrong; how to fix it"; [`RunDirError::what`] and
/// [`RunDirError::hint`] give the two halves for a CLI that prints them on separate lines.
#[derive(Debug, thiserror::Error)]
pub enum RunDirError {
    /// The out directory is the empty path (it would write into the current directory).
    EmptyPath,
    /// The out directory is the filesystem root or the home directory.
    UnsafeDir {
        /// The directory.
        dir: PathBuf,
    },
    /// The out path exists and is not a directory.
    NotADirectory {
        /// The path.
        path: PathBuf,
    },
    /// Another process holds the directory's lock.
    Locked {
        /// The directory.
        dir: PathBuf,
        /// Who holds it.
        holder: LockHolder,
    },
    /// A file operation failed.
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What was being done, as a verb phrase ("write", "rename into place").
        action: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// `state.json` cannot be read as a checkpoint state.
    CorruptState {
        /// The state file.
        path: PathBuf,
        /// What is wrong with it (the parser's message, with line and column).
        reason: String,
    },
    /// The run marker (`.shardes-run`) cannot be read.
    CorruptMarker {
        /// The marker file.
        path: PathBuf,
        /// The parser's message.
        reason: String,
    },
    /// A resume was asked for, but the directory holds no `state.json`.
    NoCheckpoint {
        /// The directory.
        dir: PathBuf,
    },
    /// The directory holds a run whose config hash differs from this run's.
    OtherConfig {
        /// The directory.
        dir: PathBuf,
        /// The hash recorded in the directory.
        found: String,
        /// This run's hash.
        expected: String,
        /// Whether a resume was asked for (the fix differs).
        resume: bool,
    },
    /// A fresh start was asked for without force, but the directory holds a run of this
    /// config that has something to lose.
    RunExists {
        /// The directory.
        dir: PathBuf,
        /// The checkpoint's generation, if it has one.
        generation: Option<u32>,
        /// The records in its `metrics.jsonl`.
        metrics: usize,
    },
    /// The directory holds files that are not (recognisably) a shardes run.
    NotARunDir {
        /// The directory.
        dir: PathBuf,
        /// The entries that are not ours (or all of them, when nothing marks the directory
        /// as a run), sorted.
        entries: Vec<String>,
    },
    /// The parameter file `state.json` names does not exist.
    ParamsMissing {
        /// The state file.
        state: PathBuf,
        /// The missing parameter file.
        params: PathBuf,
    },
    /// The parameter file's sha256 differs from the one `state.json` records.
    ParamsMismatch {
        /// The state file.
        state: PathBuf,
        /// The parameter file.
        params: PathBuf,
        /// The recorded hash.
        expected: String,
        /// The file's hash.
        found: String,
        /// The state was written by a shardes before pair-atomic checkpoints (it names
        /// `params.safetensors` itself), whose writer could stop between the two files.
        legacy: bool,
    },
    /// The parameter file has the recorded hash but is not valid safetensors.
    ParamsCorrupt {
        /// The parser's error, naming the file.
        #[source]
        source: IoError,
    },
    /// The optimizer state file `state.json` names is missing, damaged or not safetensors.
    OptimizerStateInvalid {
        /// The state file.
        state: PathBuf,
        /// The optimizer state file.
        file: PathBuf,
        /// What is wrong with it ("is missing", ...).
        reason: String,
    },
    /// The checkpoint's parameters do not fit the template (another model).
    ParamsLoad {
        /// The error, naming the file and the tensor.
        #[source]
        source: IoError,
    },
    /// The parameters could not be serialized.
    Serialize {
        /// The serializer's error.
        #[source]
        source: IoError,
    },
}

fn previous(dir: &Path) -> String {
    dir.join(super::layout::PREVIOUS).display().to_string()
}

fn list(entries: &[String]) -> String {
    const SHOWN: usize = 5;
    let mut s = entries
        .iter()
        .take(SHOWN)
        .map(String::as_str)
        .collect::<Vec<_>>()
        .join(", ");
    if entries.len() > SHOWN {
        s.push_str(&format!(" and {} more", entries.len() - SHOWN));
    }
    s
}

fn short(hash: &str) -> &str {
    hash.get(..16).unwrap_or(hash)
}

impl RunDirError {
    /// What is wrong, naming the file or directory.
    pub fn what(&self) -> String {
        use RunDirError::*;
        match self {
            EmptyPath => "the out directory is the empty path (it would write into the current \
                          directory)"
                .into(),
            UnsafeDir { dir } => format!(
                "the out directory {} is the filesystem root or the home directory",
                dir.display()
            ),
            NotADirectory { path } => format!("{} exists and is not a directory", path.display()),
            Locked { dir, holder } => format!(
                "{} is in use by another shardes run ({holder})",
                dir.display()
            ),
            Io {
                path,
                action,
                source,
            } => format!("cannot {action} {}: {source}", path.display()),
            CorruptState { path, reason } => format!(
                "{} is not a valid shardes checkpoint state: {reason}",
                path.display()
            ),
            CorruptMarker { path, reason } => format!(
                "{} is not a valid shardes run marker: {reason}",
                path.display()
            ),
            NoCheckpoint { dir } => {
                format!(
                    "{} holds no checkpoint (state.json) to resume",
                    dir.display()
                )
            }
            OtherConfig {
                dir,
                found,
                expected,
                ..
            } => format!(
                "{} holds a run of another config (hash {found} ≠ {expected})",
                dir.display()
            ),
            RunExists {
                dir,
                generation: Some(g),
                ..
            } => format!(
                "{} holds a checkpoint of this config at generation {g}",
                dir.display()
            ),
            RunExists {
                dir,
                generation: None,
                metrics,
            } => format!(
                "{} holds an unfinished run of this config ({metrics} generations in \
                 metrics.jsonl, no checkpoint)",
                dir.display()
            ),
            NotARunDir { dir, entries } => format!(
                "{} holds files that are not part of a shardes run ({})",
                dir.display(),
                list(entries)
            ),
            ParamsMissing { state, params } => format!(
                "{} is missing, but {} names it as the checkpoint's parameters",
                params.display(),
                state.display()
            ),
            ParamsMismatch {
                state,
                params,
                expected,
                found,
                legacy,
            } => {
                let cause = if *legacy {
                    "the file was changed or damaged after it was written, or (checkpoints of \
                     shardes before pair-atomic checkpoints) the run stopped between writing \
                     the two"
                } else {
                    "the file was changed or damaged after it was written"
                };
                format!(
                    "{} does not match the sha256 recorded in {} (recorded {}…, file {}…): \
                     {cause}",
                    params.display(),
                    state.display(),
                    short(expected),
                    short(found)
                )
            }
            ParamsCorrupt { source } => format!(
                "{source} (its sha256 matches state.json, so the checkpoint was written from a \
                 damaged file)"
            ),
            OptimizerStateInvalid {
                state,
                file,
                reason,
            } => format!(
                "the optimizer state {} that {} names {reason}",
                file.display(),
                state.display()
            ),
            ParamsLoad { source } | Serialize { source } => source.to_string(),
        }
    }

    /// How to fix it.
    pub fn hint(&self) -> String {
        use RunDirError::*;
        match self {
            EmptyPath => "set run.out to a directory, e.g. runs/NAME (\".\" if you do mean the \
                          current directory)"
                .into(),
            UnsafeDir { .. } => "set run.out to a directory of its own, e.g. runs/NAME".into(),
            NotADirectory { .. } => "point run.out at a directory, or move the file".into(),
            Locked { .. } => "wait for it to finish, or choose another run.out for this run".into(),
            Io { action: "lock", .. } => "the filesystem may not support file locks: choose \
                                          a run.out on a local disk"
                .into(),
            Io { .. } => "check that the directory exists, is writable and has space".into(),
            CorruptState { path, .. } | CorruptMarker { path, .. } => format!(
                "it was damaged or edited: restore it, or pass --force to start over (the old \
                 run is moved to {})",
                previous(path.parent().unwrap_or(Path::new(".")))
            ),
            NoCheckpoint { .. } => "run without --resume to start this run, or point run.out \
                                    at the run to continue"
                .into(),
            OtherConfig { resume: true, .. } => {
                "resume with the config that started it, or start over with --force".into()
            }
            OtherConfig { dir, .. } => format!(
                "choose another run.out, pass --resume with that run's config, or --force to \
                 overwrite it (the old run is moved to {})",
                previous(dir)
            ),
            RunExists { dir, .. } => format!(
                "pass --resume to continue it, --force to start over (the old run is moved to \
                 {}), or choose another run.out",
                previous(dir)
            ),
            NotARunDir { dir, .. } => format!(
                "choose another run.out (a new or empty directory), or pass --force to move \
                 them to {} and start there",
                previous(dir)
            ),
            ParamsMissing { .. }
            | ParamsMismatch { .. }
            | ParamsCorrupt { .. }
            | OptimizerStateInvalid { .. } => {
                "restore the file from a backup, or start over with --force".into()
            }
            ParamsLoad { .. } => "resume with the config that started the run".into(),
            Serialize { .. } => "give every parameter leaf a distinct name".into(),
        }
    }

    /// Whether the user can fix it by changing the command or the directory (the CLI exits
    /// 2), as opposed to a failure of the machine (a full disk, a permission; exit 1).
    pub fn is_user_error(&self) -> bool {
        !matches!(self, RunDirError::Io { .. } | RunDirError::Serialize { .. })
    }

    pub(crate) fn io(path: &Path, action: &'static str, source: std::io::Error) -> RunDirError {
        RunDirError::Io {
            path: path.to_path_buf(),
            action,
            source,
        }
    }
}

impl fmt::Display for RunDirError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}; {}", self.what(), self.hint())
    }
}
