//! The shared state behind a client ([`ClientInner`]) and the device descriptions it holds.
//!
//! Its own module so that buffers and executables, which keep their client alive through
//! it, and the client, which creates them, depend on it without depending on each other.

use std::sync::Arc;

use crate::api::{pjrt_args, pjrt_call};
use crate::ffi;
use crate::plugin::Plugin;

/// Description of one addressable device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// The device id reported by the plugin.
    pub id: usize,
    /// Device kind (e.g. `cpu`).
    pub kind: String,
    /// The plugin's human-readable description of the device.
    pub description: String,
}

/// The shared state behind a [`crate::Client`]: destroyed only when the client and every
/// buffer and executable created from it are gone.
pub(crate) struct ClientInner {
    pub(crate) plugin: Arc<Plugin>,
    pub(crate) raw: *mut ffi::PJRT_Client,
    pub(crate) devices: Vec<*mut ffi::PJRT_Device>,
    pub(crate) infos: Vec<DeviceInfo>,
    pub(crate) platform: String,
}

// SAFETY: PJRT clients are thread-safe by contract; device handles are owned by the client and
// immutable; we destroy the client exactly once, in Drop.
unsafe impl Send for ClientInner {}
// SAFETY: as above.
unsafe impl Sync for ClientInner {}

impl Drop for ClientInner {
    fn drop(&mut self) {
        let mut a = pjrt_args!(PJRT_Client_Destroy_Args);
        a.client = self.raw;
        // SAFETY: every buffer / executable holds an `Arc<ClientInner>`, so none is alive here;
        // the handle is destroyed exactly once. Errors cannot be reported from Drop.
        let _ = unsafe { pjrt_call!(&*self.plugin, PJRT_Client_Destroy, &mut a) };
    }
}

impl ClientInner {
    pub(crate) fn device_index(&self, d: *mut ffi::PJRT_Device) -> Option<usize> {
        self.devices.iter().position(|&x| x == d)
    }
}
