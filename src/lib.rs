//! shardes: sharded evolution strategies on XLA.
//!
//! This facade re-exports the crates users depend on:
//! [`hlo`] builds one StableHLO program per generation, [`runtime`] runs it through PJRT.

pub use shardes_hlo as hlo;
pub use shardes_runtime as runtime;

pub mod io;
