//! Owned MuJoCo models and simulations: [`Model`] (a compiled `mjModel`) and [`Data`] (an
//! `mjData`, one simulation of a model), each freed in its `Drop`.
//!
//! A model is read-only once compiled (`mj_step` takes `const mjModel*`), so one [`Model`]
//! is shared by any number of simulations on any threads (`Arc<Model>`, `Sync`); a [`Data`]
//! is one simulation's mutable state, moved between threads but used by one at a time
//! (`Send`, not `Sync`). Every array view is bounded by the model's counts.

use std::ffi::{c_char, c_int, CStr, CString};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::Arc;

use super::error::MujocoError;
use super::{ffi, Mujoco};

/// How much of MuJoCo's load error is kept (its messages are one or two lines).
const ERROR_BYTES: usize = 1024;

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
    ptr: NonNull<ffi::mjModel>,
    path: PathBuf,
}

// SAFETY: MuJoCo never writes a compiled mjModel during simulation (every mj_* function
// this wrapper calls takes it as `const mjModel*`), and MuJoCo documents one model as
// shareable by threads that each step their own mjData. The wrapper offers no mutation.
unsafe impl Send for Model {}
// SAFETY: as above: shared references only ever read the model.
unsafe impl Sync for Model {}

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

/// A count of the model as `usize` (MuJoCo's are `int64`, never negative).
fn count(v: i64) -> usize {
    usize::try_from(v).unwrap_or(0)
}

/// An index of the model's `int` arrays as `usize` (never negative in a compiled model).
fn index(v: c_int) -> usize {
    usize::try_from(v).unwrap_or(0)
}

/// `len` elements at `ptr`, or none when MuJoCo left the array empty (a null pointer).
///
/// # Safety
/// When `len > 0` and `ptr` is not null, `ptr` must point to `len` initialised elements
/// that live, unmodified, for `'a`.
unsafe fn view<'a, T>(ptr: *const T, len: usize) -> &'a [T] {
    if ptr.is_null() || len == 0 {
        &[]
    } else {
        // SAFETY: the caller's contract.
        unsafe { std::slice::from_raw_parts(ptr, len) }
    }
}

/// `len` elements at `ptr`, mutable.
///
/// # Safety
/// As [`view`], and nothing else may access the elements for `'a`.
unsafe fn view_mut<'a, T>(ptr: *mut T, len: usize) -> &'a mut [T] {
    if ptr.is_null() || len == 0 {
        &mut []
    } else {
        // SAFETY: the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(ptr, len) }
    }
}

impl Model {
    /// Loads and compiles the model file `path` (MJCF or URDF). A file MuJoCo refuses
    /// gives [`MujocoError::Load`] with MuJoCo's message.
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
        let mut error = vec![0 as c_char; ERROR_BYTES];
        // MuJoCo's XML reader and compiler keep global state (the element schema, the
        // plugin and resource tables); loads are serialised, simulations are not.
        static LOADING: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _one = LOADING.lock().unwrap_or_else(|p| p.into_inner());
        // SAFETY: `c_path` is a NUL-terminated path; a null VFS means the file system;
        // `error` is writable for ERROR_BYTES bytes, the size passed, and MuJoCo writes a
        // NUL-terminated message of at most that size into it.
        let raw = unsafe {
            lib.ffi().mj_loadXML(
                c_path.as_ptr(),
                std::ptr::null(),
                error.as_mut_ptr(),
                ERROR_BYTES as c_int,
            )
        };
        match NonNull::new(raw) {
            Some(ptr) => Ok(Model {
                lib: Arc::clone(lib),
                ptr,
                path: path.to_path_buf(),
            }),
            None => {
                // MuJoCo's buffer is NUL-terminated within its size; the last byte is kept 0.
                error[ERROR_BYTES - 1] = 0;
                // SAFETY: `error` holds a NUL byte within its length (just written).
                let text = unsafe { CStr::from_ptr(error.as_ptr()) }.to_string_lossy();
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

    fn raw(&self) -> &ffi::mjModel {
        // SAFETY: `ptr` is the live model mj_loadXML returned, freed only in Drop.
        unsafe { self.ptr.as_ref() }
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
        count(self.raw().nq)
    }

    /// Degrees of freedom, `nv`.
    pub fn nv(&self) -> usize {
        count(self.raw().nv)
    }

    /// Actuators (controls), `nu`.
    pub fn nu(&self) -> usize {
        count(self.raw().nu)
    }

    /// Sensor values, `nsensordata`.
    pub fn nsensordata(&self) -> usize {
        count(self.raw().nsensordata)
    }

    /// The simulation time step in seconds (`<option timestep>`).
    pub fn timestep(&self) -> f64 {
        self.raw().opt.timestep
    }

    /// The reference positions `qpos0` (`[nq]`), where `mj_resetData` puts the model.
    pub fn qpos0(&self) -> &[f64] {
        // SAFETY: qpos0 holds nq values for the model's lifetime and is never written.
        unsafe { view(self.raw().qpos0, self.nq()) }
    }

    /// Actuator `i`'s control range, when it is limited (`ctrlrange` with `ctrllimited`).
    pub fn ctrl_range(&self, i: usize) -> Option<(f64, f64)> {
        if i >= self.nu() {
            return None;
        }
        let m = self.raw();
        // SAFETY: both arrays hold nu (limited flags) and 2·nu (ranges) values.
        let (limited, range) = unsafe {
            (
                view(m.actuator_ctrllimited, self.nu()),
                view(m.actuator_ctrlrange, 2 * self.nu()),
            )
        };
        (limited.get(i).copied()? && range.len() == 2 * self.nu())
            .then(|| (range[2 * i], range[2 * i + 1]))
    }

    /// The name at `adr` in the model's name buffer.
    fn name_at(&self, adr: c_int) -> String {
        let m = self.raw();
        // SAFETY: `names` holds nnames bytes, every name NUL-terminated inside it.
        let names = unsafe { view(m.names as *const u8, count(m.nnames)) };
        let tail = names.get(index(adr)..).unwrap_or(&[]);
        let end = tail.iter().position(|&b| b == 0).unwrap_or(tail.len());
        String::from_utf8_lossy(&tail[..end]).into_owned()
    }

    /// The joints, in model order.
    pub fn joints(&self) -> Vec<Joint> {
        let m = self.raw();
        let n = count(m.njnt);
        // SAFETY: the joint arrays and name addresses hold njnt values each.
        let (kinds, adrs, names) = unsafe {
            (
                view(m.jnt_type, n),
                view(m.jnt_qposadr, n),
                view(m.name_jntadr, n),
            )
        };
        (0..n.min(kinds.len()).min(adrs.len()).min(names.len()))
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
        let m = self.raw();
        let n = count(m.nsensor);
        // SAFETY: the sensor arrays and name addresses hold nsensor values each.
        let (adrs, dims, names) = unsafe {
            (
                view(m.sensor_adr, n),
                view(m.sensor_dim, n),
                view(m.name_sensoradr, n),
            )
        };
        (0..n.min(adrs.len()).min(dims.len()).min(names.len()))
            .map(|s| Sensor {
                name: self.name_at(names[s]),
                adr: index(adrs[s]),
                dim: index(dims[s]),
            })
            .collect()
    }

    /// The `<custom><numeric>` elements, in model order.
    pub fn numerics(&self) -> Vec<Numeric> {
        let m = self.raw();
        let n = count(m.nnumeric);
        // SAFETY: the numeric arrays and name addresses hold nnumeric values each, and
        // numeric_data holds nnumericdata values.
        let (adrs, sizes, names, data) = unsafe {
            (
                view(m.numeric_adr, n),
                view(m.numeric_size, n),
                view(m.name_numericadr, n),
                view(m.numeric_data, count(m.nnumericdata)),
            )
        };
        (0..n.min(adrs.len()).min(sizes.len()).min(names.len()))
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

impl Drop for Model {
    fn drop(&mut self) {
        // SAFETY: the model is live and owned by us; every Data holds an Arc of its model,
        // so none refers to it any more.
        unsafe { self.lib.ffi().mj_deleteModel(self.ptr.as_ptr()) }
    }
}

/// One simulation of a [`Model`]: its `mjData`.
pub struct Data {
    model: Arc<Model>,
    ptr: NonNull<ffi::mjData>,
}

// SAFETY: an mjData is plain memory owned by this value; MuJoCo keeps no thread-local or
// thread-affine state in it, so it may be stepped on any one thread at a time.
unsafe impl Send for Data {}

impl std::fmt::Debug for Data {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Data")
            .field("model", &self.model.path)
            .field("time", &self.time())
            .finish_non_exhaustive()
    }
}

impl Data {
    /// A fresh simulation of `model`, at its reference state (`mj_makeData`).
    pub fn new(model: &Arc<Model>) -> Result<Data, MujocoError> {
        // SAFETY: the model is live (held by the Arc we keep).
        let raw = unsafe { model.lib.ffi().mj_makeData(model.ptr.as_ptr()) };
        let ptr = NonNull::new(raw).ok_or_else(|| MujocoError::Model {
            path: model.path.clone(),
            what: "MuJoCo could not allocate its simulation data (mj_makeData)".into(),
        })?;
        Ok(Data {
            model: Arc::clone(model),
            ptr,
        })
    }

    /// The model this simulates.
    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    fn raw(&self) -> &ffi::mjData {
        // SAFETY: `ptr` is the live data mj_makeData returned, freed only in Drop.
        unsafe { self.ptr.as_ref() }
    }

    /// Back to the reference state: `qpos = qpos0`, zero velocities, controls and time,
    /// warnings cleared (`mj_resetData`).
    pub fn reset(&mut self) {
        // SAFETY: model and data are live; `&mut self` excludes any view into the data.
        unsafe {
            self.model
                .lib
                .ffi()
                .mj_resetData(self.model.ptr.as_ptr(), self.ptr.as_ptr())
        }
    }

    /// One time step (`mj_step`) under the current controls.
    pub fn step(&mut self) {
        // SAFETY: as in `reset`.
        unsafe {
            self.model
                .lib
                .ffi()
                .mj_step(self.model.ptr.as_ptr(), self.ptr.as_ptr())
        }
    }

    /// Computes the derived quantities (positions of bodies and sites, sensors, ...) of
    /// the current state without advancing time (`mj_forward`).
    pub fn forward(&mut self) {
        // SAFETY: as in `reset`.
        unsafe {
            self.model
                .lib
                .ffi()
                .mj_forward(self.model.ptr.as_ptr(), self.ptr.as_ptr())
        }
    }

    /// The simulation time in seconds.
    pub fn time(&self) -> f64 {
        self.raw().time
    }

    /// Positions, `[nq]`.
    pub fn qpos(&self) -> &[f64] {
        // SAFETY: qpos holds nq values while the data lives; `&self` excludes writers.
        unsafe { view(self.raw().qpos, self.model.nq()) }
    }

    /// Positions, writable.
    pub fn qpos_mut(&mut self) -> &mut [f64] {
        let n = self.model.nq();
        // SAFETY: qpos holds nq values; `&mut self` makes this the only view.
        unsafe { view_mut(self.raw().qpos, n) }
    }

    /// Velocities, `[nv]`.
    pub fn qvel(&self) -> &[f64] {
        // SAFETY: as in `qpos`, nv values.
        unsafe { view(self.raw().qvel, self.model.nv()) }
    }

    /// Velocities, writable.
    pub fn qvel_mut(&mut self) -> &mut [f64] {
        let n = self.model.nv();
        // SAFETY: as in `qpos_mut`, nv values.
        unsafe { view_mut(self.raw().qvel, n) }
    }

    /// Controls, `[nu]`.
    pub fn ctrl(&self) -> &[f64] {
        // SAFETY: as in `qpos`, nu values.
        unsafe { view(self.raw().ctrl, self.model.nu()) }
    }

    /// Controls, writable.
    pub fn ctrl_mut(&mut self) -> &mut [f64] {
        let n = self.model.nu();
        // SAFETY: as in `qpos_mut`, nu values.
        unsafe { view_mut(self.raw().ctrl, n) }
    }

    /// Sensor values, `[nsensordata]` (computed by `step` and `forward`).
    pub fn sensordata(&self) -> &[f64] {
        // SAFETY: as in `qpos`, nsensordata values.
        unsafe { view(self.raw().sensordata, self.model.nsensordata()) }
    }

    /// How many times MuJoCo found a bad number in the accelerations (NaN, inf or huge)
    /// since the last reset. MuJoCo then resets the simulation to its reference state
    /// itself, so a nonzero count means the trajectory has been cut.
    pub fn unstable_count(&self) -> u32 {
        let w = self.raw().warning;
        [
            ffi::mjWARN_BADQACC,
            ffi::mjWARN_BADQPOS,
            ffi::mjWARN_BADQVEL,
        ]
        .iter()
        .filter_map(|&k| w.get(k as usize))
        .map(|s| u32::try_from(s.number).unwrap_or(0))
        .sum()
    }
}

impl Drop for Data {
    fn drop(&mut self) {
        // SAFETY: the data is live and owned by us; its model outlives it (we hold its Arc).
        unsafe { self.model.lib.ffi().mj_deleteData(self.ptr.as_ptr()) }
    }
}
