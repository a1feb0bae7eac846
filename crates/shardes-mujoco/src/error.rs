//! [`MujocoError`]: what can go wrong finding, opening and using the MuJoCo library.

use std::path::PathBuf;

/// Errors of this crate. Each message says what is wrong and how to fix it.
#[derive(Debug, thiserror::Error)]
pub enum MujocoError {
    /// No library was found and provisioning it failed.
    #[error(
        "no MuJoCo library found; looked at:\n{}\nfix: set SHARDES_MUJOCO=/path/to/libmujoco.so.4.0.0, \
         or let shardes provision it ({provision})",
        tried.iter().map(|p| format!("  - {}", p.display())).collect::<Vec<_>>().join("\n")
    )]
    NotFound {
        /// Every place looked at, in order.
        tried: Vec<PathBuf>,
        /// Why provisioning failed, with the manual steps.
        provision: String,
    },

    /// Downloading, unpacking or checking the pinned library failed.
    #[error("provisioning the MuJoCo library failed: {reason}\nto do it by hand: {manual}")]
    Provision {
        /// What failed.
        reason: String,
        /// The commands that do it by hand.
        manual: String,
    },

    /// The file is not a loadable MuJoCo library (missing, a directory, not an ELF shared
    /// object for this machine, truncated, damaged, or `dlopen` refused it).
    #[error(
        "{path} is not a usable MuJoCo library: {reason}; fix: point SHARDES_MUJOCO at the \
         libmujoco.so.4.0.0 of the mujoco-core 4.0.0 wheel, or unset it to let shardes \
         provision that one"
    )]
    NotALibrary {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },

    /// The library is another MuJoCo version than the bindings were generated for.
    #[error(
        "{path} is MuJoCo {found}, but shardes is built against MuJoCo {expected} (the layout of \
         mjModel and mjData changes between versions); fix: use libmujoco.so.{expected} (the \
         mujoco-core {expected} wheel), or unset SHARDES_MUJOCO to let shardes provision it"
    )]
    Version {
        /// The library file.
        path: PathBuf,
        /// The version it reports (`mj_versionString`).
        found: String,
        /// The version of the bindings.
        expected: &'static str,
    },

    /// MuJoCo refused a model file; `message` is MuJoCo's own.
    #[error("MuJoCo cannot load {path}: {message}")]
    Load {
        /// The model file.
        path: PathBuf,
        /// MuJoCo's message (what and where in the file).
        message: String,
    },

    /// A model is larger than this machine's address space allows (a count that does not
    /// fit `usize`), or MuJoCo could not allocate a model's data.
    #[error("MuJoCo model {path}: {what}")]
    Model {
        /// The model file.
        path: PathBuf,
        /// What failed.
        what: String,
    },
}
