//! Evolution strategies: strategies, shapings and the generation program.
//!
//! - [`spec`]: strategy names as written in configs (`mirrored(lowrank(r=1))`);
//! - [`strategy`]: the [`Strategy`] trait and `LowRank`, `SeedRegenerated`, `IidGaussian`,
//!   `Mirrored`;
//! - [`shaping`]: the [`Shaping`] trait and the four shapings of the spec;
//! - [`program`]: [`ShardedES`], the [`Model`] trait, the generation program and
//!   [`check_model`].

pub mod program;
pub mod shaping;
pub mod spec;
pub mod strategy;

pub use program::{
    check_model, leaf_infos, Access, EsError, Finding, How, Layout, Model, ModelParams, Program,
    ShardedES, CHUNK_BYTES, DEFAULT_MEMBER_CHUNK, KEEP_NOISE_BYTES, TELL_CHUNK_BYTES,
};
pub use shaping::Shaping;
pub use spec::{SpecError, StrategySpec};
pub use strategy::{LeafInfo, Noise, Strategy};
