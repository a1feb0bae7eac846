//! Example problems: each defines its parameters (`init`), its data (`make_batch`) and, as
//! emitted programs, its forward pass and loss.
//!
//! The host functions here produce the exact numbers of `shared/spec/` (they draw from the
//! JAX-compatible PRNG in [`crate::prng`]), so a run started from Rust and one started from
//! the JAX reference begin from the same parameters and see the same batch.

use thiserror::Error;

use crate::params::ParamError;
use crate::prng::PrngError;

pub mod control;
pub mod qwen2;
pub mod transformer_block;

/// Errors of the problems' host functions.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ProblemError {
    /// A model dimension is zero or too large.
    #[error("{what} = {value} is invalid: {fix}")]
    BadDimension {
        /// Which dimension (`d_model`, `batch`, `seq`).
        what: &'static str,
        /// The value given.
        value: usize,
        /// How to fix it.
        fix: &'static str,
    },
    /// Drawing random numbers failed (a shape too large).
    #[error(transparent)]
    Prng(#[from] PrngError),
    /// Assembling an array or tree failed.
    #[error(transparent)]
    Param(#[from] ParamError),
}
