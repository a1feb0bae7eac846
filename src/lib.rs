//! shardes: sharded evolution strategies on XLA.
//!
//! One StableHLO program per generation (ask + apply + tell), with Shardy annotations over a
//! one-axis `"pop"` mesh, run through the PJRT C API. This facade re-exports the crates
//! users depend on and adds what needs more than one of them:
//! - [`hlo`] builds programs (builder, PRNG, seams, ES, problems);
//! - [`runtime`] runs them through a PJRT plugin;
//! - [`mujoco`] opens the MuJoCo library and simulates its models on the host;
//! - [`problem`] turns a problem description into a model, parameters, a batch and a key;
//! - [`population`] keeps an ES run's state on the devices and steps it, one runner
//!   ([`Population`]) whatever its fitness comes from and whoever holds its members;
//! - [`session`] runs a training run's generations over any population: metrics lines,
//!   checkpoints, held-out evaluations, divergence checks, stop signals, resume;
//! - [`decode`] decodes prompts under every member's perturbation ([`PopulationDecoder`]);
//! - [`distributed`] runs one population across processes (MPI with the feature `mpi`);
//! - [`io`] reads and writes parameter trees as safetensors;
//! - [`estimate`] measures gradient estimators (one generation's estimate, central
//!   differences, cosine/bias/variance);
//! - [`mjcf`] makes MuJoCo models control environments stepped on the host;
//! - [`tensorboard`] writes per-generation scalars as TensorBoard event files.
//!
//! The default feature `models` adds Hugging Face checkpoints (`hf`), tokenizers
//! (`tokenizer`) and the Qwen2 problem (`problem::qwen2`); without it the core does not
//! compile the `tokenizers` crate.

pub use shardes_hlo as hlo;
pub use shardes_mujoco as mujoco;
pub use shardes_runtime as runtime;

pub mod bench;
pub mod bench_control;
pub mod decode;
pub mod distributed;
pub mod dtype;
pub mod estimate;
#[cfg(feature = "models")]
pub mod export;
#[cfg(feature = "models")]
pub mod family;
#[cfg(feature = "models")]
pub mod finetune;
#[cfg(feature = "models")]
pub mod gguf;
#[cfg(feature = "models")]
pub mod gguf_tokenizer;
#[cfg(feature = "models")]
pub mod hf;
pub mod host_control;
pub mod io;
pub mod mjcf;
#[cfg(feature = "models")]
pub mod models;
pub mod population;
#[cfg(feature = "models")]
pub mod pretrained;
pub mod problem;
pub mod process;
pub mod rundir;
pub mod session;
mod state;
pub mod tasks;
pub mod tensorboard;
#[cfg(feature = "models")]
pub mod tokenizer;

pub use decode::{Decode, DecodeConfig, Decoded, PopulationDecoder};
pub use population::{
    BuildTimes, CompileWhen, Evaluator, Fitness, HostArray, HostData, HostFitness, Population,
};
#[cfg(feature = "models")]
pub use problem::qwen2::{Qwen2Source, Qwen2Weights};
pub use problem::{Problem, ProblemError};

/// The population of the fused generation program (ask + apply + tell in one executable).
pub type Trainer = Population<population::Fused>;
/// The population whose `ask + apply` returns the model's losses, with the tell apart
/// (split mode: fitness from the host).
pub type SplitTrainer = Population<population::Losses>;
/// The population whose program returns per-member outputs that the caller scores.
pub type OutputsRunner = Population<population::Outputs>;

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
    /// A problem could not be built from its description.
    #[error(transparent)]
    Problem(#[from] ProblemError),
    /// A population refused a call (a fitness of the wrong length, a group it was not
    /// built for, inputs that do not fit its program).
    #[error(transparent)]
    Population(#[from] population::PopulationError),
    /// A prompt batch a decoder cannot take.
    #[error(transparent)]
    Decode(#[from] decode::DecodeError),
    /// A task (prompts, rewards, chat template) refused its input.
    #[error(transparent)]
    Task(#[from] tasks::TaskError),
    /// A MuJoCo environment (the library, the model file or its conventions).
    #[error(transparent)]
    Mjcf(#[from] mjcf::MjcfError),
    /// Processes of one population disagree, or their collectives failed.
    #[error(transparent)]
    Distributed(#[from] distributed::DistributedError),
    /// Anything else a caller got wrong; the message says what to change.
    #[error("{0}")]
    Invalid(String),
}
