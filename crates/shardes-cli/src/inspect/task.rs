//! `shardes check` and `shardes diag` on a `[task]` config (fine-tuning on a reward from
//! decoded text).
//!
//! [`plan`] validates everything a reward run reads before it compiles anything, with the
//! same functions the run uses: the task, the tokenizer and (with `task.chat`) the chat
//! template ([`crate::taskset`]), the decode settings and the model's positions
//! ([`crate::run::reward::decode_config`]), the `[es]` settings against the model's leaves,
//! and the first generation's and the held-out prompts against `task.prompt_len`. The model
//! is described by shape (a checkpoint's `config.json`, headers and generation ids; a
//! random size's dimensions), so no parameter is read or allocated. [`programs`] builds the
//! programs a reward run compiles (the decode, the tell and, with `[eval]`, the held-out
//! decode), for `shardes diag`.

use std::path::PathBuf;

use anyhow::{Context, Result};
use shardes::decode::LoadedQwen2;
use shardes::finetune::{Prompt, RewardTask, TextCodec};
use shardes::hlo::decode::Sampling;
use shardes::hlo::es::strategy::LowRank;
use shardes::hlo::es::{check_model, AsModel, Finding, LeafInfo, Program, ShardedES, WithTasks};
use shardes::hlo::params::ParamTree;
use shardes::hlo::problems::leaf_infos_of_shapes;
use shardes::hlo::problems::qwen2::Qwen2;
use shardes::problem::qwen2::config_of_size;
use shardes::DecodeConfig;
use shardes::Qwen2Weights;

use crate::config::{Config, ConfigError, ProblemConfig, TaskConfig};
use crate::out::{outln, Stdout};
use crate::setup;
use crate::taskset;

/// What a reward run of a config would do, checked without compiling.
pub struct TaskPlan {
    /// The run's ES.
    pub es: ShardedES,
    /// The decoding model's config, positions, EOS and pad ids (no parameters).
    pub loaded: LoadedQwen2,
    /// The parameters' leaves, by shape.
    pub leaves: Vec<LeafInfo>,
    /// The decode settings the run compiles.
    pub decode: DecodeConfig,
    /// Members per evaluation chunk of the decode program.
    pub member_chunk: usize,
    /// The model in words.
    pub summary: String,
    /// The tokenizer file, when the task has text prompts.
    pub tokenizer: Option<PathBuf>,
    /// Generation 0's prompts: how many and the longest, in tokens.
    pub train: PromptStats,
    /// The held-out prompts of one evaluation, when the config has an `[eval]`.
    pub held_out: Option<PromptStats>,
    /// Generation 0's first prompt as the model sees it (after the chat template).
    pub first_prompt: String,
    /// Leaves the model never reads, or reads without a seam (`check_model`).
    pub findings: Vec<Finding>,
}

/// A prompt batch's size in prompts and tokens.
#[derive(Debug, Clone, Copy)]
pub struct PromptStats {
    /// Prompts.
    pub count: usize,
    /// The longest prompt's tokens.
    pub longest: usize,
}

fn task_of(config: &Config) -> Result<&TaskConfig> {
    config
        .task
        .as_ref()
        .ok_or_else(|| anyhow::anyhow!("the config has no [task]"))
}

/// The decoding model of a `[task]` config by shape: what [`setup::decoding_problem`]
/// loads, less the parameters.
fn model_shapes(config: &Config) -> Result<(LoadedQwen2, String)> {
    if !matches!(config.problem, ProblemConfig::Qwen2 { .. }) {
        anyhow::bail!("a [task] needs a qwen2 problem");
    }
    let weights = setup::weights(&config.problem)?;
    let compute_dtype = config.compute_dtype()?;
    let key = shardes::hlo::prng::key(config.run.seed).map_err(|e| {
        ConfigError::new(
            format!("run.seed: {e}"),
            "use a seed below 2^63 (the run's key is drawn from it)",
        )
    })?;
    let checkpoint_error = |e: shardes::pretrained::ModelError| {
        ConfigError::new(
            format!("problem.checkpoint: {e}"),
            "point problem.checkpoint at a Hugging Face model directory (config.json, \
             generation_config.json and model.safetensors) or a .gguf file",
        )
    };
    let (cfg, max_positions, eos, pad, origin, family) = match &weights {
        Qwen2Weights::Checkpoint(path) => {
            let info = shardes::pretrained::read_info(path).map_err(checkpoint_error)?;
            shardes::pretrained::check_weights(path, &info.config).map_err(checkpoint_error)?;
            let origin = path.display().to_string();
            (
                info.config,
                info.max_positions,
                info.eos,
                info.pad,
                origin,
                info.family,
            )
        }
        Qwen2Weights::Random(size) => {
            let cfg = config_of_size(size).map_err(setup::config_error)?;
            (
                cfg,
                None,
                Vec::new(),
                None,
                format!("random {size}"),
                "qwen2",
            )
        }
    };
    let summary = format!(
        "{family} ({origin}, {} layers, d {}, vocab {}) decoding",
        cfg.num_hidden_layers, cfg.hidden_size, cfg.vocab_size
    );
    let loaded = LoadedQwen2 {
        config: cfg,
        params: ParamTree::map(Vec::<(String, ParamTree)>::new()),
        key,
        max_positions,
        eos,
        pad,
        compute_dtype,
        family,
        layers: setup::layers_of(&config.problem)?,
    };
    Ok((loaded, summary))
}

/// The tokens of each prompt of `prompts`, refusing one longer than `prompt_len` with the
/// error a run gives (naming `task.prompt_len`).
fn prompt_stats(
    prompts: &[Prompt],
    codec: &TextCodec,
    prompt_len: usize,
    which: &str,
) -> Result<PromptStats> {
    let mut longest = 0;
    for (index, p) in prompts.iter().enumerate() {
        let len = codec.encode(p)?.len();
        if len == 0 {
            return Err(ConfigError::new(
                format!("task: {which} prompt {index} has no tokens"),
                "every prompt needs at least one token: check the task's prompts",
            )
            .into());
        }
        if len > prompt_len {
            return Err(ConfigError::new(
                format!("task.prompt_len = {prompt_len}: {which} prompt {index} has {len} tokens"),
                format!(
                    "raise task.prompt_len to at least {len} (prompt_len + max_new_tokens must \
                     fit the model's positions), or shorten the prompts"
                ),
            )
            .into());
        }
        longest = longest.max(len);
    }
    Ok(PromptStats {
        count: prompts.len(),
        longest,
    })
}

/// Checks a `[task]` config as a reward run would, without compiling anything.
pub fn plan(config: &Config) -> Result<TaskPlan> {
    let task_cfg = task_of(config)?;
    let (loaded, summary) = model_shapes(config)?;
    let weights = setup::weights(&config.problem)?;
    let leaves = leaf_infos_of_shapes(&loaded.config.param_shapes())
        .context("describing the model's parameters")?;
    let task: Box<dyn RewardTask> = taskset::task(task_cfg, loaded.config.vocab_size)?;
    let codec = taskset::codec(config, task_cfg)?;
    let decode = crate::run::reward::decode_config(config, task_cfg, &loaded)?;
    let spec = decode
        .spec(loaded.decoder(&decode))
        .map_err(|e| ConfigError::new(format!("task: {e}"), "change the [task] key it names"))?;
    let grouped = WithTasks(&spec, decode.groups);
    // As the run builds it: the decode program sizes its chunk from the decoder itself.
    let es = setup::es(config)?;
    crate::config::sigma::check_leaves(&es, &leaves)?;
    let member_chunk = es
        .member_chunk_for(&AsModel(&grouped))
        .map_err(crate::config::es_error)?;
    let first = task
        .train(config.run.seed, 0, task_cfg.prompts())
        .map_err(taskset::task_error)?;
    let train = prompt_stats(&first.prompts, &codec, decode.prompt_len, "training")?;
    let held_out = match &config.eval {
        Some(e) => {
            let b = task.held_out(e.prompts).map_err(taskset::task_error)?;
            Some(prompt_stats(
                &b.prompts,
                &codec,
                decode.prompt_len,
                "held-out",
            )?)
        }
        None => None,
    };
    let first_prompt = match first.prompts.first() {
        Some(p) => codec.rendered(p)?,
        None => String::new(),
    };
    // `check_model` traces a loss; the decoder is the same Qwen2 over the same leaves.
    let traced = Qwen2::new(loaded.config.clone(), 1, 1)
        .with_compute_dtype(loaded.compute_dtype)
        .with_layers(loaded.layers);
    let findings = check_model(&traced, &leaves).context("tracing the model")?;
    let tokenizer = match &config.problem {
        ProblemConfig::Qwen2 { tokenizer, .. } if codec.has_tokenizer() => {
            tokenizer.clone().or_else(|| match &weights {
                // A GGUF file holds its tokenizer; a directory its tokenizer.json.
                Qwen2Weights::Checkpoint(c) if c.is_dir() => Some(c.join("tokenizer.json")),
                Qwen2Weights::Checkpoint(c) => Some(c.clone()),
                Qwen2Weights::Random(_) => None,
            })
        }
        _ => None,
    };
    Ok(TaskPlan {
        es,
        loaded,
        leaves,
        decode,
        member_chunk,
        summary,
        tokenizer,
        train,
        held_out,
        first_prompt,
        findings,
    })
}

/// The generations a run of `generations` evaluates at, in words: 0, every `every` and
/// the last.
fn eval_generations(every: usize, generations: usize) -> (Vec<usize>, usize) {
    let mut at = vec![0];
    if every > 0 {
        at.extend((every..generations).step_by(every));
    }
    if generations > 0 {
        at.push(generations);
    }
    let count = at.len();
    if count > 8 {
        let last = at[count - 1];
        at.truncate(4);
        at.push(last);
    }
    (at, count)
}

fn list(at: &[usize], count: usize) -> String {
    let words: Vec<String> = at.iter().map(usize::to_string).collect();
    if count > at.len() {
        let (head, last) = words.split_at(words.len() - 1);
        format!(
            "{}, ..., {} ({count} evaluations)",
            head.join(", "),
            last[0]
        )
    } else {
        format!("{} ({count} evaluations)", words.join(", "))
    }
}

/// At most `max` characters of `s` on one line (newlines shown as `\n`).
fn one_line(s: &str, max: usize) -> String {
    let flat = s.replace('\n', "\\n");
    if flat.chars().count() <= max {
        return flat;
    }
    let head: String = flat.chars().take(max).collect();
    format!("{head}...")
}

/// The lines `shardes check` prints for a `[task]` config.
pub fn lines(config: &Config, p: &TaskPlan) -> Result<Vec<String>> {
    let t = task_of(config)?;
    let d = &p.decode;
    let n = p.es.n();
    let devices = p.es.devices();
    let mut v = Vec::new();
    v.push(format!(
        "population: {} n = {n} on {devices} device(s) ({} per device, member chunk {}), \
         sigma {}, lr {}, shaping {}",
        p.es.strategy().name(),
        n / devices.max(1),
        p.member_chunk,
        p.es.sigma(),
        p.es.lr(),
        p.es.shaping().name()
    ));
    let sampling = match d.sampling {
        Sampling::Greedy => "greedy".to_string(),
        Sampling::Sample { temperature, top_p } => {
            format!("sampled (temperature {temperature}, top_p {top_p})")
        }
    };
    let positions = match p.loaded.max_positions {
        Some(m) => format!("of the model's {m}"),
        None => "(no max_position_embeddings to check them against)".into(),
    };
    v.push(format!(
        "decode: {sampling}, {n} members x {} prompts = {} rows of prompt_len {} + max_new_tokens \
         {} = {} positions {positions}; eos {:?}, pad {}",
        d.batch,
        n * d.batch,
        d.prompt_len,
        d.max_new,
        d.prompt_len + d.max_new,
        d.eos,
        d.pad
    ));
    v.push(format!(
        "task: {}, {} prompts per generation (fresh each generation, from run.seed {} and \
         the generation); generation 0's longest is {} of {} tokens; at most {} tokens \
         generated per generation; fitness {}",
        t.name(),
        p.train.count,
        config.run.seed,
        p.train.longest,
        d.prompt_len,
        n * d.batch * d.max_new,
        if d.groups > 1 {
            format!("[n, {}] (one group per prompt)", d.groups)
        } else {
            "[n] (mean reward per member)".into()
        }
    ));
    v.push(format!(
        "first prompt: \"{}\"",
        one_line(&p.first_prompt, 120)
    ));
    let tokenizer = match &p.tokenizer {
        Some(path) => path.display().to_string(),
        None => "none (the prompts are token ids)".into(),
    };
    let chat = if t.chat() {
        "the checkpoint's chat template"
    } else {
        "off"
    };
    v.push(format!("tokenizer: {tokenizer}; chat: {chat}"));
    match (&config.eval, &p.held_out) {
        (Some(e), Some(h)) => {
            let (at, count) = eval_generations(e.every, config.run.generations);
            v.push(format!(
                "eval: {} held-out prompts (longest {} tokens), greedy on the unperturbed \
                 parameters, at generations {}, {} samples each, to {}",
                h.count,
                h.longest,
                list(&at, count),
                e.samples,
                config.run.out.join(shardes::finetune::EVAL_LOG).display()
            ));
        }
        _ => v.push("eval: none (no [eval] section)".into()),
    }
    v.push(format!(
        "programs: decode and tell{} (`shardes diag` compiles them)",
        if config.eval.is_some() {
            ", and the held-out decode"
        } else {
            ""
        }
    ));
    Ok(v)
}

/// Runs `shardes check` on a `[task]` config; returns the number of findings.
pub fn check(config: &Config, json: bool) -> Result<usize> {
    let p = plan(config)?;
    let lines = lines(config, &p)?;
    let mut out = Stdout::new();
    if json {
        let list = super::findings::to_json(&p.findings);
        let doc = serde_json::json!({
            "problem": config.problem.name(),
            "leaves": p.leaves.len(),
            "findings": list,
            "task": task_of(config)?.name(),
            "n": p.es.n(),
            "devices": p.es.devices(),
            "member_chunk": p.member_chunk,
            "decode": {
                "rows": p.es.n() * p.decode.batch,
                "batch": p.decode.batch,
                "prompt_len": p.decode.prompt_len,
                "max_new": p.decode.max_new,
                "eos": p.decode.eos,
                "pad": p.decode.pad,
            },
            "longest_prompt": p.train.longest,
            "eval_prompts": p.held_out.map(|h| h.count),
        });
        outln!(out, "{doc}");
    } else {
        let ok = format!(
            "ok: {}; reads all {} leaves, every 2-D leaf through a seam",
            p.summary,
            p.leaves.len()
        );
        super::findings::print(&mut out, &p.findings, &ok, &format!(" in {}", p.summary));
        for l in &lines {
            outln!(out, "{l}");
        }
    }
    out.finish()?;
    Ok(p.findings.len())
}

/// A program built for `shardes diag`, with the time its building took.
pub struct BuiltProgram {
    /// What it is (`decode`, `tell`, ...).
    pub name: &'static str,
    /// The program.
    pub program: Program,
    /// Building it, ms (printing its text is timed by the caller).
    pub build_ms: f64,
}

/// Builds a program with `build`, timing it.
pub fn timed(
    name: &'static str,
    build: impl FnOnce() -> Result<Program, shardes::hlo::es::EsError>,
) -> Result<BuiltProgram> {
    let t0 = std::time::Instant::now();
    let program = build().with_context(|| format!("building the {name} program"))?;
    Ok(BuiltProgram {
        name,
        program,
        build_ms: t0.elapsed().as_secs_f64() * 1e3,
    })
}

/// The programs a reward run of `p` compiles: the decode of every member, the tell and,
/// with `[eval]`, the held-out decode (the unperturbed parameters, one member per device,
/// greedy: as [`shardes::PopulationDecoder`] builds it).
pub fn programs(config: &Config, p: &TaskPlan) -> Result<Vec<BuiltProgram>> {
    let spec = p.decode.spec(p.loaded.decoder(&p.decode))?;
    let grouped = WithTasks(&spec, p.decode.groups);
    let mut v = vec![
        timed("decode", || p.es.outputs_program(&grouped, &p.leaves))?,
        timed("tell", || p.es.tell_program(&AsModel(&grouped), &p.leaves))?,
    ];
    if config.eval.is_some() {
        let devices = p.es.devices();
        let eval_es = ShardedES::new(
            Box::new(LowRank { r: 1 }),
            devices,
            p.es.sigma(),
            p.es.lr(),
            devices,
        )
        .map_err(crate::config::es_error)?;
        let eval = DecodeConfig {
            sampling: Sampling::Greedy,
            ..p.decode.clone()
        }
        .spec(p.loaded.decoder(&p.decode))?;
        v.push(timed("eval", || {
            eval_es.plain_outputs_program(&eval, &p.leaves)
        })?);
    }
    Ok(v)
}
