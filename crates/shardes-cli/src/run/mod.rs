//! `shardes run CONFIG`: a training run with progress, metrics, checkpoints and resume.
//!
//! The out directory is [`shardes::rundir`]'s (see its docs for the files): a lock with the
//! holder's pid, checkpoints atomic as a pair, `metrics.jsonl` that stays valid JSON.
//! A start goes in two phases so that nothing is lost and a failing start changes nothing:
//! 1. load and check the config, then `RunDir::prepare`, which takes the lock and refuses a
//!    directory holding a run unless `--resume` (continue it) or `--force` (move it to
//!    `OUT/previous/`); it reads and verifies the checkpoint to resume;
//! 2. build the problem and client, check the parameters are finite, compile; only then
//!    `commit` (which moves the old run aside or truncates the metrics to the checkpoint),
//!    write `config.toml` and run.
//!
//! The generations themselves are a [`shardes::session::Session`]: metrics lines,
//! held-out evaluations, checkpoints, the divergence checks, the stop at a signal and the
//! summary's numbers are the library's, the same for every evaluator. This command adds
//! what the user sees:
//! - output errors never stop training: a closed or full stdout stops the progress lines
//!   (with a note on stderr) and the run goes on to its checkpoint and normal exit code;
//! - SIGINT, SIGTERM and SIGHUP finish the generation, checkpoint and exit 128 + the signal
//!   ([`signals`] installs the handlers);
//! - every checkpoint redraws `OUT/curves.svg` and, with `run.tensorboard`, writes the
//!   generations since the last one to the event file under `OUT/tb/` ([`curves`]);
//! - a divergence (a non-finite fitness, or parameters refused at a checkpoint) exits 1.
//!
//! Under `mpirun` (feature `mpi`) every process runs this command; process 0 does all of
//! the above and the others follow it ([`processes`]).

mod curves;
pub(crate) mod engine;
mod lines;
pub(crate) mod processes;
pub(crate) mod reward;
mod signals;
mod start;

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use shardes::population::Place;
use shardes::rundir::{Metric, Mode, RunDir};
use shardes::session::{check_inputs, finite, fmt_duration, Observer, Plan, Record, Session};

use crate::config::{Config, ConfigError, ProblemConfig};
use crate::out::{errln, is_closed, outln, Stdout};

use lines::Lines;

use curves::Curves;
use processes::Group;
use start::{refusal, rundir_error, session_error};

/// Arguments of `shardes run`.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// The run configuration (TOML), e.g. examples/quickstart.toml.
    pub config: PathBuf,
    /// Continue from the out directory's last checkpoint (same trajectory as an uninterrupted run).
    #[arg(long)]
    pub resume: bool,
    /// Start over in an out directory that holds a run (of any config, even a damaged one):
    /// its files are moved to OUT/previous/ (replacing an older previous/).
    #[arg(long)]
    pub force: bool,
    /// PJRT plugin: `cpu`, `cpu-jax`, `cuda`, `tpu` or a path (overrides the config's `plugin`).
    #[arg(long)]
    pub plugin: Option<String>,
}

pub use shardes::session::Outcome;

/// Progress: a bar on a terminal, one line per generation otherwise.
struct Progress {
    out: Lines,
    bar: Option<ProgressBar>,
    /// Whether the user was told that stdout failed.
    told: bool,
}

impl Progress {
    /// `bar`: whether a terminal may get a bar (not under `mpirun`, whose forwarded
    /// terminal output from several processes is better read as lines).
    fn new(out: Lines, total: u32, start: u32, bar: bool) -> Result<Progress> {
        let bar = if bar && std::io::stdout().is_terminal() && out.ok() {
            // indicatif ignores its own write errors, so a terminal that goes away cannot
            // panic it.
            let pb =
                ProgressBar::with_draw_target(Some(u64::from(total)), ProgressDrawTarget::stdout());
            pb.set_style(
                ProgressStyle::with_template(
                    "{spinner} {pos}/{len} [{bar:12.cyan/blue}] {msg} ETA {eta}",
                )
                .context("progress bar template")?
                .progress_chars("=> "),
            );
            pb.set_position(u64::from(start));
            Some(pb)
        } else {
            None
        };
        Ok(Progress {
            out,
            bar,
            told: false,
        })
    }

    /// Reports a finished generation `m` (`done` of `total`).
    fn generation(&mut self, m: &Metric, done: u32, total: u32, eta_secs: f64) {
        let (mean, lo, hi, ms) = (m.fitness_mean, m.fitness_min, m.fitness_max, m.ms);
        // Problem-specific scalars (a control task's mean return) follow the fitness.
        let extra: String = m
            .extra
            .iter()
            .map(|(k, v)| format!(" {k} {v:.2}"))
            .collect();
        match &self.bar {
            Some(pb) => {
                // Kept under 80 columns with the bar: a wrapped bar redraws badly.
                pb.set_message(format!(
                    "mean {mean:.4} min {lo:.4} max {hi:.4}{extra} | {ms:.0} ms/gen"
                ));
                pb.set_position(u64::from(done));
            }
            None => outln!(
                self.out,
                "gen {done}/{total} fitness mean {mean:.5} min {lo:.5} max {hi:.5}{extra} | {ms:.1} ms/gen | ETA {}",
                fmt_duration(eta_secs)
            ),
        }
        self.tell(m.generation);
    }

    /// Prints a line of its own (an evaluation's), above the bar when there is one.
    fn line(&mut self, text: &str) {
        match &self.bar {
            Some(pb) => pb.println(text),
            None => outln!(self.out, "{text}"),
        }
    }

    /// Ends the bar's line, so that what follows starts on a line of its own.
    fn finish(&mut self) {
        if let Some(pb) = self.bar.take() {
            pb.abandon();
            // The bar leaves the cursor at the end of its line.
            outln!(self.out);
        }
    }

    /// Tells the user once, on stderr, that stdout failed and the run goes on without it.
    fn tell(&mut self, generation: u32) {
        if self.told {
            return;
        }
        let Some(e) = self.out.error() else {
            return;
        };
        self.told = true;
        if let Some(pb) = &self.bar {
            pb.set_draw_target(ProgressDrawTarget::hidden());
        }
        let what = if is_closed(&e) {
            "stdout was closed".to_string()
        } else {
            format!("cannot write to stdout ({e})")
        };
        errln!(
            "note: {what} at generation {generation}; the run goes on without printing progress \
             (metrics.jsonl has every generation)"
        );
    }
}

/// Runs `shardes run`.
///
/// Under `mpirun`, after a stop signal, every process exits here (with the signal's exit
/// code) once every process got here, the lead with its checkpoint written and its lines
/// out ([`Group::exit_together`]). A process that exits makes `mpirun` kill the others
/// within milliseconds, so none may exit before the checkpoint is on disk; released from
/// one barrier, with nothing left to drop, they exit within microseconds of each other.
pub fn run(args: &RunArgs) -> Result<Outcome> {
    let mut group = Group::from_env()?;
    let outcome = run_in(&mut group, args);
    if let Ok(Outcome::Interrupted(sig)) = &outcome {
        // Everything of the run is dropped by now (the out directory's lock released).
        group.exit_together(*sig);
    }
    outcome
}

/// [`run`] in `group`.
fn run_in(group: &mut Group, args: &RunArgs) -> Result<Outcome> {
    let t_command = Instant::now();
    let mut config = Config::load(&args.config)?;
    if let Some(p) = &args.plugin {
        config.plugin = Some(p.clone());
    }
    group.agree_config(&config)?;
    group.check_split(&config)?;
    let hash = group.trajectory_hash(&config);
    let dir = config.run.out.clone();
    // Everything the config alone can refuse is refused before the directory is looked at.
    let total = u32::try_from(config.run.generations).map_err(|_| {
        ConfigError::new(
            format!("run.generations = {} is too large", config.run.generations),
            "use at most 4294967295 generations",
        )
    })?;
    let spec = &config.es.strategy;
    let resolved = toml::to_string_pretty(&config).context("serializing the resolved config")?;
    let stop = signals::install()?;
    if !group.is_lead() {
        return Ok(match processes::follow(group, &config, &stop, total)? {
            Some(sig) => Outcome::Interrupted(sig),
            None => Outcome::Finished,
        });
    }

    let mode = if args.resume {
        Mode::Resume
    } else {
        Mode::Fresh { force: args.force }
    };
    let mut prep = RunDir::prepare(&dir, mode, &hash).map_err(|e| refusal(e, &hash))?;
    let replaced = if prep.moves_aside() {
        Some(prep.existing_state().map(|s| s.generation))
    } else {
        None
    };

    let mut s = group.setup(&config)?;
    // The contents of the problem's files, which the hash covers only by path (read once
    // the problem has loaded them, so a missing file is reported by its loader).
    let inputs = serde_json::json!({ "inputs": config.input_digests()? });
    // The optimizer's state at the checkpoint (empty under sgd), set once the trainer is
    // built.
    let mut resumed_optimizer = None;
    let start = match prep.take_checkpoint() {
        Some(ckpt) => {
            if ckpt.state().key != s.problem.key.data() {
                return Err(ConfigError::new(
                    "--resume: the checkpoint's key differs from key(run.seed)",
                    "resume with the config that started the run",
                )
                .into());
            }
            check_inputs(ckpt.state().extra.as_ref(), &inputs).map_err(session_error)?;
            s.problem.params = ckpt.params(&s.problem.params).map_err(rundir_error)?;
            resumed_optimizer = Some(ckpt.optimizer_state().map_err(rundir_error)?);
            ckpt.state().generation
        }
        None => 0,
    };
    finite::check_start(&s.problem.params, &s.problem.batch, args.resume).map_err(session_error)?;
    // Moved, not cloned: a copy would hold the model's size twice on the host.
    let params = std::mem::replace(&mut s.problem.params, empty_tree());
    let (start, params) = group.share_start(start, params)?;
    s.problem.params = params;

    // Across processes the lead's lines go through a thread of their own: mpirun stops
    // reading them while it stops the job ([`lines`]), and the run must still reach the
    // generation boundary where it checkpoints.
    let mut out = if group.size() > 1 {
        Lines::queued()
    } else {
        Lines::Direct(Stdout::new())
    };
    outln!(
        out,
        "shardes run {}\n  problem  {}: {} parameters in {} leaves\n  \
         es       {spec}, n {}, sigma {}, lr {}, {}, how {}\n  devices  {} × {} ({})\n  out      {}",
        args.config.display(),
        s.problem.summary,
        s.problem.params.num_params(),
        s.problem.params.num_leaves(),
        config.es.n,
        config.es.sigma,
        config.es.lr,
        config.es.shaping,
        config.es.how,
        s.config.devices,
        s.client.platform_name(),
        s.client.plugin().path().display(),
        dir.display(),
    );
    if let Some(line) = group.describe(&config) {
        outln!(out, "{line}");
    }
    if start >= total {
        outln!(
            out,
            "the checkpoint is at generation {start}; run.generations = {total}: nothing to do \
             (raise run.generations to continue)"
        );
        group.finish();
        return Ok(Outcome::Finished);
    }
    // Handed over: the devices hold the parameters from here on (a checkpoint reads them
    // back), so no host copy stays the model's size for the whole run.
    let params = std::mem::replace(&mut s.problem.params, empty_tree());
    let place = match group.size() {
        1 => Place::Alone,
        _ => Place::Group(group.dist()?, config.es.hosts_how()),
    };
    let mut trainer = engine::build(&s, params, start, place)?;
    if let Some(optimizer) = &resumed_optimizer {
        engine::resume_optimizer(&mut trainer, optimizer)?;
    }
    group.share_optimizer(&mut trainer)?;
    let bt = trainer.build_times();
    outln!(
        out,
        "compiled in {:.2} s (emit {:.0} ms){}{}",
        bt.compile_ms / 1e3,
        bt.emit_ms,
        match s.client.compile_cache() {
            // Says why a compile took milliseconds: it was loaded.
            Some(c) => format!("; compile cache {}", c.dir().display()),
            None => String::new(),
        },
        if start > 0 {
            format!("; resuming at generation {start}")
        } else {
            String::new()
        }
    );
    if let Some(sig) = group.stop(&stop)? {
        errln!(
            "{}: stopped before the first generation; {} is unchanged",
            sig.name(),
            dir.display()
        );
        return Ok(Outcome::Interrupted(sig));
    }

    // Phase two: from here on the directory is this run's.
    let rundir = prep.commit().map_err(rundir_error)?;
    if let (Some(prev), Some(old)) = (&rundir.report().moved_aside, replaced) {
        let held = match old {
            Some(g) => format!("a checkpoint at generation {g}"),
            None => "files of an earlier start".to_string(),
        };
        outln!(
            out,
            "note: {} held {held}; moved it to {}, starting over",
            dir.display(),
            prev.display()
        );
    }
    if let Some(t) = &rundir.report().metrics {
        if let Some(bad) = t.bad.first() {
            errln!(
                "warning: {}: dropped {} line(s) that are not metrics records (line {}: {})",
                dir.join("metrics.jsonl").display(),
                t.bad.len(),
                bad.line,
                bad.error
            );
        }
    }
    rundir.write_config(&resolved).map_err(rundir_error)?;
    trainer.attach(&dir, start)?;
    let record = Record::new(rundir, s.problem.key, inputs).map_err(rundir_error)?;
    let mut session = Session::new(trainer, group.dist()?, Some(record), plan(&config, total))
        .map_err(session_error)?;
    let mut shown = Shown {
        curves: Curves::new(&dir, config.run.tensorboard),
        progress: Progress::new(out, total, start, group.size() == 1)?,
    };
    let ending = session.run(&mut || stop.received(), &mut shown);
    let ending = ending.map_err(session_error)?;
    let result = session.finish().map_err(session_error);
    let Shown {
        mut progress,
        mut curves,
    } = shown;
    let (outcome, g, loop_secs) = (ending.outcome, ending.generation, ending.loop_secs);
    if outcome != Outcome::Finished {
        progress.out.stopping();
    }
    progress.finish();
    result?;
    // A run stopped before its first generation has nothing to draw.
    if g > start {
        curves.checkpoint();
    }
    let out = &mut progress.out;
    match outcome {
        Outcome::Finished => outln!(
            out,
            "done: {} generations in {}; checkpoint at generation {g} in {}",
            g - start,
            fmt_duration(loop_secs),
            dir.display()
        ),
        // The signal thread named the signal on stderr already.
        Outcome::Interrupted(_) => {
            let line = format!(
                "interrupted: checkpoint at generation {g} in {}; continue with `shardes run \
                 {} --resume`",
                dir.display(),
                args.config.display()
            );
            // Under mpirun nothing may read stdout any more (it is stopping the job, see
            // [`lines`]); stderr, a pipe that holds the few lines it gets, still takes it.
            if group.size() > 1 {
                errln!("{line}");
            } else {
                outln!(out, "{line}");
            }
        }
    }
    let total_secs = t_command.elapsed().as_secs_f64();
    for line in session
        .summary()
        .lines(loop_secs, total_secs, Some(g), &dir)
    {
        outln!(out, "{line}");
    }
    if let Some(line) = curves.summary_line() {
        outln!(out, "{line}");
    }
    progress.tell(g);
    drop(session);
    group.end(outcome == Outcome::Finished);
    Ok(outcome)
}

/// What `config` asks of a session: its length, checkpoints, divergence advice, out
/// directory and extra scalars (a control task's fitness is the negated mean return, so
/// its `return`, higher is better, is logged and shown too).
pub(crate) fn plan(config: &Config, total: u32) -> Plan {
    Plan {
        total,
        checkpoint_every: config.run.checkpoint_every,
        es: finite::Settings {
            n: config.es.n,
            sigma: config.es.sigma,
            lr: config.es.lr,
        },
        dir: config.run.out.clone(),
        negated_return: matches!(config.problem, ProblemConfig::Control { .. }),
    }
}

/// What the user sees of a session: the progress and the curves.
struct Shown {
    progress: Progress,
    curves: Curves,
}

impl Observer for Shown {
    fn generation(&mut self, m: &Metric, done: u32, total: u32, eta_secs: f64) {
        self.curves.record(m);
        self.progress.generation(m, done, total, eta_secs);
    }

    fn line(&mut self, text: &str) {
        self.progress.line(text);
    }

    fn checkpoint(&mut self) {
        self.curves.checkpoint();
    }

    fn failing(&mut self) {
        self.progress.finish();
    }
}

/// A parameter tree without leaves, left where the host parameters were moved out.
fn empty_tree() -> shardes::hlo::params::ParamTree {
    shardes::hlo::params::ParamTree::Map(Default::default())
}
