//! `shardes run CONFIG`: a training run with progress, metrics, checkpoints and resume.
//!
//! Files in the out directory:
//! - `config.toml`: the resolved config (every default filled in);
//! - `metrics.jsonl`: one JSON object per generation, flushed as soon as it is written;
//! - `params.safetensors` and `state.json`: the checkpoint, written at every
//!   `checkpoint_every` generations and at the end. Both are written to a temporary file and
//!   renamed, params first; `state.json` records the sha256 of the params file so a crash
//!   between the two renames is detected on resume instead of silently mixing generations.
//!
//! The trainer folds the generation into the key on the device, so a run resumed from a
//! checkpoint at generation g computes exactly what an uninterrupted run computes from g on.

use std::fs::{self, File, OpenOptions};
use std::io::{BufRead, BufReader, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use shardes::hlo::prng::Key;
use shardes::io::write_atomic;
use shardes::Trainer;

use crate::config::{Config, ConfigError, ProblemConfig};
use crate::setup;

/// Arguments of `shardes run`.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// The run configuration (TOML), e.g. examples/quickstart.toml.
    pub config: PathBuf,
    /// Continue from the out directory's last checkpoint (same trajectory as an uninterrupted run).
    #[arg(long)]
    pub resume: bool,
    /// Overwrite an out directory that holds a run of another config.
    #[arg(long)]
    pub force: bool,
    /// PJRT plugin: `cpu`, `cuda`, `tpu` or a path (overrides the config's `plugin`).
    #[arg(long)]
    pub plugin: Option<String>,
}

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Every generation ran; the final checkpoint is written.
    Finished,
    /// Ctrl-C: the current generation finished and a checkpoint was written.
    Interrupted,
}

/// `out/state.json`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct State {
    /// The run's key (`key(seed)`), as its two u32 words.
    pub key: [u32; 2],
    /// The generation the next step runs (= generations completed).
    pub generation: u32,
    /// [`Config::trajectory_hash`] of the run's config.
    pub config_hash: String,
    /// sha256 of `params.safetensors` as written with this state.
    pub params_sha256: String,
}

/// One line of `out/metrics.jsonl`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Metric {
    /// The generation that produced this fitness (0-based).
    pub generation: u32,
    /// Mean fitness (loss) over the population.
    pub fitness_mean: f64,
    /// Lowest fitness in the population.
    pub fitness_min: f64,
    /// Highest fitness in the population.
    pub fitness_max: f64,
    /// Wall time of the generation (dispatch to fitness on the host), milliseconds.
    pub ms: f64,
}

fn sha256_file(path: &Path) -> Result<String> {
    let bytes = fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

/// Reads `out/state.json`, if there is one.
pub fn read_state(out: &Path) -> Result<Option<State>> {
    let path = out.join("state.json");
    if !path.exists() {
        return Ok(None);
    }
    let text = fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let state = serde_json::from_str(&text).map_err(|e| {
        ConfigError::new(
            format!("{} is not a shardes state file: {e}", path.display()),
            "pass --force to start over in this directory, or choose another run.out",
        )
    })?;
    Ok(Some(state))
}

/// The trajectory hash of the run an out directory holds: from its checkpoint, or from its
/// `config.toml` when it was stopped before the first checkpoint.
fn existing_hash(out: &Path) -> Result<Option<String>> {
    if let Some(s) = read_state(out)? {
        return Ok(Some(s.config_hash));
    }
    let cfg = out.join("config.toml");
    if cfg.exists() {
        return match Config::load(&cfg) {
            Ok(c) => Ok(Some(c.trajectory_hash())),
            Err(_) => Ok(Some("<unreadable config.toml>".into())),
        };
    }
    Ok(None)
}

fn checkpoint(out: &Path, trainer: &Trainer, key: Key, hash: &str) -> Result<()> {
    let params = trainer.params().context("copying parameters to the host")?;
    let ppath = out.join("params.safetensors");
    shardes::io::write_params(&ppath, &params)?;
    let state = State {
        key: key.data(),
        generation: trainer.generation(),
        config_hash: hash.to_string(),
        params_sha256: sha256_file(&ppath)?,
    };
    let text = serde_json::to_string_pretty(&state)?;
    Ok(write_atomic(&out.join("state.json"), text.as_bytes())?)
}

/// Keeps the metrics of generations before `generation` (the checkpoint's) and drops the rest.
fn truncate_metrics(path: &Path, generation: u32) -> Result<()> {
    if !path.exists() {
        return Ok(());
    }
    let file = File::open(path).with_context(|| format!("reading {}", path.display()))?;
    let mut kept = String::new();
    for line in BufReader::new(file).lines() {
        let line = line.with_context(|| format!("reading {}", path.display()))?;
        // A line cut short by a kill is dropped like any line past the checkpoint.
        if let Ok(m) = serde_json::from_str::<Metric>(&line) {
            if m.generation < generation {
                kept.push_str(&line);
                kept.push('\n');
            }
        }
    }
    Ok(write_atomic(path, kept.as_bytes())?)
}

fn stats(fitness: &[f32]) -> (f64, f64, f64) {
    let mut sum = 0.0f64;
    let mut lo = f64::INFINITY;
    let mut hi = f64::NEG_INFINITY;
    for &f in fitness {
        let f = f64::from(f);
        sum += f;
        lo = lo.min(f);
        hi = hi.max(f);
    }
    (sum / fitness.len().max(1) as f64, lo, hi)
}

fn fmt_duration(secs: f64) -> String {
    if !secs.is_finite() {
        return "?".into();
    }
    let s = secs.round() as u64;
    if s >= 3600 {
        format!("{}h{:02}m", s / 3600, (s % 3600) / 60)
    } else if s >= 60 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        format!("{secs:.1}s")
    }
}

/// Installs the Ctrl-C handler: the first press asks the loop to stop after the current
/// generation; a second press exits at once (the last checkpoint is intact: writes are atomic).
fn install_interrupt() -> Result<Arc<AtomicBool>> {
    let flag = Arc::new(AtomicBool::new(false));
    let f = flag.clone();
    ctrlc::set_handler(move || {
        if f.swap(true, Ordering::SeqCst) {
            std::process::exit(130);
        }
        eprintln!("\ninterrupt: finishing this generation and writing a checkpoint (Ctrl-C again to quit now)");
    })
    .context("installing the Ctrl-C handler")?;
    Ok(flag)
}

/// Runs `shardes run`.
pub fn run(args: &RunArgs) -> Result<Outcome> {
    let mut config = Config::load(&args.config)?;
    if let Some(p) = &args.plugin {
        config.plugin = Some(p.clone());
    }
    let hash = config.trajectory_hash();
    let out = config.run.out.clone();
    let interrupted = install_interrupt()?;

    let resume_state = if args.resume {
        let state =
            read_state(&out)?.ok_or_else(|| {
                ConfigError::new(
                format!("--resume: {} holds no checkpoint (state.json)", out.display()),
                "run without --resume to start this run, or point run.out at the run to continue",
            )
            })?;
        if state.config_hash != hash {
            return Err(ConfigError::new(
                format!(
                    "--resume: {} holds a run of another config (hash {} ≠ {hash})",
                    out.display(),
                    state.config_hash
                ),
                "resume with the config that started it (only run.generations, run.out, \
                 run.checkpoint_every and plugin may change), or start over with --force",
            )
            .into());
        }
        Some(state)
    } else {
        if let Some(other) = existing_hash(&out)? {
            if other != hash && !args.force {
                return Err(ConfigError::new(
                    format!(
                        "{} holds a run of another config (hash {other} ≠ {hash})",
                        out.display()
                    ),
                    "choose another run.out, pass --resume with that run's config, or --force \
                     to overwrite it",
                )
                .into());
            }
        }
        if let Ok(Some(st)) = read_state(&out) {
            if st.config_hash == hash {
                println!(
                    "note: {} holds a checkpoint of this config at generation {}; starting over \
                     (pass --resume to continue it instead)",
                    out.display(),
                    st.generation
                );
            }
        }
        None
    };

    fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let resolved = toml::to_string_pretty(&config).context("serializing the resolved config")?;
    write_atomic(&out.join("config.toml"), resolved.as_bytes())?;

    let mut s = setup::build(&config)?;
    let start = match &resume_state {
        Some(state) => {
            let ppath = out.join("params.safetensors");
            let sha = sha256_file(&ppath)?;
            if sha != state.params_sha256 {
                return Err(ConfigError::new(
                    format!(
                        "{} does not match state.json (the run stopped between writing the two)",
                        ppath.display()
                    ),
                    "the checkpoint is inconsistent: start over with --force",
                )
                .into());
            }
            if state.key != s.problem.key.data() {
                return Err(ConfigError::new(
                    "--resume: the checkpoint's key differs from key(run.seed)",
                    "resume with the config that started the run",
                )
                .into());
            }
            s.problem.params = shardes::io::read_params(&ppath, &s.problem.params)
                .with_context(|| format!("loading the checkpoint {}", ppath.display()))?;
            state.generation
        }
        None => 0,
    };
    let metrics_path = out.join("metrics.jsonl");
    if args.resume {
        truncate_metrics(&metrics_path, start)?;
    } else {
        // A fresh run: drop any previous run's checkpoint so it cannot be resumed by mistake.
        let _ = fs::remove_file(out.join("state.json"));
        File::create(&metrics_path)
            .with_context(|| format!("creating {}", metrics_path.display()))?;
    }

    let total = u32::try_from(config.run.generations).map_err(|_| {
        ConfigError::new(
            format!("run.generations = {} is too large", config.run.generations),
            "use at most 4294967295 generations",
        )
    })?;
    let tty = std::io::stdout().is_terminal();
    let spec = config.strategy()?;
    println!(
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
        out.display(),
    );
    if start >= total {
        println!(
            "the checkpoint is at generation {start}; run.generations = {total}: nothing to do \
             (raise run.generations to continue)"
        );
        return Ok(Outcome::Finished);
    }
    let p = &s.problem;
    let mut trainer = Trainer::with_state(
        &s.client, &s.es, &*p.model, &p.params, p.key, &p.batch, start,
    )
    .context("building the generation program")?;
    let bt = trainer.build_times();
    println!(
        "compiled in {:.2} s (emit {:.0} ms){}",
        bt.compile_ms / 1e3,
        bt.emit_ms,
        if start > 0 {
            format!("; resuming at generation {start}")
        } else {
            String::new()
        }
    );

    let mut metrics = OpenOptions::new()
        .append(true)
        .create(true)
        .open(&metrics_path)
        .with_context(|| format!("opening {}", metrics_path.display()))?;
    let pb = if tty {
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

    let every = config.run.checkpoint_every;
    let t_run = Instant::now();
    let mut outcome = Outcome::Finished;
    for g in start..total {
        if interrupted.load(Ordering::SeqCst) {
            outcome = Outcome::Interrupted;
            break;
        }
        let t0 = Instant::now();
        let fitness = trainer
            .step()
            .with_context(|| format!("running generation {g}"))?;
        let ms = t0.elapsed().as_secs_f64() * 1e3;
        let (mean, lo, hi) = stats(&fitness);
        // A control problem's fitness is the negated return; show the return too.
        let ret = match config.problem {
            ProblemConfig::Control { .. } => format!(" return {:.2}", -mean),
            _ => String::new(),
        };
        let m = Metric {
            generation: g,
            fitness_mean: mean,
            fitness_min: lo,
            fitness_max: hi,
            ms,
        };
        writeln!(metrics, "{}", serde_json::to_string(&m)?)
            .and_then(|()| metrics.flush())
            .with_context(|| format!("writing {}", metrics_path.display()))?;
        let done = g + 1;
        let avg_ms = t_run.elapsed().as_secs_f64() * 1e3 / f64::from(done - start);
        match &pb {
            Some(pb) => {
                // Kept under 80 columns with the bar: a wrapped bar redraws badly.
                pb.set_message(format!(
                    "mean {mean:.4} min {lo:.4} max {hi:.4}{ret} | {ms:.0} ms/gen"
                ));
                pb.set_position(u64::from(done));
            }
            None => println!(
                "gen {done}/{total} fitness mean {mean:.5} min {lo:.5} max {hi:.5}{ret} | {ms:.1} ms/gen | ETA {}",
                fmt_duration(avg_ms * f64::from(total - done) / 1e3)
            ),
        }
        if every > 0 && (done as usize).is_multiple_of(every) && done < total {
            checkpoint(&out, &trainer, s.problem.key, &hash)?;
        }
    }
    if interrupted.load(Ordering::SeqCst) {
        outcome = Outcome::Interrupted;
    }
    checkpoint(&out, &trainer, s.problem.key, &hash)?;
    if let Some(pb) = &pb {
        pb.finish();
        // The bar leaves the cursor at the end of its line.
        println!();
    }
    let g = trainer.generation();
    match outcome {
        Outcome::Finished => println!(
            "done: {} generations in {}; checkpoint at generation {g} in {}",
            g - start,
            fmt_duration(t_run.elapsed().as_secs_f64()),
            out.display()
        ),
        Outcome::Interrupted => println!(
            "interrupted: checkpoint at generation {g} in {}; continue with `shardes run {} --resume`",
            out.display(),
            args.config.display()
        ),
    }
    Ok(outcome)
}
