//! `shardes run` as one of several processes (`mpirun -np P shardes run CONFIG`, built with
//! the feature `mpi`; see `docs/cluster.md`).
//!
//! Every process loads the same config, builds the same problem and compiles its own
//! programs; process 0 (the lead) alone owns the out directory (lock, metrics,
//! checkpoints) and prints. The processes meet, in this order, at:
//! 1. the config: a hash of each process's resolved config, compared (exit 2 on every
//!    process if one differs);
//! 2. the split: `es.n` must divide by processes × devices × pairing (every process refuses
//!    it alike, exit 2);
//! 3. the start: the lead's start generation and parameters (a resumed checkpoint, written
//!    by any process count) broadcast to the others;
//! 4. each generation: a stop check (a signal seen by any process stops them all after the
//!    same generation), then the generation itself (fitness gather, and the update
//!    exchange under `how_hosts = B`);
//! 5. every [`shardes::session::PARAM_CHECK_EVERY`] generations, before every checkpoint
//!    and at the end: a hash of the parameters, compared (a failure naming the generation
//!    if they differ).
//!
//! A process that fails on its own (the lead refusing the out directory, a process killed)
//! exits without finalizing MPI; `mpirun` then stops the others and exits non-zero. After a
//! stop signal every process exits without finalizing too, but only once every process got
//! to the end of the run, the lead with its checkpoint written ([`Group::exit_together`]). A
//! collective that waits longer than `SHARDES_MPI_TIMEOUT` seconds (default 600) ends its
//! process too, for launchers that would leave the others waiting.
//!
//! The trajectory hash of a run across processes counts every process's devices
//! (`processes × devices`), so a checkpoint written by 2 × 4 resumes under 1 × 8 and the
//! other way round.

use std::time::Duration;

use anyhow::{Context, Result};
use shardes::distributed::{bytes_digest, Distributed};
use shardes::hlo::es::check_processes;
use shardes::hlo::params::Array;
use shardes::hlo::params::ParamTree;
use shardes::population::Place;
use shardes::session::{agree_stop, Outcome, Quiet, Session};

use super::engine::{self, Engine};
use super::signals::{Signal, Stop};
use super::start::session_error;
use crate::config::{es_error, Config, ConfigError};
use crate::out::errln;
use crate::setup::{self, Setup};

/// The default of `SHARDES_MPI_TIMEOUT`: the longest wait in one collective, in seconds.
const DEFAULT_TIMEOUT_S: u64 = 600;

/// Ends the process at once (no destructors racing the plugin's threads, no MPI finalize).
fn die() -> ! {
    signal_hook::low_level::exit(1)
}

/// `SHARDES_MPI_TIMEOUT` in seconds, or the default.
fn timeout_secs() -> Result<u64> {
    match std::env::var("SHARDES_MPI_TIMEOUT") {
        Ok(v) => Ok(v
            .trim()
            .parse::<u64>()
            .ok()
            .filter(|&s| s > 0)
            .ok_or_else(|| {
                ConfigError::new(
                    format!("SHARDES_MPI_TIMEOUT = {v:?} is not a whole number of seconds > 0"),
                    format!("unset it (default {DEFAULT_TIMEOUT_S} s) or set it to e.g. 600"),
                )
            })?),
        Err(_) => Ok(DEFAULT_TIMEOUT_S),
    }
}

/// The group of processes a run is one of (one process unless started by an MPI launcher).
pub struct Group {
    /// `None` once finished.
    dist: Option<Distributed>,
    rank: usize,
    size: usize,
}

impl Group {
    /// The group this process was started in ([`Distributed::from_env`]), with the
    /// collective timeout of `SHARDES_MPI_TIMEOUT`.
    pub fn from_env() -> Result<Group> {
        let dist = Distributed::from_env()
            .map_err(|e| ConfigError::new(e.to_string(), "see docs/cluster.md"))?;
        // The timeout matters (and is read) only between processes.
        let dist = if dist.size() > 1 {
            dist.with_timeout(Duration::from_secs(timeout_secs()?), die)
        } else {
            dist
        };
        Ok(Group {
            rank: dist.rank(),
            size: dist.size(),
            dist: Some(dist),
        })
    }

    /// The number of processes.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Whether this is process 0, which prints and writes the out directory.
    pub fn is_lead(&self) -> bool {
        self.rank == 0
    }

    /// The group's collectives (refused once the group has ended).
    pub fn dist(&self) -> Result<&Distributed> {
        self.dist
            .as_ref()
            .context("the processes already ended their group")
    }

    /// Ends the group on every process together (MPI is finalized); no collective after.
    pub fn finish(&mut self) {
        if let Some(d) = self.dist.take() {
            d.finish();
        }
    }

    /// Ends the group at the end of a run: together ([`Group::finish`]) after the last
    /// generation, but not after a stop signal: the launcher is taking the job down then
    /// (`mpirun` sends SIGTERM, then SIGKILL), and finalizing MPI while it does can wait
    /// until the SIGKILL. The processes then exit together ([`Group::exit_together`]).
    pub fn end(&mut self, finished: bool) {
        if finished {
            self.finish();
        }
    }

    /// Returns `e` after ending the group: for a refusal every process reached alike, so
    /// that each prints it before any exits.
    fn refuse<T>(&mut self, e: impl Into<anyhow::Error>) -> Result<T> {
        self.finish();
        Err(e.into())
    }

    /// The trajectory hash of `config` run by this group: the config's own with `devices`
    /// counting every process's, so that a checkpoint resumes under any split of the same
    /// devices (one process: [`Config::trajectory_hash`] itself).
    pub fn trajectory_hash(&self, config: &Config) -> String {
        if self.size == 1 {
            return config.trajectory_hash();
        }
        let mut all = config.clone();
        all.devices = config.devices.saturating_mul(self.size);
        all.trajectory_hash()
    }

    /// Refuses (on every process) unless every process was given the same config.
    pub fn agree_config(&mut self, config: &Config) -> Result<()> {
        if self.size == 1 {
            return Ok(());
        }
        let text = toml::to_string(config).context("serializing the config")?;
        let agreed = self
            .dist()?
            .agree("the config", bytes_digest(text.as_bytes()), "");
        match agreed {
            Ok(()) => Ok(()),
            Err(e) => self.refuse(ConfigError::new(
                format!(
                    "process {}: {}",
                    self.rank,
                    e.to_string().trim_end_matches("; ")
                ),
                "start every process with the same config file and flags (mpirun -np P \
                 shardes run CONFIG)",
            )),
        }
    }

    /// Refuses (on every process alike) a population that does not split over the
    /// processes and their devices.
    pub fn check_split(&mut self, config: &Config) -> Result<()> {
        if self.size == 1 {
            return Ok(());
        }
        let es = match config.es.build(config.devices) {
            Ok(es) => es,
            Err(e) => return self.refuse(es_error(e)),
        };
        let strategy = config.es.strategy.to_string();
        match check_processes(
            config.es.n,
            self.size,
            config.devices,
            es.strategy().pairing(),
            &strategy,
        ) {
            Ok(()) => Ok(()),
            Err(e) => {
                let (message, fix) = (e.message(), e.fix().unwrap_or_default());
                self.refuse(ConfigError::new(
                    format!("process {} of {}: {message}", self.rank, self.size),
                    fix,
                ))
            }
        }
    }

    /// What `config` needs on this process: the ES over every process's devices, the
    /// problem, and a client with this process's devices.
    pub fn setup(&self, config: &Config) -> Result<Setup> {
        if self.size == 1 {
            return setup::build(config);
        }
        let mut all = config.clone();
        all.devices = config.devices * self.size;
        if config.task.is_some() {
            // The ES of the whole run; the model to decode with, as on one process.
            let (problem, loaded) = setup::decoding_problem(config)?;
            let es = setup::es(&all)?;
            let leaves = shardes::hlo::es::leaf_infos(&problem.params);
            crate::config::sigma::check_leaves(&es, &leaves)?;
            return Ok(Setup {
                config: config.clone(),
                es,
                problem,
                client: setup::client(config)?,
                decode: Some(loaded),
                host: None,
            });
        }
        // A MuJoCo model (`host`) is loaded on every process: each simulates its own members.
        let (es, problem, host) = setup::problem(&all)?;
        let client = setup::client(config)?;
        Ok(Setup {
            config: config.clone(),
            es,
            problem,
            client,
            decode: None,
            host,
        })
    }

    /// The lead's start generation and parameters on every process (the lead passes its
    /// own; the others pass theirs, which only give the tree's shape).
    pub fn share_start(&self, start: u32, params: ParamTree) -> Result<(u32, ParamTree)> {
        if self.size == 1 {
            return Ok((start, params));
        }
        let dist = self.dist()?;
        let bytes = dist.broadcast_bytes(start.to_le_bytes().to_vec())?;
        let start = <[u8; 4]>::try_from(bytes.as_slice())
            .map(u32::from_le_bytes)
            .map_err(|_| anyhow::anyhow!("the start generation did not arrive"))?;
        let params = dist.broadcast_params(&params)?;
        Ok((start, params))
    }

    /// The lead's optimizer state (its resumed checkpoint's, or zeros) on every process:
    /// a collective under a stateful optimizer across processes, nothing otherwise.
    pub fn share_optimizer(&self, engine: &mut Engine) -> Result<()> {
        if self.size == 1 {
            return Ok(());
        }
        let mine = engine.optimizer_state()?;
        if mine.is_empty() {
            return Ok(());
        }
        let bytes: Vec<u8> = mine
            .iter()
            .flat_map(|(_, a)| a.data().iter().flat_map(|x| x.to_le_bytes()))
            .collect();
        let bytes = self.dist()?.broadcast_bytes(bytes)?;
        let mut values = bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]));
        let mut tensors = Vec::with_capacity(mine.len());
        for (name, a) in &mine {
            let data: Vec<f32> = values.by_ref().take(a.data().len()).collect();
            if data.len() != a.data().len() {
                anyhow::bail!(
                    "process 0's optimizer state ends before `{name}`; start every process with \
                     the same config"
                );
            }
            tensors.push((name.clone(), Array::new(a.shape().to_vec(), data)?));
        }
        engine.set_optimizer_state(&tensors)?;
        Ok(())
    }

    /// The stop signal of any process (the first in rank order), the same on every
    /// process: all stop after the same generation.
    pub fn stop(&self, stop: &Stop) -> Result<Option<Signal>> {
        Ok(agree_stop(self.dist()?, stop.received())?)
    }

    /// After a stop signal, across processes: waits until every process got here (the
    /// lead with its checkpoint written), then ends this process at once with the signal's
    /// exit code, without finalizing MPI (whose fence needs `mpirun`, which is busy
    /// stopping the job). A process that exits makes `mpirun` kill the others within
    /// milliseconds (Open MPI 4.1), so no process may exit before the lead's checkpoint,
    /// and none may linger after the others: released together from the barrier, every
    /// process exits within microseconds. On one process it returns.
    pub fn exit_together(&mut self, sig: Signal) {
        if self.size == 1 {
            return;
        }
        if let Some(d) = &self.dist {
            if let Err(e) = d.barrier() {
                errln!("error: process {}: {e}", self.rank);
            }
        }
        // `_exit`: nothing is left to flush (stderr is unbuffered, stdout's lines were
        // written or given up on) and nothing to release.
        signal_hook::low_level::exit(i32::from(sig.exit_code()))
    }

    /// A header line saying how the run is split, for a run across processes.
    pub fn describe(&self, config: &Config) -> Option<String> {
        (self.size > 1).then(|| {
            format!(
                "  processes {} × {} devices (members {} per process), how_hosts {}",
                self.size,
                config.devices,
                config.es.n / self.size,
                config.es.hosts_how()
            )
        })
    }
}

/// A process other than the lead: the same steps as the lead's run, in the same order
/// (see the module docs), without the out directory or any output. Returns the signal the
/// group stopped on, if any.
pub fn follow(
    group: &mut Group,
    config: &Config,
    stop: &Stop,
    total: u32,
) -> Result<Option<Signal>> {
    let s = group.setup(config)?;
    let (start, params) = group.share_start(0, s.problem.params.clone())?;
    if start >= total {
        group.finish();
        return Ok(None);
    }
    let place = Place::Group(group.dist()?, config.es.hosts_how());
    let mut engine = engine::build(&s, params, start, place)?;
    group.share_optimizer(&mut engine)?;
    if let Some(sig) = group.stop(stop)? {
        return Ok(Some(sig));
    }
    let mut session = Session::new(engine, group.dist()?, None, super::plan(config, total))
        .map_err(session_error)?;
    let ending = session
        .run(&mut || stop.received(), &mut Quiet)
        .map_err(session_error)?;
    drop(session);
    let outcome = match ending.outcome {
        Outcome::Interrupted(sig) => Some(sig),
        Outcome::Finished => None,
    };
    group.end(outcome.is_none());
    Ok(outcome)
}
