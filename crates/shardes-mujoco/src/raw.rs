//! The FFI layer: the only module that calls MuJoCo's C functions or reads its structs
//! through raw pointers. It turns the generated bindings (`ffi`) into three safe handles:
//!
//! - [`Library`]: an opened `libmujoco` (`dlopen`, the quiet warning hook, the function
//!   table, the version queries);
//! - [`RawModel`]: an owned compiled `mjModel`, freed in its `Drop`;
//! - [`RawData`]: an owned `mjData` of one model, freed in its `Drop`.
//!
//! Every array a handle hands out is a slice bounded by the model's counts; the safe layer
//! (`model`, `data`) interprets them.
#![deny(clippy::undocumented_unsafe_blocks)]

use std::ffi::{c_char, c_int, CStr};
use std::path::Path;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use crate::ffi;
use crate::provision::check_file;

/// `mj_version()` of the library the bindings were generated for.
pub(crate) const VERSION: i32 = ffi::mjVERSION_HEADER as i32;

/// How much of MuJoCo's load error is kept (its messages are one or two lines).
const ERROR_BYTES: usize = 1024;

/// MuJoCo's warning handler while shardes runs simulations: nothing is printed or logged
/// (the counts in `mjData.warning` are the record).
extern "C" fn quiet_warning(_message: *const c_char) {}

/// Why [`Library::open`] refused a file.
#[derive(Debug)]
pub(crate) enum OpenError {
    /// It is not a loadable MuJoCo library; the reason is worded to follow "is not a usable
    /// MuJoCo library: ".
    NotALibrary(String),
    /// It is MuJoCo, of this other version (`mj_versionString`) than [`VERSION`].
    Version(String),
}

/// An opened MuJoCo library of the bindings' version: its function table. Never unloaded
/// while a model of it lives (each [`RawModel`] holds an `Arc` of it).
pub(crate) struct Library {
    lib: ffi::MujocoLib,
    version: String,
}

impl Library {
    /// Checks the file at `path` ([`check_file`]), opens it, installs the quiet warning
    /// handler, resolves every function the bindings declare and checks that the library
    /// is MuJoCo [`VERSION`] (the layout of the structs the bindings read).
    pub(crate) fn open(path: &Path) -> Result<Library, OpenError> {
        let bad = OpenError::NotALibrary;
        check_file(path).map_err(bad)?;
        // One library opened at a time: the warning hook below is written while no other
        // thread opens (and so writes it) too.
        static OPENING: Mutex<()> = Mutex::new(());
        let _one = OPENING.lock().unwrap_or_else(|p| p.into_inner());
        // SAFETY: the file was checked to be a complete ELF shared object for this machine
        // exporting mj_versionString (or the pinned, checksummed library); opening it runs
        // MuJoCo's initialisers, which set up its global tables and nothing else.
        let library = unsafe { libloading::Library::new(path) }
            .map_err(|e| bad(format!("dlopen failed: {e}")))?;
        // SAFETY: `mju_user_warning` is MuJoCo's global warning hook, declared
        // `void (*mju_user_warning)(const char*)`; the symbol's address is that variable's.
        // It is written before any model exists (so no MuJoCo call reads it concurrently),
        // with a handler of the declared signature that never unwinds.
        unsafe {
            let hook = library
                .get::<*mut Option<extern "C" fn(*const c_char)>>(b"mju_user_warning\0")
                .map_err(|e| bad(format!("it lacks mju_user_warning: {e}")))?;
            **hook = Some(quiet_warning);
        }
        // SAFETY: from_library only resolves symbols; with --dynamic-link-require-all it
        // fails unless every function the bindings declare is present, and the bindings
        // were generated from MuJoCo 4.0.0's own headers (the version is checked next,
        // before any function but the version queries is called).
        let lib = unsafe { ffi::MujocoLib::from_library(library) }
            .map_err(|e| bad(format!("it lacks a MuJoCo function: {e}")))?;
        // SAFETY: mj_version and mj_versionString take no arguments and exist in every
        // MuJoCo release; the string is static, NUL-terminated and owned by the library.
        let (number, version) = unsafe {
            let s = lib.mj_versionString();
            let text = if s.is_null() {
                String::from("?")
            } else {
                CStr::from_ptr(s).to_string_lossy().into_owned()
            };
            (lib.mj_version(), text)
        };
        if number != VERSION {
            return Err(OpenError::Version(version));
        }
        Ok(Library { lib, version })
    }

    /// The version it reports (`mj_versionString`), e.g. `4.0.0`.
    pub(crate) fn version(&self) -> &str {
        &self.version
    }

    /// Loads and compiles the model file `path` (`mj_loadXML`); `Err` is MuJoCo's message,
    /// as it wrote it.
    pub(crate) fn load_xml(self: &Arc<Library>, path: &CStr) -> Result<RawModel, String> {
        let mut error = vec![0 as c_char; ERROR_BYTES];
        // MuJoCo's XML reader and compiler keep global state (the element schema, the
        // plugin and resource tables); loads are serialised, simulations are not.
        static LOADING: Mutex<()> = Mutex::new(());
        let _one = LOADING.lock().unwrap_or_else(|p| p.into_inner());
        // SAFETY: `path` is a NUL-terminated path; a null VFS means the file system;
        // `error` is writable for ERROR_BYTES bytes, the size passed, and MuJoCo writes a
        // NUL-terminated message of at most that size into it.
        let raw = unsafe {
            self.lib.mj_loadXML(
                path.as_ptr(),
                std::ptr::null(),
                error.as_mut_ptr(),
                ERROR_BYTES as c_int,
            )
        };
        match NonNull::new(raw) {
            Some(ptr) => Ok(RawModel {
                lib: Arc::clone(self),
                ptr,
            }),
            None => {
                // MuJoCo's buffer is NUL-terminated within its size; the last byte is kept 0.
                error[ERROR_BYTES - 1] = 0;
                // SAFETY: `error` holds a NUL byte within its length (just written).
                let text = unsafe { CStr::from_ptr(error.as_ptr()) };
                Err(text.to_string_lossy().into_owned())
            }
        }
    }
}

/// A count of the model as `usize` (MuJoCo's are `int64`, never negative).
fn count(v: i64) -> usize {
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

/// An owned compiled `mjModel` (what `mj_loadXML` returned), freed in `Drop`.
pub(crate) struct RawModel {
    lib: Arc<Library>,
    ptr: NonNull<ffi::mjModel>,
}

// SAFETY: MuJoCo never writes a compiled mjModel during simulation (every mj_* function
// this wrapper calls takes it as `const mjModel*`), and MuJoCo documents one model as
// shareable by threads that each step their own mjData. The wrapper offers no mutation.
unsafe impl Send for RawModel {}
// SAFETY: as above: shared references only ever read the model.
unsafe impl Sync for RawModel {}

impl RawModel {
    /// The model's plain fields (counts, options); its pointers are read through the views
    /// below.
    pub(crate) fn get(&self) -> &ffi::mjModel {
        // SAFETY: `ptr` is the live model mj_loadXML returned, freed only in Drop.
        unsafe { self.ptr.as_ref() }
    }

    /// Position coordinates, `nq`.
    pub(crate) fn nq(&self) -> usize {
        count(self.get().nq)
    }

    /// Degrees of freedom, `nv`.
    pub(crate) fn nv(&self) -> usize {
        count(self.get().nv)
    }

    /// Actuators, `nu`.
    pub(crate) fn nu(&self) -> usize {
        count(self.get().nu)
    }

    /// Sensor values, `nsensordata`.
    pub(crate) fn nsensordata(&self) -> usize {
        count(self.get().nsensordata)
    }

    /// `qpos0`, `[nq]`.
    pub(crate) fn qpos0(&self) -> &[f64] {
        // SAFETY: qpos0 holds nq values for the model's lifetime and is never written.
        unsafe { view(self.get().qpos0, self.nq()) }
    }

    /// `actuator_ctrllimited` (`[nu]`) and `actuator_ctrlrange` (`[nu, 2]`).
    pub(crate) fn ctrl_limits(&self) -> (&[bool], &[f64]) {
        let m = self.get();
        // SAFETY: both arrays hold nu (limited flags) and 2·nu (ranges) values.
        unsafe {
            (
                view(m.actuator_ctrllimited, self.nu()),
                view(m.actuator_ctrlrange, 2 * self.nu()),
            )
        }
    }

    /// The name buffer, `[nnames]` bytes, every name NUL-terminated inside it.
    pub(crate) fn names(&self) -> &[u8] {
        let m = self.get();
        // SAFETY: `names` holds nnames bytes for the model's lifetime.
        unsafe { view(m.names as *const u8, count(m.nnames)) }
    }

    /// The joints' `jnt_type`, `jnt_qposadr` and `name_jntadr`, `[njnt]` each.
    pub(crate) fn joint_arrays(&self) -> (&[c_int], &[c_int], &[c_int]) {
        let m = self.get();
        let n = count(m.njnt);
        // SAFETY: the joint arrays and name addresses hold njnt values each.
        unsafe {
            (
                view(m.jnt_type, n),
                view(m.jnt_qposadr, n),
                view(m.name_jntadr, n),
            )
        }
    }

    /// The sensors' `sensor_adr`, `sensor_dim` and `name_sensoradr`, `[nsensor]` each.
    pub(crate) fn sensor_arrays(&self) -> (&[c_int], &[c_int], &[c_int]) {
        let m = self.get();
        let n = count(m.nsensor);
        // SAFETY: the sensor arrays and name addresses hold nsensor values each.
        unsafe {
            (
                view(m.sensor_adr, n),
                view(m.sensor_dim, n),
                view(m.name_sensoradr, n),
            )
        }
    }

    /// The numerics' `numeric_adr`, `numeric_size` and `name_numericadr` (`[nnumeric]`
    /// each), and `numeric_data` (`[nnumericdata]`).
    pub(crate) fn numeric_arrays(&self) -> (&[c_int], &[c_int], &[c_int], &[f64]) {
        let m = self.get();
        let n = count(m.nnumeric);
        // SAFETY: the numeric arrays and name addresses hold nnumeric values each, and
        // numeric_data holds nnumericdata values.
        unsafe {
            (
                view(m.numeric_adr, n),
                view(m.numeric_size, n),
                view(m.name_numericadr, n),
                view(m.numeric_data, count(m.nnumericdata)),
            )
        }
    }
}

impl Drop for RawModel {
    fn drop(&mut self) {
        // SAFETY: the model is live and owned by us; every RawData holds an Arc of its
        // model, so none refers to it any more.
        unsafe { self.lib.lib.mj_deleteModel(self.ptr.as_ptr()) }
    }
}

/// An owned `mjData` of a model (what `mj_makeData` returned), freed in `Drop`.
pub(crate) struct RawData {
    model: Arc<RawModel>,
    ptr: NonNull<ffi::mjData>,
}

// SAFETY: an mjData is plain memory owned by this value; MuJoCo keeps no thread-local or
// thread-affine state in it, so it may be stepped on any one thread at a time.
unsafe impl Send for RawData {}

impl RawData {
    /// A fresh simulation of `model` at its reference state (`mj_makeData`), or `None` when
    /// MuJoCo could not allocate it.
    pub(crate) fn new(model: &Arc<RawModel>) -> Option<RawData> {
        // SAFETY: the model is live (held by the Arc we keep).
        let raw = unsafe { model.lib.lib.mj_makeData(model.ptr.as_ptr()) };
        NonNull::new(raw).map(|ptr| RawData {
            model: Arc::clone(model),
            ptr,
        })
    }

    /// The function table of the model's library.
    fn lib(&self) -> &ffi::MujocoLib {
        &self.model.lib.lib
    }

    /// The data's plain fields (time, warnings); its arrays are read through the views
    /// below.
    pub(crate) fn get(&self) -> &ffi::mjData {
        // SAFETY: `ptr` is the live data mj_makeData returned, freed only in Drop.
        unsafe { self.ptr.as_ref() }
    }

    /// `mj_resetData`.
    pub(crate) fn reset(&mut self) {
        // SAFETY: model and data are live; `&mut self` excludes any view into the data.
        unsafe {
            self.lib()
                .mj_resetData(self.model.ptr.as_ptr(), self.ptr.as_ptr())
        }
    }

    /// `mj_step`.
    pub(crate) fn step(&mut self) {
        // SAFETY: as in `reset`.
        unsafe {
            self.lib()
                .mj_step(self.model.ptr.as_ptr(), self.ptr.as_ptr())
        }
    }

    /// `mj_forward`.
    pub(crate) fn forward(&mut self) {
        // SAFETY: as in `reset`.
        unsafe {
            self.lib()
                .mj_forward(self.model.ptr.as_ptr(), self.ptr.as_ptr())
        }
    }

    /// `qpos`, `[nq]`.
    pub(crate) fn qpos(&self) -> &[f64] {
        // SAFETY: qpos holds nq values while the data lives; `&self` excludes writers.
        unsafe { view(self.get().qpos, self.model.nq()) }
    }

    /// `qpos`, writable.
    pub(crate) fn qpos_mut(&mut self) -> &mut [f64] {
        let n = self.model.nq();
        // SAFETY: qpos holds nq values; `&mut self` makes this the only view.
        unsafe { view_mut(self.get().qpos, n) }
    }

    /// `qvel`, `[nv]`.
    pub(crate) fn qvel(&self) -> &[f64] {
        // SAFETY: as in `qpos`, nv values.
        unsafe { view(self.get().qvel, self.model.nv()) }
    }

    /// `qvel`, writable.
    pub(crate) fn qvel_mut(&mut self) -> &mut [f64] {
        let n = self.model.nv();
        // SAFETY: as in `qpos_mut`, nv values.
        unsafe { view_mut(self.get().qvel, n) }
    }

    /// `ctrl`, `[nu]`.
    pub(crate) fn ctrl(&self) -> &[f64] {
        // SAFETY: as in `qpos`, nu values.
        unsafe { view(self.get().ctrl, self.model.nu()) }
    }

    /// `ctrl`, writable.
    pub(crate) fn ctrl_mut(&mut self) -> &mut [f64] {
        let n = self.model.nu();
        // SAFETY: as in `qpos_mut`, nu values.
        unsafe { view_mut(self.get().ctrl, n) }
    }

    /// `sensordata`, `[nsensordata]`.
    pub(crate) fn sensordata(&self) -> &[f64] {
        // SAFETY: as in `qpos`, nsensordata values.
        unsafe { view(self.get().sensordata, self.model.nsensordata()) }
    }
}

impl Drop for RawData {
    fn drop(&mut self) {
        // SAFETY: the data is live and owned by us; its model outlives it (we hold its Arc).
        unsafe { self.lib().mj_deleteData(self.ptr.as_ptr()) }
    }
}
