//! [`Model`]: an owned compiled MuJoCo model (`mjModel`), and what it describes: its
//! [`Joint`]s, [`Sensor`]s and `<custom><numeric>` elements ([`Numeric`]).
//!
//! A model is read-only once compiled (`mj_step` takes `const mjModel*`), so one [`Model`]
//! is shared by any number of simulations ([`crate::Data`]) on any threads (`Arc<Model>`,
//! `Sync`). Every array view is bounded by the model's counts.

use std::ffi::{c_int, CString};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::MujocoError;
use crate::ffi;
use crate::library::Mujoco;
use crate::raw::RawModel;

/// The kind of a joint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum JointKind {
    /// A free joint (7 qpos, 6 dof).
    Free,
    /// A ball joint (4 qpos, 3 dof).
    Ball,
    /// A slide joint (1 qpos, 1 dof).
    Slide,
    /// A hinge joint (1 qpos, 1 dof).
    Hinge,
}

/// A joint of a model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Joint {
    /// Its name (empty if the model gives none).
    pub name: String,
    /// Its kind.
    pub kind: JointKind,
    /// Index of its first coordinate in `qpos`.
    pub qpos_adr: usize,
}

/// A sensor of a model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sensor {
    /// Its name (empty if the model gives none).
    pub name: String,
    /// Index of its first value in `sensordata`.
    pub adr: usize,
    /// Its number of values.
    pub dim: usize,
}

/// A `<custom><numeric>` element of a model.
#[derive(Debug, Clone, PartialEq)]
pub struct Numeric {
    /// Its name.
    pub name: String,
    /// Its values.
    pub data: Vec<f64>,
}

/// A compiled MuJoCo model, loaded from an MJCF (or URDF) file.
pub struct Model {
    lib: Arc<Mujoco>,
    raw: Arc<RawModel>,
    path: PathBuf,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("path", &self.path)
            .field("nq", &self.nq())
            .field("nv", &self.nv())
            .field("nu", &self.nu())
            .finish_non_exhaustive()
    }
}

/// An index of the model's `int` arrays as `usize` (never negative in a compiled model).
fn index(v: c_int) -> usize {
    usize::try_from(v).unwrap_or(0)
}

impl Model {
    /// Loads and compiles the model file `path` (MJCF or URDF).
    ///
    /// # Errors
    ///
    /// [`MujocoError::Load`] with MuJoCo's message for a file MuJoCo refuses (or that is
    /// missing, a directory, or a path with a NUL byte).
    pub fn load(lib: &Arc<Mujoco>, path: &Path) -> Result<Model, MujocoError> {
        let load_error = |message: String| MujocoError::Load {
            path: path.to_path_buf(),
            message,
        };
        if !path.is_file() {
            return Err(load_error(if path.is_dir() {
                "it is a directory, not a model file".into()
            } else {
                "no such file".into()
            }));
        }
        let c_path = CString::new(path.as_os_str().as_encoded_bytes())
            .map_err(|_| load_error("the path contains a NUL byte".into()))?;
        match lib.raw().load_xml(&c_path) {
            Ok(raw) => Ok(Model {
                lib: Arc::clone(lib),
                raw: Arc::new(raw),
                path: path.to_path_buf(),
            }),
            Err(text) => {
                // One line: MuJoCo puts the element and line number on a line of their own.
                let message = text
                    .lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty())
                    .collect::<Vec<_>>()
                    .join("; ");
                Err(load_error(if message.is_empty() {
                    "MuJoCo gave no reason".into()
                } else {
                    message
                }))
            }
        }
    }

    /// The owned `mjModel`, for a simulation of it.
    pub(crate) fn raw(&self) -> &Arc<RawModel> {
        &self.raw
    }

    /// The file the model was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The library the model was loaded with.
    pub fn library(&self) -> &Arc<Mujoco> {
        &self.lib
    }

    /// Position coordinates, `nq`.
    pub fn nq(&self) -> usize {
        self.raw.nq()
    }

    /// Degrees of freedom, `nv`.
    pub fn nv(&self) -> usize {
        self.raw.nv()
    }

    /// Actuators (controls), `nu`.
    pub fn nu(&self) -> usize {
        self.raw.nu()
    }

    /// Sensor values, `nsensordata`.
    pub fn nsensordata(&self) -> usize {
        self.raw.nsensordata()
    }

    /// The simulation time step in seconds (`<option timestep>`).
    pub fn timestep(&self) -> f64 {
        self.raw.get().opt.timestep
    }

    /// The reference positions `qpos0` (`[nq]`), where `mj_resetData` puts the model.
    pub fn qpos0(&self) -> &[f64] {
        self.raw.qpos0()
    }

    /// Actuator `i`'s control range, when it is limited (`ctrlrange` with `ctrllimited`).
    pub fn ctrl_range(&self, i: usize) -> Option<(f64, f64)> {
        if i >= self.nu() {
            return None;
        }
        let (limited, range) = self.raw.ctrl_limits();
        (limited.get(i).copied()? && range.len() == 2 * self.nu())
            .then(|| (range[2 * i], range[2 * i + 1]))
    }

    /// The name at `adr` in the model's name buffer.
    fn name_at(&self, adr: c_int) -> String {
        let names = self.raw.names();
        let tail = names.get(index(adr)..).unwrap_or(&[]);
        let end = tail.iter().position(|&b| b == 0).unwrap_or(tail.len());
        String::from_utf8_lossy(&tail[..end]).into_owned()
    }

    /// The joints, in model order.
    pub fn joints(&self) -> Vec<Joint> {
        let (kinds, adrs, names) = self.raw.joint_arrays();
        (0..kinds.len().min(adrs.len()).min(names.len()))
            .map(|j| Joint {
                name: self.name_at(names[j]),
                kind: match kinds[j] as ffi::mjtJoint {
                    ffi::mjJNT_FREE => JointKind::Free,
                    ffi::mjJNT_BALL => JointKind::Ball,
                    ffi::mjJNT_SLIDE => JointKind::Slide,
                    _ => JointKind::Hinge,
                },
                qpos_adr: index(adrs[j]),
            })
            .collect()
    }

    /// The sensors, in model order.
    pub fn sensors(&self) -> Vec<Sensor> {
        let (adrs, dims, names) = self.raw.sensor_arrays();
        (0..adrs.len().min(dims.len()).min(names.len()))
            .map(|s| Sensor {
                name: self.name_at(names[s]),
                adr: index(adrs[s]),
                dim: index(dims[s]),
            })
            .collect()
    }

    /// The `<custom><numeric>` elements, in model order.
    pub fn numerics(&self) -> Vec<Numeric> {
        let (adrs, sizes, names, data) = self.raw.numeric_arrays();
        (0..adrs.len().min(sizes.len()).min(names.len()))
            .map(|k| {
                let (a, s) = (index(adrs[k]), index(sizes[k]));
                Numeric {
                    name: self.name_at(names[k]),
                    data: data.get(a..a + s).unwrap_or(&[]).to_vec(),
                }
            })
            .collect()
    }
}
