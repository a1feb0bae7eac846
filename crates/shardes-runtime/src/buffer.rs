//! Device buffers.

use std::sync::Arc;

use crate::api::{pjrt_args, pjrt_call};
use crate::dtype::{Element, ElementType};
use crate::error::{Result, RuntimeError};
use crate::ffi;
use crate::handle::ClientInner;

/// An array on one device, owned by this value (destroyed on drop).
///
/// Keeps its client alive, so clients, executables and buffers may be dropped in any order.
pub struct Buffer {
    pub(crate) client: Arc<ClientInner>,
    pub(crate) raw: *mut ffi::PJRT_Buffer,
    device: usize,
    element_type: ElementType,
    dims: Vec<usize>,
}

// SAFETY: a PJRT buffer handle may be used from any thread (the C API is thread-safe); we own
// the handle exclusively and only free it in Drop.
unsafe impl Send for Buffer {}
// SAFETY: all `&self` methods are thread-safe C calls or reads of immutable fields.
unsafe impl Sync for Buffer {}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Buffer({}{:?} on device {})",
            self.element_type, self.dims, self.device
        )
    }
}

impl Buffer {
    /// Wraps a buffer handle returned by the plugin, querying its type and dims.
    pub(crate) fn from_raw(
        client: Arc<ClientInner>,
        raw: *mut ffi::PJRT_Buffer,
        device: usize,
    ) -> Result<Buffer> {
        // Own the handle first so it is freed even if a query below fails.
        let mut b = Buffer {
            client,
            raw,
            device,
            element_type: ElementType::F32,
            dims: Vec::new(),
        };
        let plugin = &*b.client.plugin;
        let mut t = pjrt_args!(PJRT_Buffer_ElementType_Args);
        t.buffer = raw;
        // SAFETY: `raw` is a live buffer owned by `b`.
        unsafe { pjrt_call!(plugin, PJRT_Buffer_ElementType, &mut t)? };
        let mut d = pjrt_args!(PJRT_Buffer_Dimensions_Args);
        d.buffer = raw;
        // SAFETY: as above; `dims` lives as long as the buffer and has `num_dims` entries.
        let dims = unsafe {
            pjrt_call!(plugin, PJRT_Buffer_Dimensions, &mut d)?;
            if d.num_dims == 0 || d.dims.is_null() {
                Vec::new()
            } else {
                std::slice::from_raw_parts(d.dims, d.num_dims).to_vec()
            }
        };
        b.element_type =
            ElementType::from_pjrt(t.type_).map_err(RuntimeError::UnsupportedElementType)?;
        b.dims = dims.into_iter().map(|x| x.max(0) as usize).collect();
        Ok(b)
    }

    pub(crate) fn new_known(
        client: Arc<ClientInner>,
        raw: *mut ffi::PJRT_Buffer,
        device: usize,
        element_type: ElementType,
        dims: Vec<usize>,
    ) -> Buffer {
        Buffer {
            client,
            raw,
            device,
            element_type,
            dims,
        }
    }

    /// Element type.
    pub fn element_type(&self) -> ElementType {
        self.element_type
    }

    /// Dimensions (empty for a scalar).
    pub fn dims(&self) -> &[usize] {
        &self.dims
    }

    /// Number of elements.
    pub fn element_count(&self) -> usize {
        self.dims.iter().product()
    }

    /// Index of the device (in [`crate::Client::devices`] order) holding this buffer.
    pub fn device(&self) -> usize {
        self.device
    }

    /// Frees the device memory now. The value stays valid, but reading or passing it to an
    /// executable afterwards is an error ([`RuntimeError::BufferDeleted`]).
    pub fn delete(&self) -> Result<()> {
        let mut a = pjrt_args!(PJRT_Buffer_Delete_Args);
        a.buffer = self.raw;
        // SAFETY: `self.raw` is a live buffer handle; Delete keeps the handle valid.
        unsafe { pjrt_call!(&*self.client.plugin, PJRT_Buffer_Delete, &mut a) }
    }

    /// Whether the buffer was deleted or donated to an executable.
    pub fn is_deleted(&self) -> Result<bool> {
        let mut a = pjrt_args!(PJRT_Buffer_IsDeleted_Args);
        a.buffer = self.raw;
        // SAFETY: `self.raw` is a live buffer handle.
        unsafe { pjrt_call!(&*self.client.plugin, PJRT_Buffer_IsDeleted, &mut a)? };
        Ok(a.is_deleted)
    }

    /// Copies the buffer to the host. `T` must match [`Buffer::element_type`].
    pub fn to_host<T: Element>(&self) -> Result<Vec<T>> {
        if T::TYPE != self.element_type {
            return Err(RuntimeError::DtypeMismatch {
                what: "to_host".into(),
                expected: self.element_type,
                got: T::TYPE,
            });
        }
        let bytes = self.to_host_bytes()?;
        Ok(T::from_raw(&bytes))
    }

    /// Copies the raw bytes (native endianness, dense row-major) to the host.
    pub fn to_host_bytes(&self) -> Result<Vec<u8>> {
        if self.is_deleted()? {
            return Err(RuntimeError::BufferDeleted {
                what: format!("{self:?}"),
            });
        }
        let plugin = &*self.client.plugin;
        let mut a = pjrt_args!(PJRT_Buffer_ToHostBuffer_Args);
        a.src = self.raw;
        // SAFETY: size query: `dst` is null so the plugin only writes `dst_size`.
        unsafe { pjrt_call!(plugin, PJRT_Buffer_ToHostBuffer, &mut a)? };
        plugin.api().await_event(a.event)?;
        let expected = self.element_count() * self.element_type.size_in_bytes();
        if a.dst_size != expected {
            return Err(RuntimeError::InvalidArgument(format!(
                "plugin reports {} bytes for {self:?}, expected {expected} for a dense layout",
                a.dst_size
            )));
        }
        let mut out = vec![0u8; a.dst_size];
        let mut a = pjrt_args!(PJRT_Buffer_ToHostBuffer_Args);
        a.src = self.raw;
        a.dst = out.as_mut_ptr().cast();
        a.dst_size = out.len();
        // SAFETY: `out` is valid for `dst_size` bytes and outlives the copy because we await
        // the completion event before returning.
        unsafe { pjrt_call!(plugin, PJRT_Buffer_ToHostBuffer, &mut a)? };
        plugin.api().await_event(a.event)?;
        Ok(out)
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        let mut a = pjrt_args!(PJRT_Buffer_Destroy_Args);
        a.buffer = self.raw;
        // SAFETY: we own the handle and destroy it exactly once. An error cannot be reported
        // from Drop; `check` has already freed the error object.
        let _ = unsafe { pjrt_call!(&*self.client.plugin, PJRT_Buffer_Destroy, &mut a) };
    }
}
