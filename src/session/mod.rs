//! A training run's generations, whatever the population evaluates: [`Session`].
//!
//! A session steps a [`Population`] from its start generation to the run's total and owns
//! everything a run does between two generations, written once for every evaluator:
//! - the metrics line of each generation (`metrics.jsonl`, through [`crate::rundir`]);
//! - the held-out evaluations the evaluator schedules ([`Population::held_out`]);
//! - a checkpoint every `checkpoint_every` generations and at the end, never of parameters
//!   that are not finite ([`finite`]), so the last checkpoint on disk is a good one;
//! - a stop at a fitness that is not finite, after writing its metrics line;
//! - a stop signal, agreed by every process of the group, after the generation it came in;
//! - across processes, a comparison of the parameters every [`PARAM_CHECK_EVERY`]
//!   generations, before every checkpoint and at the end;
//! - the numbers of the end-of-run summary ([`Summary`]).
//!
//! The lead process of a group holds the out directory ([`Record`]); the others run the
//! same session without one. What is shown to a user (progress, plots) is the caller's:
//! it gets each generation, line and checkpoint through an [`Observer`].
//!
//! Resuming is the population built at the checkpoint's generation and state (see
//! [`check_inputs`] and [`finite::check_start`] for what a resume refuses): the key folds in
//! the generation on the device, so a resumed run computes exactly what an uninterrupted
//! one computes from there on.

pub mod finite;
mod summary;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use shardes_hlo::prng::Key;
use thiserror::Error;

use crate::distributed::{Distributed, DistributedError};
use crate::population::{Evaluator, Population};
use crate::rundir::{read_metrics, Metric, MetricsWriter, RunDir, RunDirError};

pub use summary::{fmt_duration, stats, Summary};

/// Generations between two comparisons of the parameters across processes (besides every
/// checkpoint and the end).
pub const PARAM_CHECK_EVERY: u32 = 10;

/// What stops a [`Session`] early.
#[derive(Debug, Error)]
pub enum SessionError {
    /// A generation failed.
    #[error("running generation {generation}")]
    Generation {
        /// The generation that failed.
        generation: u32,
        /// Why.
        #[source]
        source: crate::Error,
    },
    /// A held-out evaluation failed.
    #[error("evaluating at generation {generation}")]
    HeldOut {
        /// Generations done when it ran.
        generation: u32,
        /// Why.
        #[source]
        source: crate::Error,
    },
    /// Reading the parameters or the optimizer state back for a checkpoint failed.
    #[error("copying the {what} to the host")]
    ToHost {
        /// `parameters` or `optimizer state`.
        what: &'static str,
        /// Why.
        #[source]
        source: crate::Error,
    },
    /// The processes of the group disagree on the parameters (or could not compare them).
    #[error(transparent)]
    Check(crate::Error),
    /// The run diverged: a fitness or the parameters are not finite. The last finite
    /// checkpoint is kept.
    #[error("{message}")]
    Diverged {
        /// What diverged, and the likely cause.
        message: String,
        /// What to change.
        fix: String,
    },
    /// The run cannot start as asked: its parameters or inputs are not finite
    /// ([`finite::check_start`]), or a resume's input files differ from the checkpoint's
    /// ([`check_inputs`]). The user's to fix.
    #[error("{message}")]
    Refused {
        /// What is wrong.
        message: String,
        /// What to change.
        fix: String,
    },
    /// The out directory refused a write.
    #[error(transparent)]
    RunDir(#[from] RunDirError),
    /// The processes could not agree on a stop.
    #[error(transparent)]
    Distributed(#[from] DistributedError),
}

/// A stop signal, by number (SIGINT, SIGTERM, SIGHUP: "stop, but keep the work").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Signal(pub i32);

impl Signal {
    /// The exit code after it: 128 + the signal's number, as a shell reports a process
    /// killed by it.
    pub fn exit_code(self) -> u8 {
        u8::try_from(128 + self.0).unwrap_or(1)
    }

    /// Its usual name (POSIX numbers: 1 SIGHUP, 2 SIGINT, 15 SIGTERM).
    pub fn name(self) -> &'static str {
        match self.0 {
            2 => "SIGINT (Ctrl-C)",
            15 => "SIGTERM",
            1 => "SIGHUP",
            _ => "a signal",
        }
    }
}

/// How a session ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Every generation ran.
    Finished,
    /// A stop signal: the generation it came in finished.
    Interrupted(Signal),
}

impl Outcome {
    /// The process's exit code: 0, or 128 + the signal.
    pub fn exit_code(self) -> u8 {
        match self {
            Outcome::Finished => 0,
            Outcome::Interrupted(s) => s.exit_code(),
        }
    }
}

/// What a session reports as it goes; every method has a default that ignores it.
pub trait Observer {
    /// Generation `m.generation` finished (`done` of `total`), `eta_secs` left at the
    /// average pace. Called after its metrics line is written.
    fn generation(&mut self, _m: &Metric, _done: u32, _total: u32, _eta_secs: f64) {}
    /// A held-out evaluation's line.
    fn line(&mut self, _text: &str) {}
    /// A checkpoint was written during the loop.
    fn checkpoint(&mut self) {}
    /// The session is about to return an error (a progress bar should end its line).
    fn failing(&mut self) {}
}

/// An observer that ignores everything (a process of a group other than the lead).
pub struct Quiet;

impl Observer for Quiet {}

/// The lead's out directory as a session writes it: the committed [`RunDir`], its metrics
/// writer, and what every checkpoint records beside the parameters.
pub struct Record {
    rundir: RunDir,
    metrics: MetricsWriter,
    key: Key,
    inputs: serde_json::Value,
}

impl Record {
    /// The record of a run in `rundir` (committed) with `key`; `inputs` (the digests of the
    /// files the run read) goes into every checkpoint, for [`check_inputs`] on resume.
    pub fn new(rundir: RunDir, key: Key, inputs: serde_json::Value) -> Result<Record, RunDirError> {
        let metrics = rundir.metrics_writer()?;
        Ok(Record {
            rundir,
            metrics,
            key,
            inputs,
        })
    }

    /// The out directory.
    pub fn rundir(&self) -> &RunDir {
        &self.rundir
    }
}

/// The run a session carries out.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Generations of the whole run (`run.generations`).
    pub total: u32,
    /// A checkpoint every this many generations; 0: only at the end.
    pub checkpoint_every: usize,
    /// The ES settings a divergence is explained by.
    pub es: finite::Settings,
    /// The out directory, named by the errors of every process.
    pub dir: PathBuf,
    /// The fitness is a negated mean return (control): log `return` beside it.
    pub negated_return: bool,
}

/// How [`Session::run`] ended.
#[derive(Debug, Clone, Copy)]
pub struct Ending {
    /// Finished, or stopped by a signal.
    pub outcome: Outcome,
    /// Generations done.
    pub generation: u32,
    /// Wall time of the generation loop, seconds.
    pub loop_secs: f64,
}

/// A population's run from its generation to [`Plan::total`] (see the module docs).
pub struct Session<'d, E> {
    population: Population<E>,
    dist: &'d Distributed,
    record: Option<Record>,
    plan: Plan,
    start: u32,
    summary: Summary,
}

impl<'d, E: Evaluator> Session<'d, E> {
    /// The session of `population` (at the generation it starts from) in the group `dist`,
    /// recording to `record` (the lead; `None` on the other processes). On a resume the
    /// summary starts from the records already in `metrics.jsonl`.
    pub fn new(
        population: Population<E>,
        dist: &'d Distributed,
        record: Option<Record>,
        plan: Plan,
    ) -> Result<Session<'d, E>, SessionError> {
        let start = population.generation();
        let mut summary = Summary::default();
        if let (true, Some(r)) = (start > 0, &record) {
            for (m, _) in &read_metrics(r.metrics.path())?.records {
                summary.record(m, false);
            }
        }
        Ok(Session {
            population,
            dist,
            record,
            plan,
            start,
            summary,
        })
    }

    /// The population.
    pub fn population(&self) -> &Population<E> {
        &self.population
    }

    /// What the summary reports so far.
    pub fn summary(&self) -> &Summary {
        &self.summary
    }

    /// Runs the generations until the plan's total or a stop. `stop` is this process's
    /// signal, if one came; every process stops after the same generation. The last
    /// checkpoint is [`Session::finish`]'s, so a caller can show how the loop ended first.
    pub fn run(
        &mut self,
        stop: &mut dyn FnMut() -> Option<Signal>,
        observer: &mut dyn Observer,
    ) -> Result<Ending, SessionError> {
        let (start, total) = (self.start, self.plan.total);
        let t_run = Instant::now();
        let mut outcome = Outcome::Finished;
        if start == 0 {
            self.held_out(0, false, observer)?;
        }
        for g in start..total {
            if let Some(sig) = agree_stop(self.dist, stop())? {
                outcome = Outcome::Interrupted(sig);
                break;
            }
            let t0 = Instant::now();
            let fitness =
                self.population
                    .step_in(self.dist)
                    .map_err(|source| SessionError::Generation {
                        generation: g,
                        source,
                    })?;
            let ms = t0.elapsed().as_secs_f64() * 1e3;
            let m = self.metric(g, &fitness, ms);
            if let Some(r) = &mut self.record {
                // Written before the divergence check: the user sees the NaN generation.
                r.metrics.append(&m)?;
            }
            self.summary.record(&m, true);
            let done = g + 1;
            let avg_ms = t_run.elapsed().as_secs_f64() * 1e3 / f64::from(done - start);
            observer.generation(&m, done, total, avg_ms * f64::from(total - done) / 1e3);
            let between = self.between(g, &fitness, observer);
            if between.is_err() {
                observer.failing();
            }
            between?;
        }
        if outcome == Outcome::Finished {
            if let Some(sig) = agree_stop(self.dist, stop())? {
                outcome = Outcome::Interrupted(sig);
            }
        }
        let g = self.population.generation();
        let end = self.check(g, true);
        // The end of the run (not of an interrupted part of it) is evaluated too.
        let end = end.and_then(|()| {
            if outcome == Outcome::Finished && g > start {
                self.held_out(g, true, observer)
            } else {
                Ok(())
            }
        });
        if end.is_err() {
            observer.failing();
        }
        end?;
        Ok(Ending {
            outcome,
            generation: g,
            loop_secs: t_run.elapsed().as_secs_f64(),
        })
    }

    /// Writes the last checkpoint, unless the last one written is of this generation.
    pub fn finish(&mut self) -> Result<(), SessionError> {
        let g = self.population.generation();
        match &self.record {
            Some(r) if r.rundir.committed().map(|s| s.generation) != Some(g) => {
                self.checkpoint().map(|_| ())
            }
            _ => Ok(()),
        }
    }

    /// The metrics line of generation `g`.
    fn metric(&self, g: u32, fitness: &[f32], ms: f64) -> Metric {
        let (mean, lo, hi) = stats(fitness);
        let mut extra = BTreeMap::new();
        if self.plan.negated_return {
            extra.insert("return".to_string(), -mean);
        }
        extra.extend(self.population.metrics());
        Metric {
            generation: g,
            fitness_mean: mean,
            fitness_min: lo,
            fitness_max: hi,
            ms,
            extra,
        }
    }

    /// What follows generation `g` once its line is out: the divergence check, the
    /// parameters' comparison across processes, the held-out evaluation and the checkpoint
    /// due.
    fn between(
        &mut self,
        g: u32,
        fitness: &[f32],
        observer: &mut dyn Observer,
    ) -> Result<(), SessionError> {
        if let Some(bad) = finite::fitness(fitness) {
            return Err(finite::diverged_fitness(self.plan.es, g, &bad, self.kept()));
        }
        let done = g + 1;
        if done >= self.plan.total {
            // The end's comparison, evaluation and checkpoint follow the loop.
            return self.held_out(done, false, observer);
        }
        self.check(done, false)?;
        // Before the checkpoint: a kill between the two leaves an evaluation that the
        // resume (from the previous checkpoint) drops and writes again.
        self.held_out(done, false, observer)?;
        if self.checkpoint_due(done) && self.checkpoint()? {
            observer.checkpoint();
        }
        Ok(())
    }

    fn checkpoint_due(&self, done: u32) -> bool {
        let every = self.plan.checkpoint_every;
        every > 0 && (done as usize).is_multiple_of(every)
    }

    /// Across processes, at a checkpoint, every [`PARAM_CHECK_EVERY`] generations and at
    /// the end (`last`): the parameters must be the same on every process.
    fn check(&self, done: u32, last: bool) -> Result<(), SessionError> {
        let due = last || self.checkpoint_due(done) || done.is_multiple_of(PARAM_CHECK_EVERY);
        if self.dist.size() == 1 || !due {
            return Ok(());
        }
        self.population
            .check_params(self.dist, done)
            .map_err(SessionError::Check)
    }

    /// The held-out evaluation due after `done` generations, if any (the lead's alone).
    fn held_out(
        &mut self,
        done: u32,
        last: bool,
        observer: &mut dyn Observer,
    ) -> Result<(), SessionError> {
        if self.record.is_none() {
            return Ok(());
        }
        let line =
            self.population
                .held_out(done, last)
                .map_err(|source| SessionError::HeldOut {
                    generation: done,
                    source,
                })?;
        if let Some(line) = line {
            observer.line(&line);
        }
        Ok(())
    }

    /// What a divergence leaves: the last checkpoint written and the out directory.
    fn kept(&self) -> finite::Kept<'_> {
        finite::Kept {
            checkpoint: self
                .record
                .as_ref()
                .and_then(|r| r.rundir.committed().map(|s| s.generation)),
            dir: &self.plan.dir,
        }
    }

    /// Copies the parameters (and the optimizer's state) to the host and writes them as the
    /// checkpoint of the generation the population runs next, unless the parameters are
    /// not finite (then the run has diverged: no checkpoint, a failure naming the cause).
    /// Whether it wrote one: only the lead, which holds the out directory, does.
    fn checkpoint(&mut self) -> Result<bool, SessionError> {
        if self.record.is_none() {
            return Ok(false);
        }
        let to_host = |what| move |source| SessionError::ToHost { what, source };
        let params = self.population.params().map_err(to_host("parameters"))?;
        let g = self.population.generation();
        if let Some(bad) = finite::params(&params) {
            return Err(finite::diverged_params(self.plan.es, g, &bad, self.kept()));
        }
        let optimizer = self
            .population
            .optimizer_state()
            .map_err(to_host("optimizer state"))?;
        if let Some(r) = &mut self.record {
            r.rundir.write_checkpoint_taking(
                r.key.data(),
                g,
                params,
                &optimizer,
                Some(r.inputs.clone()),
            )?;
        }
        Ok(true)
    }
}

/// The stop signal of any process (the first in rank order), the same on every process:
/// all stop after the same generation. `mine` is this process's.
pub fn agree_stop(
    dist: &Distributed,
    mine: Option<Signal>,
) -> Result<Option<Signal>, DistributedError> {
    if dist.size() == 1 {
        return Ok(mine);
    }
    let code = mine.map_or(0, |s| s.0 as u64);
    let all = dist.gather_u64(code)?;
    Ok(all
        .into_iter()
        .find(|&c| c != 0)
        .and_then(|c| i32::try_from(c).ok())
        .map(Signal))
}

/// Refuses a resume whose input files (data, tokenizer, checkpoint weights) differ from the
/// ones the checkpoint was written with: `then` is the checkpoint's record (its `extra`),
/// `now` this run's, both `{"inputs": {path: digest}}`. Checkpoints that recorded none
/// (older runs) pass.
pub fn check_inputs(
    then: Option<&serde_json::Value>,
    now: &serde_json::Value,
) -> Result<(), SessionError> {
    let Some(then) = then
        .and_then(|e| e.get("inputs"))
        .and_then(|i| i.as_object())
    else {
        return Ok(());
    };
    let refuse = |message: String| SessionError::Refused {
        message,
        fix: "resume with the files the run started with, or start over with --force".into(),
    };
    let now = now.get("inputs").and_then(|i| i.as_object());
    for (path, digest) in then {
        let current = now.and_then(|n| n.get(path));
        if current != Some(digest) {
            let what = if current.is_none() {
                "is no longer an input of this config"
            } else {
                "changed since the checkpoint was written"
            };
            return Err(refuse(format!("--resume: {path} {what}")));
        }
    }
    if let Some(path) = now.and_then(|n| n.keys().find(|p| !then.contains_key(*p))) {
        return Err(refuse(format!(
            "--resume: {path} was not an input when the checkpoint was written"
        )));
    }
    Ok(())
}
