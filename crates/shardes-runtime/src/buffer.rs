//! Device buffers and element types.

use std::sync::Arc;

use half::{bf16, f16};

use crate::client::ClientInner;
use crate::ffi;
use crate::plugin::{pjrt_args, pjrt_call};
use crate::{Result, RuntimeError};

/// Element type of a buffer (ours; mapped to the C API's `PJRT_Buffer_Type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ElementType {
    /// Boolean (`pred`), one byte per element.
    Pred,
    /// Signed 8-bit integer.
    S8,
    /// Signed 16-bit integer.
    S16,
    /// Signed 32-bit integer.
    S32,
    /// Signed 64-bit integer.
    S64,
    /// Unsigned 8-bit integer.
    U8,
    /// Unsigned 16-bit integer.
    U16,
    /// Unsigned 32-bit integer.
    U32,
    /// Unsigned 64-bit integer.
    U64,
    /// IEEE half precision.
    F16,
    /// bfloat16.
    BF16,
    /// IEEE single precision.
    F32,
    /// IEEE double precision.
    F64,
}

impl ElementType {
    /// Size of one element in bytes.
    pub fn size_in_bytes(self) -> usize {
        match self {
            ElementType::Pred | ElementType::S8 | ElementType::U8 => 1,
            ElementType::S16 | ElementType::U16 | ElementType::F16 | ElementType::BF16 => 2,
            ElementType::S32 | ElementType::U32 | ElementType::F32 => 4,
            ElementType::S64 | ElementType::U64 | ElementType::F64 => 8,
        }
    }

    /// The MLIR / HLO spelling (`f32`, `bf16`, `pred`, `s32`, ...).
    pub fn name(self) -> &'static str {
        match self {
            ElementType::Pred => "pred",
            ElementType::S8 => "s8",
            ElementType::S16 => "s16",
            ElementType::S32 => "s32",
            ElementType::S64 => "s64",
            ElementType::U8 => "u8",
            ElementType::U16 => "u16",
            ElementType::U32 => "u32",
            ElementType::U64 => "u64",
            ElementType::F16 => "f16",
            ElementType::BF16 => "bf16",
            ElementType::F32 => "f32",
            ElementType::F64 => "f64",
        }
    }

    pub(crate) fn to_pjrt(self) -> ffi::PJRT_Buffer_Type {
        match self {
            ElementType::Pred => ffi::PJRT_Buffer_Type_PRED,
            ElementType::S8 => ffi::PJRT_Buffer_Type_S8,
            ElementType::S16 => ffi::PJRT_Buffer_Type_S16,
            ElementType::S32 => ffi::PJRT_Buffer_Type_S32,
            ElementType::S64 => ffi::PJRT_Buffer_Type_S64,
            ElementType::U8 => ffi::PJRT_Buffer_Type_U8,
            ElementType::U16 => ffi::PJRT_Buffer_Type_U16,
            ElementType::U32 => ffi::PJRT_Buffer_Type_U32,
            ElementType::U64 => ffi::PJRT_Buffer_Type_U64,
            ElementType::F16 => ffi::PJRT_Buffer_Type_F16,
            ElementType::BF16 => ffi::PJRT_Buffer_Type_BF16,
            ElementType::F32 => ffi::PJRT_Buffer_Type_F32,
            ElementType::F64 => ffi::PJRT_Buffer_Type_F64,
        }
    }

    pub(crate) fn from_pjrt(t: ffi::PJRT_Buffer_Type) -> Result<Self> {
        Ok(match t {
            ffi::PJRT_Buffer_Type_PRED => ElementType::Pred,
            ffi::PJRT_Buffer_Type_S8 => ElementType::S8,
            ffi::PJRT_Buffer_Type_S16 => ElementType::S16,
            ffi::PJRT_Buffer_Type_S32 => ElementType::S32,
            ffi::PJRT_Buffer_Type_S64 => ElementType::S64,
            ffi::PJRT_Buffer_Type_U8 => ElementType::U8,
            ffi::PJRT_Buffer_Type_U16 => ElementType::U16,
            ffi::PJRT_Buffer_Type_U32 => ElementType::U32,
            ffi::PJRT_Buffer_Type_U64 => ElementType::U64,
            ffi::PJRT_Buffer_Type_F16 => ElementType::F16,
            ffi::PJRT_Buffer_Type_BF16 => ElementType::BF16,
            ffi::PJRT_Buffer_Type_F32 => ElementType::F32,
            ffi::PJRT_Buffer_Type_F64 => ElementType::F64,
            other => return Err(RuntimeError::UnsupportedElementType(other)),
        })
    }

    /// Maps XLA's `PrimitiveType` numbering (used in HLO protos, which differs from the C API's
    /// enum) to ours.
    pub(crate) fn from_xla_primitive(t: i32) -> Option<Self> {
        Some(match t {
            1 => ElementType::Pred,
            2 => ElementType::S8,
            3 => ElementType::S16,
            4 => ElementType::S32,
            5 => ElementType::S64,
            6 => ElementType::U8,
            7 => ElementType::U16,
            8 => ElementType::U32,
            9 => ElementType::U64,
            10 => ElementType::F16,
            11 => ElementType::F32,
            12 => ElementType::F64,
            16 => ElementType::BF16,
            _ => return None,
        })
    }
}

impl std::fmt::Display for ElementType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

mod sealed {
    pub trait Sealed {}
}

/// A Rust type that can be copied to and from device buffers.
///
/// Implemented for `bool` (pred), `i8`, `i16`, `i32`, `i64`, `u8`, `u16`, `u32`, `u64`,
/// [`half::f16`], [`half::bf16`], `f32` and `f64`. Sealed: the byte layout of each type must
/// match XLA's, which only this crate can vouch for.
pub trait Element: Copy + Send + Sync + 'static + sealed::Sealed {
    /// The matching element type.
    const TYPE: ElementType;

    /// Builds values from raw device bytes (native endianness, `TYPE.size_in_bytes()` each).
    #[doc(hidden)]
    fn from_raw(bytes: &[u8]) -> Vec<Self>;
}

macro_rules! pod_element {
    ($($t:ty => $e:ident),* $(,)?) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const TYPE: ElementType = ElementType::$e;
            fn from_raw(bytes: &[u8]) -> Vec<Self> {
                bytes
                    .chunks_exact(std::mem::size_of::<$t>())
                    .map(|c| {
                        let mut a = [0u8; std::mem::size_of::<$t>()];
                        a.copy_from_slice(c);
                        <$t>::from_ne_bytes(a)
                    })
                    .collect()
            }
        }
    )*};
}

pod_element!(
    i8 => S8, i16 => S16, i32 => S32, i64 => S64,
    u8 => U8, u16 => U16, u32 => U32, u64 => U64,
    f32 => F32, f64 => F64,
);

impl sealed::Sealed for f16 {}
impl Element for f16 {
    const TYPE: ElementType = ElementType::F16;
    fn from_raw(bytes: &[u8]) -> Vec<Self> {
        u16::from_raw(bytes)
            .into_iter()
            .map(f16::from_bits)
            .collect()
    }
}

impl sealed::Sealed for bf16 {}
impl Element for bf16 {
    const TYPE: ElementType = ElementType::BF16;
    fn from_raw(bytes: &[u8]) -> Vec<Self> {
        u16::from_raw(bytes)
            .into_iter()
            .map(bf16::from_bits)
            .collect()
    }
}

impl sealed::Sealed for bool {}
impl Element for bool {
    const TYPE: ElementType = ElementType::Pred;
    fn from_raw(bytes: &[u8]) -> Vec<Self> {
        bytes.iter().map(|&b| b != 0).collect()
    }
}

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
        b.element_type = ElementType::from_pjrt(t.type_)?;
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
        plugin.await_event(a.event)?;
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
        plugin.await_event(a.event)?;
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
