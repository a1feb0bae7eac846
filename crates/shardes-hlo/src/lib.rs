//! shardes-hlo: turns Rust calls into StableHLO programs (MLIR text) with Shardy
//! sharding annotations over a one-axis `"pop"` mesh.
//!
//! This crate does no I/O and knows nothing of PJRT. Modules:
//! - [`builder`]: the typed program builder, printer, sharding and inspection;
//! - [`prng`]: JAX-compatible threefry random numbers, on the host and as emitted ops;
//! - [`params`]: parameter trees of named f32 arrays in JAX leaf order.
//! - [`nn`]: the seams `dense` and `embed` through which models read 2-D weights;
//! - [`es`]: strategies, shapings and the generation program;
//! - [`decode`]: KV-cache decoding under every member's perturbation ([`decode::Decoder`]);
//! - [`problems`]: the example models (init, data, forward, loss).

pub mod builder;
pub mod decode;
pub mod es;
pub mod nn;
pub mod params;
pub mod prng;
pub mod problems;
