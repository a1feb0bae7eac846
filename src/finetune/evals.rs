//! `eval.jsonl`: one [`EvalRecord`] per line, appended and flushed as each evaluation
//! ends, truncated to a checkpoint on resume so that a resumed run writes the same lines
//! as an uninterrupted one.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::Error;

use super::EvalRecord;

fn io(path: &Path, what: &str, e: std::io::Error) -> Error {
    Error::Invalid(format!("cannot {what} {}: {e}", path.display()))
}

/// Appends records to an eval log.
#[derive(Debug)]
pub struct EvalWriter {
    path: PathBuf,
    file: File,
}

impl EvalWriter {
    /// Opens `path` for appending (creating it).
    pub fn open(path: &Path) -> Result<EvalWriter, Error> {
        let file = OpenOptions::new()
            .append(true)
            .create(true)
            .open(path)
            .map_err(|e| io(path, "open", e))?;
        Ok(EvalWriter {
            path: path.to_path_buf(),
            file,
        })
    }

    /// Appends `r` as one line and flushes it.
    pub fn append(&mut self, r: &EvalRecord) -> Result<(), Error> {
        let mut line = serde_json::to_string(r)
            .map_err(|e| Error::Invalid(format!("serializing an eval record: {e}")))?;
        line.push('\n');
        self.file
            .write_all(line.as_bytes())
            .and_then(|()| self.file.flush())
            .map_err(|e| io(&self.path, "write", e))
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// The records of `path` (missing: none). Lines that do not parse (a torn last line after
/// a kill) are skipped.
pub fn read_evals(path: &Path) -> Result<Vec<EvalRecord>, Error> {
    let text = match fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io(path, "read", e)),
    };
    Ok(text
        .lines()
        .filter_map(|l| serde_json::from_str(l.trim()).ok())
        .collect())
}

/// Keeps the records of generations up to `generation` (a checkpoint's: the evaluation of
/// the parameters the checkpoint holds is kept, later ones are dropped), rewriting `path`
/// atomically; a missing file stays missing.
pub fn truncate_evals(path: &Path, generation: u32) -> Result<(), Error> {
    if !path.exists() {
        return Ok(());
    }
    let text = fs::read_to_string(path).map_err(|e| io(path, "read", e))?;
    let mut kept = String::new();
    for line in text.lines() {
        if let Ok(r) = serde_json::from_str::<EvalRecord>(line.trim()) {
            if r.generation <= generation {
                kept.push_str(line.trim());
                kept.push('\n');
            }
        }
    }
    let tmp = path.with_extension("jsonl.tmp");
    fs::write(&tmp, kept.as_bytes()).map_err(|e| io(&tmp, "write", e))?;
    fs::rename(&tmp, path).map_err(|e| io(path, "replace", e))
}
