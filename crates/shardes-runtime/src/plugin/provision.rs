//! Finding a plugin file, and provisioning the pinned CPU plugin into a per-user cache.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::error::{Result, RuntimeError};
// `hex` is re-exported for the plugin checks (`check.rs`), which hash cached plugins alike.
pub(super) use crate::pinned::hex;
use crate::pinned::{provision_with, python, PinnedWheelFile};

/// A PJRT plugin pinned by package version and checksums, provisionable through pip.
///
/// The wheel is fetched with `python3 -m pip download --no-deps --require-hashes` (pinned
/// version and wheel sha256, and `pip_select` flags that pick the same wheel whatever the
/// local Python), the plugin library is extracted and its sha256 checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PinnedPlugin {
    /// The name a config uses: `cpu`, `cpu-jax`, `cuda` or `tpu`.
    pub name: &'static str,
    /// The Python package that ships the plugin.
    pub package: &'static str,
    /// Its pinned version.
    pub version: &'static str,
    /// sha256 of the pinned wheel.
    pub wheel_sha256: &'static str,
    /// Path of the plugin library inside the wheel.
    pub so_path_in_wheel: &'static str,
    /// sha256 of the plugin library.
    pub so_sha256: &'static str,
    /// Size of the plugin library in bytes, where known; checked on every load of the cached
    /// file (see [`crate::Plugin::load`]). `None` until someone records it: the sha256 is
    /// still checked, and the size is then compared with the one recorded when it was.
    pub so_size: Option<u64>,
    /// pip flags that select the pinned wheel (platform and Python tags).
    pub pip_select: &'static [&'static str],
    /// The importable module whose directory holds the library when the package is
    /// pip-installed in a Python environment (where its RPATH finds its runtime libraries).
    pub module: &'static str,
    /// Environment variable naming the library directly.
    pub env: &'static str,
    /// What else the plugin needs at run time.
    pub needs: &'static str,
    /// Whether its devices are simulated CPU devices, so that a client asks it for the
    /// config's `devices` (`cpu_device_count`); accelerator plugins have real devices.
    pub simulated_devices: bool,
}

/// The pinned CPU plugin (the default).
pub const CPU: PinnedPlugin = PinnedPlugin {
    name: "cpu",
    package: "xla-cpu-pjrt",
    version: "0.0.1",
    wheel_sha256: "55837b6b7b47daa717f2d9a5a03563ea0ceaa338d06a81a1e2d3f060d960decc",
    so_path_in_wheel: "xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so",
    so_sha256: "88c3f28c5900f48ad4a82cab9e79bba9537809743395e341485f8794268820dc",
    so_size: Some(259_284_552),
    pip_select: &[],
    module: "xla_plugins.xla_cpu_pjrt",
    env: "SHARDES_PJRT_PLUGIN",
    needs: "nothing else",
    simulated_devices: true,
};

/// An opt-in, newer CPU plugin: the XLA:CPU of jax 0.11.2, as the `lammps-jax-pjrt-cpu`
/// package ships it (202 MB unpacked; the package is a plain build of that XLA's CPU
/// plugin). Its dots go through YNNPACK, and bf16 dots reach the CPU's AMX units, where
/// the default plugin's are no faster than f32: on this project's 2-core machine the
/// SmolLM2 decode step is faster in f32 and much faster in bf16 (`docs/performance.md`,
/// "A newer XLA:CPU" and "the targets on `cpu-jax`"). It is not the default because its
/// float results drift from the JAX references the tests hold shardes to (computed by
/// jax 0.10.2): on it the quickstart's generation 0 ranks 6 of 256 members differently
/// from JAX (the default plugin ranks all as JAX did), and its `chlo.erf_inv` differs from
/// the default plugin's in the last bit for 0.7 % of inputs.
pub const CPU_JAX: PinnedPlugin = PinnedPlugin {
    name: "cpu-jax",
    package: "lammps-jax-pjrt-cpu",
    version: "0.11.2",
    wheel_sha256: "1319390d948b39f69f7dade496b7c385149d9ca6097a6b62114da113216d9ad1",
    so_path_in_wheel: "lammps_jax_pjrt_cpu/pjrt_c_api_cpu_plugin.so",
    so_sha256: "ad1309ac822b1b24d51b7f9947c7c9fa9ef5d67f390584cbc3d1fa2428fed9c2",
    so_size: Some(201_600_336),
    pip_select: &[],
    module: "lammps_jax_pjrt_cpu",
    env: "SHARDES_PJRT_CPU_JAX",
    needs: "nothing else",
    simulated_devices: true,
};

/// The pinned CUDA 12 plugin (`jax-cuda12-pjrt`, 487 MB unpacked).
pub const CUDA: PinnedPlugin = PinnedPlugin {
    name: "cuda",
    package: "jax-cuda12-pjrt",
    version: "0.12.0.1",
    wheel_sha256: "5ec28e06198d094031c37590b4ea753ae8cde4879ab4b60baf40f0dffb673286",
    so_path_in_wheel: "jax_plugins/xla_cuda12/xla_cuda_plugin.so",
    so_sha256: "921aaa9c635255fb7b7a660d11c8f702c78a70e7f7d005d4f377c2dc5f0fede2",
    so_size: None,
    pip_select: &["--platform", "manylinux_2_27_x86_64"],
    module: "jax_plugins.xla_cuda12",
    env: "SHARDES_PJRT_CUDA",
    needs: "an NVIDIA driver and the CUDA 12 runtime libraries: `python3 -m pip install \
            jax-cuda12-pjrt==0.12.0.1 jax-cuda12-plugin[with_cuda]==0.12.0.1` installs both \
            (shardes then finds the plugin in that Python environment), or put a CUDA 12 \
            installation on LD_LIBRARY_PATH",
    simulated_devices: false,
};

/// The pinned TPU plugin (`libtpu`).
pub const TPU: PinnedPlugin = PinnedPlugin {
    name: "tpu",
    package: "libtpu",
    version: "0.0.51",
    wheel_sha256: "ba67ddbfdbac61c8da1fafc26cd51b93e9fe4d298016e2882eb986b1718cba34",
    so_path_in_wheel: "libtpu/libtpu.so",
    so_sha256: "ad0b2a3bc5d4de96f653b3701aaed8769a691776ca0e14c791dcdca785d43e42",
    so_size: None,
    pip_select: &[
        "--platform",
        "manylinux_2_31_x86_64",
        "--python-version",
        "3.11",
        "--implementation",
        "cp",
    ],
    module: "libtpu",
    env: "SHARDES_PJRT_TPU",
    needs: "a TPU VM (TPU devices under /dev/accel* or /dev/vfio)",
    simulated_devices: false,
};

/// The named plugins a config may give as `plugin = "NAME"`.
pub const NAMED: [PinnedPlugin; 4] = [CPU, CPU_JAX, CUDA, TPU];

/// Python package that ships the pinned PJRT CPU plugin.
pub const PACKAGE: &str = CPU.package;
/// Pinned version of [`PACKAGE`].
pub const VERSION: &str = CPU.version;
/// sha256 of the pinned wheel (`xla_cpu_pjrt-0.0.1-py3-none-manylinux_2_27_x86_64.whl`).
pub const WHEEL_SHA256: &str = CPU.wheel_sha256;
/// sha256 of the plugin shared library inside the pinned wheel.
pub const SO_SHA256: &str = CPU.so_sha256;
/// Path of the plugin inside the wheel.
pub const SO_PATH_IN_WHEEL: &str = CPU.so_path_in_wheel;

const SO_FILE_NAME: &str = "xla_cpu_pjrt.so";
const ENV_PLUGIN: &str = CPU.env;
const ENV_CACHE: &str = "SHARDES_CACHE_DIR";
const REPO_DIR: &str = "xla_extension";

/// Finds a PJRT plugin file, provisioning the pinned CPU plugin if nothing else is found.
///
/// Order: `explicit` → env `SHARDES_PJRT_PLUGIN` → `xla_extension/*.so` in the repository
/// (searched upwards from the current directory, then next to the crate's source tree) → the
/// per-user cache (see [`cache_root`]); if the cache is empty, [`provision`] fills it.
///
/// An explicit path or the environment variable must name an existing file (a directory is
/// refused as such); it is not checksummed (any PJRT plugin is accepted). Errors list every
/// path that was tried.
pub fn locate(explicit: Option<&Path>) -> Result<PathBuf> {
    if let Some(p) = explicit {
        return existing(p);
    }
    if let Some(p) = std::env::var_os(ENV_PLUGIN).filter(|v| !v.is_empty()) {
        return existing(Path::new(&p));
    }
    let mut tried = Vec::new();
    for dir in repo_plugin_dirs() {
        if let Some(so) = plugin_in_dir(&dir) {
            return Ok(so);
        }
        tried.push(dir.join("*.so"));
    }
    let root = cache_root()?;
    let cached = cached_plugin_path(&root);
    if cached.is_file() {
        return Ok(cached);
    }
    tried.push(cached);
    provision_into(&root).map_err(|e| RuntimeError::PluginNotFound {
        tried,
        provision_hint: e.to_string(),
    })
}

/// Resolves a config's `plugin` value: `cpu` (the default discovery, [`locate`]), `cuda`
/// or `tpu` (see [`PinnedPlugin::locate`]), or a path to any PJRT plugin library.
pub fn resolve(plugin: &str) -> Result<PathBuf> {
    match NAMED.iter().find(|p| p.name.eq_ignore_ascii_case(plugin)) {
        Some(p) if p.name == CPU.name => locate(None),
        Some(p) => p.locate(),
        None => locate(Some(Path::new(plugin))),
    }
}

impl PinnedPlugin {
    /// The library as a [`PinnedWheelFile`]: what is provisioned, and how it is checked.
    pub const fn wheel_file(&self) -> PinnedWheelFile {
        PinnedWheelFile {
            package: self.package,
            version: self.version,
            wheel_sha256: self.wheel_sha256,
            path_in_wheel: self.so_path_in_wheel,
            file_sha256: self.so_sha256,
            size: self.so_size,
            pip_select: self.pip_select,
        }
    }

    /// The library's file name.
    pub fn so_file_name(&self) -> &'static str {
        self.so_path_in_wheel
            .rsplit('/')
            .next()
            .unwrap_or(self.so_path_in_wheel)
    }

    /// Where this plugin lives under cache root `root`:
    /// `root/pjrt/<package>-<version>-<first 12 hex of the library's sha256>/<file>`.
    pub fn cached_path(&self, root: &Path) -> PathBuf {
        root.join("pjrt")
            .join(self.cache_dir_name())
            .join(self.so_file_name())
    }

    /// `<package>-<version>-<first 12 hex of the library's sha256>`: the cache directory's
    /// name, by which a cached copy is also recognised when loaded.
    pub fn cache_dir_name(&self) -> String {
        format!(
            "{}-{}-{}",
            self.package,
            self.version,
            &self.so_sha256[..12]
        )
    }

    /// Finds this plugin: the environment variable [`PinnedPlugin::env`], then the package
    /// installed in the Python environment (`$SHARDES_PYTHON` or `python3`), then the per-user
    /// cache; if none has it, provisions it into the cache. Errors list what was tried and
    /// what the plugin needs besides itself.
    pub fn locate(&self) -> Result<PathBuf> {
        if let Some(p) = std::env::var_os(self.env).filter(|v| !v.is_empty()) {
            return existing(Path::new(&p));
        }
        let mut tried = Vec::new();
        if let Some(so) = self.python_installed(&mut tried) {
            return Ok(so);
        }
        let root = cache_root()?;
        let cached = self.cached_path(&root);
        if cached.is_file() {
            return Ok(cached);
        }
        tried.push(cached);
        self.provision_into(&root)
            .map_err(|e| RuntimeError::PluginNotFound {
                tried,
                provision_hint: format!("{e}; the {} plugin also needs {}", self.name, self.needs),
            })
    }

    /// The library inside [`PinnedPlugin::module`] as installed in the Python environment
    /// (`$SHARDES_PYTHON` or `python3`), if it is there; if not, what was looked at (the
    /// file, or that the module is not installed) is added to `tried`.
    pub fn python_installed(&self, tried: &mut Vec<PathBuf>) -> Option<PathBuf> {
        match python_module_dir(self.module) {
            Some(dir) => {
                let so = dir.join(self.so_file_name());
                if so.is_file() {
                    return Some(so);
                }
                tried.push(so);
            }
            None => tried.push(PathBuf::from(format!(
                "(python module {} not installed)",
                self.module
            ))),
        }
        None
    }

    /// Provisions this plugin under cache root `root` (see [`PinnedPlugin::cached_path`]);
    /// a no-op if it is there. Concurrency-safe as [`provision_into`].
    pub fn provision_into(&self, root: &Path) -> Result<PathBuf> {
        provision_pinned(self, root)
    }
}

/// The directory of an importable Python package, without importing it (its parent
/// packages are imported, which for the plugin namespaces runs no plugin code).
pub(crate) fn python_module_dir(module: &str) -> Option<PathBuf> {
    let out = Command::new(python())
        .args([
            "-c",
            "import importlib.util as u, sys\n\
             try:\n    s = u.find_spec(sys.argv[1])\n\
             except Exception:\n    s = None\n\
             print(s.submodule_search_locations[0] if s and s.submodule_search_locations else '')",
            module,
        ])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (out.status.success() && !text.is_empty()).then(|| PathBuf::from(text))
}

fn existing(p: &Path) -> Result<PathBuf> {
    if p.is_file() {
        Ok(p.to_path_buf())
    } else if p.is_dir() {
        Err(RuntimeError::PluginIsDirectory {
            path: p.to_path_buf(),
        })
    } else {
        Err(RuntimeError::PluginMissing {
            path: p.to_path_buf(),
        })
    }
}

/// Candidate `xla_extension/` directories: upwards from the current directory, then the one
/// next to this crate's sources (baked in at compile time, so tests and tools run from anywhere
/// inside or outside the checkout still find it).
fn repo_plugin_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Ok(cwd) = std::env::current_dir() {
        for anc in cwd.ancestors() {
            let d = anc.join(REPO_DIR);
            if d.is_dir() {
                dirs.push(d);
                break;
            }
        }
    }
    let baked = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("..")
        .join(REPO_DIR);
    if baked.is_dir() && !dirs.iter().any(|d| same_dir(d, &baked)) {
        dirs.push(baked);
    }
    dirs
}

fn same_dir(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

/// The plugin in a repository `xla_extension/` directory: `xla_cpu_pjrt.so` if present,
/// otherwise the first `*.so` in name order (so the choice is deterministic).
fn plugin_in_dir(dir: &Path) -> Option<PathBuf> {
    let preferred = dir.join(SO_FILE_NAME);
    if preferred.is_file() {
        return Some(preferred);
    }
    let mut sos: Vec<PathBuf> = fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file() && p.extension().is_some_and(|x| x == "so"))
        .collect();
    sos.sort();
    sos.into_iter().next()
}

/// Root of shardes' per-user cache: `$SHARDES_CACHE_DIR` if set, else
/// `$XDG_CACHE_HOME/shardes`, else `~/.cache/shardes`.
pub fn cache_root() -> Result<PathBuf> {
    if let Some(d) = std::env::var_os(ENV_CACHE).filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(d));
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(d).join("shardes"));
    }
    match std::env::var_os("HOME").filter(|v| !v.is_empty()) {
        Some(h) => Ok(PathBuf::from(h).join(".cache").join("shardes")),
        None => Err(RuntimeError::Provision {
            reason: "no cache directory: neither SHARDES_CACHE_DIR, XDG_CACHE_HOME nor HOME is set"
                .into(),
            manual: manual_steps(Path::new("$SHARDES_CACHE_DIR")),
        }),
    }
}

/// Where the pinned plugin lives under cache root `root`:
/// `root/pjrt/xla-cpu-pjrt-0.0.1-<first 12 hex of the .so sha256>/xla_cpu_pjrt.so`.
pub fn cached_plugin_path(root: &Path) -> PathBuf {
    CPU.cached_path(root)
}

/// Provisions the pinned CPU plugin into the default cache root ([`cache_root`]) and returns
/// its path. A no-op if it is already there.
pub fn provision() -> Result<PathBuf> {
    provision_into(&cache_root()?)
}

/// Provisions the pinned CPU plugin under cache root `root` (see [`cached_plugin_path`]).
///
/// Safe to call concurrently from threads and processes: an exclusive file lock in the target
/// directory serialises the work, and the file appears atomically (written to a temporary
/// name, fsynced, renamed), so readers never see a partial plugin. The wheel is fetched by
/// `python3 -m pip download` (override the interpreter with `SHARDES_PYTHON`) with the version
/// and the wheel's sha256 pinned; the extracted library's sha256 is checked as well.
pub fn provision_into(root: &Path) -> Result<PathBuf> {
    provision_pinned(&CPU, root)
}

fn provision_pinned(p: &PinnedPlugin, root: &Path) -> Result<PathBuf> {
    provision_pinned_to(p, p.cached_path(root))
}

/// Provisions the pinned library `p` at `target` (see [`provision_into`]); a no-op if it
/// is there. Libraries other than PJRT plugins (MuJoCo) choose their own cache path.
///
/// # Errors
///
/// [`RuntimeError::Provision`] with the commands that do it by hand, when the wheel cannot
/// be fetched, unpacked or checked.
pub fn provision_pinned_to(p: &PinnedPlugin, target: PathBuf) -> Result<PathBuf> {
    provision_with(&p.wheel_file(), &target, &|dir| manual_steps_for(p, dir))
}

/// The exact commands that do by hand what provisioning does.
fn manual_steps(dir: &Path) -> String {
    manual_steps_for(&CPU, dir)
}

fn manual_steps_for(p: &PinnedPlugin, dir: &Path) -> String {
    format!(
        "{}, or set {env}=/path/to/{file}",
        p.wheel_file().manual_steps(dir),
        env = p.env,
        file = p.so_file_name(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_layout_names_version_and_hash() {
        let p = cached_plugin_path(Path::new("/c"));
        assert_eq!(
            p,
            Path::new("/c/pjrt/xla-cpu-pjrt-0.0.1-88c3f28c5900/xla_cpu_pjrt.so")
        );
        assert_eq!(&SO_SHA256[..12], "88c3f28c5900");
    }

    #[test]
    fn repo_dir_prefers_the_cpu_plugin_then_name_order() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(plugin_in_dir(d.path()), None);
        fs::write(d.path().join("zz_other.so"), b"x").unwrap();
        fs::write(d.path().join("b_plugin.so"), b"x").unwrap();
        fs::write(d.path().join("README.txt"), b"x").unwrap();
        assert_eq!(plugin_in_dir(d.path()), Some(d.path().join("b_plugin.so")));
        fs::write(d.path().join(SO_FILE_NAME), b"x").unwrap();
        assert_eq!(plugin_in_dir(d.path()), Some(d.path().join(SO_FILE_NAME)));
    }

    #[test]
    fn explicit_path_must_exist_and_skips_checksums() {
        let d = tempfile::tempdir().unwrap();
        let missing = d.path().join("nope.so");
        assert!(matches!(
            locate(Some(&missing)),
            Err(RuntimeError::PluginMissing { .. })
        ));
        // Any existing file is accepted by discovery; loading decides whether it is a plugin.
        let any = d.path().join("custom_plugin.so");
        fs::write(&any, b"not checked here").unwrap();
        assert_eq!(locate(Some(&any)).unwrap(), any);
    }

    #[test]
    fn named_plugins_have_distinct_pins_and_cache_paths() {
        let root = Path::new("/c");
        assert_eq!(CPU.cached_path(root), cached_plugin_path(root));
        assert_eq!(
            CUDA.cached_path(root),
            Path::new("/c/pjrt/jax-cuda12-pjrt-0.12.0.1-921aaa9c6352/xla_cuda_plugin.so")
        );
        assert_eq!(
            TPU.cached_path(root),
            Path::new("/c/pjrt/libtpu-0.0.51-ad0b2a3bc5d4/libtpu.so")
        );
        for p in NAMED {
            assert_eq!(p.wheel_sha256.len(), 64, "{}", p.name);
            assert_eq!(p.so_sha256.len(), 64, "{}", p.name);
            let m = manual_steps_for(&p, Path::new("/d"));
            assert!(m.contains(&format!("{}=={}", p.package, p.version)), "{m}");
            assert!(m.contains(p.env), "{m}");
        }
        // A name that is not a plugin's is a path, and a missing path says so.
        assert!(matches!(
            resolve("/nonexistent/libfoo.so"),
            Err(RuntimeError::PluginMissing { .. })
        ));
    }

    #[test]
    fn manual_steps_name_the_command_and_the_target() {
        let m = manual_steps(Path::new("/cache/dir"));
        assert!(m.contains("python3 -m pip download --no-deps xla-cpu-pjrt==0.0.1"));
        assert!(m.contains("-d /cache/dir"));
        assert!(m.contains(SO_SHA256));
        assert!(m.contains(ENV_PLUGIN));
    }
}
