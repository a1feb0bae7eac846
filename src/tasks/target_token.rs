//! `target_token`: a reward any language model can learn, for smoke tests and tutorials.
//!
//! Prompts are short random token-id sequences (no tokenizer needed, so it runs on a model
//! with random weights); the reward of a completion is the fraction of its generated
//! tokens equal to one chosen id (an empty completion scores 0). A population that moves
//! probability mass toward that id raises its mean reward, which makes the task a direct
//! check that the reward loop's update points the right way.

use crate::hlo::prng::fold_in;

use super::draw::{task_key, Draws};
use super::TaskError;

const TRAIN_TAG: u32 = 0x7474_7472; // "tttr"
const HELD_OUT_TAG: u32 = 0x7474_6576; // "ttev"
const HELD_OUT_SEED: u64 = 0x7461_7267_6574; // "target"

/// `target_token` settings.
#[derive(Clone, Debug, PartialEq)]
pub struct TargetTokenConfig {
    /// The id whose frequency is the reward.
    pub token: u32,
    /// Ids the prompts are drawn from: `0..vocab`.
    pub vocab: u32,
    /// Tokens per prompt (at least 1).
    pub prompt_tokens: usize,
}

/// The task (see the [module docs](self)).
#[derive(Clone, Debug)]
pub struct TargetToken {
    config: TargetTokenConfig,
}

impl TargetToken {
    /// A task with `config`; the token must lie in the vocabulary.
    pub fn new(config: TargetTokenConfig) -> Result<TargetToken, TaskError> {
        if config.vocab == 0 || config.token >= config.vocab {
            return Err(TaskError::Config(format!(
                "target_token token = {} must be below the vocabulary size {}",
                config.token, config.vocab
            )));
        }
        if config.prompt_tokens == 0 {
            return Err(TaskError::Config(
                "target_token prompt_tokens = 0: use at least one token per prompt".into(),
            ));
        }
        Ok(TargetToken { config })
    }

    /// The settings.
    pub fn config(&self) -> &TargetTokenConfig {
        &self.config
    }

    fn prompts(
        &self,
        root: crate::hlo::prng::Key,
        count: usize,
    ) -> Result<Vec<Vec<u32>>, TaskError> {
        let count = u32::try_from(count)
            .map_err(|_| TaskError::Config(format!("{count} prompts: at most 2^32 − 1")))?;
        Ok((0..count)
            .map(|i| {
                let mut d = Draws::new(fold_in(root, i));
                (0..self.config.prompt_tokens)
                    // Below vocab, a u32.
                    .map(|_| d.below(u64::from(self.config.vocab)) as u32)
                    .collect()
            })
            .collect())
    }

    /// `count` training prompts of `generation`, a function of `(seed, generation, count)`.
    pub fn train(
        &self,
        seed: u64,
        generation: u32,
        count: usize,
    ) -> Result<Vec<Vec<u32>>, TaskError> {
        self.prompts(fold_in(task_key(seed, TRAIN_TAG)?, generation), count)
    }

    /// The first `count` held-out prompts (independent of the run seed).
    pub fn held_out(&self, count: usize) -> Result<Vec<Vec<u32>>, TaskError> {
        self.prompts(task_key(HELD_OUT_SEED, HELD_OUT_TAG)?, count)
    }

    /// The reward of `completion`: the fraction of its ids equal to the token.
    pub fn reward(&self, completion: &[u32]) -> f32 {
        reward(self.config.token, completion)
    }
}

/// The fraction of `completion`'s ids equal to `token` (0 for an empty completion).
pub fn reward(token: u32, completion: &[u32]) -> f32 {
    if completion.is_empty() {
        return 0.0;
    }
    let hits = completion.iter().filter(|&&t| t == token).count();
    (hits as f64 / completion.len() as f64) as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reward_is_the_fraction_of_the_token() {
        assert_eq!(reward(3, &[]), 0.0);
        assert_eq!(reward(3, &[3, 1, 3, 2]), 0.5);
        assert_eq!(reward(3, &[3, 3]), 1.0);
    }

    #[test]
    fn prompts_are_deterministic_and_in_range() {
        let t = TargetToken::new(TargetTokenConfig {
            token: 5,
            vocab: 16,
            prompt_tokens: 4,
        })
        .unwrap();
        let a = t.train(7, 3, 5).unwrap();
        assert_eq!(a, t.train(7, 3, 5).unwrap());
        assert_ne!(a, t.train(7, 4, 5).unwrap());
        assert_eq!(&t.train(7, 3, 8).unwrap()[..5], &a[..]);
        assert!(a.iter().flatten().all(|&i| i < 16));
        assert_eq!(t.held_out(2).unwrap(), t.held_out(3).unwrap()[..2]);
        assert!(TargetToken::new(TargetTokenConfig {
            token: 16,
            vocab: 16,
            prompt_tokens: 4
        })
        .is_err());
    }
}
