//! Evolution strategies: strategies, shapings and the generation program.
//!
//! - [`spec`]: strategy and placement names as written in configs
//!   (`mirrored(lowrank(r=1))`, `B`);
//! - [`strategy`]: the [`Strategy`] trait and `LowRank`, `SeedRegenerated`, `IidGaussian`,
//!   `Mirrored`, `Coupled`;
//! - [`coupling`]: coupled noise ([`Coupling`]: `gaussian`, `orthogonal_hd`, `sobol`);
//! - [`shaping`]: the [`Shaping`] trait, the four shapings of the spec and their names;
//! - [`sigma`]: per-leaf and separable σ, frozen leaves;
//! - [`settings`]: [`ShardedES`] (validated settings, member chunks) and [`EsSpec`], the
//!   config's `[es]` section;
//! - [`model`]: the [`Model`] trait, [`ModelParams`] and [`check_model`];
//! - [`layout`]: [`Layout`], the argument and result order of every program;
//! - [`outputs`]: [`MemberOutputs`] (per-member outputs instead of a loss) and the outputs
//!   program;
//! - [`precision`]: [`ComputeDtype`], the dtype every model's forward runs in (`bf16` on f32
//!   masters, the noise rounded once for `apply` and `tell`);
//! - [`optimizer`]: [`Optimizer`], how `tell` steps on the ES gradient (sgd, momentum, adam,
//!   clipup), and [`OptimizerSpec`], its config form;
//! - [`program`]: the programs ([`ShardedES::generation_program`] and the others);
//! - [`processes`]: the programs of one process of a population run across processes
//!   ([`Part`]);
//! - [`error`]: the error type, [`EsError`].

pub mod coupling;
pub mod error;
mod generation;
mod layers;
pub mod layout;
mod leaf_sigma;
pub mod model;
pub mod optimizer;
pub mod outputs;
pub mod precision;
pub mod processes;
pub mod program;
pub mod settings;
pub mod shaping;
pub mod sigma;
pub mod spec;
pub mod strategy;

pub use coupling::{Coupling, COUPLING_NAMES};
pub use error::EsError;
pub use layout::{Layout, ProgramArgs, ProgramKind, ProgramResults, Slot, Stack};
pub use model::{
    check_model, leaf_infos, Access, ChunkPolicy, Finding, LayerLeaves, LayerSource, Model,
    ModelParams,
};
pub use optimizer::{Optimizer, OptimizerKind, OptimizerName, OptimizerSpec, OPTIMIZER_NAMES};
pub use outputs::{AsModel, MemberInfo, MemberOutputs, WithTasks, SAMPLE_TAG};
pub use precision::{ComputeDtype, COMPUTE_DTYPE_NAMES};
pub use processes::{check_processes, Part};
pub use program::Program;
pub use settings::{
    EsSpec, ShardedES, BATCH_BYTES, CHUNK_BYTES, DEFAULT_MEMBER_CHUNK, KEEP_NOISE_BYTES,
    TELL_CHUNK_BYTES,
};
pub use shaping::{Shaping, ShapingError, ShapingSpec, SHAPING_NAMES};
pub use sigma::{LeafScale, LeafSigma, SigmaPatterns};
pub use spec::{How, HowError, SpecError, StrategySpec};
pub use strategy::{LeafInfo, Noise, Strategy};
