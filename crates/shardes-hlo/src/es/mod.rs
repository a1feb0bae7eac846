//! Evolution strategies: strategies, shapings and the generation program.

pub mod spec;

pub use spec::{SpecError, StrategySpec};
