//! `countdown`: TinyZero's arithmetic puzzles ([`shardes::tasks::countdown`]), as the CLI
//! reads them: its own `[task]` keys (each key's doc comment is what `shardes init` writes
//! above it), how they build the task and what its reward means.

use shardes::tasks::command::RewardCommand;
use shardes::tasks::countdown::{CountdownConfig, CountdownTask, PromptStyle};

use super::{Built, OwnKeys, Rates};
use crate::config::ConfigError;
use crate::taskset::{task_error, text_task};

own_keys! {
    /// `countdown`'s own keys.
    pub struct CountdownKeys {
        /// Fewest numbers per puzzle. Default: 3.
        pub min_numbers: Option<usize> = optional("3"),
        /// Most numbers per puzzle. Default: 4.
        pub max_numbers: Option<usize> = optional("4"),
        /// Smallest number drawn. Default: 1.
        pub min_number: Option<u32> = optional("1"),
        /// Largest number drawn. Default: 99.
        pub max_number: Option<u32> = optional("99"),
        /// Targets lie in 1..=max_target. Default: 100.
        pub max_target: Option<i64> = optional("100"),
        /// Seed of the held-out puzzles (disjoint from every training puzzle). Default: 0.
        pub eval_seed: Option<u64> = optional("0"),
        /// Prompt wording: "instruction" (TinyZero's user message; with chat = true for
        /// Instruct models), "base" (TinyZero's framing for base models) or "compact" (one
        /// short line, for tiny models). Default: "instruction".
        pub style: Option<String> = optional("\"base\""),
    }
}

impl CountdownKeys {
    /// The prompt wording `style` names (checked by [`OwnKeys::check`]).
    fn style(&self) -> PromptStyle {
        match self.style.as_deref() {
            Some("base") => PromptStyle::Base,
            Some("compact") => PromptStyle::Compact,
            _ => PromptStyle::Instruction,
        }
    }
}

impl OwnKeys for CountdownKeys {
    fn check(&self) -> Result<(), ConfigError> {
        match &self.style {
            Some(style) if !["instruction", "base", "compact"].contains(&style.as_str()) => {
                Err(ConfigError::new(
                    format!("task.style = \"{style}\""),
                    "use \"instruction\", \"base\" or \"compact\"",
                ))
            }
            _ => Ok(()),
        }
    }

    fn build(&self, _vocab: usize, command: Option<RewardCommand>) -> Built {
        let d = CountdownConfig::default();
        let c = CountdownConfig {
            min_numbers: self.min_numbers.unwrap_or(d.min_numbers),
            max_numbers: self.max_numbers.unwrap_or(d.max_numbers),
            min_number: self.min_number.unwrap_or(d.min_number),
            max_number: self.max_number.unwrap_or(d.max_number),
            max_target: self.max_target.unwrap_or(d.max_target),
            eval_seed: self.eval_seed.unwrap_or(d.eval_seed),
            prompt: self.style(),
        };
        let task = CountdownTask::new(c).map_err(task_error)?;
        Ok(text_task(task, command))
    }

    /// 1 correct, 0.1 well formed, 0 otherwise.
    fn rates(&self) -> Rates {
        Rates {
            accuracy: true,
            format: true,
        }
    }
}
