//! The typed StableHLO builder.
//!
//! Values carry their static [`TensorType`]; ops are methods that check shapes and
//! element types when the program is built and return [`HloError`] (never panic) on
//! misuse. A [`Module`] holds [`Function`]s and an optional one-axis [`Mesh`];
//! [`Module::to_mlir`] prints deterministic MLIR text (StableHLO + Shardy).
//!
//! ```
//! use shardes_hlo::builder::{Module, Mesh, Sharding, TensorType};
//! # fn main() -> Result<(), shardes_hlo::builder::HloError> {
//! let mut m = Module::with_mesh("step", Mesh::pop(8)?);
//! let f = m.func("main");
//! let x = f.arg_sharded("x", TensorType::f32(&[16, 4]), &Sharding::split(2, 0)?)?;
//! let w = f.arg("w", TensorType::f32(&[8, 4]))?;
//! let y = x.matmul_nt(&w)?.tanh()?.reduce_sum(&[1])?.named("y");
//! f.output_sharded(&y, &Sharding::split(1, 0)?)?;
//! m.add(f.finish()?)?;
//! assert!(m.to_mlir().contains("sdy.mesh @mesh = <[\"pop\"=8]>"));
//! # Ok(()) }
//! ```
//!
//! # Ops
//! - constants: [`Func::constant`], [`Func::scalar`], [`Func::full`], [`Func::scalar_of`],
//!   [`Value::const_like`], [`Func::iota`];
//! - elementwise unary: `neg abs exp log log1p sqrt rsqrt tanh logistic floor ceil sign
//!   cos sin not`, [`Value::erf_inv`] (`chlo.erf_inv`), [`Value::is_finite`];
//! - elementwise binary (numpy broadcasting): `add sub mul div rem max min pow and or xor
//!   shift_left shift_right_logical shift_right_arithmetic`;
//! - [`Value::compare`] (+ `eq ne lt le gt ge`, [`Value::compare_typed`]), [`Value::select`],
//!   [`Value::clamp`], [`Value::convert`], [`Value::bitcast_convert`];
//! - shapes: [`Value::broadcast_in_dim`], [`Value::broadcast_to`], [`Value::reshape`],
//!   [`Value::transpose`], [`Value::slice`], [`Value::slice_in_dim`],
//!   [`Value::dynamic_slice`], [`Value::dynamic_update_slice`], [`Func::concatenate`],
//!   [`Value::pad`];
//! - contractions: [`Value::dot_general`], [`Value::matmul`], [`Value::matmul_nt`];
//! - reductions: [`Func::reduce`] (multi-operand), `reduce_sum reduce_max reduce_min
//!   reduce_mean`, [`Value::argmax`];
//! - [`Func::sort`] (multi-operand, comparator closure), [`Func::sort_ascending`];
//! - [`Value::take_rows`] (gather), [`Value::take_cols`], [`Value::scatter_rows`],
//!   [`Value::scatter_add_rows`];
//! - control: [`Func::while_loop`], [`Func::fori_loop`], [`Func::call`],
//!   [`Func::optimization_barrier`];
//! - sharding: [`Value::shard`] (`sdy.sharding_constraint`), [`Func::manual_computation`]
//!   (`sdy.manual_computation`), and inside it [`Value::all_reduce_sum`],
//!   [`Value::all_reduce_max`], [`Value::all_gather`], [`Func::partition_id`].
//!
//! Regions are built by closures. A closure may use values of enclosing blocks in `while`
//! bodies; reduce bodies, sort comparators and manual computations are isolated and see
//! only their arguments (create constants inside them). Region closures return
//! `Result<_, E>` for any error type `E` that an [`HloError`] converts into, and the op
//! returns the closure's error unchanged: a caller with its own error type uses `?` inside
//! the region as outside. After an error the function stays usable (the region is closed).
//!
//! # Layout
//! Each file owns one concept and imports only files listed above it (so no two files
//! import each other):
//! - `error.rs`: [`HloError`];
//! - `types.rs`: [`DType`], [`TensorType`], the [`Element`] host types of constants, and
//!   how lists of types and function types print;
//! - `sharding/mod.rs`: [`Mesh`] and [`Sharding`];
//! - `func.rs`: the arena of one function under construction ([`Func`], [`Value`],
//!   [`Function`], [`Callee`]): values and their SSA names, blocks, op records, scoping
//!   checks and regions;
//! - `printer.rs`: MLIR text from the op records (module header, signatures, bodies) and
//!   [`Module::op_counts`];
//! - `module.rs`: [`Module`], which checks calls between its functions;
//! - `ops/`: the ops by family (`elementwise`, `shape`, `contraction`, `reduction`,
//!   `gather_scatter`, `control`) over shared checks in `ops/mod.rs` ([`Cmp`], [`DotDims`]);
//! - `sharding/ops.rs`: the sharding ops (constraint, manual computation, collectives).

mod error;
mod func;
mod module;
mod ops;
mod printer;
mod sharding;
mod types;

pub use error::{HloError, Result};
pub use func::{Callee, Func, Function, Value};
pub use module::Module;
pub(crate) use ops::broadcast_shape;
pub use ops::{Cmp, DotDims};
pub use sharding::{Mesh, Sharding};
pub use types::{DType, Element, TensorType};
