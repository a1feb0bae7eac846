//! `target_token`: random prompts, rewarded by how often one token id is generated
//! ([`shardes::tasks::target_token`]), as the CLI reads them: its own `[task]` keys (each
//! key's doc comment is what `shardes init` writes above it), how they build the task and
//! what its reward means (a frequency: no rate beside the mean, the default `rates`).

use shardes::tasks::command::RewardCommand;
use shardes::tasks::target_token::{TargetToken, TargetTokenConfig};

use super::{required, Built, OwnKeys};
use crate::config::ConfigError;
use crate::taskset::task_error;

own_keys! {
    /// `target_token`'s own keys.
    pub struct TargetTokenKeys {
        /// The id whose frequency in a completion is its reward.
        pub token: Option<u32> = needed("1"),
        /// Tokens per random prompt. Default: 4.
        pub prompt_tokens: Option<usize> = optional("4"),
    }
}

impl TargetTokenKeys {
    /// `token`, which the task needs.
    fn token(&self) -> Result<u32, ConfigError> {
        let hint = "set task.token to the id whose frequency is the reward";
        required(&self.token, "target_token", "token", hint).copied()
    }
}

impl OwnKeys for TargetTokenKeys {
    fn text(&self) -> bool {
        false
    }

    fn check(&self) -> Result<(), ConfigError> {
        self.token().map(|_| ())
    }

    /// The completions are token ids: no reward program scores them (`[task.reward]` is
    /// refused for this task), so `_command` is always `None`.
    fn build(&self, vocab: usize, _command: Option<RewardCommand>) -> Built {
        let config = TargetTokenConfig {
            token: self.token()?,
            vocab: u32::try_from(vocab).unwrap_or(u32::MAX),
            prompt_tokens: self.prompt_tokens.unwrap_or(4),
        };
        Ok(Box::new(TargetToken::new(config).map_err(task_error)?))
    }
}
