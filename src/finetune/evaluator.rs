//! [`RewardEvaluator`]: a population's fitness from decoding and a reward on the host,
//! with held-out evaluations on a schedule into `eval.jsonl`.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

use crate::decode::Decode;
use crate::distributed::Distributed;
use crate::population::{Core, Evaluator, Fitness, Population};
use crate::Error;

use super::decoder::Decoding;
use super::{truncate_evals, EvalRecord, EvalWriter, GenerationReport, RewardLoop};

/// The eval log's file name in a run directory.
pub const EVAL_LOG: &str = "eval.jsonl";

/// When and how much a reward run evaluates on held-out prompts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeldOut {
    /// Generations between evaluations (also at 0 and at the end; 0: only there).
    pub every: usize,
    /// Held-out prompts each evaluation decodes.
    pub prompts: usize,
    /// Completions kept in each record.
    pub samples: usize,
}

/// Decoding every member on this generation's prompts, the reward on the host, the
/// negated rewards as the fitness; held-out evaluations of the unperturbed parameters
/// where [`HeldOut`] asks.
pub struct RewardEvaluator {
    decode: Decode,
    reward: RewardLoop,
    held_out: Option<HeldOut>,
    log: Option<EvalWriter>,
    last_eval: Option<u32>,
    last: Option<(GenerationReport, f64)>,
}

impl Population<Decode> {
    /// This decoder as a reward run: its fitness from `reward`, held-out evaluations where
    /// `held_out` asks (give it only to the process that writes the log).
    pub fn rewarded(
        self,
        reward: RewardLoop,
        held_out: Option<HeldOut>,
    ) -> Population<RewardEvaluator> {
        let (core, decode) = self.into_parts();
        Population::from_parts(
            core,
            RewardEvaluator {
                decode,
                reward,
                held_out,
                log: None,
                last_eval: None,
                last: None,
            },
        )
    }
}

impl RewardEvaluator {
    /// The last generation's report (none before the first).
    pub fn last_report(&self) -> Option<&GenerationReport> {
        self.last.as_ref().map(|(r, _)| r)
    }

    /// The reward loop (task, codec).
    pub fn reward(&self) -> &RewardLoop {
        &self.reward
    }

    /// Evaluates on the held-out prompts now, whatever the schedule (none without
    /// [`HeldOut`]).
    pub fn evaluate_held_out(&mut self, core: &Core) -> Result<Option<EvalRecord>, Error> {
        let Some(h) = self.held_out else {
            return Ok(None);
        };
        let mut view = Decoding {
            core,
            decode: &self.decode,
        };
        self.reward
            .evaluate(&mut view, h.prompts, h.samples)
            .map(Some)
    }
}

impl Evaluator for RewardEvaluator {
    fn evaluate(&mut self, core: &mut Core, dist: &Distributed) -> Result<Fitness, Error> {
        let t0 = Instant::now();
        let mut view = Decoding {
            core,
            decode: &self.decode,
        };
        let r = self.reward.score_in(&mut view, dist)?;
        let fitness = r.fitness.clone();
        self.last = Some((r, t0.elapsed().as_secs_f64()));
        Ok(Fitness::All(fitness))
    }

    /// The mean reward, accuracy, format rate, tokens per second, the host's share of
    /// the evaluation and (when any) the contained reward failures, the whole
    /// population's.
    fn metrics(&self) -> BTreeMap<String, f64> {
        let mut extra = BTreeMap::new();
        let Some((r, secs)) = &self.last else {
            return extra;
        };
        extra.insert("reward".to_string(), r.mean_reward);
        extra.insert("accuracy".to_string(), r.accuracy);
        extra.insert("format".to_string(), r.format_rate);
        extra.insert("tok/s".to_string(), r.tokens_per_sec());
        // Encoding, detokenizing and scoring: the part of a generation on the host.
        extra.insert("host_share".to_string(), r.host_secs / secs.max(1e-12));
        if r.contained > 0 {
            extra.insert("contained".to_string(), r.contained as f64);
        }
        extra
    }

    fn attach(&mut self, dir: &Path, start: u32) -> Result<(), Error> {
        if self.held_out.is_none() {
            return Ok(());
        }
        let path = dir.join(EVAL_LOG);
        if start > 0 {
            truncate_evals(&path, start)?;
        }
        self.log = Some(EvalWriter::open(&path)?);
        Ok(())
    }

    /// Due at 0, every `every` generations and at the end of the run; once per
    /// generation count.
    fn held_out(&mut self, core: &Core, done: u32, last: bool) -> Result<Option<String>, Error> {
        let Some(h) = self.held_out else {
            return Ok(None);
        };
        let due = done == 0 || last || (h.every > 0 && (done as usize).is_multiple_of(h.every));
        if !due || self.last_eval == Some(done) {
            return Ok(None);
        }
        let Some(rec) = self.evaluate_held_out(core)? else {
            return Ok(None);
        };
        if let Some(w) = &mut self.log {
            w.append(&rec)?;
        }
        self.last_eval = Some(done);
        Ok(Some(rec.line()))
    }
}

impl EvalRecord {
    /// The one-line summary a run prints.
    pub fn line(&self) -> String {
        format!(
            "eval gen {}: reward {:.4} accuracy {:.3} format {:.3} length {:.1} |Δθ| {:.4} ({} \
             prompts)",
            self.generation,
            self.mean_reward,
            self.accuracy,
            self.format_rate,
            self.mean_length,
            self.l2_from_init,
            self.prompts
        )
    }
}
