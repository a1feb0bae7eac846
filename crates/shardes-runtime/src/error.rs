//! The crate's error type.

use std::path::PathBuf;

use crate::dtype::ElementType;

/// Convenience alias used by every fallible function of this crate.
pub type Result<T, E = RuntimeError> = std::result::Result<T, E>;

/// Everything that can go wrong while finding, loading or driving a PJRT plugin.
///
/// Every variant names the problem and, where there is one, the fix.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RuntimeError {
    /// The plugin returned an error. `message` is the plugin's own text; for compile errors it
    /// carries XLA's diagnostic (e.g. the MLIR parse error with line and column).
    #[error("PJRT error ({code}): {message}")]
    Pjrt {
        /// Status code name as used by absl (e.g. `INVALID_ARGUMENT`).
        code: String,
        /// The plugin's message, verbatim.
        message: String,
    },

    /// No plugin was found in any of the places discovery looks at, and provisioning was not
    /// attempted or failed.
    #[error(
        "no PJRT plugin found; looked at:\n{}\nfix: set SHARDES_PJRT_PLUGIN=/path/to/plugin.so, \
         pass an explicit path, or let shardes provision the CPU plugin ({provision_hint})",
        tried.iter().map(|p| format!("  - {}", p.display())).collect::<Vec<_>>().join("\n")
    )]
    PluginNotFound {
        /// Every path that was checked, in discovery order.
        tried: Vec<PathBuf>,
        /// Why provisioning did not help, and what to run by hand.
        provision_hint: String,
    },

    /// An explicitly given plugin path does not exist.
    #[error("PJRT plugin {path} does not exist; fix: point to an existing PJRT plugin .so")]
    PluginMissing {
        /// The path that was given.
        path: PathBuf,
    },

    /// A plugin path names a directory.
    #[error(
        "PJRT plugin {path} is a directory, not a plugin library; fix: point to the plugin's .so \
         file inside it (e.g. {path}/xla_cpu_pjrt.so)"
    )]
    PluginIsDirectory {
        /// The path that was given.
        path: PathBuf,
    },

    /// A plugin library is shorter than its own ELF headers say: loading it would crash the
    /// process (SIGBUS on the first access past the end), so it is refused before `dlopen`.
    #[error(
        "PJRT plugin {path} is truncated ({size} bytes, but its ELF headers need {needed}); fix: \
         copy or download the plugin again"
    )]
    PluginTruncated {
        /// The file.
        path: PathBuf,
        /// Its size in bytes.
        size: u64,
        /// The size its headers need (end of the furthest segment, section or table).
        needed: u64,
    },

    /// A pinned plugin in the cache does not match its pin (size or sha256): it was damaged
    /// after provisioning (a partial copy, a full disk, a bad sector), so it is not loaded.
    #[error(
        "PJRT plugin {path} is damaged: {problem}; fix: delete it and rerun to provision it \
         again (the pinned {package} {version} is then downloaded and checked afresh)"
    )]
    PluginDamaged {
        /// The cached file.
        path: PathBuf,
        /// What differs from the pin, e.g. `it is truncated (1048576 bytes, expected 259284552)`.
        problem: String,
        /// The pinned package.
        package: &'static str,
        /// Its pinned version.
        version: &'static str,
    },

    /// The file exists but is not a loadable PJRT plugin (not a regular file, not an ELF shared
    /// object for this machine, or one that does not export `GetPjrtApi`).
    #[error(
        "{path} is not a PJRT plugin: {reason}; fix: point to a shared library that exports \
         GetPjrtApi (e.g. xla_cpu_pjrt.so)"
    )]
    NotAPlugin {
        /// The offending file.
        path: PathBuf,
        /// What the loader reported.
        reason: String,
    },

    /// The plugin implements a PJRT C API whose major version differs from the bindings'.
    #[error(
        "PJRT API version mismatch: plugin {path} implements {plugin_major}.{plugin_minor}, \
         shardes was built against {ours_major}.{ours_minor}; major versions must match. fix: use \
         a plugin built against PJRT C API {ours_major}.x"
    )]
    VersionMismatch {
        /// The plugin file.
        path: PathBuf,
        /// Plugin's major version.
        plugin_major: i32,
        /// Plugin's minor version.
        plugin_minor: i32,
        /// Bindings' major version.
        ours_major: i32,
        /// Bindings' minor version.
        ours_minor: i32,
    },

    /// The plugin is too old to offer a C API function that this operation needs.
    #[error(
        "the PJRT plugin does not implement {function} (its API table is too short); fix: use a \
         newer plugin"
    )]
    Unsupported {
        /// Name of the missing C API function.
        function: &'static str,
    },

    /// Downloading / unpacking / verifying the pinned CPU plugin failed.
    #[error("provisioning the PJRT CPU plugin failed: {reason}\nto do it by hand: {manual}")]
    Provision {
        /// What went wrong.
        reason: String,
        /// Exact commands to run by hand, and where to put the file.
        manual: String,
    },

    /// An I/O error on a named file.
    #[error("I/O error on {path}: {source}")]
    Io {
        /// The file or directory involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },

    /// The data handed to a host→device copy does not match the dims.
    #[error(
        "host data has {got} elements but dims {dims:?} need {expected}; fix: pass dims whose \
         product equals the data length"
    )]
    HostDataLength {
        /// Requested dims.
        dims: Vec<usize>,
        /// Product of dims.
        expected: usize,
        /// Length of the data.
        got: usize,
    },

    /// More simulated CPU devices were asked for than the CPU plugin can run programs on
    /// (see [`crate::MAX_CPU_DEVICES`]).
    #[error(
        "{requested} simulated CPU devices requested, but at most {max} are supported: the XLA \
         CPU plugin runs collectives on at most {max} threads, so with more devices every \
         program with a collective waits forever and XLA aborts the process; fix: use at most \
         {max} devices (devices = {max} or fewer)"
    )]
    TooManyDevices {
        /// The count asked for.
        requested: usize,
        /// The most supported.
        max: usize,
    },

    /// `SHARDES_LOG` holds something that is not a log level.
    #[error(
        "SHARDES_LOG = {value:?} is not a log level; fix: set SHARDES_LOG to error, warning, \
         info or debug (or unset it)"
    )]
    UnknownLogLevel {
        /// The value found.
        value: String,
    },

    /// `SHARDES_COMPILE_CACHE_MAX_BYTES` is not a size ([`crate::CompileCache::from_env`]).
    #[error(
        "SHARDES_COMPILE_CACHE_MAX_BYTES = {value:?} is not a size; fix: set it to a number of \
         bytes or a number with a K, M, G or T suffix (such as 500M or 4G), or unset it for \
         the default 4G"
    )]
    CacheBound {
        /// The value found.
        value: String,
    },

    /// A device index is out of range.
    #[error("device {device} does not exist: the client has {count} device(s)")]
    NoSuchDevice {
        /// Requested device index.
        device: usize,
        /// Number of addressable devices.
        count: usize,
    },

    /// Leading dimension not divisible by the number of devices in `scatter_rows`.
    #[error(
        "cannot split {rows} rows evenly over {devices} devices; fix: make dim 0 a multiple of \
         the device count"
    )]
    UnevenSplit {
        /// Size of dimension 0.
        rows: usize,
        /// Number of devices.
        devices: usize,
    },

    /// A buffer (or an argument) had a different element type than required.
    #[error("{what}: expected element type {expected}, got {got}")]
    DtypeMismatch {
        /// Which value (e.g. "argument 0 on device 3").
        what: String,
        /// Required type.
        expected: ElementType,
        /// Actual type.
        got: ElementType,
    },

    /// A buffer (or an argument) had a different shape than required.
    #[error("{what}: expected shape {expected:?}, got {got:?}")]
    ShapeMismatch {
        /// Which value (e.g. "argument 0 on device 3").
        what: String,
        /// Required dims.
        expected: Vec<usize>,
        /// Actual dims.
        got: Vec<usize>,
    },

    /// Wrong number of per-device argument lists, or wrong arity within one.
    #[error("{0}")]
    Arity(String),

    /// A buffer was used after it was deleted or donated to an executable.
    #[error(
        "{what} has been deleted or donated (an executable that aliases an input to an output \
         consumes it); fix: do not reuse donated buffers, or list the input index in \
         ExecuteOptions::non_donatable_inputs"
    )]
    BufferDeleted {
        /// Which value.
        what: String,
    },

    /// The plugin reported an element type this crate does not model.
    #[error("unsupported element type (PJRT_Buffer_Type {0}); shardes handles pred, s32, s64, u8, u32, f16, bf16, f32, f64")]
    UnsupportedElementType(u32),

    /// A protobuf returned by the plugin could not be decoded.
    #[error("could not decode {what} returned by the plugin: {reason}")]
    Decode {
        /// Which message.
        what: &'static str,
        /// Decoder's message.
        reason: String,
    },

    /// Buffers handed to a multi-buffer operation were inconsistent.
    #[error("{0}")]
    InvalidArgument(String),
}

impl RuntimeError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        RuntimeError::Io {
            path: path.into(),
            source,
        }
    }
}
