//! Problems: a model with its initial parameters, its batch and the run's key, derived the
//! way `shared/spec/` derives them, so a library user and `shardes run` start from the same
//! numbers for the same seed.
//!
//! `key = key(seed)`; the parameters come from `key` (or a checkpoint); a drawn batch comes
//! from `fold_in(key, 1)`. The trainer takes `key` as the ES state and folds the generation
//! in on the device.

use shardes_hlo::es::Model;
use shardes_hlo::params::{Array, ParamError, ParamTree};
use shardes_hlo::prng::{fold_in, key, Key};
use shardes_hlo::problems::transformer_block::TransformerBlock;
use thiserror::Error;

pub mod control;
#[cfg(feature = "models")]
pub mod qwen2;

/// Everything a generation program is built from besides the ES settings.
pub struct Problem {
    /// The model whose loss is the fitness.
    pub model: Box<dyn Model>,
    /// Initial parameters.
    pub params: ParamTree,
    /// The batch arrays in [`Model::batch_types`] order.
    pub batch: Vec<Array>,
    /// The run's key, `key(seed)`.
    pub key: Key,
    /// One line describing the model and batch, for run headers.
    pub summary: String,
}

/// The input of a problem constructor that an [`ProblemError::Input`] is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Setting {
    /// The seed the key is drawn from.
    Seed,
    /// A Hugging Face checkpoint directory.
    Checkpoint,
    /// A random-model preset (`tiny`, `0.5b`, `1.5b`).
    Size,
    /// A `tokenizer.json`.
    Tokenizer,
    /// A prompt/target JSONL file.
    Data,
    /// Sequences per batch.
    Batch,
    /// Tokens per sequence.
    Seq,
}

impl Setting {
    /// The setting's name, as error messages begin with it.
    pub fn name(self) -> &'static str {
        match self {
            Setting::Seed => "seed",
            Setting::Checkpoint => "checkpoint",
            Setting::Size => "size",
            Setting::Tokenizer => "tokenizer",
            Setting::Data => "data",
            Setting::Batch => "batch",
            Setting::Seq => "seq",
        }
    }
}

/// Errors building a problem.
#[derive(Debug, Error)]
pub enum ProblemError {
    /// An input the caller chose cannot be used.
    #[error("{message}; {fix}")]
    Input {
        /// Which input.
        setting: Setting,
        /// What is wrong, starting with the setting's [`Setting::name`] (e.g. `seq = 2: …`,
        /// `data d.jsonl:3: …`), so a caller can qualify it with its own prefix.
        message: String,
        /// How to fix it.
        fix: String,
    },
    /// Drawing parameters or a batch on the host failed.
    #[error("{what}")]
    Host {
        /// What was being computed.
        what: String,
        /// The cause.
        #[source]
        source: shardes_hlo::problems::ProblemError,
    },
    /// Assembling an array failed.
    #[error(transparent)]
    Param(#[from] ParamError),
}

impl ProblemError {
    pub(crate) fn input(setting: Setting, message: String, fix: impl Into<String>) -> Self {
        ProblemError::Input {
            setting,
            message,
            fix: fix.into(),
        }
    }

    pub(crate) fn host(
        what: impl Into<String>,
    ) -> impl FnOnce(shardes_hlo::problems::ProblemError) -> Self {
        let what = what.into();
        move |source| ProblemError::Host { what, source }
    }
}

/// `key(seed)`, or the error naming the seed.
pub(crate) fn run_key(seed: u64) -> Result<Key, ProblemError> {
    key(seed).map_err(|e| {
        ProblemError::input(
            Setting::Seed,
            format!("seed = {seed}: {e}"),
            "use a seed below 2^63",
        )
    })
}

impl Problem {
    /// The transformer_block problem: `params = init(key)`, `batch = make_batch(fold_in(key,
    /// 1))` (`x` and `target`), `key = key(seed)`.
    pub fn transformer_block(tb: TransformerBlock, seed: u64) -> Result<Problem, ProblemError> {
        let k = run_key(seed)?;
        let params = tb.init(k).map_err(ProblemError::host(
            "initialising transformer_block parameters",
        ))?;
        let b = tb
            .make_batch(fold_in(k, 1))
            .map_err(ProblemError::host("drawing the transformer_block batch"))?;
        let summary = format!(
            "transformer_block (d_model {}, batch {}, seq {})",
            tb.d_model, tb.batch, tb.seq
        );
        Ok(Problem {
            model: Box::new(tb),
            params,
            batch: vec![b.x, b.target],
            key: k,
            summary,
        })
    }
}
