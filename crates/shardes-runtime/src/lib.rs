//! # shardes-runtime
//!
//! Runs StableHLO programs on XLA through the PJRT C API: a plugin shared library is
//! `dlopen`ed at run time, so no XLA build is linked into shardes.
//!
//! ```no_run
//! use shardes_runtime::{Client, CompileOptions};
//! # fn main() -> shardes_runtime::Result<()> {
//! let client = Client::cpu(8)?; // 8 simulated CPU devices
//! # let mlir = "";
//! let exe = client.compile(mlir, &CompileOptions::new(8))?;
//! let x: Vec<f32> = vec![0.0; 256 * 16];
//! let shards = client.scatter_rows(&x, &[256, 16])?; // [32,16] per device
//! let outs = exe.execute(&shards.iter().map(|b| vec![b]).collect::<Vec<_>>())?;
//! let rows: Vec<f32> = shardes_runtime::gather_rows(
//!     &outs.into_iter().map(|mut o| o.remove(0)).collect::<Vec<_>>())?;
//! # Ok(()) }
//! ```
//!
//! ## Where the plugin comes from
//!
//! [`plugin::locate`] looks, in order, at:
//!
//! 1. an explicit path passed by the caller ([`Plugin::load`]); any PJRT plugin is accepted;
//! 2. the environment variable `SHARDES_PJRT_PLUGIN`;
//! 3. `xla_extension/*.so` in the repository: the first `xla_extension/` directory found
//!    walking up from the current directory, then the one next to this crate's sources
//!    (path fixed at compile time);
//! 4. the per-user cache: `$SHARDES_CACHE_DIR` (or `$XDG_CACHE_HOME/shardes`, or
//!    `~/.cache/shardes`) `/pjrt/xla-cpu-pjrt-0.0.1-<first 12 hex of the .so sha256>/xla_cpu_pjrt.so`.
//!
//! If the cache is empty, [`plugin::provision`] fills it: under an exclusive file lock it runs
//! `python3 -m pip download --no-deps --require-hashes` for the pinned wheel
//! ([`plugin::PACKAGE`] [`plugin::VERSION`], hash [`plugin::WHEEL_SHA256`]), extracts only
//! the plugin library, checks its sha256 ([`plugin::SO_SHA256`]) and renames it into place
//! atomically. When that is impossible (no python/pip, offline), the error spells out the
//! command to run by hand and where to put the file.
//!
//! ## Before a plugin is opened
//!
//! [`Plugin::load`] checks the file first, because `dlopen` of a truncated library kills the
//! process: a cached pinned plugin must match its pinned size and sha256, any other file must
//! be an ELF shared object for this machine, no shorter than its headers say, that exports
//! `GetPjrtApi`. Before the first plugin of a process is opened, XLA's own logging is set to
//! warnings and errors ([`plugin::set_log_level`], overridden by `SHARDES_LOG=info`). A CPU
//! client simulates at most [`MAX_CPU_DEVICES`] devices.
//!
//! ## Ownership
//!
//! Every C handle is owned by one Rust value and freed in its `Drop`. Buffers and executables
//! hold a reference to their client's handle, so values can be dropped in any order. Plugins
//! are loaded once per process and never unloaded (see [`Plugin`]).

#![warn(missing_docs)]

mod api;
mod buffer;
mod cache;
pub mod child;
mod client;
mod dtype;
mod error;
mod executable;
mod ffi;
mod handle;
mod hlo;
pub mod host_alloc;
mod memory;
mod pinned;
pub mod plugin;
mod proto;

pub use buffer::Buffer;
pub use cache::{CompileCache, CACHE_ENV, DEFAULT_MAX_BYTES, MAX_BYTES_ENV};
pub use client::{gather_rows, Client, ClientOptions, DeviceInfo, MAX_CPU_DEVICES};
pub use dtype::{Element, ElementType};
pub use error::{Result, RuntimeError};
pub use executable::{ArgSpec, CompileOptions, CompiledMemoryStats, Executable, ExecuteOptions};
pub use hlo::{HloComputation, HloInstruction, HloModule, HloShape};
pub use memory::DeviceMemoryStats;
pub use pinned::{
    ensure_wheel_file, provision_wheel_file, verify_file, Ensured, Fetched, FileCheck,
    PinnedWheelFile,
};
pub use plugin::{AttributeValue, Plugin};

/// Re-exported so callers can name `bf16`/`f16` elements without adding `half` themselves.
pub use half;
