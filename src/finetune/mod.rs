//! Fine-tuning a language model on a reward computed from what each member generates.
//!
//! One generation of a [`RewardLoop`]:
//! 1. the task picks this generation's prompts, a function of the run seed and the
//!    generation (so a resumed run sees the same prompts);
//! 2. the prompts are rendered (chat template) and tokenized on the host; only their ids
//!    go to the devices;
//! 3. the [`Sampler`] decodes every member on every prompt under that member's
//!    perturbation (one program; the parameters never leave the devices) and returns the
//!    generated ids;
//! 4. the completions are detokenized and scored on host threads; a reward that panics or
//!    returns NaN is contained (that completion ranks worst, the count is reported);
//! 5. the rewards, negated into a loss, go to `tell`: as `[n]` (each member's mean over
//!    the prompts) or, for `group_relative`, as `[n, prompts]` (one group per prompt).
//!
//! [`RewardLoop::evaluate`] decodes the unperturbed parameters greedily on held-out prompts
//! and reports mean reward, accuracy (reward = 1), format rate (reward > 0), mean length
//! and the distance of the parameters from where the run started ([`EvalRecord`]).

mod decoder;
mod evals;
mod evaluator;
mod task;
mod text;

use std::ops::Range;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::distributed::Distributed;
use crate::hlo::params::ParamTree;
use crate::Error;

pub use evals::{read_evals, truncate_evals, EvalWriter};
pub use evaluator::{HeldOut, RewardEvaluator, EVAL_LOG};
pub use task::{join_ids, Completion, Prompt, PromptBatch, RewardTask, TextTask};
pub use text::TextCodec;

/// A population's decoding: what the reward loop asks of it.
///
/// A decode [`crate::Population`] is the implementation (through
/// [`crate::PopulationDecoder`], or inside the [`RewardEvaluator`] of a run); the trait
/// keeps the loop independent of how, and on how many processes, the population is decoded.
pub trait Sampler {
    /// The generation the next [`Sampler::decode`] belongs to.
    fn generation(&self) -> u32;
    /// The global ids of the members [`Sampler::decode`] returns, in order: all `n` on one
    /// process, this process's share in a run across processes.
    fn members(&self) -> Range<usize>;
    /// Each of [`Sampler::members`]' completion of every prompt, `[members][prompts]`,
    /// each cut at its length (EOS and padding removed), under the current generation's
    /// perturbations.
    fn decode(&mut self, prompts: &[Vec<u32>]) -> Result<Vec<Vec<Vec<u32>>>, Error>;
    /// Greedy completions of the unperturbed parameters, one per prompt.
    fn decode_plain(&mut self, prompts: &[Vec<u32>]) -> Result<Vec<Vec<u32>>, Error>;
    /// The parameters, copied to the host.
    fn params(&self) -> Result<ParamTree, Error>;
}

/// Settings of a [`RewardLoop`].
#[derive(Clone, Debug, PartialEq)]
pub struct RewardSettings {
    /// The run seed (prompts derive from it and the generation).
    pub seed: u64,
    /// Training prompts per generation.
    pub prompts: usize,
    /// Whether `tell` takes `[n, prompts]` (one group per prompt, for `group_relative`)
    /// rather than each member's mean reward.
    pub grouped: bool,
}

/// What one generation did.
#[derive(Clone, Debug, PartialEq)]
pub struct GenerationReport {
    /// The generation that ran.
    pub generation: u32,
    /// The fitness handed to `tell` (negated rewards), `[n]` or `[n, prompts]`.
    pub fitness: Vec<f32>,
    /// Every completion's reward, `[n, prompts]` row-major.
    pub rewards: Vec<f32>,
    /// Mean reward over all completions.
    pub mean_reward: f64,
    /// Fraction of completions with reward 1.
    pub accuracy: f64,
    /// Fraction of completions with reward above 0.
    pub format_rate: f64,
    /// Generated tokens, all members and prompts.
    pub tokens: usize,
    /// Seconds spent decoding (device work and transfers).
    pub decode_secs: f64,
    /// Seconds on the host: encoding, detokenizing and scoring.
    pub host_secs: f64,
    /// Completions whose reward failed and was contained.
    pub contained: usize,
}

impl GenerationReport {
    /// Generated tokens per second of decoding.
    pub fn tokens_per_sec(&self) -> f64 {
        if self.decode_secs > 0.0 {
            self.tokens as f64 / self.decode_secs
        } else {
            0.0
        }
    }
}

/// One completion shown in an [`EvalRecord`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EvalSample {
    /// The prompt as given (before the chat template).
    pub prompt: String,
    /// The completion's text.
    pub completion: String,
    /// Its reward.
    pub reward: f32,
}

/// One line of `eval.jsonl`: greedy decoding of the unperturbed parameters on held-out
/// prompts.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EvalRecord {
    /// Generations done when evaluated (0: the starting parameters).
    pub generation: u32,
    /// Held-out prompts decoded.
    pub prompts: usize,
    /// Mean reward.
    pub mean_reward: f64,
    /// Fraction with reward 1.
    pub accuracy: f64,
    /// Fraction with reward above 0.
    pub format_rate: f64,
    /// Mean generated tokens per completion.
    pub mean_length: f64,
    /// `‖θ − θ₀‖₂` over every leaf, θ₀ the parameters the run started from.
    pub l2_from_init: f64,
    /// Completions whose reward failed and was contained.
    pub contained: usize,
    /// The first few completions.
    pub samples: Vec<EvalSample>,
}

/// The reward loop (see the [module docs](self)).
pub struct RewardLoop {
    task: Box<dyn RewardTask>,
    codec: TextCodec,
    settings: RewardSettings,
    init: Option<ParamTree>,
}

fn fraction(rewards: &[f32], keep: impl Fn(f32) -> bool) -> f64 {
    if rewards.is_empty() {
        return 0.0;
    }
    rewards.iter().filter(|&&r| keep(r)).count() as f64 / rewards.len() as f64
}

fn mean(v: impl Iterator<Item = f64>) -> f64 {
    let (s, k) = v.fold((0.0, 0usize), |(s, k), x| (s + x, k + 1));
    if k == 0 {
        0.0
    } else {
        s / k as f64
    }
}

impl RewardLoop {
    /// A loop over `task`'s prompts, encoded by `codec`. `init` (the parameters the run
    /// started from) is what [`EvalRecord::l2_from_init`] measures against; without it
    /// that field is 0.
    pub fn new(
        task: Box<dyn RewardTask>,
        codec: TextCodec,
        settings: RewardSettings,
        init: Option<ParamTree>,
    ) -> Result<RewardLoop, Error> {
        if settings.prompts == 0 {
            return Err(Error::Invalid(
                "task.prompts = 0: decode at least one prompt per generation".into(),
            ));
        }
        Ok(RewardLoop {
            task,
            codec,
            settings,
            init,
        })
    }

    /// The task.
    pub fn task(&self) -> &dyn RewardTask {
        &*self.task
    }

    /// The codec.
    pub fn codec(&self) -> &TextCodec {
        &self.codec
    }

    /// One generation's rewards on this process alone: prompts, `sampler`'s decode,
    /// rewards, and the fitness `tell` takes ([`GenerationReport::fitness`]).
    pub fn score(&mut self, sampler: &mut impl Sampler) -> Result<GenerationReport, Error> {
        self.score_in(sampler, &Distributed::single())
    }

    /// [`RewardLoop::score`] as one process of `dist`, every process together: each picks
    /// the same prompts (they derive from the seed and the generation), decodes and scores
    /// its own members ([`Sampler::members`]); the rewards (with each process's token and
    /// failure counts) are gathered in rank order, which is member order, like the fitness;
    /// every process shapes the same fitness from them, for the population to tell. The
    /// report is the whole population's, the same on every process (but the timings).
    pub fn score_in(
        &mut self,
        sampler: &mut impl Sampler,
        dist: &Distributed,
    ) -> Result<GenerationReport, Error> {
        let t_host = Instant::now();
        let generation = sampler.generation();
        let batch = self
            .task
            .train(self.settings.seed, generation, self.settings.prompts)?;
        let ids = batch
            .prompts
            .iter()
            .map(|p| self.codec.encode(p))
            .collect::<Result<Vec<_>, _>>()?;
        let mut host = t_host.elapsed().as_secs_f64();
        let t_dec = Instant::now();
        let decoded = sampler.decode(&ids)?;
        let decode_secs = t_dec.elapsed().as_secs_f64();
        let t_host = Instant::now();
        let m = sampler.members().len();
        let b = ids.len();
        if decoded.len() != m || decoded.iter().any(|c| c.len() != b) {
            return Err(Error::Invalid(format!(
                "the sampler returned {} members of {:?} completions; expected {m} × {b}",
                decoded.len(),
                decoded.iter().map(Vec::len).collect::<Vec<_>>()
            )));
        }
        let flat: Vec<Vec<u32>> = decoded.into_iter().flatten().collect();
        let tokens: usize = flat.iter().map(Vec::len).sum();
        let completions = self.codec.completions(flat)?;
        let scores = batch.score_from(&completions, sampler.members().start)?;
        host += t_host.elapsed().as_secs_f64();
        let (rewards, tokens, contained) = if dist.size() == 1 {
            (scores.rewards, tokens, scores.contained.len())
        } else {
            gather_rewards(dist, scores.rewards, tokens, scores.contained.len())?
        };
        let t_host = Instant::now();
        let fitness: Vec<f32> = if self.settings.grouped {
            rewards.iter().map(|r| -r).collect()
        } else {
            rewards
                .chunks(b)
                .map(|row| -(mean(row.iter().map(|&r| f64::from(r))) as f32))
                .collect()
        };
        host += t_host.elapsed().as_secs_f64();
        Ok(GenerationReport {
            generation,
            mean_reward: mean(rewards.iter().map(|&r| f64::from(r))),
            accuracy: fraction(&rewards, |r| r == 1.0),
            format_rate: fraction(&rewards, |r| r > 0.0),
            fitness,
            rewards,
            tokens,
            decode_secs,
            host_secs: host,
            contained,
        })
    }

    /// Greedy decoding of `sampler`'s unperturbed parameters on the first `count`
    /// held-out prompts, keeping `samples` completions.
    pub fn evaluate(
        &mut self,
        sampler: &mut impl Sampler,
        count: usize,
        samples: usize,
    ) -> Result<EvalRecord, Error> {
        let batch = self.task.held_out(count)?;
        let ids = batch
            .prompts
            .iter()
            .map(|p| self.codec.encode(p))
            .collect::<Result<Vec<_>, _>>()?;
        let out = sampler.decode_plain(&ids)?;
        if out.len() != ids.len() {
            return Err(Error::Invalid(format!(
                "the sampler returned {} plain completions for {} prompts",
                out.len(),
                ids.len()
            )));
        }
        let mean_length = mean(out.iter().map(|c| c.len() as f64));
        let completions = self.codec.completions(out)?;
        let scores = batch.score_plain(&completions)?;
        let r = &scores.rewards;
        let l2 = match &self.init {
            Some(init) => l2_distance(&sampler.params()?, init)?,
            None => 0.0,
        };
        Ok(EvalRecord {
            generation: sampler.generation(),
            prompts: ids.len(),
            mean_reward: mean(r.iter().map(|&x| f64::from(x))),
            accuracy: fraction(r, |x| x == 1.0),
            format_rate: fraction(r, |x| x > 0.0),
            mean_length,
            l2_from_init: l2,
            contained: scores.contained.len(),
            samples: batch
                .prompts
                .iter()
                .zip(&completions)
                .zip(r)
                .take(samples)
                .map(|((p, c), &reward)| EvalSample {
                    prompt: p.display(),
                    completion: c.text.clone(),
                    reward,
                })
                .collect(),
        })
    }
}

/// Every process's `rewards` (its members' × prompts, row-major), in rank order, with
/// the totals of the processes' `tokens` and `contained` counts: one gather of `rewards`
/// and the two counts (whole numbers, exact in f32 below 2^24, which is checked).
fn gather_rewards(
    dist: &Distributed,
    mut rewards: Vec<f32>,
    tokens: usize,
    contained: usize,
) -> Result<(Vec<f32>, usize, usize), Error> {
    const EXACT: usize = 1 << 24;
    if tokens >= EXACT || contained >= EXACT {
        return Err(Error::Invalid(format!(
            "a process generated {tokens} tokens ({contained} contained rewards) in one \
             generation, beyond the 2^24 the reward gather counts exactly; lower task.prompts \
             or task.max_new_tokens"
        )));
    }
    let per = rewards.len() + 2;
    rewards.push(tokens as f32);
    rewards.push(contained as f32);
    let all = dist.gather_fitness(&rewards)?;
    if all.len() != per * dist.size() {
        return Err(Error::Invalid(format!(
            "the reward gather returned {} values for {} processes of {per}",
            all.len(),
            dist.size()
        )));
    }
    let (mut out, mut tokens, mut contained) = (Vec::with_capacity(all.len()), 0, 0);
    for part in all.chunks(per) {
        out.extend_from_slice(&part[..per - 2]);
        // Whole numbers below 2^24 on every process: exact.
        tokens += part[per - 2] as usize;
        contained += part[per - 1] as usize;
    }
    Ok((out, tokens, contained))
}

/// `‖a − b‖₂` over every leaf, accumulated in f64; the trees must have the same leaves.
pub fn l2_distance(a: &ParamTree, b: &ParamTree) -> Result<f64, Error> {
    let (la, lb) = (a.leaves(), b.leaves());
    if la.len() != lb.len() {
        return Err(Error::Invalid(format!(
            "parameter trees differ: {} leaves against {}",
            la.len(),
            lb.len()
        )));
    }
    let mut sum = 0.0f64;
    for ((pa, x), (pb, y)) in la.iter().zip(&lb) {
        if pa != pb || x.shape() != y.shape() {
            return Err(Error::Invalid(format!(
                "parameter trees differ at {pa} {:?} / {pb} {:?}",
                x.shape(),
                y.shape()
            )));
        }
        sum += x
            .data()
            .iter()
            .zip(y.data())
            .map(|(&p, &q)| {
                let d = f64::from(p) - f64::from(q);
                d * d
            })
            .sum::<f64>();
    }
    Ok(sum.sqrt())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tasks::target_token::{TargetToken, TargetTokenConfig};

    /// Member `i` answers every prompt with `i` copies of token 1 then one token 2.
    struct Fixed {
        n: usize,
        generation: u32,
    }

    impl Sampler for Fixed {
        fn members(&self) -> Range<usize> {
            0..self.n
        }
        fn generation(&self) -> u32 {
            self.generation
        }
        fn decode(&mut self, prompts: &[Vec<u32>]) -> Result<Vec<Vec<Vec<u32>>>, Error> {
            Ok((0..self.n)
                .map(|i| {
                    prompts
                        .iter()
                        .map(|_| {
                            let mut c = vec![1; i];
                            c.push(2);
                            c
                        })
                        .collect()
                })
                .collect())
        }
        fn decode_plain(&mut self, prompts: &[Vec<u32>]) -> Result<Vec<Vec<u32>>, Error> {
            Ok(prompts.to_vec())
        }
        fn params(&self) -> Result<ParamTree, Error> {
            Ok(ParamTree::map(Vec::<(String, ParamTree)>::new()))
        }
    }

    /// A loop over `task` decoding `prompts` prompts a generation, ids as text.
    fn reward_loop(task: TargetToken, prompts: usize, grouped: bool) -> RewardLoop {
        let settings = RewardSettings {
            seed: 0,
            prompts,
            grouped,
        };
        let codec = TextCodec::new(None, None, None);
        RewardLoop::new(Box::new(task), codec, settings, None).unwrap()
    }

    fn target(token: u32, vocab: u32, prompt_tokens: usize) -> TargetToken {
        TargetToken::new(TargetTokenConfig {
            token,
            vocab,
            prompt_tokens,
        })
        .unwrap()
    }

    fn run(grouped: bool) -> (GenerationReport, Vec<Vec<f32>>) {
        let mut sampler = Fixed {
            n: 3,
            generation: 0,
        };
        let mut lp = reward_loop(target(1, 8, 3), 2, grouped);
        let r = lp.score(&mut sampler).unwrap();
        // What the population tells with.
        let told = vec![r.fitness.clone()];
        (r, told)
    }

    #[test]
    fn fitness_is_the_negated_reward_per_member_or_per_prompt() {
        let (r, told) = run(false);
        // Member i's completions are i ones and a two: reward i / (i + 1).
        assert_eq!(r.rewards, vec![0.0, 0.0, 0.5, 0.5, 2.0 / 3.0, 2.0 / 3.0]);
        assert_eq!(told, vec![vec![-0.0, -0.5, -(2.0f32 / 3.0)]]);
        assert_eq!(r.tokens, 2 * (1 + 2 + 3));
        let (_, grouped) = run(true);
        assert_eq!(grouped[0].len(), 6);
        assert_eq!(grouped[0][3], -0.5);
    }

    #[test]
    fn evaluation_scores_the_plain_completions() {
        let task = target(1, 2, 4);
        let held = TargetToken::held_out(&task, 5).unwrap();
        let expect: Vec<f64> = held
            .iter()
            .map(|p| f64::from(crate::tasks::target_token::reward(1, p)))
            .collect();
        let mut sampler = Fixed {
            n: 2,
            generation: 4,
        };
        let mut lp = reward_loop(task, 1, false);
        let e = lp.evaluate(&mut sampler, 5, 2).unwrap();
        assert_eq!(e.generation, 4);
        assert_eq!(e.prompts, 5);
        assert!((e.mean_reward - expect.iter().sum::<f64>() / 5.0).abs() < 1e-6);
        assert_eq!(e.mean_length, 4.0);
        assert_eq!(e.samples.len(), 2);
    }
}

#[cfg(test)]
mod containment {
    use super::*;
    use crate::tasks::{Reward, Task, TaskError, TaskItem};

    struct Item(String);
    impl TaskItem for Item {
        fn prompt(&self) -> &str {
            &self.0
        }
    }

    /// A reward that returns NaN for completions containing "9" and panics on "8".
    struct Hostile;
    impl Reward<Item> for Hostile {
        fn score(&self, _: &Item, completion: &str) -> f32 {
            if completion.contains('8') {
                panic!("hostile reward");
            }
            if completion.contains('9') {
                f32::NAN
            } else {
                completion.len() as f32
            }
        }
    }

    struct Echo;
    impl Task for Echo {
        type Item = Item;
        fn name(&self) -> &str {
            "echo"
        }
        fn train(&self, _: u64, _: u32, count: usize) -> Result<Vec<Item>, TaskError> {
            Ok((0..count).map(|i| Item(i.to_string())).collect())
        }
        fn held_out(&self, count: usize) -> Result<Vec<Item>, TaskError> {
            self.train(0, 0, count)
        }
        fn reward(&self) -> &dyn Reward<Item> {
            &Hostile
        }
    }

    /// Member `i` answers with ids `[i; i + 1]` (text: the ids joined).
    struct Members(usize);
    impl Sampler for Members {
        fn members(&self) -> Range<usize> {
            0..self.0
        }
        fn generation(&self) -> u32 {
            0
        }
        fn decode(&mut self, prompts: &[Vec<u32>]) -> Result<Vec<Vec<Vec<u32>>>, Error> {
            Ok((0..self.0)
                .map(|i| prompts.iter().map(|_| vec![i as u32; i + 1]).collect())
                .collect())
        }
        fn decode_plain(&mut self, prompts: &[Vec<u32>]) -> Result<Vec<Vec<u32>>, Error> {
            Ok(prompts.to_vec())
        }
        fn params(&self) -> Result<ParamTree, Error> {
            Ok(ParamTree::map(Vec::<(String, ParamTree)>::new()))
        }
    }

    /// A NaN and a panicking reward are contained: those members rank last with a finite
    /// fitness, and the count is reported.
    #[test]
    fn failing_rewards_rank_worst_and_are_counted() {
        let codec = TextCodec::new(None, None, None);
        let settings = RewardSettings {
            seed: 0,
            prompts: 2,
            grouped: false,
        };
        // Prompts are text; a codec without a tokenizer refuses them, so feed ids.
        let task = TextTask::new(Echo);
        let mut lp = RewardLoop::new(Box::new(task), codec, settings, None).unwrap();
        let e = lp.score(&mut Members(10)).unwrap_err().to_string();
        assert!(e.contains("needs a tokenizer"), "{e}");

        let scores = TextTask::new(Echo)
            .train(0, 0, 1)
            .unwrap()
            .score(&[
                Completion {
                    ids: vec![],
                    text: "1 1".into(),
                },
                Completion {
                    ids: vec![],
                    text: "9".into(),
                },
                Completion {
                    ids: vec![],
                    text: "8".into(),
                },
            ])
            .unwrap();
        let hook = std::panic::take_hook();
        std::panic::set_hook(hook);
        assert_eq!(scores.contained.len(), 2);
        assert!(scores.rewards.iter().all(|r| r.is_finite()));
        assert!(scores.rewards[1] < scores.rewards[0] && scores.rewards[2] < scores.rewards[0]);
    }
}
