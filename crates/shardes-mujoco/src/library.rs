//! [`Mujoco`]: an opened MuJoCo library, one per file per process, its version checked
//! against the bindings' ([`VERSION`]).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use crate::error::MujocoError;
use crate::provision::{locate, MUJOCO};
use crate::raw::{self, Library, OpenError};

/// `mj_version()` of the library the bindings were generated for (MuJoCo 4.0.0).
pub const VERSION: i32 = raw::VERSION;

/// An opened MuJoCo library (one per file per process, never unloaded).
pub struct Mujoco {
    path: PathBuf,
    lib: Arc<Library>,
}

impl std::fmt::Debug for Mujoco {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mujoco")
            .field("path", &self.path)
            .field("version", &self.version())
            .finish_non_exhaustive()
    }
}

fn registry() -> &'static Mutex<HashMap<PathBuf, Arc<Mujoco>>> {
    static LIBS: OnceLock<Mutex<HashMap<PathBuf, Arc<Mujoco>>>> = OnceLock::new();
    LIBS.get_or_init(|| Mutex::new(HashMap::new()))
}

impl Mujoco {
    /// The library [`locate`] finds (`explicit` first), opened.
    ///
    /// # Errors
    ///
    /// As [`locate`] and [`Mujoco::load`].
    pub fn open(explicit: Option<&Path>) -> Result<Arc<Mujoco>, MujocoError> {
        Mujoco::load(&locate(explicit)?)
    }

    /// Opens the library at `path` (checked first; see the crate documentation), or
    /// returns the one already open from that file.
    ///
    /// # Errors
    ///
    /// [`MujocoError::NotALibrary`] when the file is not a loadable MuJoCo library, and
    /// [`MujocoError::Version`] when it is another MuJoCo version than [`VERSION`].
    pub fn load(path: &Path) -> Result<Arc<Mujoco>, MujocoError> {
        let bad = |reason: String| MujocoError::NotALibrary {
            path: path.to_path_buf(),
            reason,
        };
        let canonical = path.canonicalize().map_err(|e| bad(e.to_string()))?;
        let mut libs = registry().lock().unwrap_or_else(|p| p.into_inner());
        if let Some(lib) = libs.get(&canonical) {
            return Ok(Arc::clone(lib));
        }
        let lib = Library::open(&canonical).map_err(|e| match e {
            OpenError::NotALibrary(reason) => bad(reason),
            OpenError::Version(found) => MujocoError::Version {
                path: canonical.clone(),
                found,
                expected: MUJOCO.version,
            },
        })?;
        let opened = Arc::new(Mujoco {
            path: canonical.clone(),
            lib: Arc::new(lib),
        });
        libs.insert(canonical, Arc::clone(&opened));
        Ok(opened)
    }

    /// The library file (canonical path).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The version it reports, e.g. `4.0.0`.
    pub fn version(&self) -> &str {
        self.lib.version()
    }

    /// Its function table, for loading models.
    pub(crate) fn raw(&self) -> &Arc<Library> {
        &self.lib
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provision::cached_path;

    #[test]
    fn the_cache_path_names_package_version_and_hash() {
        assert_eq!(
            cached_path(Path::new("/c")),
            Path::new("/c/mujoco/mujoco-core-4.0.0-90bc997a73ef/libmujoco.so.4.0.0")
        );
        assert_eq!(VERSION, 4_000_000);
    }

    #[test]
    fn a_file_that_is_not_a_library_is_refused_before_dlopen() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("libmujoco.so");
        std::fs::write(&f, b"not an ELF file").unwrap();
        let e = Mujoco::load(&f).unwrap_err().to_string();
        assert!(e.contains("not a usable MuJoCo library"), "{e}");
        assert!(e.contains("ELF magic"), "{e}");
        let e = locate(Some(&d.path().join("missing.so")))
            .unwrap_err()
            .to_string();
        assert!(e.contains("does not exist"), "{e}");
        let e = locate(Some(d.path())).unwrap_err().to_string();
        assert!(e.contains("is a directory"), "{e}");
    }
}
