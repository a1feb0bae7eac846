//! Loading a PJRT plugin, and finding / provisioning one.
//!
//! See the crate documentation for the discovery order. [`locate`] finds (or provisions) a
//! plugin file, [`Plugin::load`] checks and opens it; [`set_log_level`] chooses how much of
//! the plugin's own logging is shown.
//!
//! Other native libraries pinned to a Python wheel (MuJoCo, in `shardes-mujoco`) are found,
//! provisioned and checked with the same pieces: [`PinnedPlugin`] (its
//! [`PinnedPlugin::python_installed`]), [`provision_pinned_to`], [`verify_pinned`] and
//! [`check_elf_exporting`].

pub(crate) mod check;
mod log;
mod provision;

pub use check::MIN_PLUGIN_BYTES;
pub use check::{check_elf_exporting, verify_pinned};
pub use log::{log_level, set_log_level, set_verbose, LogLevel, LOG_ENV};
pub use provision::{
    cache_root, cached_plugin_path, locate, provision, provision_into, provision_pinned_to,
    resolve, PinnedPlugin, CPU, CPU_JAX, CUDA, NAMED, PACKAGE, SO_PATH_IN_WHEEL, SO_SHA256, TPU,
    VERSION, WHEEL_SHA256,
};

use std::collections::HashMap;
use std::mem::ManuallyDrop;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use crate::api::{lossy, pjrt_args, pjrt_call, Api, HasApi};
use crate::error::{Result, RuntimeError};
use crate::ffi;

/// A loaded PJRT plugin (one per plugin file per process).
///
/// Plugins are process-global: [`Plugin::load`] returns the same `Arc` for the same file, and
/// `PJRT_Plugin_Initialize` runs exactly once per file. The shared library is never unloaded:
/// XLA starts thread pools and registers static objects and `atexit` handlers inside the
/// library, so `dlclose` while any of them may still run would crash the process.
pub struct Plugin {
    path: PathBuf,
    api: Api,
    version: (i32, i32),
    attributes: Vec<(String, AttributeValue)>,
    // Never dropped: see the type's documentation.
    _library: ManuallyDrop<libloading::Library>,
}

impl HasApi for Plugin {
    fn pjrt_api(&self) -> &Api {
        &self.api
    }
}

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
    /// Loads the PJRT plugin at `path`, or returns the already-loaded instance for that file.
    ///
    /// The file is checked before it is opened, because `dlopen` of a truncated library
    /// crashes the process: a pinned plugin in the cache (a file at
    /// [`PinnedPlugin::cached_path`] under any root) must match its pinned size and sha256
    /// (hashed once per file identity: a stamp file next to it records size, mtime, inode and
    /// hash, so later processes only compare those); any
    /// other file must be a 64-bit ELF shared object for this machine of at least
    /// [`MIN_PLUGIN_BYTES`], no shorter than its headers say, that exports `GetPjrtApi`
    /// (no checksum: any PJRT plugin is accepted).
    ///
    /// Before the first plugin of the process is opened, XLA's logging is set up as
    /// [`set_log_level`] describes (by default only its warnings and errors are shown).
    ///
    /// Errors: [`RuntimeError::PluginMissing`] if the file does not exist,
    /// [`RuntimeError::PluginIsDirectory`] for a directory,
    /// [`RuntimeError::PluginTruncated`] for a library shorter than its headers say,
    /// [`RuntimeError::PluginDamaged`] for a cached pinned plugin that differs from its pin,
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
        check::check_plugin_file(&canonical)?;
        log::apply()?;
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
            // SAFETY: `api` is non-null and points to the plugin's static table of at least
            // `struct_size` bytes; the library is never unloaded (`_library` is never dropped).
            api: unsafe { Api::new(api, struct_size) },
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

    /// The plugin's function table.
    pub(crate) fn api(&self) -> &Api {
        &self.api
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A table shorter than an entry's offset means an older plugin: the entry must be
    /// reported as unsupported and never read or called.
    #[test]
    fn functions_beyond_the_plugin_table_are_unsupported() {
        let real = Plugin::load_default().expect("a PJRT plugin");
        let cut = std::mem::offset_of!(ffi::PJRT_Api, PJRT_Client_Create);
        // SAFETY: the real plugin's table, which lives for the rest of the process, with a
        // shorter size than it really has (every byte below `cut` is readable).
        let short = unsafe { Api::new(real.api().table(), cut) };
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
