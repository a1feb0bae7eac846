//! A `[task]` run: each generation decodes every member on fresh prompts, scores the text
//! on the host and hands the negated rewards to `tell`; `[eval]` decodes the unperturbed
//! parameters on held-out prompts into `OUT/eval.jsonl`.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result};
use shardes::decode::{DecodeError, LoadedQwen2};
use shardes::distributed::Distributed;
use shardes::finetune::{
    EvalRecord, EvalWriter, RewardLoop, RewardSettings, RewardTask, Sampler, TextCodec,
};
use shardes::hlo::decode::{DecodeShape, Decoder, Sampling};
use shardes::hlo::es::{How, ShapingSpec};
use shardes::hlo::params::{Array, ParamTree};
use shardes::{BuildTimes, DecodeConfig, PopulationDecoder};

use super::step::StepOut;
use crate::config::{Config, ConfigError, EvalConfig, TaskConfig};
use crate::setup::Setup;
use crate::taskset;

/// The eval log's file name in the out directory.
pub(crate) const EVAL_LOG: &str = "eval.jsonl";

/// A reward run's state between generations.
pub(crate) struct RewardRun {
    lp: RewardLoop<Box<dyn Sampler>>,
    eval: Option<EvalConfig>,
    evals: Option<EvalWriter>,
    times: BuildTimes,
    last_eval: Option<u32>,
}

impl RewardRun {
    /// A run of `lp`; with `eval`, evaluations append to `out/eval.jsonl`.
    pub fn new(
        lp: RewardLoop<Box<dyn Sampler>>,
        eval: Option<EvalConfig>,
        times: BuildTimes,
    ) -> RewardRun {
        RewardRun {
            lp,
            eval,
            evals: None,
            times,
            last_eval: None,
        }
    }

    /// Opens the eval log in `dir` (after the out directory is committed to this run).
    pub fn open_log(&mut self, dir: &Path) -> Result<()> {
        if self.eval.is_some() {
            self.evals = Some(EvalWriter::open(&dir.join(EVAL_LOG))?);
        }
        Ok(())
    }

    /// One generation (with every process of `dist` together); the metrics' extras are the
    /// mean reward, accuracy, format rate, tokens per second and (when any) the contained
    /// reward failures, the whole population's.
    pub fn step(&mut self, dist: &Distributed) -> Result<StepOut> {
        let t0 = Instant::now();
        let r = self.lp.step_in(dist).map_err(too_long)?;
        let secs = t0.elapsed().as_secs_f64().max(1e-12);
        let mut extra = BTreeMap::new();
        extra.insert("reward".to_string(), r.mean_reward);
        extra.insert("accuracy".to_string(), r.accuracy);
        extra.insert("format".to_string(), r.format_rate);
        extra.insert("tok/s".to_string(), r.tokens_per_sec());
        // Encoding, detokenizing and scoring: the part of a generation on the host.
        extra.insert("host_share".to_string(), r.host_secs / secs);
        if r.contained > 0 {
            extra.insert("contained".to_string(), r.contained as f64);
        }
        Ok(StepOut {
            fitness: r.fitness,
            extra,
        })
    }

    /// The parameters on the host.
    pub fn params(&self) -> Result<ParamTree> {
        Ok(self.lp.sampler().params()?)
    }

    /// The optimizer's state on the host (empty under sgd).
    pub fn optimizer_state(&self) -> Result<Vec<(String, Array)>, shardes::Error> {
        self.lp.sampler().optimizer_state()
    }

    /// Replaces the optimizer's state on the devices (a resumed checkpoint's).
    pub fn set_optimizer_state(
        &mut self,
        tensors: &[(String, Array)],
    ) -> Result<(), shardes::Error> {
        self.lp.sampler_mut().set_optimizer_state(tensors)
    }

    /// The generation the next step runs.
    pub fn generation(&self) -> u32 {
        self.lp.sampler().generation()
    }

    /// Compile times of the programs.
    pub fn build_times(&self) -> BuildTimes {
        self.times
    }

    /// See [`super::engine::Engine::evaluate_if_due`].
    pub fn evaluate_if_due(&mut self, done: u32, last: bool) -> Result<Option<String>> {
        let Some(eval) = &self.eval else {
            return Ok(None);
        };
        let due =
            done == 0 || last || (eval.every > 0 && (done as usize).is_multiple_of(eval.every));
        if !due || self.last_eval == Some(done) {
            return Ok(None);
        }
        let (prompts, samples) = (eval.prompts, eval.samples);
        let rec = self
            .lp
            .evaluate(prompts, samples)
            .with_context(|| format!("evaluating at generation {done}"))?;
        if let Some(w) = &mut self.evals {
            w.append(&rec)?;
        }
        self.last_eval = Some(done);
        Ok(Some(eval_line(&rec)))
    }
}

/// A prompt longer than the compiled slots as the config error naming the key.
fn too_long(e: shardes::Error) -> anyhow::Error {
    match e {
        shardes::Error::Decode(DecodeError::PromptTooLong {
            index,
            len,
            prompt_len,
        }) => prompt_len_error(index, len, prompt_len),
        other => other.into(),
    }
}

fn prompt_len_error(index: usize, len: usize, prompt_len: usize) -> anyhow::Error {
    ConfigError::new(
        format!("task.prompt_len = {prompt_len}: prompt {index} has {len} tokens"),
        format!(
            "raise task.prompt_len to at least {len} (prompt_len + max_new_tokens must fit \
             the model's positions), or shorten the prompts"
        ),
    )
    .into()
}

/// Refuses, before anything is compiled, a first generation's or held-out prompt that
/// does not fit `prompt_len` (later generations' prompts are checked as they come).
fn check_prompts(
    task: &dyn RewardTask,
    codec: &TextCodec,
    config: &Config,
    start: u32,
    prompt_len: usize,
) -> Result<()> {
    let t = config.task.as_ref().map_or(1, TaskConfig::prompts);
    let mut batches = vec![task
        .train(config.run.seed, start, t)
        .map_err(taskset::task_error)?];
    if let Some(e) = &config.eval {
        batches.push(task.held_out(e.prompts).map_err(taskset::task_error)?);
    }
    for b in &batches {
        for (index, p) in b.prompts.iter().enumerate() {
            let len = codec.encode(p)?.len();
            if len > prompt_len {
                return Err(prompt_len_error(index, len, prompt_len));
            }
        }
    }
    Ok(())
}

/// The progress line of an evaluation.
fn eval_line(r: &EvalRecord) -> String {
    format!(
        "eval gen {}: reward {:.4} accuracy {:.3} format {:.3} length {:.1} |Δθ| {:.4} ({} prompts)",
        r.generation, r.mean_reward, r.accuracy, r.format_rate, r.mean_length, r.l2_from_init,
        r.prompts
    )
}

/// The decode config of a `[task]`: its batch geometry, EOS ids (the task's, else the
/// checkpoint's), pad id and sampling; one fitness column per prompt for
/// `group_relative`.
pub(crate) fn decode_config(
    config: &Config,
    task: &TaskConfig,
    loaded: &LoadedQwen2,
) -> Result<DecodeConfig> {
    let mut d = loaded.decode_config(task.prompts(), task.prompt_len(), task.max_new_tokens());
    if let Some(eos) = &task.eos {
        d.eos = eos.clone();
        if loaded.pad.is_none() {
            d.pad = eos.first().copied().unwrap_or(0);
        }
    }
    let vocab = loaded.config.vocab_size;
    if let Some(bad) = d.eos.iter().find(|&&t| t as usize >= vocab) {
        return Err(ConfigError::new(
            format!("task.eos: id {bad} is not below the vocabulary size {vocab}"),
            "use the tokenizer's end-of-sequence ids",
        )
        .into());
    }
    if task.temperature() > 0.0 {
        d.sampling = Sampling::Sample {
            temperature: task.temperature() as f32,
            top_p: task.top_p() as f32,
        };
    }
    if let Some(e) = &config.eval {
        d.eval_batch = Some(eval_rows(loaded, &d, e.prompts));
    }
    let grouped = config.es.shaping == ShapingSpec::GroupRelative;
    if grouped {
        d.groups = task.prompts();
    }
    if let Some(max) = loaded.max_positions {
        let need = task.prompt_len() + task.max_new_tokens();
        if need > max {
            return Err(ConfigError::new(
                format!(
                    "task.prompt_len + task.max_new_tokens = {need} exceeds the model's {max} \
                     positions (max_position_embeddings)"
                ),
                format!("lower task.prompt_len or task.max_new_tokens to fit {max} positions"),
            )
            .into());
        }
    }
    Ok(d)
}

/// The rows of the evaluation program for `count` held-out prompts of `d`'s geometry: all
/// in one call where the memory allows ([`DecodeConfig::eval_rows_for`]).
pub(crate) fn eval_rows(loaded: &LoadedQwen2, d: &DecodeConfig, count: usize) -> usize {
    let decoder = loaded.decoder(d);
    DecodeConfig::eval_rows_for(count, |rows| {
        decoder.member_bytes(&DecodeShape {
            batch: rows,
            ..d.shape()
        })
    })
}

/// Builds the reward run of `s` (a config with a `[task]`) on its parameters (resumed
/// ones when `start > 0`) at generation `start`. With `group`, this is one process of a run
/// across processes: it decodes its own members, places the update by `how_hosts`, and
/// evaluates only if it is the lead (the one that writes `eval.jsonl`).
pub(crate) fn build(
    s: &Setup,
    start: u32,
    group: Option<(&Distributed, How)>,
) -> Result<RewardRun> {
    let config = &s.config;
    let (Some(task_cfg), Some(loaded)) = (&config.task, &s.decode) else {
        anyhow::bail!("a reward run needs a [task] and a qwen2 problem");
    };
    let task = taskset::task(task_cfg, loaded.config.vocab_size)?;
    let codec = taskset::codec(config, task_cfg)?;
    let dc = decode_config(config, task_cfg, loaded)?;
    check_prompts(&*task, &codec, config, start, dc.prompt_len)?;
    let t0 = Instant::now();
    let decoder = match group {
        None => PopulationDecoder::with_state(
            &s.client,
            &s.es,
            loaded.decoder(&dc),
            &s.problem.params,
            s.problem.key,
            start,
            dc.clone(),
        ),
        Some((dist, how_hosts)) => PopulationDecoder::for_process(
            &s.client,
            &s.es,
            loaded.decoder(&dc),
            &s.problem.params,
            s.problem.key,
            start,
            dc.clone(),
            dist,
            how_hosts,
        ),
    }
    .context("building the decoding programs")?;
    // Only the lead evaluates: the others would decode the same tokens for no one.
    let eval = config
        .eval
        .clone()
        .filter(|_| group.is_none_or(|(d, _)| d.is_lead()));
    let compile_ms = t0.elapsed().as_secs_f64() * 1e3;
    // The starting parameters, for the eval's distance; a resumed run rebuilds them from
    // the config (the checkpoint or the seed).
    let init = if eval.is_some() {
        Some(if start == 0 {
            s.problem.params.clone()
        } else {
            crate::setup::decoding_problem(config)?.0.params
        })
    } else {
        None
    };
    let settings = RewardSettings {
        seed: config.run.seed,
        prompts: task_cfg.prompts(),
        grouped: config.es.shaping == ShapingSpec::GroupRelative,
    };
    let sampler: Box<dyn Sampler> = Box::new(decoder);
    let lp = RewardLoop::new(task, codec, sampler, settings, init)?;
    Ok(RewardRun::new(
        lp,
        eval,
        BuildTimes {
            emit_ms: 0.0,
            compile_ms,
        },
    ))
}
