//! `jsonl`: prompts and answers from JSONL files ([`shardes::tasks::jsonl`]), as the CLI
//! reads them: its own `[task]` keys (each key's doc comment is what `shardes init` writes
//! above it), how they build the task and what its reward means.

use std::path::{Path, PathBuf};

use shardes::tasks::command::RewardCommand;
use shardes::tasks::jsonl::JsonlTask;

use super::{required, Built, OwnKeys, Rates};
use crate::config::ConfigError;
use crate::taskset::{task_error, text_task};

own_keys! {
    /// `jsonl`'s own keys.
    pub struct JsonlKeys {
        /// FILL IN: a JSONL file, one {"prompt": "...", "answer": "..."} per line; the
        /// reward is an exact match of the last number or the <answer> content.
        pub train: Option<PathBuf> = needed("\"path/to/train.jsonl\""),
        /// A held-out JSONL file for [eval]. Default: the training file's lines marked held
        /// out.
        pub held_out: Option<PathBuf> = optional("\"path/to/test.jsonl\""),
    }
}

impl JsonlKeys {
    /// `train`, which the task needs.
    fn train(&self) -> Result<&Path, ConfigError> {
        let hint =
            "set task.train to a JSONL file with one {\"prompt\": ..., \"answer\": ...} per line";
        required(&self.train, "jsonl", "train", hint).map(PathBuf::as_path)
    }
}

impl OwnKeys for JsonlKeys {
    fn check(&self) -> Result<(), ConfigError> {
        self.train().map(|_| ())
    }

    fn input_files(&self) -> Vec<(String, PathBuf)> {
        let keys = [
            ("task.train", &self.train),
            ("task.held_out", &self.held_out),
        ];
        keys.into_iter()
            .filter_map(|(key, p)| Some((key.to_string(), p.clone()?)))
            .collect()
    }

    fn build(&self, _vocab: usize, command: Option<RewardCommand>) -> Built {
        let task = JsonlTask::open(self.train()?, self.held_out.as_deref()).map_err(task_error)?;
        Ok(text_task(task, command))
    }

    /// An exact match: 1 or 0, no partial credit for the format.
    fn rates(&self) -> Rates {
        Rates {
            accuracy: true,
            format: false,
        }
    }
}
