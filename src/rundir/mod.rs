//! A run's out directory: a lock, checkpoints atomic as a pair, metrics that stay valid
//! JSON, and a two-phase start that changes nothing until the run is about to begin.
//!
//! # Layout
//!
//! ```text
//! out/
//!   .lock                              advisory lock of the live run (pid, start time)
//!   .shardes-run                       marks a shardes run: {"format":1,"config_hash":".."}
//!   config.toml                        the resolved config (the CLI writes it)
//!   metrics.jsonl                      one JSON object per generation (see `metrics`)
//!   state.json                         the checkpoint: key, generation, config hash,
//!                                      params_file and its sha256, extra
//!   params.000042.9f86d081.safetensors the parameters state.json names (generation, hash)
//!   params.safetensors                 the same parameters for users (a hard link or a copy;
//!                                      Hugging Face tensor names); never read on resume
//!   optimizer.000042.9f86d081.safetensors  the optimizer's state state.json names (optimizers
//!                                      that keep state: momentum, adam, clipup)
//!   previous/                          the run a forced fresh start moved aside
//!   .NAME.tmpPID                       temporaries of atomic writes; a crash may leave
//!                                      them, the next open removes them
//! ```
//!
//! A directory is a run of ours when it holds `.shardes-run` or a `state.json` that parses
//! (runs of earlier versions had no marker). Everything else in it is *foreign*.
//!
//! # Contract for a caller (the CLI)
//!
//! 1. Validate everything that can be validated (the config, the inputs).
//! 2. [`RunDir::prepare`]`(out, mode, config_hash)`: checks the path, takes the lock (when
//!    the directory exists), reads what is there and decides whether this start may use it;
//!    for a resume it reads and verifies the checkpoint ([`Prepared::checkpoint`]). It
//!    changes nothing on disk except the lock file, which dropping the [`Prepared`] removes:
//!    a start that fails from here until step 4 (a compile error, a key mismatch, "nothing
//!    to do") leaves the directory as it was.
//! 3. Load the parameters ([`Checkpoint::params`]), build and compile.
//! 4. [`Prepared::commit`] right before the first generation runs: creates the directory,
//!    removes stale temporaries and unreferenced parameter files, moves a previous run aside
//!    (fresh start with force) or truncates `metrics.jsonl` to the checkpoint (resume), and
//!    writes the marker. Then [`RunDir::write_config`], [`RunDir::metrics_writer`] and, every
//!    few generations, [`RunDir::write_checkpoint`]. Dropping the [`RunDir`] releases the lock.
//!
//! Stale temporaries and parameter files no `state.json` names are ignored by `prepare` and
//! removed by `commit`. The [`CommitReport`] says what the commit did; its metrics `bad`
//! lines deserve a warning, and `moved_aside` a note saying where the old run went.
//!
//! # Which starts proceed
//!
//! - [`Mode::Resume`] needs a `state.json` of the same config hash whose parameter file is
//!   present, has the recorded sha256 and parses; foreign files are left alone.
//! - [`Mode::Fresh`] without force is refused (typed errors, nothing touched) unless the
//!   directory is missing or empty, or holds only the marker, `config.toml`, an empty
//!   `metrics.jsonl` (and `previous/`, which stays) of a start of the same config that never
//!   finished a generation. A run with a checkpoint or with metrics, another config's run,
//!   a corrupt `state.json` and files that are not ours each have their own error.
//! - With force it always proceeds, even over a corrupt `state.json`: everything in the
//!   directory but the lock and temporaries is moved into `previous/`; a `previous/` of an
//!   earlier forced start is deleted first (force means overwrite; only one run is kept).

pub mod checkpoint;
pub mod error;
pub mod layout;
pub mod lock;
pub mod metrics;

use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use shardes_hlo::params::{Array, ParamTree};

pub use checkpoint::{read_checkpoint, Checkpoint, State};

use checkpoint::{NewCheckpoint, NewParams};
pub use error::{LockHolder, RunDirError};
pub use lock::DirLock;
pub use metrics::{
    read_metrics, truncate_metrics, BadLine, Metric, MetricsLog, MetricsTruncation, MetricsWriter,
};

use layout::{write_atomic, CONFIG, MARKER, METRICS, OURS, PREVIOUS, STATE};

/// How a run starts in its out directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// A new run from generation 0. With `force`, a previous run (of any config, even with
    /// a corrupt `state.json`) or foreign files are moved into `previous/` at commit;
    /// without, they refuse the start.
    Fresh {
        /// Overwrite (move aside) whatever the directory holds.
        force: bool,
    },
    /// Continue the directory's checkpoint.
    Resume,
}

/// `.shardes-run`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Marker {
    format: u32,
    config_hash: String,
}

/// What an out directory held at [`RunDir::prepare`].
#[derive(Debug, Default)]
struct Survey {
    /// Every entry but the lock and temporaries, sorted.
    entries: Vec<String>,
    /// Entries that are not ours by name (see [`layout::OURS`]).
    foreign: Vec<String>,
    /// The marker, or why it does not parse.
    marker: Option<Result<Marker, String>>,
    /// `state.json`, or why it does not parse.
    state: Option<Result<State, String>>,
    /// Records (or unreadable lines) in `metrics.jsonl`.
    metrics: usize,
}

impl Survey {
    fn of(dir: &Path) -> Result<Survey, RunDirError> {
        let mut s = Survey::default();
        let entries = match fs::read_dir(dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(s),
            Err(e) => return Err(RunDirError::io(dir, "list", e)),
        };
        for entry in entries {
            let entry = entry.map_err(|e| RunDirError::io(dir, "list", e))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name == layout::LOCK || layout::is_temporary(&name) {
                continue;
            }
            if !OURS.contains(&name.as_str())
                && !layout::is_generation_file(&name)
                && !layout::is_optimizer_file(&name)
            {
                s.foreign.push(name.clone());
            }
            s.entries.push(name);
        }
        s.entries.sort();
        s.foreign.sort();
        if s.has(MARKER) {
            let path = dir.join(MARKER);
            let bytes = fs::read(&path).map_err(|e| RunDirError::io(&path, "read", e))?;
            s.marker = Some(serde_json::from_slice(&bytes).map_err(|e| e.to_string()));
        }
        if s.has(STATE) {
            s.state = match checkpoint::read_state(dir) {
                Ok(st) => st.map(Ok),
                Err(RunDirError::CorruptState { reason, .. }) => Some(Err(reason)),
                Err(e) => return Err(e),
            };
        }
        if s.has(METRICS) {
            let log = read_metrics(&dir.join(METRICS))?;
            s.metrics = log.records.len() + log.bad.len() + usize::from(log.torn.is_some());
        }
        Ok(s)
    }

    fn has(&self, name: &str) -> bool {
        self.entries.iter().any(|e| e == name)
    }

    fn is_ours(&self) -> bool {
        matches!(self.marker, Some(Ok(_))) || matches!(self.state, Some(Ok(_)))
    }

    /// Whether a fresh start may proceed here, and why not.
    fn check_fresh(&self, dir: &Path, force: bool, hash: &str) -> Result<(), RunDirError> {
        if force || self.entries.is_empty() {
            return Ok(());
        }
        match &self.state {
            Some(Err(reason)) => return Err(corrupt_state(dir, reason)),
            Some(Ok(st)) if st.config_hash != hash => {
                return Err(other_config(dir, &st.config_hash, hash, false))
            }
            Some(Ok(st)) => {
                return Err(RunDirError::RunExists {
                    dir: dir.to_path_buf(),
                    generation: Some(st.generation),
                    metrics: self.metrics,
                })
            }
            None => {}
        }
        match &self.marker {
            Some(Err(reason)) => {
                return Err(RunDirError::CorruptMarker {
                    path: dir.join(MARKER),
                    reason: reason.clone(),
                })
            }
            Some(Ok(m)) if m.config_hash != hash => {
                return Err(other_config(dir, &m.config_hash, hash, false))
            }
            _ => {}
        }
        if !self.is_ours() {
            return Err(RunDirError::NotARunDir {
                dir: dir.to_path_buf(),
                entries: self.entries.clone(),
            });
        }
        if !self.foreign.is_empty() {
            return Err(RunDirError::NotARunDir {
                dir: dir.to_path_buf(),
                entries: self.foreign.clone(),
            });
        }
        // Left: a start of this config without a checkpoint. Only when it never finished a
        // generation (and left no parameters) is there nothing to lose; `previous/` stays
        // as it is.
        if self.metrics > 0 || self.has(layout::PARAMS) {
            return Err(RunDirError::RunExists {
                dir: dir.to_path_buf(),
                generation: None,
                metrics: self.metrics,
            });
        }
        Ok(())
    }
}

fn corrupt_state(dir: &Path, reason: &str) -> RunDirError {
    RunDirError::CorruptState {
        path: dir.join(STATE),
        reason: reason.to_string(),
    }
}

fn other_config(dir: &Path, found: &str, expected: &str, resume: bool) -> RunDirError {
    RunDirError::OtherConfig {
        dir: dir.to_path_buf(),
        found: found.to_string(),
        expected: expected.to_string(),
        resume,
    }
}

fn check_path(dir: &Path) -> Result<(), RunDirError> {
    if dir.as_os_str().is_empty() {
        return Err(RunDirError::EmptyPath);
    }
    if dir.exists() && !dir.is_dir() {
        return Err(RunDirError::NotADirectory {
            path: dir.to_path_buf(),
        });
    }
    if let Ok(canon) = dir.canonicalize() {
        let home = std::env::var_os("HOME").and_then(|h| Path::new(&h).canonicalize().ok());
        if canon.parent().is_none() || home.as_deref() == Some(canon.as_path()) {
            return Err(RunDirError::UnsafeDir {
                dir: dir.to_path_buf(),
            });
        }
    }
    Ok(())
}

/// Phase one of a start: the directory checked and locked, nothing changed. See the module
/// docs for the contract; [`Prepared::commit`] is phase two.
#[derive(Debug)]
pub struct Prepared {
    dir: PathBuf,
    mode: Mode,
    config_hash: String,
    /// `None` when the directory did not exist; commit creates and locks it.
    lock: Option<DirLock>,
    survey: Survey,
    checkpoint: Option<Checkpoint>,
    resume_state: Option<State>,
}

/// An out directory in use by this run (phase two): locked until dropped.
#[derive(Debug)]
pub struct RunDir {
    dir: PathBuf,
    config_hash: String,
    _lock: DirLock,
    committed: Option<State>,
    report: CommitReport,
}

/// What [`Prepared::commit`] changed, for the CLI to tell the user.
#[derive(Debug, Clone, Default)]
pub struct CommitReport {
    /// Where the previous run's files went (`DIR/previous`), if a forced start moved any.
    pub moved_aside: Option<PathBuf>,
    /// Stale temporaries and unreferenced parameter files that were deleted.
    pub removed: Vec<PathBuf>,
    /// What truncating `metrics.jsonl` to the checkpoint found (resume only). Its `bad`
    /// lines deserve a warning.
    pub metrics: Option<MetricsTruncation>,
}

impl RunDir {
    /// Phase one of a start (see the module docs): checks `dir` (refusing the empty path,
    /// a file, `/` and the home directory), takes its lock if it exists, and decides whether
    /// `mode` may start here for a run whose config hashes to `config_hash`. For
    /// [`Mode::Resume`] it reads and verifies the checkpoint. Changes nothing on disk but the
    /// lock file, which dropping the result removes.
    pub fn prepare(
        dir: impl AsRef<Path>,
        mode: Mode,
        config_hash: &str,
    ) -> Result<Prepared, RunDirError> {
        let dir = dir.as_ref().to_path_buf();
        check_path(&dir)?;
        let lock = if dir.is_dir() {
            Some(DirLock::acquire(&dir)?)
        } else {
            None
        };
        let survey = Survey::of(&dir)?;
        let mut checkpoint = None;
        match mode {
            Mode::Fresh { force } => survey.check_fresh(&dir, force, config_hash)?,
            Mode::Resume => {
                let state = match &survey.state {
                    None => {
                        return Err(RunDirError::NoCheckpoint { dir });
                    }
                    Some(Err(reason)) => return Err(corrupt_state(&dir, reason)),
                    Some(Ok(st)) => st.clone(),
                };
                if state.config_hash != config_hash {
                    return Err(other_config(&dir, &state.config_hash, config_hash, true));
                }
                checkpoint = Some(checkpoint::verify(&dir, state)?);
            }
        }
        let resume_state = checkpoint.as_ref().map(|c| c.state().clone());
        Ok(Prepared {
            dir,
            mode,
            config_hash: config_hash.to_string(),
            lock,
            survey,
            checkpoint,
            resume_state,
        })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// The run's config hash.
    pub fn config_hash(&self) -> &str {
        &self.config_hash
    }

    /// The state of the checkpoint currently committed in the directory (the resumed one,
    /// or the last written), `None` before the first.
    pub fn committed(&self) -> Option<&State> {
        self.committed.as_ref()
    }

    /// What the commit changed.
    pub fn report(&self) -> &CommitReport {
        &self.report
    }

    /// The user-facing parameter file, `DIR/params.safetensors`.
    pub fn params_path(&self) -> PathBuf {
        self.dir.join(layout::PARAMS)
    }

    /// Writes `DIR/config.toml` atomically.
    pub fn write_config(&self, text: &str) -> Result<(), RunDirError> {
        let path = self.dir.join(CONFIG);
        write_atomic(&path, text.as_bytes(), None, None)
            .map_err(|(step, e)| RunDirError::io(&path, step, e))
    }

    /// Opens `DIR/metrics.jsonl` for appending records.
    pub fn metrics_writer(&self) -> Result<MetricsWriter, RunDirError> {
        MetricsWriter::open(&self.dir.join(METRICS))
    }

    /// Writes a checkpoint of `params` for the step that runs `generation` next (see
    /// [`checkpoint`] for the steps). On success and on any error after the commit point,
    /// [`RunDir::committed`] is the new state; on an error before it, the previous one,
    /// which is still intact on disk.
    pub fn write_checkpoint(
        &mut self,
        key: [u32; 2],
        generation: u32,
        params: &ParamTree,
        extra: Option<serde_json::Value>,
    ) -> Result<&State, RunDirError> {
        self.write_checkpoint_with_optimizer(key, generation, params, &[], extra)
    }

    /// [`RunDir::write_checkpoint`] with the optimizer's state (`crate::Trainer::
    /// optimizer_state`): written to its own per-generation file before `state.json`, which
    /// names both, so the pair commits together. Empty (`sgd`): no optimizer file, the
    /// checkpoint of [`RunDir::write_checkpoint`].
    pub fn write_checkpoint_with_optimizer(
        &mut self,
        key: [u32; 2],
        generation: u32,
        params: &ParamTree,
        optimizer: &[(String, Array)],
        extra: Option<serde_json::Value>,
    ) -> Result<&State, RunDirError> {
        self.write_new(
            key,
            generation,
            NewParams::Borrowed(params),
            optimizer,
            extra,
        )
    }

    /// [`RunDir::write_checkpoint_with_optimizer`] consuming `params`: each leaf is freed as
    /// soon as it is serialized, so the host holds the file's bytes and not the tree beside
    /// them (for a model of gigabytes, one copy less at every checkpoint). The files are
    /// byte for byte those of the borrowing call.
    pub fn write_checkpoint_taking(
        &mut self,
        key: [u32; 2],
        generation: u32,
        params: ParamTree,
        optimizer: &[(String, Array)],
        extra: Option<serde_json::Value>,
    ) -> Result<&State, RunDirError> {
        self.write_new(key, generation, NewParams::Owned(params), optimizer, extra)
    }

    fn write_new(
        &mut self,
        key: [u32; 2],
        generation: u32,
        params: NewParams<'_>,
        optimizer: &[(String, Array)],
        extra: Option<serde_json::Value>,
    ) -> Result<&State, RunDirError> {
        let new = NewCheckpoint {
            key,
            generation,
            config_hash: &self.config_hash,
            params,
            optimizer,
            extra,
        };
        let state = checkpoint::write(&self.dir, &mut self.committed, new)?;
        Ok(self.committed.insert(state))
    }
}

impl Prepared {
    /// The directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// The mode it was prepared for.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The verified checkpoint to resume from ([`Mode::Resume`] only; `None` after
    /// [`Prepared::take_checkpoint`]).
    pub fn checkpoint(&self) -> Option<&Checkpoint> {
        self.checkpoint.as_ref()
    }

    /// Takes the checkpoint, e.g. to free its parameter bytes once loaded; the commit still
    /// knows the generation to truncate the metrics to.
    pub fn take_checkpoint(&mut self) -> Option<Checkpoint> {
        self.checkpoint.take()
    }

    /// The state of the checkpoint the directory holds, if it has a valid one (for a fresh
    /// start with force: what will be moved aside).
    pub fn existing_state(&self) -> Option<&State> {
        match &self.survey.state {
            Some(Ok(s)) => Some(s),
            _ => None,
        }
    }

    /// Whether the commit will move entries into `previous/` (a fresh start with force
    /// into a directory that holds anything).
    pub fn moves_aside(&self) -> bool {
        matches!(self.mode, Mode::Fresh { force: true })
            && self.survey.entries.iter().any(|e| e != PREVIOUS)
    }

    /// Phase two (see the module docs): makes the directory this run's. Call it once the
    /// program is built and the first generation is about to run.
    pub fn commit(self) -> Result<RunDir, RunDirError> {
        let Prepared {
            dir,
            mode,
            config_hash,
            lock,
            mut survey,
            checkpoint,
            resume_state,
        } = self;
        drop(checkpoint);
        let lock = match lock {
            Some(l) => l,
            None => {
                fs::create_dir_all(&dir).map_err(|e| RunDirError::io(&dir, "create", e))?;
                let l = DirLock::acquire(&dir)?;
                // Another start may have used the directory since `prepare` found none.
                survey = Survey::of(&dir)?;
                if let Mode::Fresh { force } = mode {
                    survey.check_fresh(&dir, force, &config_hash)?;
                }
                l
            }
        };
        let mut report = CommitReport::default();
        if let Mode::Fresh { force: true } = mode {
            // First, so that the previous run's parameter files go with it.
            report.moved_aside = move_aside(&dir, &survey.entries)?;
        }
        let keep: Vec<&str> = resume_state.as_ref().map_or(Vec::new(), |s| s.files());
        report.removed = checkpoint::remove_unreferenced_except(&dir, &keep, true)?;
        match mode {
            Mode::Fresh { .. } => {
                let metrics = dir.join(METRICS);
                fs::File::create(&metrics).map_err(|e| RunDirError::io(&metrics, "create", e))?;
            }
            Mode::Resume => {
                if let Some(st) = &resume_state {
                    checkpoint::refresh_alias(&dir, &st.params_file)?;
                    report.metrics = Some(truncate_metrics(&dir.join(METRICS), st.generation)?);
                }
            }
        }
        let marker = Marker {
            format: 1,
            config_hash: config_hash.clone(),
        };
        let path = dir.join(MARKER);
        let text = serde_json::to_string(&marker).unwrap_or_default() + "\n";
        write_atomic(&path, text.as_bytes(), None, None)
            .map_err(|(step, e)| RunDirError::io(&path, step, e))?;
        Ok(RunDir {
            dir,
            config_hash,
            _lock: lock,
            committed: resume_state,
            report,
        })
    }
}

/// Moves every entry of `dir` in `entries` but `previous/` into a fresh `previous/`,
/// deleting an older one. Returns where they went, or `None` when there was nothing.
fn move_aside(dir: &Path, entries: &[String]) -> Result<Option<PathBuf>, RunDirError> {
    let moving: Vec<&String> = entries.iter().filter(|e| e.as_str() != PREVIOUS).collect();
    if moving.is_empty() {
        return Ok(None);
    }
    let prev = dir.join(PREVIOUS);
    match fs::symlink_metadata(&prev) {
        Ok(m) if m.is_dir() => {
            fs::remove_dir_all(&prev).map_err(|e| RunDirError::io(&prev, "remove", e))?
        }
        Ok(_) => fs::remove_file(&prev).map_err(|e| RunDirError::io(&prev, "remove", e))?,
        Err(_) => {}
    }
    fs::create_dir(&prev).map_err(|e| RunDirError::io(&prev, "create", e))?;
    for name in moving {
        let from = dir.join(name);
        fs::rename(&from, prev.join(name))
            .map_err(|e| RunDirError::io(&from, "move into previous/", e))?;
    }
    layout::sync_dir(dir);
    Ok(Some(prev))
}
