//! `shardes generate CONFIG`: greedy completions of a qwen2 config's model (its starting
//! parameters or a trained `--params` file), of one `--prompt` or of the task's held-out
//! (`--split test`) or training (`--split train`) prompts, with their rewards when the
//! config has a `[task]`.

use std::path::PathBuf;

use anyhow::Result;
use shardes::finetune::{Prompt, PromptBatch, Sampler};

use crate::config::{Config, ConfigError, ProblemConfig, TaskConfig, TaskSection};
use crate::out::{outln, Stdout};
use crate::{setup, taskset};

/// Arguments of `shardes generate`.
#[derive(Debug, Clone, clap::Args)]
pub struct GenerateArgs {
    /// A qwen2 config (with or without a [task]).
    pub config: PathBuf,
    /// Parameters to decode with (e.g. OUT/params.safetensors); default: the config's
    /// starting parameters (its checkpoint, or the preset drawn from run.seed).
    #[arg(long)]
    pub params: Option<PathBuf>,
    /// One prompt of your own (rendered with the chat template when task.chat is set).
    #[arg(long, conflicts_with = "split")]
    pub prompt: Option<String>,
    /// The task's prompts: `test` (held out) or `train` (generation 0's).
    #[arg(long, value_parser = ["test", "train"])]
    pub split: Option<String>,
    /// How many of the split's prompts.
    #[arg(long, default_value_t = 4)]
    pub count: usize,
    /// New tokens per completion (default: task.max_new_tokens, else 64).
    #[arg(long)]
    pub max_new_tokens: Option<usize>,
    /// PJRT plugin (overrides the config's `plugin`).
    #[arg(long)]
    pub plugin: Option<String>,
}

/// Runs `shardes generate`.
pub fn run(args: &GenerateArgs) -> Result<()> {
    let mut config = Config::load(&args.config)?;
    if let Some(p) = &args.plugin {
        config.plugin = Some(p.clone());
    }
    if !matches!(config.problem, ProblemConfig::Qwen2 { .. }) {
        return Err(ConfigError::new(
            format!(
                "shardes generate decodes a language model, not problem \"{}\"",
                config.problem.name()
            ),
            "pass a config with [problem] name = \"qwen2\"",
        )
        .into());
    }
    if args.count == 0 || args.max_new_tokens == Some(0) {
        return Err(ConfigError::new(
            "--count 0 or --max-new-tokens 0",
            "ask for at least one prompt and one new token",
        )
        .into());
    }
    let (mut problem, loaded) = setup::decoding_problem(&config)?;
    if let Some(p) = &args.params {
        problem.params = shardes::io::read_params(p, &problem.params).map_err(|e| {
            ConfigError::new(
                format!("--params {}: {e}", p.display()),
                "pass a params.safetensors written by `shardes run` for this config",
            )
        })?;
    }
    // Prompts given as text need no task: a token-id task with its defaults stands in.
    let plain = TaskConfig::TargetToken(TaskSection::default());
    let task_cfg = config.task.clone();
    let codec = taskset::codec(&config, task_cfg.as_ref().unwrap_or(&plain))?;
    let batch: Option<PromptBatch> = match (&args.prompt, &task_cfg) {
        (Some(_), _) => None,
        (None, Some(t)) => {
            let task = taskset::task(t, loaded.config.vocab_size)?;
            let b = match args.split.as_deref() {
                Some("train") => task.train(config.run.seed, 0, args.count),
                _ => task.held_out(args.count),
            };
            Some(b.map_err(taskset::task_error)?)
        }
        (None, None) => {
            return Err(ConfigError::new(
                "nothing to complete: the config has no [task] and no --prompt was given",
                "pass --prompt TEXT, or a config with a [task] for --split test|train",
            )
            .into())
        }
    };
    let prompts: Vec<Prompt> = match (&args.prompt, &batch) {
        (Some(text), _) => vec![Prompt::Text(text.clone())],
        (None, Some(b)) => b.prompts.clone(),
        (None, None) => Vec::new(),
    };
    let ids = prompts
        .iter()
        .map(|p| codec.encode(p))
        .collect::<Result<Vec<_>, _>>()?;
    let prompt_len = ids.iter().map(Vec::len).max().unwrap_or(1).max(1);
    let max_new = args
        .max_new_tokens
        .or(task_cfg.as_ref().map(TaskConfig::max_new_tokens))
        .unwrap_or(64);
    let mut dc = loaded.decode_config(ids.len(), prompt_len, max_new);
    if let Some(eos) = task_cfg.as_ref().and_then(|t| t.eos.clone()) {
        dc.eos = eos;
    }
    let mut decoder = setup::evaluator(&config, &loaded, &problem.params, problem.key, dc)?;
    let out = Sampler::decode_plain(&mut decoder, &ids)?;
    let completions = codec.completions(out)?;
    let rewards = match &batch {
        Some(b) => Some(
            b.score_plain(&completions)
                .map_err(taskset::task_error)?
                .rewards,
        ),
        None => None,
    };
    let mut o = Stdout::new();
    for (i, (p, c)) in prompts.iter().zip(&completions).enumerate() {
        let reward = rewards
            .as_ref()
            .map(|r| format!(", reward {}", r[i]))
            .unwrap_or_default();
        outln!(o, "### prompt {i}\n{}", codec.rendered(p)?);
        outln!(
            o,
            "### completion {i} ({} tokens{reward})\n{}\n",
            c.ids.len(),
            c.text
        );
    }
    if let Some(r) = &rewards {
        let mean = r.iter().map(|&x| f64::from(x)).sum::<f64>() / r.len().max(1) as f64;
        outln!(o, "mean reward {mean:.4} over {} prompts", r.len());
    }
    o.finish()
}
