//! JAX-compatible threefry random numbers.
//!
//! Every random number in shardes comes from threefry2x32 (Random123, 20 rounds) exactly as
//! JAX computes it with `jax_threefry_partitionable = True` (its default), so that a JAX user
//! gets the same numbers from `jax.random` with the same key. The definitions are those of
//! `shared/spec/semantics.md`, "Keys and random bits".
//!
//! [`emit`] emits the same functions as StableHLO ops over traced keys ([`Keys`]).
//!
//! [`host`] evaluates the functions on the CPU, in plain Rust; it is the reference the
//! emitted programs are tested against and what builds initial parameters and data. The
//! threefry tables ([`THREEFRY_ROTATIONS`], [`THREEFRY_PARITY`], [`THREEFRY_INJECTIONS`])
//! live in [`host`] and are the single source for every implementation.
//!
//! [`erf_inv`] emits `erf_inv` with the plugin's exact bits but no scalar library call
//! ([`erf_inv::erf_inv_exact`]), for kernels where a vectorized log pays off.
//!
//! [`sobol`] holds the Joe–Kuo Sobol direction numbers (quasi-random points for the
//! `sobol` noise coupling, `es::coupling`).

pub mod emit;
pub mod erf_inv;
pub mod host;
pub mod sobol;

pub use emit::Keys;

pub use host::*;
