//! Problems: a model with its initial parameters, its batch and the run's key, derived the
//! way `shared/spec/` derives them, so a library user and `shardes run` start from the same
//! numbers for the same seed.
//!
//! `key = key(seed)`; the parameters come from `key` (or a checkpoint); a drawn batch comes
//! from `fold_in(key, 1)`. The trainer takes `key` as the ES state and folds the generation
//! in on the device.
//!
//! A [`ProblemShapes`] is the same problem described by shape alone: the model, the leaves'
//! paths and shapes and the host bytes the arrays would need, without allocating them. It
//! is all a program needs to be printed or checked, and it is what the memory check
//! ([`memory`]) runs on before the real [`Problem`] is built.

use shardes_hlo::es::{LeafInfo, Model};
use shardes_hlo::params::{Array, ParamError, ParamTree};
use shardes_hlo::prng::{fold_in, key, Key};
use shardes_hlo::problems::transformer_block::TransformerBlock;
use shardes_hlo::problems::{f32_bytes, leaf_infos_of_shapes};
use thiserror::Error;

pub mod control;
pub mod memory;
pub mod mjcf;
pub mod quadratic;
#[cfg(feature = "models")]
pub mod qwen2;

use memory::{HostBytes, MemoryError};

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
    /// The problem's arrays need more host memory than the machine has available; the
    /// message names both figures and the settings to lower.
    #[error(transparent)]
    Memory(#[from] MemoryError),
}

/// A problem described by shape alone: what [`Problem`] holds, without the parameters'
/// and the batch's values (see the module documentation).
pub struct ProblemShapes {
    /// The model whose loss is the fitness.
    pub model: Box<dyn Model>,
    /// The parameters' leaves (JAX leaf order), as [`shardes_hlo::es::leaf_infos`] gives
    /// them for the parameters the [`Problem`] would hold.
    pub leaves: Vec<LeafInfo>,
    /// The run's key, `key(seed)`.
    pub key: Key,
    /// The line [`Problem::summary`] would hold.
    pub summary: String,
    /// The host bytes the [`Problem`]'s arrays need while it is built.
    pub host_bytes: HostBytes,
    /// What needs the memory and which settings lower it, for [`MemoryError`].
    memory_what: String,
    memory_lower: &'static str,
}

impl ProblemShapes {
    /// Refuses the problem when its [`Self::host_bytes`] exceed the host memory available
    /// now ([`memory::available`]), with an error naming both and the settings to lower.
    pub fn check_host_memory(&self) -> Result<(), ProblemError> {
        memory::require(
            self.host_bytes.total(),
            || self.memory_what.clone(),
            self.memory_lower,
        )?;
        Ok(())
    }
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
    /// The shapes of [`Self::transformer_block`]: six `(d, d)` leaves and the batch
    /// `(batch, seq, d)` twice, nothing allocated.
    pub fn transformer_block_shapes(
        tb: TransformerBlock,
        seed: u64,
    ) -> Result<ProblemShapes, ProblemError> {
        let k = run_key(seed)?;
        let named = tb.param_shapes();
        let leaves = leaf_infos_of_shapes(&named).map_err(ProblemError::host(
            "describing the transformer_block parameters",
        ))?;
        let leaf = f32_bytes([[tb.d_model, tb.d_model].as_slice()]);
        let x = f32_bytes([tb.batch_shape().as_slice()]);
        let host_bytes = HostBytes {
            params: f32_bytes(named.iter().map(|(_, s)| s.as_slice())),
            largest_leaf: leaf,
            batch: x.saturating_mul(2),
        };
        Ok(ProblemShapes {
            model: Box::new(tb),
            leaves,
            key: k,
            summary: transformer_block_summary(&tb),
            host_bytes,
            memory_what: format!(
                "transformer_block with d_model = {}, batch = {}, seq = {} (its parameters \
                 and batch)",
                tb.d_model, tb.batch, tb.seq
            ),
            memory_lower: "d_model (or batch and seq)",
        })
    }

    /// The transformer_block problem: `params = init(key)`, `batch = make_batch(fold_in(key,
    /// 1))` (`x` and `target`), `key = key(seed)`. Refused with [`ProblemError::Memory`]
    /// before anything is drawn when the arrays would not fit the host's memory.
    pub fn transformer_block(tb: TransformerBlock, seed: u64) -> Result<Problem, ProblemError> {
        Self::transformer_block_shapes(tb, seed)?.check_host_memory()?;
        let k = run_key(seed)?;
        let params = tb.init(k).map_err(ProblemError::host(
            "initialising transformer_block parameters",
        ))?;
        let b = tb
            .make_batch(fold_in(k, 1))
            .map_err(ProblemError::host("drawing the transformer_block batch"))?;
        Ok(Problem {
            model: Box::new(tb),
            params,
            batch: vec![b.x, b.target],
            key: k,
            summary: transformer_block_summary(&tb),
        })
    }
}

fn transformer_block_summary(tb: &TransformerBlock) -> String {
    format!(
        "transformer_block (d_model {}, batch {}, seq {})",
        tb.d_model, tb.batch, tb.seq
    )
}
