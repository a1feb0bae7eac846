//! Finding the MuJoCo library ([`locate`]), provisioning the pinned one ([`MUJOCO`]) into
//! the per-user cache, and checking a file before it is opened ([`check_file`]), with the
//! PJRT plugin's machinery from `shardes-runtime`.

use std::path::{Path, PathBuf};

use shardes_runtime::plugin::{
    cache_root, check_elf_exporting, provision_pinned_to, verify_pinned, PinnedPlugin,
};
use shardes_runtime::RuntimeError;

use crate::error::MujocoError;

/// The pinned MuJoCo library: `libmujoco.so.4.0.0` from the `mujoco-core` 4.0.0 wheel for
/// CPython 3.11 on manylinux 2.28 x86-64 (the library is the same in every CPython wheel of
/// the release; pinning one wheel pins its hash). `tools/gen_mujoco_bindings.sh` generates
/// the bindings from the same wheel.
pub const MUJOCO: PinnedPlugin = PinnedPlugin {
    name: "mujoco",
    package: "mujoco-core",
    version: "4.0.0",
    wheel_sha256: "885bd9b9cc0a6b5ba1114923eb954027652a6a0c115fa46b3218b83bae72ac4f",
    so_path_in_wheel: "mujoco/libmujoco.so.4.0.0",
    so_sha256: "90bc997a73efc90624a120f63eccd67441dfc6c705cd537357508f44757880ba",
    so_size: Some(7_550_456),
    pip_select: &[
        "--platform",
        "manylinux_2_28_x86_64",
        "--python-version",
        "3.11",
        "--implementation",
        "cp",
    ],
    module: "mujoco",
    env: "SHARDES_MUJOCO",
    needs: "nothing else",
    simulated_devices: false,
};

/// Where the pinned library lives under cache root `root`:
/// `root/mujoco/mujoco-core-4.0.0-<first 12 hex of its sha256>/libmujoco.so.4.0.0`.
pub fn cached_path(root: &Path) -> PathBuf {
    root.join("mujoco")
        .join(MUJOCO.cache_dir_name())
        .join(MUJOCO.so_file_name())
}

/// Finds the MuJoCo library (see the crate documentation for the order), provisioning
/// the pinned one into the cache if nothing else is found. An explicit path and
/// `SHARDES_MUJOCO` must name an existing file.
///
/// # Errors
///
/// [`MujocoError::NotALibrary`] for a given path that is missing or a directory,
/// [`MujocoError::NotFound`] (every place looked at) when provisioning failed, and
/// [`MujocoError::Provision`] when there is no cache directory.
pub fn locate(explicit: Option<&Path>) -> Result<PathBuf, MujocoError> {
    let given = explicit.map(Path::to_path_buf).or_else(|| {
        std::env::var_os(MUJOCO.env)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    });
    if let Some(p) = given {
        return if p.is_file() {
            Ok(p)
        } else {
            let reason = if p.is_dir() {
                "it is a directory"
            } else {
                "it does not exist"
            };
            Err(MujocoError::NotALibrary {
                path: p,
                reason: reason.into(),
            })
        };
    }
    let mut tried = Vec::new();
    if let Some(so) = MUJOCO.python_installed(&mut tried) {
        return Ok(so);
    }
    let root = cache_root().map_err(provision_error)?;
    let cached = cached_path(&root);
    if cached.is_file() {
        return Ok(cached);
    }
    tried.push(cached.clone());
    provision_pinned_to(&MUJOCO, cached).map_err(|e| MujocoError::NotFound {
        tried,
        provision: e.to_string(),
    })
}

/// Provisions the pinned library under cache root `root` ([`cached_path`]); a no-op if it
/// is there. Safe to call concurrently (as the PJRT plugin's provisioning).
///
/// # Errors
///
/// [`MujocoError::Provision`] with the commands that do it by hand.
pub fn provision_into(root: &Path) -> Result<PathBuf, MujocoError> {
    provision_pinned_to(&MUJOCO, cached_path(root)).map_err(provision_error)
}

fn provision_error(e: RuntimeError) -> MujocoError {
    match e {
        RuntimeError::Provision { reason, manual } => MujocoError::Provision { reason, manual },
        other => MujocoError::Provision {
            reason: other.to_string(),
            manual: format!(
                "run `python3 -m pip download --no-deps {}=={}` and set {} to the {} inside \
                 the wheel",
                MUJOCO.package, MUJOCO.version, MUJOCO.env, MUJOCO.so_path_in_wheel
            ),
        },
    }
}

/// Checks the library file at `path` (canonical) before it is opened: the pinned cached
/// library must match its pin (size, and sha256 once per file identity); any other file
/// must be a complete ELF shared object for this machine that exports `mj_versionString`.
/// `Err` says what is wrong, worded to follow "is not a usable MuJoCo library: ".
pub(crate) fn check_file(path: &Path) -> Result<(), String> {
    let pinned = path.file_name().and_then(|f| f.to_str()) == Some(MUJOCO.so_file_name())
        && path
            .parent()
            .and_then(Path::file_name)
            .and_then(|d| d.to_str())
            == Some(MUJOCO.cache_dir_name().as_str());
    let checked = if pinned {
        verify_pinned(&MUJOCO, path)
    } else {
        check_elf_exporting(
            path,
            b"mj_versionString",
            "MuJoCo library",
            "libmujoco is several MB",
        )
    };
    checked.map_err(reason_of)
}

/// The part of a file check's error that says what is wrong (its messages are worded for
/// PJRT plugins; the path and fix come from [`MujocoError::NotALibrary`]).
fn reason_of(e: RuntimeError) -> String {
    match e {
        RuntimeError::NotAPlugin { reason, .. } => reason,
        RuntimeError::PluginTruncated { size, needed, .. } => {
            format!("it is truncated ({size} bytes, but its ELF headers need {needed})")
        }
        RuntimeError::PluginDamaged { problem, .. } => problem,
        RuntimeError::PluginIsDirectory { .. } => "it is a directory".into(),
        other => other.to_string(),
    }
}
