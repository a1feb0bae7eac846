//! A `[task]` run: each generation decodes every member on fresh prompts, scores the text
//! on the host and hands the negated rewards to `tell`; `[eval]` decodes the unperturbed
//! parameters on held-out prompts into `OUT/eval.jsonl`.

use anyhow::{Context, Result};
use shardes::decode::{DecodeError, LoadedQwen2};
use shardes::finetune::{
    HeldOut, RewardEvaluator, RewardLoop, RewardSettings, RewardTask, TextCodec,
};
use shardes::hlo::decode::{DecodeShape, Decoder, Sampling};
use shardes::hlo::es::ShapingSpec;
use shardes::hlo::params::ParamTree;
use shardes::population::Place;
use shardes::{CompileWhen, DecodeConfig, Population, PopulationDecoder};

use crate::config::{Config, ConfigError, TaskConfig};
use crate::setup::Setup;
use crate::taskset;

/// A prompt longer than the compiled slots as the config error naming the key.
pub(crate) fn too_long(e: shardes::Error) -> anyhow::Error {
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

/// Builds the reward run of `s` (a config with a `[task]`) on `params` (resumed ones when
/// `start > 0`) at generation `start`, placed by `place`. As one process of several, it
/// decodes its own members, places the update by `how_hosts`, and evaluates only if it
/// is the lead (the one that writes `eval.jsonl`).
pub(crate) fn build(
    s: &Setup,
    params: &ParamTree,
    start: u32,
    place: Place<'_>,
) -> Result<Population<RewardEvaluator>> {
    let config = &s.config;
    let (Some(task_cfg), Some(loaded)) = (&config.task, &s.decode) else {
        anyhow::bail!("a reward run needs a [task] and a qwen2 problem");
    };
    let task = taskset::task(task_cfg, loaded.config.vocab_size)?;
    let codec = taskset::codec(config, task_cfg)?;
    let dc = decode_config(config, task_cfg, loaded)?;
    check_prompts(&*task, &codec, config, start, dc.prompt_len)?;
    let decoder = PopulationDecoder::placed(
        &s.client,
        &s.es,
        loaded.decoder(&dc),
        params,
        s.problem.key,
        start,
        dc.clone(),
        place,
        CompileWhen::Now,
    )
    .context("building the decoding programs")?;
    // Only the lead evaluates: the others would decode the same tokens for no one.
    let lead = match place {
        Place::Alone => true,
        Place::Group(dist, _) => dist.is_lead(),
    };
    let held_out = config.eval.as_ref().filter(|_| lead).map(|e| HeldOut {
        every: e.every,
        prompts: e.prompts,
        samples: e.samples,
    });
    // The starting parameters, for the eval's distance; a resumed run rebuilds them from
    // the config (the checkpoint or the seed).
    let init = if held_out.is_some() {
        Some(if start == 0 {
            params.clone()
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
    let reward = RewardLoop::new(task, codec, settings, init)?;
    Ok(decoder.rewarded(reward, held_out))
}
