//! Checkpoints that are atomic as a pair: per-generation parameters, then `state.json`
//! naming them and their sha256; the rename of `state.json` is the commit point.
//!
//! A write, step by step (each step's failpoint in brackets, see [`FAILPOINTS`]):
//! 1. serialize the parameters in memory and hash the bytes (no re-read);
//! 2. write them to `.params.G.H.safetensors.tmpPID` [`PARAMS_WRITTEN`], sync it
//!    [`PARAMS_SYNCED`], rename it to `params.G.H.safetensors` and sync the directory
//!    [`PARAMS_RENAMED`]; an optimizer that keeps state has it written the same way to
//!    `optimizer.G.H.safetensors` (no failpoints of its own);
//! 3. write `state.json` the same way [`STATE_WRITTEN`] and rename it into place
//!    [`STATE_RENAMED`]: from here on the new pair is the checkpoint;
//! 4. point `params.safetensors` at the new file: a hard link made under a temporary name and
//!    renamed over it, or a copy where hard links fail [`ALIASED`];
//! 5. delete the per-generation files `state.json` no longer names [`CLEANED`].
//!
//! Until step 3 the previous pair is untouched and still the checkpoint; after it, the new
//! one. A crash leaves at most temporaries and an unreferenced per-generation file, which the
//! next open removes. A hash mismatch therefore always means the file was changed or damaged
//! afterwards, never that a write stopped half-way (except for state files of earlier
//! versions, which name `params.safetensors` itself).

use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use shardes_hlo::params::{Array, ParamTree};

use super::error::RunDirError;
use super::layout::{
    failpoint, generation_file, is_generation_file, is_optimizer_file, is_temporary,
    optimizer_file, sync_dir, temporary, write_atomic, PARAMS, STATE,
};
use crate::io::{self as sio, IoError, SafetensorsFile};

/// Failpoint: the parameters' temporary is written, not synced.
pub const PARAMS_WRITTEN: &str = "rundir::checkpoint::params_written";
/// Failpoint: the parameters' temporary is synced, not renamed.
pub const PARAMS_SYNCED: &str = "rundir::checkpoint::params_synced";
/// Failpoint: the per-generation parameter file is in place; `state.json` is the old one.
pub const PARAMS_RENAMED: &str = "rundir::checkpoint::params_renamed";
/// Failpoint: the new state's temporary is written and synced, not renamed.
pub const STATE_WRITTEN: &str = "rundir::checkpoint::state_written";
/// Failpoint: the new `state.json` is in place (committed); `params.safetensors` is old.
pub const STATE_RENAMED: &str = "rundir::checkpoint::state_renamed";
/// Failpoint: `params.safetensors` names the new parameters; old files are not deleted.
pub const ALIASED: &str = "rundir::checkpoint::aliased";
/// Failpoint: old per-generation files are deleted (the write is complete).
pub const CLEANED: &str = "rundir::checkpoint::cleaned";

/// Every failpoint of the checkpoint writer, in the order a write passes them.
pub const FAILPOINTS: [&str; 7] = [
    PARAMS_WRITTEN,
    PARAMS_SYNCED,
    PARAMS_RENAMED,
    STATE_WRITTEN,
    STATE_RENAMED,
    ALIASED,
    CLEANED,
];

fn legacy_params_file() -> String {
    PARAMS.to_string()
}

/// `state.json`: the checkpoint's commit record.
///
/// Unknown fields are ignored and new ones default, so files of earlier and later versions
/// read: a state written before `params_file` existed names `params.safetensors`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct State {
    /// The run's key (`key(seed)`), as its two u32 words.
    pub key: [u32; 2],
    /// The generation the next step runs (= generations completed).
    pub generation: u32,
    /// The trajectory hash of the run's config.
    pub config_hash: String,
    /// sha256 of the parameter file, lowercase hex.
    pub params_sha256: String,
    /// The parameter file, a name in the out directory.
    #[serde(default = "legacy_params_file")]
    pub params_file: String,
    /// Whatever else a run needs back on resume (optimizer state files, input hashes);
    /// absent when `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extra: Option<serde_json::Value>,
    /// The optimizer state file (`optimizer.G.H.safetensors`), for an optimizer that keeps
    /// state; absent for `sgd` (and in checkpoints from before optimizers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optimizer_file: Option<String>,
    /// sha256 of the optimizer state file, lowercase hex.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optimizer_sha256: Option<String>,
}

impl State {
    /// The per-generation files this state names: the parameters and, if any, the
    /// optimizer state.
    pub fn files(&self) -> Vec<&str> {
        let mut files = vec![self.params_file.as_str()];
        files.extend(self.optimizer_file.as_deref());
        files
    }
}

/// A checkpoint read back and verified: its state and its parameter file, whose sha256
/// matched and which parsed as safetensors.
#[derive(Debug)]
pub struct Checkpoint {
    state: State,
    file: SafetensorsFile,
    optimizer: Option<SafetensorsFile>,
}

impl Checkpoint {
    /// The state.
    pub fn state(&self) -> &State {
        &self.state
    }

    /// The parameter file that was read.
    pub fn params_path(&self) -> &Path {
        self.file.path()
    }

    /// The parameter file, for tensors beyond a template.
    pub fn file(&self) -> &SafetensorsFile {
        &self.file
    }

    /// The optimizer state file, verified like the parameters (none for `sgd`).
    pub fn optimizer_file(&self) -> Option<&SafetensorsFile> {
        self.optimizer.as_ref()
    }

    /// The optimizer's state, every tensor of the optimizer file by name (empty without
    /// one), for `crate::Trainer::set_optimizer_state`.
    pub fn optimizer_state(&self) -> Result<Vec<(String, Array)>, RunDirError> {
        let Some(file) = &self.optimizer else {
            return Ok(Vec::new());
        };
        file.names()
            .into_iter()
            .map(|name| {
                let a = file
                    .f32(&name)
                    .map_err(|source| RunDirError::ParamsLoad { source })?;
                Ok((name, a))
            })
            .collect()
    }

    /// The parameters with `template`'s structure: each leaf from the f32 tensor named by
    /// its path, of the leaf's shape (as [`crate::io::read_params`] reads them).
    pub fn params(&self, template: &ParamTree) -> Result<ParamTree, RunDirError> {
        let load = |source| RunDirError::ParamsLoad { source };
        let mut leaves = Vec::with_capacity(template.num_leaves());
        for (name, t) in template.leaves() {
            let a = self.file.f32(&name).map_err(load)?;
            if a.shape() != t.shape() {
                return Err(load(IoError::WrongShape {
                    path: self.params_path().to_path_buf(),
                    name,
                    expected: t.shape().to_vec(),
                    found: a.shape().to_vec(),
                }));
            }
            leaves.push(a);
        }
        ParamTree::from_leaves(template, leaves).map_err(|source| {
            load(IoError::Tree {
                path: self.params_path().to_path_buf(),
                source,
            })
        })
    }

    /// Every tensor as a tree, its structure inferred from the names (as
    /// [`crate::io::read_params_inferred`] reads them).
    pub fn params_inferred(&self) -> Result<ParamTree, RunDirError> {
        let load = |source| RunDirError::ParamsLoad { source };
        let mut named = Vec::new();
        for name in self.file.names() {
            let a = self.file.f32(&name).map_err(load)?;
            named.push((name, a));
        }
        ParamTree::from_paths(named).map_err(|source| {
            load(IoError::Tree {
                path: self.params_path().to_path_buf(),
                source,
            })
        })
    }
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Parses the bytes of `state.json` at `path`, checking that the file it names is one of
/// ours in the same directory (a hand-edited name must not make us read or link elsewhere).
pub fn parse_state(path: &Path, bytes: &[u8]) -> Result<State, RunDirError> {
    let corrupt = |reason: String| RunDirError::CorruptState {
        path: path.to_path_buf(),
        reason,
    };
    let state: State = serde_json::from_slice(bytes).map_err(|e| corrupt(e.to_string()))?;
    if state.params_file != PARAMS && !is_generation_file(&state.params_file) {
        return Err(corrupt(format!(
            "it names the parameter file {:?}, which is not a shardes parameter file name",
            state.params_file
        )));
    }
    match (&state.optimizer_file, &state.optimizer_sha256) {
        (None, None) => {}
        (Some(f), Some(_)) if is_optimizer_file(f) => {}
        (Some(f), Some(_)) => {
            return Err(corrupt(format!(
                "it names the optimizer file {f:?}, which is not a shardes optimizer file name"
            )))
        }
        _ => {
            return Err(corrupt(
                "it has one of optimizer_file and optimizer_sha256 without the other".into(),
            ))
        }
    }
    Ok(state)
}

/// Reads `dir/state.json`, if there is one, without verifying its parameters.
pub fn read_state(dir: &Path) -> Result<Option<State>, RunDirError> {
    let path = dir.join(STATE);
    match fs::read(&path) {
        Ok(bytes) => parse_state(&path, &bytes).map(Some),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(RunDirError::io(&path, "read", e)),
    }
}

/// Reads and verifies the checkpoint in `dir`: `state.json`, the parameter file it names,
/// its sha256, its format. `None` when there is no `state.json`. Reads only; needs no lock
/// (but a run writing into `dir` at the same time may have replaced the pair in between, in
/// which case the parameter file is missing: take the lock to rule that out).
pub fn read_checkpoint(dir: &Path) -> Result<Option<Checkpoint>, RunDirError> {
    match read_state(dir)? {
        Some(state) => verify(dir, state).map(Some),
        None => Ok(None),
    }
}

/// Reads the parameter file `state` names and checks it against the state.
pub fn verify(dir: &Path, state: State) -> Result<Checkpoint, RunDirError> {
    let path = dir.join(&state.params_file);
    let bytes = match fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(RunDirError::ParamsMissing {
                state: dir.join(STATE),
                params: path,
            })
        }
        Err(e) => return Err(RunDirError::io(&path, "read", e)),
    };
    let found = sha256_hex(&bytes);
    if found != state.params_sha256 {
        return Err(RunDirError::ParamsMismatch {
            state: dir.join(STATE),
            params: path,
            expected: state.params_sha256.clone(),
            found,
            legacy: state.params_file == PARAMS,
        });
    }
    let file = SafetensorsFile::from_bytes(&path, bytes)
        .map_err(|source| RunDirError::ParamsCorrupt { source })?;
    let optimizer = verify_optimizer(dir, &state)?;
    Ok(Checkpoint {
        state,
        file,
        optimizer,
    })
}

/// Reads the optimizer file `state` names, if any, checking its sha256 and format.
fn verify_optimizer(dir: &Path, state: &State) -> Result<Option<SafetensorsFile>, RunDirError> {
    let (Some(name), Some(sha)) = (&state.optimizer_file, &state.optimizer_sha256) else {
        return Ok(None);
    };
    let path = dir.join(name);
    let invalid = |reason: String| RunDirError::OptimizerStateInvalid {
        state: dir.join(STATE),
        file: path.clone(),
        reason,
    };
    let bytes = match fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(invalid("is missing".into()))
        }
        Err(e) => return Err(RunDirError::io(&path, "read", e)),
    };
    let found = sha256_hex(&bytes);
    if &found != sha {
        return Err(invalid(format!(
            "does not match the sha256 it records (recorded {}…, file {}…): the file was \
             changed or damaged after it was written",
            sha.get(..16).unwrap_or(sha),
            found.get(..16).unwrap_or(&found)
        )));
    }
    SafetensorsFile::from_bytes(&path, bytes)
        .map(Some)
        .map_err(|e| invalid(format!("is not valid safetensors ({e})")))
}

/// The parameters of a checkpoint: borrowed, or given up to be freed leaf by leaf while
/// they are serialized.
#[derive(Debug, Clone)]
pub(crate) enum NewParams<'a> {
    /// The caller keeps the tree.
    Borrowed(&'a ParamTree),
    /// The tree is consumed ([`sio::params_into_bytes`]).
    Owned(ParamTree),
}

/// What to write: everything of a [`State`] but the parameter file and its hash.
#[derive(Debug, Clone)]
pub(crate) struct NewCheckpoint<'a> {
    /// The run's key words.
    pub key: [u32; 2],
    /// The generation the next step runs.
    pub generation: u32,
    /// The trajectory hash of the run's config.
    pub config_hash: &'a str,
    /// The parameters.
    pub params: NewParams<'a>,
    /// The optimizer's state, named tensors (empty: none, no optimizer file).
    pub optimizer: &'a [(String, Array)],
    /// Extra state for resume.
    pub extra: Option<serde_json::Value>,
}

/// Writes a checkpoint into `dir` (whose lock the caller holds), as the module docs
/// describe. `committed` is the state currently in `dir`; it is replaced by the new state
/// the moment that state is committed, so after an error it still says which pair is the
/// checkpoint.
pub(crate) fn write(
    dir: &Path,
    committed: &mut Option<State>,
    new: NewCheckpoint<'_>,
) -> Result<State, RunDirError> {
    let bytes = match new.params {
        NewParams::Borrowed(tree) => sio::params_to_bytes(&dir.join(PARAMS), tree),
        NewParams::Owned(tree) => sio::params_into_bytes(&dir.join(PARAMS), tree),
    }
    .map_err(|source| RunDirError::Serialize { source })?;
    let sha = sha256_hex(&bytes);
    let name = generation_file(new.generation, &sha);
    let params_path = dir.join(&name);
    // The same bytes already committed under this name (a final checkpoint right after a
    // periodic one): rewriting them would only cost time.
    let unchanged = committed
        .as_ref()
        .is_some_and(|s| s.params_file == name && s.params_sha256 == sha)
        && params_path.is_file();
    if !unchanged {
        write_atomic(
            &params_path,
            &bytes,
            Some(PARAMS_WRITTEN),
            Some(PARAMS_SYNCED),
        )
        .map_err(|(step, e)| RunDirError::io(&params_path, step, e))?;
        step(&params_path, PARAMS_RENAMED)?;
    }
    drop(bytes);
    let optimizer = write_optimizer(dir, committed.as_ref(), new.generation, new.optimizer)?;

    let (optimizer_file, optimizer_sha256) = optimizer.unzip();
    let state = State {
        key: new.key,
        generation: new.generation,
        config_hash: new.config_hash.to_string(),
        params_sha256: sha,
        params_file: name.clone(),
        extra: new.extra,
        optimizer_file,
        optimizer_sha256,
    };
    let state_path = dir.join(STATE);
    let mut text = serde_json::to_string_pretty(&state)
        .map_err(|e| RunDirError::io(&state_path, "serialize", std::io::Error::other(e)))?;
    text.push('\n');
    write_atomic(&state_path, text.as_bytes(), None, Some(STATE_WRITTEN))
        .map_err(|(step, e)| RunDirError::io(&state_path, step, e))?;
    *committed = Some(state.clone());
    step(&state_path, STATE_RENAMED)?;

    refresh_alias(dir, &name)?;
    step(&dir.join(PARAMS), ALIASED)?;
    remove_unreferenced_except(dir, &state.files(), false)?;
    step(dir, CLEANED)?;
    Ok(state)
}

/// Writes the optimizer's state to its per-generation file (before `state.json` names it),
/// unless the same bytes are committed already; `None` without state. Returns the file's
/// name and sha256.
fn write_optimizer(
    dir: &Path,
    committed: Option<&State>,
    generation: u32,
    tensors: &[(String, Array)],
) -> Result<Option<(String, String)>, RunDirError> {
    if tensors.is_empty() {
        return Ok(None);
    }
    let named: Vec<(&str, &Array)> = tensors.iter().map(|(n, a)| (n.as_str(), a)).collect();
    let dest = dir.join(format!("optimizer.{generation:06}.safetensors"));
    let bytes =
        sio::named_to_bytes(&dest, &named).map_err(|source| RunDirError::Serialize { source })?;
    let sha = sha256_hex(&bytes);
    let name = optimizer_file(generation, &sha);
    let path = dir.join(&name);
    let unchanged = committed.is_some_and(|s| {
        s.optimizer_file.as_deref() == Some(name.as_str())
            && s.optimizer_sha256.as_deref() == Some(sha.as_str())
    }) && path.is_file();
    if !unchanged {
        write_atomic(&path, &bytes, None, None)
            .map_err(|(step, e)| RunDirError::io(&path, step, e))?;
    }
    Ok(Some((name, sha)))
}

fn step(path: &Path, name: &str) -> Result<(), RunDirError> {
    failpoint(name).map_err(|e| RunDirError::io(path, "checkpoint", e))
}

#[cfg(unix)]
fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (fs::metadata(a), fs::metadata(b)) {
        (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
        _ => false,
    }
}

#[cfg(not(unix))]
fn same_file(_a: &Path, _b: &Path) -> bool {
    false
}

/// Makes `dir/params.safetensors` the file `dir/target`: a hard link under a temporary name
/// renamed over it (atomic: readers see the old or the new file, never none), or a synced
/// copy where the filesystem has no hard links. Nothing to do for `target` =
/// `params.safetensors` (a state of an earlier version) or when it already is that file.
pub fn refresh_alias(dir: &Path, target: &str) -> Result<(), RunDirError> {
    let alias = dir.join(PARAMS);
    let source = dir.join(target);
    if target == PARAMS || same_file(&alias, &source) {
        return Ok(());
    }
    let tmp = temporary(&alias);
    let _ = fs::remove_file(&tmp);
    let result = (|| {
        if fs::hard_link(&source, &tmp).is_err() {
            fs::copy(&source, &tmp).map_err(|e| ("copy", e))?;
            fs::File::open(&tmp)
                .and_then(|f| f.sync_all())
                .map_err(|e| ("sync", e))?;
        }
        fs::rename(&tmp, &alias).map_err(|e| ("rename into place", e))?;
        sync_dir(dir);
        Ok(())
    })();
    result.map_err(|(step, e): (&'static str, std::io::Error)| {
        let _ = fs::remove_file(&tmp);
        RunDirError::io(&alias, step, e)
    })
}

/// Removes from `dir` the per-generation parameter files other than `keep` and, with
/// `temporaries`, every temporary of an atomic write (`.NAME.tmpPID`, files only). The
/// caller holds the lock, so no temporary belongs to a live write. Returns what it removed.
pub fn remove_unreferenced(
    dir: &Path,
    keep: Option<&str>,
    temporaries: bool,
) -> Result<Vec<PathBuf>, RunDirError> {
    let keep: Vec<&str> = keep.into_iter().collect();
    remove_unreferenced_except(dir, &keep, temporaries)
}

/// [`remove_unreferenced`] keeping every per-generation file (parameters or optimizer
/// state) named in `keep`.
pub fn remove_unreferenced_except(
    dir: &Path,
    keep: &[&str],
    temporaries: bool,
) -> Result<Vec<PathBuf>, RunDirError> {
    let mut removed = Vec::new();
    let entries = fs::read_dir(dir).map_err(|e| RunDirError::io(dir, "list", e))?;
    for entry in entries {
        let entry = entry.map_err(|e| RunDirError::io(dir, "list", e))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let stale = ((is_generation_file(name) || is_optimizer_file(name))
            && !keep.contains(&name))
            || (temporaries && is_temporary(name));
        if !stale || !entry.file_type().is_ok_and(|t| t.is_file()) {
            continue;
        }
        let path = entry.path();
        match fs::remove_file(&path) {
            Ok(()) => removed.push(path),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(RunDirError::io(&path, "remove", e)),
        }
    }
    removed.sort();
    Ok(removed)
}
