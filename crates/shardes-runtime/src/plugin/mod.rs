//! Loading a PJRT plugin, and finding / provisioning one.
//!
//! See the crate documentation for the discovery order. [`locate`] finds (or provisions) a
//! plugin file, [`Plugin::load`] opens it.

mod provision;

pub use provision::{
    cache_root, cached_plugin_path, locate, provision, provision_into, resolve, PinnedPlugin, CPU,
    CUDA, NAMED, PACKAGE, SO_PATH_IN_WHEEL, SO_SHA256, TPU, VERSION, WHEEL_SHA256,
};

use std::collections::HashMap;
use std::mem::ManuallyDrop;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use crate::ffi;
use crate::{Result, RuntimeError};

/// Calls a function from a plugin's `PJRT_Api` table.
///
/// Resolves to `Err(RuntimeError::Unsupported)` when the plugin's table is too short to contain
/// the entry (older plugin) or the entry is null, and converts a returned `PJRT_Error*` into a
/// [`RuntimeError::Pjrt`]. Must be used inside an `unsafe` block: the caller vouches that `args`
/// is a correctly initialised argument struct for that function.
macro_rules! pjrt_call {
    ($plugin:expr, $name:ident, $args:expr) => {{
        let plugin: &$crate::plugin::Plugin = $plugin;
        match plugin.function_available(
            ::std::mem::offset_of!($crate::ffi::PJRT_Api, $name),
            ::std::mem::size_of::<$crate::ffi::$name>(),
        ) {
            false => Err($crate::RuntimeError::Unsupported {
                function: stringify!($name),
            }),
            true => match (*plugin.api()).$name {
                None => Err($crate::RuntimeError::Unsupported {
                    function: stringify!($name),
                }),
                Some(f) => plugin.check(f($args)),
            },
        }
    }};
}
pub(crate) use pjrt_call;

/// Creates a zeroed C argument struct with its `struct_size` set, as the C API requires.
macro_rules! pjrt_args {
    ($ty:ident) => {{
        // SAFETY: every PJRT args struct is plain old data (integers, pointers, nullable
        // function pointers); the all-zero pattern is its documented default.
        // (The block is redundant when the macro is used inside another `unsafe` block.)
        #[allow(unused_unsafe)]
        let mut a: $crate::ffi::$ty = unsafe { ::std::mem::zeroed() };
        // The header's size (offset + size of the last field) is what plugins compare against
        // to learn which fields the caller knows about.
        a.struct_size = ::paste::paste!($crate::ffi::[<$ty _STRUCT_SIZE>]) as usize;
        a
    }};
}
pub(crate) use pjrt_args;

/// A loaded PJRT plugin (one per plugin file per process).
///
/// Plugins are process-global: [`Plugin::load`] returns the same `Arc` for the same file, and
/// `PJRT_Plugin_Initialize` runs exactly once per file. The shared library is never unloaded:
/// XLA starts thread pools and registers static objects and `atexit` handlers inside the
/// library, so `dlclose` while any of them may still run would crash the process.
pub struct Plugin {
    path: PathBuf,
    api: *const ffi::PJRT_Api,
    api_struct_size: usize,
    version: (i32, i32),
    attributes: Vec<(String, AttributeValue)>,
    // Never dropped: see the type's documentation.
    _library: ManuallyDrop<libloading::Library>,
}

// SAFETY: the PJRT C API is thread-safe by contract (XLA's clients are used from many threads by
// JAX), the `PJRT_Api` table is immutable after `GetPjrtApi`, and the other fields are owned
// Rust values.
unsafe impl Send for Plugin {}
// SAFETY: as above; `&Plugin` only exposes immutable data and thread-safe C calls.
unsafe impl Sync for Plugin {}

impl std::fmt::Debug for Plugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plugin")
            .field("path", &self.path)
            .field("api_version", &self.version)
            .finish_non_exhaustive()
    }
}

/// Value of a plugin attribute (see [`Plugin::attributes`]).
#[derive(Debug, Clone, PartialEq)]
pub enum AttributeValue {
    /// A string.
    String(String),
    /// A 64-bit integer.
    Int(i64),
    /// A list of 64-bit integers (versions are reported this way, e.g. `[1, 13, 3]`).
    IntList(Vec<i64>),
    /// A float.
    Float(f32),
    /// A boolean.
    Bool(bool),
}

impl std::fmt::Display for AttributeValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AttributeValue::String(s) => f.write_str(s),
            AttributeValue::Int(i) => write!(f, "{i}"),
            AttributeValue::IntList(v) => {
                let parts: Vec<String> = v.iter().map(|x| x.to_string()).collect();
                f.write_str(&parts.join("."))
            }
            AttributeValue::Float(x) => write!(f, "{x}"),
            AttributeValue::Bool(b) => write!(f, "{b}"),
        }
    }
}

/// The process-wide registry of loaded plugins, keyed by canonical path.
fn registry() -> &'static Mutex<HashMap<PathBuf, Arc<Plugin>>> {
    static REGISTRY: OnceLock<Mutex<HashMap<PathBuf, Arc<Plugin>>>> = OnceLock::new();
    REGISTRY.get_or_init(|| Mutex::new(HashMap::new()))
}

impl Plugin {
    /// Loads the PJRT plugin at `path` (any plugin: no checksum is checked for explicit paths),
    /// or returns the already-loaded instance for that file.
    ///
    /// Errors: [`RuntimeError::PluginMissing`] if the file does not exist,
    /// [`RuntimeError::NotAPlugin`] if it is not a shared library exporting `GetPjrtApi`,
    /// [`RuntimeError::VersionMismatch`] if its PJRT C API major version differs.
    pub fn load(path: impl AsRef<Path>) -> Result<Arc<Plugin>> {
        let path = path.as_ref();
        if !path.exists() {
            return Err(RuntimeError::PluginMissing {
                path: path.to_path_buf(),
            });
        }
        let canonical = path.canonicalize().map_err(|e| RuntimeError::io(path, e))?;
        // A poisoned lock only means another thread panicked while loading; the map itself
        // is still consistent (entries are inserted whole), so keep going.
        let mut map = registry().lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = map.get(&canonical) {
            return Ok(Arc::clone(p));
        }
        let plugin = Arc::new(Self::open(&canonical)?);
        map.insert(canonical, Arc::clone(&plugin));
        Ok(plugin)
    }

    /// Finds a plugin with the default discovery order ([`locate`]), provisioning the pinned CPU
    /// plugin if needed, and loads it.
    pub fn load_default() -> Result<Arc<Plugin>> {
        Self::load(locate(None)?)
    }

    fn open(path: &Path) -> Result<Plugin> {
        let not_a_plugin = |reason: String| RuntimeError::NotAPlugin {
            path: path.to_path_buf(),
            reason,
        };
        // SAFETY: loading a shared library runs its initialisers. This is inherent to using a
        // plugin; the user chose the file (explicitly or through discovery).
        let library = unsafe { libloading::Library::new(path) }
            .map_err(|e| not_a_plugin(format!("cannot load it as a shared library ({e})")))?;
        type GetPjrtApi = unsafe extern "C" fn() -> *const ffi::PJRT_Api;
        // SAFETY: `GetPjrtApi` is the documented entry point of every PJRT plugin and has this
        // signature; we only call it if the symbol exists.
        let api = unsafe {
            let get: libloading::Symbol<GetPjrtApi> =
                library.get(b"GetPjrtApi\0").map_err(|e| {
                    not_a_plugin(format!("it does not export the symbol GetPjrtApi ({e})"))
                })?;
            get()
        };
        if api.is_null() {
            return Err(not_a_plugin("GetPjrtApi returned a null pointer".into()));
        }
        // SAFETY: `api` is non-null and points to the plugin's static API table; the first
        // fields (`struct_size`, `pjrt_api_version`) exist in every version of the C API.
        let (struct_size, major, minor) = unsafe {
            (
                (*api).struct_size,
                (*api).pjrt_api_version.major_version,
                (*api).pjrt_api_version.minor_version,
            )
        };
        let ours = (ffi::PJRT_API_MAJOR as i32, ffi::PJRT_API_MINOR as i32);
        if major != ours.0 {
            return Err(RuntimeError::VersionMismatch {
                path: path.to_path_buf(),
                plugin_major: major,
                plugin_minor: minor,
                ours_major: ours.0,
                ours_minor: ours.1,
            });
        }
        let mut plugin = Plugin {
            path: path.to_path_buf(),
            api,
            api_struct_size: struct_size,
            version: (major, minor),
            attributes: Vec::new(),
            _library: ManuallyDrop::new(library),
        };
        let mut init = pjrt_args!(PJRT_Plugin_Initialize_Args);
        // SAFETY: correctly initialised args; called once per file because `load` holds the
        // registry lock and caches the result.
        unsafe { pjrt_call!(&plugin, PJRT_Plugin_Initialize, &mut init)? };
        plugin.attributes = plugin.read_attributes().unwrap_or_default();
        Ok(plugin)
    }

    fn read_attributes(&self) -> Result<Vec<(String, AttributeValue)>> {
        let mut args = pjrt_args!(PJRT_Plugin_Attributes_Args);
        // SAFETY: correctly initialised args.
        unsafe { pjrt_call!(self, PJRT_Plugin_Attributes, &mut args)? };
        let mut out = Vec::with_capacity(args.num_attributes);
        for i in 0..args.num_attributes {
            // SAFETY: the plugin returned an array of `num_attributes` values that lives as long
            // as the process; each string/array pointer is valid for its stated size.
            let (name, value) = unsafe {
                let nv = &*args.attributes.add(i);
                let name = lossy(nv.name, nv.name_size);
                let u = &nv.__bindgen_anon_1;
                let value = match nv.type_ {
                    ffi::PJRT_NamedValue_kString => {
                        AttributeValue::String(lossy(u.string_value, nv.value_size))
                    }
                    ffi::PJRT_NamedValue_kInt64 => AttributeValue::Int(u.int64_value),
                    ffi::PJRT_NamedValue_kInt64List => {
                        let p = u.int64_array_value;
                        let v = if p.is_null() || nv.value_size == 0 {
                            Vec::new()
                        } else {
                            std::slice::from_raw_parts(p, nv.value_size).to_vec()
                        };
                        AttributeValue::IntList(v)
                    }
                    ffi::PJRT_NamedValue_kFloat => AttributeValue::Float(u.float_value),
                    ffi::PJRT_NamedValue_kBool => AttributeValue::Bool(u.bool_value),
                    _ => continue,
                };
                (name, value)
            };
            out.push((name, value));
        }
        Ok(out)
    }

    /// The file this plugin was loaded from (canonical path).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The PJRT C API version (major, minor) the plugin implements.
    pub fn api_version(&self) -> (i32, i32) {
        self.version
    }

    /// All attributes reported by `PJRT_Plugin_Attributes` (empty if the plugin offers none).
    pub fn attributes(&self) -> &[(String, AttributeValue)] {
        &self.attributes
    }

    fn attribute(&self, name: &str) -> Option<String> {
        self.attributes
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.to_string())
    }

    /// XLA version the plugin was built from (attribute `xla_version`), if reported.
    pub fn xla_version(&self) -> Option<String> {
        self.attribute("xla_version")
    }

    /// Newest StableHLO version the plugin accepts (e.g. `1.13.3`), if reported.
    pub fn stablehlo_current_version(&self) -> Option<String> {
        self.attribute("stablehlo_current_version")
    }

    /// Oldest StableHLO version the plugin accepts, if reported.
    pub fn stablehlo_minimum_version(&self) -> Option<String> {
        self.attribute("stablehlo_minimum_version")
    }

    pub(crate) fn api(&self) -> *const ffi::PJRT_Api {
        self.api
    }

    /// Whether the table entry at `offset` (of `size` bytes) lies within the plugin's table.
    pub(crate) fn function_available(&self, offset: usize, size: usize) -> bool {
        offset + size <= self.api_struct_size
    }

    /// Converts a `PJRT_Error*` into a `Result`, destroying the error.
    pub(crate) fn check(&self, err: *mut ffi::PJRT_Error) -> Result<()> {
        if err.is_null() {
            return Ok(());
        }
        let mut msg = pjrt_args!(PJRT_Error_Message_Args);
        msg.error = err;
        let mut code = pjrt_args!(PJRT_Error_GetCode_Args);
        code.error = err;
        // SAFETY: `err` is a live error object returned by this plugin; the message pointer
        // is valid until the error is destroyed, which happens last.
        unsafe {
            let api = &*self.api;
            let message = match api.PJRT_Error_Message {
                Some(f) => {
                    f(&mut msg);
                    lossy(msg.message, msg.message_size)
                }
                None => String::from("(plugin offers no error message)"),
            };
            let code_name = match api.PJRT_Error_GetCode {
                Some(f) if f(&mut code).is_null() => code_name(code.code),
                _ => "UNKNOWN".to_string(),
            };
            if let Some(destroy) = api.PJRT_Error_Destroy {
                let mut d = pjrt_args!(PJRT_Error_Destroy_Args);
                d.error = err;
                destroy(&mut d);
            }
            Err(RuntimeError::Pjrt {
                code: code_name,
                message,
            })
        }
    }

    /// Waits for `event` (if non-null), destroys it, and returns its status.
    pub(crate) fn await_event(&self, event: *mut ffi::PJRT_Event) -> Result<()> {
        if event.is_null() {
            return Ok(());
        }
        let mut a = pjrt_args!(PJRT_Event_Await_Args);
        a.event = event;
        // SAFETY: `event` is a live event owned by us; it is destroyed exactly once below.
        let status = unsafe { pjrt_call!(self, PJRT_Event_Await, &mut a) };
        let mut d = pjrt_args!(PJRT_Event_Destroy_Args);
        d.event = event;
        // SAFETY: as above.
        let destroyed = unsafe { pjrt_call!(self, PJRT_Event_Destroy, &mut d) };
        status.and(destroyed)
    }
}

/// Copies a (pointer, length) C string into a `String`, replacing invalid UTF-8.
///
/// # Safety
/// `p` must be null or valid for `len` bytes.
pub(crate) unsafe fn lossy(p: *const std::os::raw::c_char, len: usize) -> String {
    if p.is_null() || len == 0 {
        return String::new();
    }
    // SAFETY: guaranteed by the caller.
    let bytes = unsafe { std::slice::from_raw_parts(p as *const u8, len) };
    String::from_utf8_lossy(bytes).into_owned()
}

fn code_name(code: ffi::PJRT_Error_Code) -> String {
    let name = match code {
        ffi::PJRT_Error_Code_CANCELLED => "CANCELLED",
        ffi::PJRT_Error_Code_UNKNOWN => "UNKNOWN",
        ffi::PJRT_Error_Code_INVALID_ARGUMENT => "INVALID_ARGUMENT",
        ffi::PJRT_Error_Code_DEADLINE_EXCEEDED => "DEADLINE_EXCEEDED",
        ffi::PJRT_Error_Code_NOT_FOUND => "NOT_FOUND",
        ffi::PJRT_Error_Code_ALREADY_EXISTS => "ALREADY_EXISTS",
        ffi::PJRT_Error_Code_PERMISSION_DENIED => "PERMISSION_DENIED",
        ffi::PJRT_Error_Code_RESOURCE_EXHAUSTED => "RESOURCE_EXHAUSTED",
        ffi::PJRT_Error_Code_FAILED_PRECONDITION => "FAILED_PRECONDITION",
        ffi::PJRT_Error_Code_ABORTED => "ABORTED",
        ffi::PJRT_Error_Code_OUT_OF_RANGE => "OUT_OF_RANGE",
        ffi::PJRT_Error_Code_UNIMPLEMENTED => "UNIMPLEMENTED",
        ffi::PJRT_Error_Code_INTERNAL => "INTERNAL",
        ffi::PJRT_Error_Code_UNAVAILABLE => "UNAVAILABLE",
        ffi::PJRT_Error_Code_DATA_LOSS => "DATA_LOSS",
        ffi::PJRT_Error_Code_UNAUTHENTICATED => "UNAUTHENTICATED",
        other => return format!("code {other}"),
    };
    name.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A table shorter than an entry's offset means an older plugin: the entry must be
    /// reported as unsupported and never read or called.
    #[test]
    fn functions_beyond_the_plugin_table_are_unsupported() {
        let real = Plugin::load_default().expect("a PJRT plugin");
        // SAFETY: re-opening an already loaded library only bumps its reference count.
        let library = unsafe { libloading::Library::new(real.path()) }.unwrap();
        let cut = std::mem::offset_of!(ffi::PJRT_Api, PJRT_Client_Create);
        let short = Plugin {
            path: real.path().to_path_buf(),
            api: real.api(),
            api_struct_size: cut,
            version: real.api_version(),
            attributes: Vec::new(),
            _library: ManuallyDrop::new(library),
        };
        let mut args = pjrt_args!(PJRT_Client_Create_Args);
        // SAFETY: the call is refused before the table entry is touched.
        let r = unsafe { pjrt_call!(&short, PJRT_Client_Create, &mut args) };
        match r {
            Err(RuntimeError::Unsupported { function }) => {
                assert_eq!(function, "PJRT_Client_Create")
            }
            other => panic!("expected Unsupported, got {other:?}"),
        }
        assert!(args.client.is_null());
        // Entries before the cut are still callable.
        let mut init = pjrt_args!(PJRT_Plugin_Attributes_Args);
        // SAFETY: correctly initialised args.
        unsafe { pjrt_call!(&short, PJRT_Plugin_Attributes, &mut init) }.unwrap();
    }
}
