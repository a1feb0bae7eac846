//! shardes: sharded evolution strategies on XLA.
//!
//! One StableHLO program per generation (ask + apply + tell), with Shardy annotations over a
//! one-axis `"pop"` mesh, run through the PJRT C API. This facade re-exports the crates
//! users depend on and adds what needs both of them:
//! - [`hlo`] builds programs (builder, PRNG, seams, ES, problems);
//! - [`runtime`] runs them through a PJRT plugin;
//! - [`trainer`] keeps an ES run's state on the devices and steps it;
//! - [`io`] reads and writes parameter trees as safetensors;
//! - [`tensorboard`] writes per-generation scalars as TensorBoard event files.

pub use shardes_hlo as hlo;
pub use shardes_runtime as runtime;

pub mod bench;
pub mod hf;
pub mod io;
pub mod split;
mod state;
pub mod tasks;
pub mod tensorboard;
pub mod tokenizer;
pub mod trainer;

pub use split::{HostFitness, SplitTrainer};
pub use trainer::{BuildTimes, Trainer};

/// Errors of the facade: everything a run can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Invalid ES settings or program construction.
    #[error(transparent)]
    Es(#[from] hlo::es::EsError),
    /// The PJRT runtime failed (plugin, compile, execute, transfer).
    #[error(transparent)]
    Runtime(#[from] runtime::RuntimeError),
    /// Reading or writing a file.
    #[error(transparent)]
    Io(#[from] io::IoError),
    /// A parameter tree did not fit.
    #[error(transparent)]
    Param(#[from] hlo::params::ParamError),
    /// A building block refused its input.
    #[error(transparent)]
    Hlo(#[from] hlo::builder::HloError),
    /// Anything else a caller got wrong; the message says what to change.
    #[error("{0}")]
    Invalid(String),
}
