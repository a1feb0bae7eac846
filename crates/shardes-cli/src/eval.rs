//! `shardes eval RUN|CONFIG`: the held-out score of a run's parameters, of the base model,
//! or of both side by side (`--compare`), with standard errors and every completion in a
//! JSONL file.
//!
//! The prompts are the task's first `--count` held-out prompts, decoded greedily with the
//! run's decode geometry (`task.prompt_len`, `task.max_new_tokens`; all prompts in one call
//! where the memory allows) on the config's devices: the same program as the run's own
//! evaluation, so a score here equals the `eval.jsonl` line of the same parameters and
//! count (`eval.prompts`).
//!
//! Standard errors are those of a mean over prompts (sample standard deviation over
//! `√count`); the difference of `--compare` pairs the two models' rewards prompt by prompt
//! (both decode the same prompts), so its error is that of the mean paired difference.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::Serialize;
use shardes::finetune::{PromptBatch, Sampler};
use shardes::hlo::params::ParamTree;

use crate::config::{Config, ConfigError, ProblemConfig, Rates, WeightsKey};
use crate::out::{outln, Stdout};
use crate::{setup, taskset};

/// Arguments of `shardes eval`.
#[derive(Debug, Clone, clap::Args)]
pub struct EvalArgs {
    /// A run directory (its config.toml and params.safetensors), or a config with a
    /// [task] (the base model, or --params).
    pub target: PathBuf,
    /// Parameters to score instead of the run's params.safetensors.
    #[arg(long)]
    pub params: Option<PathBuf>,
    /// Score the base model (the config's starting parameters) only.
    #[arg(long, conflicts_with = "compare")]
    pub base: bool,
    /// Score the base model and the tuned parameters side by side, with their difference.
    #[arg(long)]
    pub compare: bool,
    /// Held-out prompts to score (default: eval.prompts, else 32).
    #[arg(long)]
    pub count: Option<usize>,
    /// Where to write every completion as JSONL (default: RUN/eval-completions.jsonl for
    /// a run directory; none for a config).
    #[arg(long)]
    pub completions: Option<PathBuf>,
    /// PJRT plugin (overrides the config's `plugin`).
    #[arg(long)]
    pub plugin: Option<String>,
}

/// Which parameters a row of the table scores.
struct Subject {
    /// `base` or `tuned`.
    name: &'static str,
    /// Where its parameters came from, for the table.
    source: String,
    /// The parameters; `None`: the config's starting parameters.
    params: Option<PathBuf>,
}

/// One model's scores on the held-out prompts.
struct Scored {
    rewards: Vec<f64>,
    lengths: Vec<usize>,
    contained: Vec<bool>,
    texts: Vec<String>,
}

/// One line of the completions file.
#[derive(Serialize)]
struct CompletionLine<'a> {
    model: &'a str,
    index: usize,
    prompt: String,
    completion: &'a str,
    tokens: usize,
    reward: f64,
    contained: bool,
}

/// Mean and standard error of the mean (0 below two values).
fn mean_se(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    if v.is_empty() {
        return (0.0, 0.0);
    }
    let m = v.iter().sum::<f64>() / n;
    if v.len() < 2 {
        return (m, 0.0);
    }
    let var = v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (n - 1.0);
    (m, (var / n).sqrt())
}

fn indicator(v: &[f64], keep: impl Fn(f64) -> bool) -> Vec<f64> {
    v.iter().map(|&x| if keep(x) { 1.0 } else { 0.0 }).collect()
}

/// The columns of the table: each a name and the per-prompt values it averages.
fn columns(r: &[f64], rates: Rates) -> Vec<(&'static str, Vec<f64>)> {
    let mut c = vec![("mean reward", r.to_vec())];
    if rates.accuracy {
        c.push(("accuracy", indicator(r, |x| x == 1.0)));
    }
    if rates.format {
        c.push(("format rate", indicator(r, |x| x > 0.0)));
    }
    c
}

/// The config and the subjects `args` asks for.
fn resolve(args: &EvalArgs) -> Result<(Config, Vec<Subject>, Option<PathBuf>)> {
    let is_run = args.target.is_dir();
    let config_path = if is_run {
        args.target.join("config.toml")
    } else {
        args.target.clone()
    };
    if is_run && !config_path.is_file() {
        return Err(ConfigError::new(
            format!(
                "{} is a directory without a config.toml",
                args.target.display()
            ),
            "pass the out directory of a `shardes run`, or a config file",
        )
        .into());
    }
    let config = Config::load(&config_path)?;
    let tuned = match (&args.params, is_run) {
        (Some(p), _) => Some(p.clone()),
        (None, true) => Some(args.target.join("params.safetensors")),
        (None, false) => None,
    };
    let base = Subject {
        name: "base",
        source: "the config's starting parameters".into(),
        params: None,
    };
    let subjects = match (args.base, args.compare, tuned) {
        (true, _, _) | (false, false, None) => vec![base],
        (false, _, Some(p)) => {
            if !p.is_file() {
                return Err(ConfigError::new(
                    format!("no parameters at {}", p.display()),
                    "the run has not written a checkpoint yet: let it run to checkpoint_every, \
                     pass --params FILE, or --base to score the base model",
                )
                .into());
            }
            let tuned = Subject {
                name: "tuned",
                source: describe(&p, is_run.then_some(args.target.as_path())),
                params: Some(p),
            };
            if args.compare {
                vec![base, tuned]
            } else {
                vec![tuned]
            }
        }
        (false, true, None) => {
            return Err(ConfigError::new(
                "--compare needs tuned parameters",
                "pass a run directory, or --params FILE with the config",
            )
            .into())
        }
    };
    let completions = args
        .completions
        .clone()
        .or_else(|| is_run.then(|| args.target.join("eval-completions.jsonl")));
    Ok((config, subjects, completions))
}

/// `path`, with the checkpoint's generation when it is a run's own parameters.
fn describe(path: &Path, run: Option<&Path>) -> String {
    let generation = run
        .and_then(|r| std::fs::read_to_string(r.join("state.json")).ok())
        .and_then(|s| serde_json::from_str::<serde_json::Value>(&s).ok())
        .and_then(|v| v.get("generation").and_then(serde_json::Value::as_u64));
    match generation {
        Some(g) if run.is_some_and(|r| path == r.join("params.safetensors")) => {
            format!("{} (generation {g})", path.display())
        }
        _ => path.display().to_string(),
    }
}

/// Runs `shardes eval`.
pub fn run(args: &EvalArgs) -> Result<()> {
    let (mut config, subjects, completions_path) = resolve(args)?;
    if let Some(p) = &args.plugin {
        config.plugin = Some(p.clone());
    }
    let Some(task_cfg) = config.task.clone() else {
        return Err(ConfigError::new(
            "shardes eval scores a [task]'s held-out prompts, and the config has no [task]",
            "pass a run or config with a [task] (countdown, jsonl, ...)",
        )
        .into());
    };
    if !matches!(config.problem, ProblemConfig::Qwen2 { .. }) {
        anyhow::bail!("a [task] needs a language model ([problem] name = \"qwen2\")");
    }
    let count = args
        .count
        .unwrap_or_else(|| config.eval.as_ref().map_or(32, |e| e.prompts));
    if count == 0 {
        return Err(ConfigError::new("--count 0", "score at least one prompt").into());
    }
    let (problem, loaded) = setup::decoding_problem(&config)?;
    let task = taskset::task(&task_cfg, loaded.config.vocab_size)?;
    let codec = taskset::codec(&config, &task_cfg)?;
    let batch = task.held_out(count).map_err(taskset::task_error)?;
    let ids = batch
        .prompts
        .iter()
        .map(|p| codec.encode(p))
        .collect::<Result<Vec<_>, _>>()?;
    let mut dc = crate::run::reward::decode_config(&config, &task_cfg, &loaded)?;
    dc.eval_batch = Some(crate::run::reward::eval_rows(&loaded, &dc, ids.len()));
    if let Some((index, len)) = ids
        .iter()
        .enumerate()
        .map(|(i, p)| (i, p.len()))
        .find(|&(_, l)| l > dc.prompt_len)
    {
        return Err(ConfigError::new(
            format!(
                "task.prompt_len = {}: held-out prompt {index} has {len} tokens",
                dc.prompt_len
            ),
            format!("raise task.prompt_len to at least {len}"),
        )
        .into());
    }
    let mut scored = Vec::with_capacity(subjects.len());
    for s in &subjects {
        let params = match &s.params {
            None => problem.params.clone(),
            Some(p) => read_tuned(&config, p, &problem.params)?,
        };
        let mut decoder = setup::evaluator(&config, &loaded, &params, problem.key, dc.clone())?;
        let out = Sampler::decode_plain(&mut decoder, &ids)
            .with_context(|| format!("decoding the {} model", s.name))?;
        scored.push(score(&batch, &codec, out)?);
    }
    let rates = task_cfg.rates();
    let mut o = Stdout::new();
    outln!(
        o,
        "shardes eval: {}, {} held-out prompts, greedy, at most {} new tokens",
        task.name(),
        ids.len(),
        dc.max_new
    );
    table(&mut o, &subjects, &scored, rates);
    if let Some(path) = &completions_path {
        write_completions(path, &subjects, &scored, &batch)?;
        outln!(o, "completions: {}", path.display());
    }
    o.finish()
}

/// The tuned parameters, checked against the model: the run that wrote them (when they
/// sit in a run directory) must name the same weights, and every leaf must match.
fn read_tuned(config: &Config, path: &Path, like: &ParamTree) -> Result<ParamTree> {
    let run_config = path
        .parent()
        .map(|d| d.join("config.toml"))
        .filter(|c| c.is_file());
    if let Some(c) = run_config {
        let theirs = Config::load(&c)?;
        let key = |cfg: &Config| -> Result<String> {
            Ok(match cfg.problem.weights_key()? {
                WeightsKey::Model(m) => format!("model {m}"),
                WeightsKey::Checkpoint(p) => format!(
                    "checkpoint {}",
                    std::fs::canonicalize(&p).unwrap_or(p).display()
                ),
                WeightsKey::Size(s) => format!("random {s} from run.seed {}", cfg.run.seed),
            })
        };
        let (mine, other) = (key(config)?, key(&theirs)?);
        if mine != other {
            return Err(ConfigError::new(
                format!(
                    "{} come from a run of another model ({other}, by {}); this config's \
                     model is {mine}",
                    path.display(),
                    c.display()
                ),
                "score a run's parameters with its own config (pass the run directory)",
            )
            .into());
        }
    }
    shardes::io::read_params(path, like).map_err(|e| {
        ConfigError::new(
            format!("{}: {e}", path.display()),
            "pass parameters written by `shardes run` with this config's model",
        )
        .into()
    })
}

fn score(
    batch: &PromptBatch,
    codec: &shardes::finetune::TextCodec,
    out: Vec<Vec<u32>>,
) -> Result<Scored> {
    let lengths: Vec<usize> = out.iter().map(Vec::len).collect();
    let completions = codec.completions(out)?;
    let scores = batch
        .score_plain(&completions)
        .map_err(taskset::task_error)?;
    let mut contained = vec![false; completions.len()];
    for c in &scores.contained {
        if let Some(slot) = contained.get_mut(c.index) {
            *slot = true;
        }
    }
    Ok(Scored {
        rewards: scores.rewards.iter().map(|&r| f64::from(r)).collect(),
        lengths,
        contained,
        texts: completions.into_iter().map(|c| c.text).collect(),
    })
}

fn table(o: &mut Stdout, subjects: &[Subject], scored: &[Scored], rates: Rates) {
    let cell = |(m, se): (f64, f64)| format!("{m:.4} ± {se:.4}");
    let names: Vec<&str> = columns(&[], rates).iter().map(|c| c.0).collect();
    let mut header = format!("{:<8}", "model");
    for n in &names {
        header.push_str(&format!("  {n:<17}"));
    }
    header.push_str("  mean tokens  contained  parameters");
    outln!(o, "{header}");
    for (s, r) in subjects.iter().zip(scored) {
        let mut line = format!("{:<8}", s.name);
        for (_, v) in columns(&r.rewards, rates) {
            line.push_str(&format!("  {:<17}", cell(mean_se(&v))));
        }
        let tokens: Vec<f64> = r.lengths.iter().map(|&l| l as f64).collect();
        let contained = r.contained.iter().filter(|&&c| c).count();
        line.push_str(&format!(
            "  {:<11.1}  {contained:<9}  {}",
            mean_se(&tokens).0,
            s.source
        ));
        outln!(o, "{line}");
    }
    if let [base, tuned] = scored {
        let mut line = format!("{:<8}", "diff");
        for ((_, b), (_, t)) in columns(&base.rewards, rates)
            .into_iter()
            .zip(columns(&tuned.rewards, rates))
        {
            let d: Vec<f64> = t.iter().zip(&b).map(|(t, b)| t - b).collect();
            let (m, se) = mean_se(&d);
            line.push_str(&format!("  {:<17}", format!("{m:+.4} ± {se:.4}")));
        }
        line.push_str("  (tuned − base, paired over prompts)");
        outln!(o, "{line}");
    }
}

fn write_completions(
    path: &Path,
    subjects: &[Subject],
    scored: &[Scored],
    batch: &PromptBatch,
) -> Result<()> {
    let mut text = Vec::new();
    for (s, r) in subjects.iter().zip(scored) {
        for (i, prompt) in batch.prompts.iter().enumerate() {
            let line = CompletionLine {
                model: s.name,
                index: i,
                prompt: prompt.display(),
                completion: &r.texts[i],
                tokens: r.lengths[i],
                reward: r.rewards[i],
                contained: r.contained[i],
            };
            serde_json::to_writer(&mut text, &line)?;
            text.push(b'\n');
        }
    }
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty());
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&text)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        ConfigError::new(
            format!("writing {}: {e}", path.display()),
            match dir {
                Some(d) => format!(
                    "check that {} exists and is writable, or pass --completions PATH",
                    d.display()
                ),
                None => "pass --completions PATH to a writable place".into(),
            },
        )
        .into()
    })
}
