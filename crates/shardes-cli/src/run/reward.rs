//! A `[task]` run: each generation decodes every member on fresh prompts, scores the text
//! on the host and hands the negated rewards to `tell`; `[eval]` decodes the unperturbed
//! parameters on held-out prompts into `OUT/eval.jsonl`.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result};
use shardes::finetune::{EvalRecord, EvalWriter, RewardLoop, Sampler};
use shardes::hlo::params::ParamTree;
use shardes::BuildTimes;

use super::engine::StepOut;
use crate::config::EvalConfig;

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

    /// One generation; the metrics' extras are the mean reward, accuracy, format rate,
    /// tokens per second and (when any) the contained reward failures.
    pub fn step(&mut self) -> Result<StepOut> {
        let r = self.lp.step()?;
        let mut extra = BTreeMap::new();
        extra.insert("reward".to_string(), r.mean_reward);
        extra.insert("accuracy".to_string(), r.accuracy);
        extra.insert("format".to_string(), r.format_rate);
        extra.insert("tok/s".to_string(), r.tokens_per_sec());
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

/// The progress line of an evaluation.
fn eval_line(r: &EvalRecord) -> String {
    format!(
        "eval gen {}: reward {:.4} accuracy {:.3} format {:.3} length {:.1} |Δθ| {:.4} ({} prompts)",
        r.generation, r.mean_reward, r.accuracy, r.format_rate, r.mean_length, r.l2_from_init,
        r.prompts
    )
}

/// Builds the reward run of `s` (a config with a `[task]`), resuming at `start`.
pub(crate) fn build(s: &crate::setup::Setup, start: u32) -> Result<RewardRun> {
    let _ = (s, start);
    anyhow::bail!("[task] runs are not wired in this build yet")
}
