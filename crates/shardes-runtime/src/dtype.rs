//! Element types: [`ElementType`], the [`Element`] trait for Rust types that match XLA's byte
//! layout, and the conversions to and from the C API's and XLA's type numbers.
//!
//! Only the bindings are needed here, so the error type, HLO decoding and buffers can all
//! name element types without importing each other.

use half::{bf16, f16};

use crate::ffi;

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

    /// Our type for a C API buffer type; `Err` carries a type this crate does not model.
    pub(crate) fn from_pjrt(t: ffi::PJRT_Buffer_Type) -> Result<Self, ffi::PJRT_Buffer_Type> {
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
            other => return Err(other),
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
    f16 => F16, bf16 => BF16, f32 => F32, f64 => F64,
);

impl sealed::Sealed for bool {}
impl Element for bool {
    const TYPE: ElementType = ElementType::Pred;
    fn from_raw(bytes: &[u8]) -> Vec<Self> {
        bytes.iter().map(|&b| b != 0).collect()
    }
}
