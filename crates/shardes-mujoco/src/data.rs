//! [`Data`]: one simulation of a [`Model`] (an owned `mjData`).
//!
//! A [`Data`] is one simulation's mutable state, moved between threads but used by one at a
//! time (`Send`, not `Sync`). Every array view is bounded by the model's counts.

use std::sync::Arc;

use crate::error::MujocoError;
use crate::ffi;
use crate::model::Model;
use crate::raw::RawData;

/// One simulation of a [`Model`]: its `mjData`.
pub struct Data {
    model: Arc<Model>,
    raw: RawData,
}

impl std::fmt::Debug for Data {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Data")
            .field("model", &self.model.path())
            .field("time", &self.time())
            .finish_non_exhaustive()
    }
}

impl Data {
    /// A fresh simulation of `model`, at its reference state (`mj_makeData`).
    ///
    /// # Errors
    ///
    /// [`MujocoError::Model`] when MuJoCo could not allocate it.
    pub fn new(model: &Arc<Model>) -> Result<Data, MujocoError> {
        let raw = RawData::new(model.raw()).ok_or_else(|| MujocoError::Model {
            path: model.path().to_path_buf(),
            what: "MuJoCo could not allocate its simulation data (mj_makeData)".into(),
        })?;
        Ok(Data {
            model: Arc::clone(model),
            raw,
        })
    }

    /// The model this simulates.
    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// Back to the reference state: `qpos = qpos0`, zero velocities, controls and time,
    /// warnings cleared (`mj_resetData`).
    pub fn reset(&mut self) {
        self.raw.reset();
    }

    /// One time step (`mj_step`) under the current controls.
    pub fn step(&mut self) {
        self.raw.step();
    }

    /// Computes the derived quantities (positions of bodies and sites, sensors, ...) of
    /// the current state without advancing time (`mj_forward`).
    pub fn forward(&mut self) {
        self.raw.forward();
    }

    /// The simulation time in seconds.
    pub fn time(&self) -> f64 {
        self.raw.get().time
    }

    /// Positions, `[nq]`.
    pub fn qpos(&self) -> &[f64] {
        self.raw.qpos()
    }

    /// Positions, writable.
    pub fn qpos_mut(&mut self) -> &mut [f64] {
        self.raw.qpos_mut()
    }

    /// Velocities, `[nv]`.
    pub fn qvel(&self) -> &[f64] {
        self.raw.qvel()
    }

    /// Velocities, writable.
    pub fn qvel_mut(&mut self) -> &mut [f64] {
        self.raw.qvel_mut()
    }

    /// Controls, `[nu]`.
    pub fn ctrl(&self) -> &[f64] {
        self.raw.ctrl()
    }

    /// Controls, writable.
    pub fn ctrl_mut(&mut self) -> &mut [f64] {
        self.raw.ctrl_mut()
    }

    /// Sensor values, `[nsensordata]` (computed by `step` and `forward`).
    pub fn sensordata(&self) -> &[f64] {
        self.raw.sensordata()
    }

    /// How many times MuJoCo found a bad number in the accelerations (NaN, inf or huge)
    /// since the last reset. MuJoCo then resets the simulation to its reference state
    /// itself, so a nonzero count means the trajectory has been cut.
    pub fn unstable_count(&self) -> u32 {
        let w = self.raw.get().warning;
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
