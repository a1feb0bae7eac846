//! Reading llama.cpp GGUF files: metadata, the tensor table, and tensors dequantized to
//! f32; and writing them ([`write_gguf`], tensors as F32, F16 or Q8_0).
//!
//! [`GgufFile::open`] memory-maps the file and validates all of it up front: the header
//! (GGUF versions 2 and 3, little-endian), every metadata entry, and the tensor table
//! (known ggml types, at most four non-zero dimensions, whole blocks per row, offsets
//! aligned to `general.alignment`, data inside the file, no two tensors sharing bytes,
//! no duplicate names or keys, UTF-8 strings). A damaged or truncated file gives a
//! [`GgufError`] naming the file, the field and its byte offset, never a panic, and no
//! allocation is sized by a count the file declares before that count is checked against
//! the bytes that remain.
//!
//! Tensor dimensions are kept in ggml order ([`TensorInfo::dims`], `ne[0]` contiguous);
//! [`TensorInfo::shape`] reverses them into PyTorch order, in which
//! [`GgufFile::dequantize`]'s values are row-major (a weight `[out, in]` is stored with
//! `ne = [in, out]`). Types F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K and
//! Q6_K dequantize bit for bit as the `gguf` Python package does; other ggml types can be
//! read as bytes ([`GgufFile::data`]).
//!
//! ```no_run
//! use shardes::gguf::GgufFile;
//!
//! let file = GgufFile::open("SmolLM2-135M-Instruct.Q4_1.gguf")?;
//! let layers = file.get_u64("llama.block_count")?;
//! if let Some(t) = file.tensor("token_embd.weight") {
//!     let values = file.dequantize(t)?; // t.shape() = [vocab, hidden]
//!     println!("{layers} layers, {} embedding values", values.len());
//! }
//! # Ok::<(), shardes::gguf::GgufError>(())
//! ```

mod cursor;
mod error;
mod quants;
mod reader;
mod write;

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

pub use error::GgufError;
pub use quants::{dequantize, GgmlType, SUPPORTED};
pub use write::{encode, encoded_len, write_gguf, GgufWriteError, TensorOut, ALIGNMENT};

/// One metadata value, as GGUF types it.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    /// GGUF type 0.
    U8(u8),
    /// GGUF type 1.
    I8(i8),
    /// GGUF type 2.
    U16(u16),
    /// GGUF type 3.
    I16(i16),
    /// GGUF type 4.
    U32(u32),
    /// GGUF type 5.
    I32(i32),
    /// GGUF type 10.
    U64(u64),
    /// GGUF type 11.
    I64(i64),
    /// GGUF type 6.
    F32(f32),
    /// GGUF type 12.
    F64(f64),
    /// GGUF type 7 (a byte, 0 or 1).
    Bool(bool),
    /// GGUF type 8 (UTF-8).
    String(String),
    /// GGUF type 9: items of one type (nested arrays included).
    Array(Vec<MetaValue>),
}

impl MetaValue {
    /// The type's name: `u8` ... `i64`, `f32`, `f64`, `bool`, `string`, `array`.
    pub fn type_name(&self) -> &'static str {
        match self {
            MetaValue::U8(_) => "u8",
            MetaValue::I8(_) => "i8",
            MetaValue::U16(_) => "u16",
            MetaValue::I16(_) => "i16",
            MetaValue::U32(_) => "u32",
            MetaValue::I32(_) => "i32",
            MetaValue::U64(_) => "u64",
            MetaValue::I64(_) => "i64",
            MetaValue::F32(_) => "f32",
            MetaValue::F64(_) => "f64",
            MetaValue::Bool(_) => "bool",
            MetaValue::String(_) => "string",
            MetaValue::Array(_) => "array",
        }
    }

    /// The type and a short form of the value, for messages (`u32 48`, `array of 3 i32`).
    pub fn describe(&self) -> String {
        match self {
            MetaValue::String(s) if s.chars().count() > 40 => {
                let head: String = s.chars().take(40).collect();
                format!("string {head:?}...")
            }
            MetaValue::String(s) => format!("string {s:?}"),
            MetaValue::Array(items) => match items.first() {
                Some(first) => format!("array of {} {}", items.len(), first.type_name()),
                None => "an empty array".to_string(),
            },
            _ => format!("{} {}", self.type_name(), self.scalar_text()),
        }
    }

    fn scalar_text(&self) -> String {
        match self {
            MetaValue::U8(v) => v.to_string(),
            MetaValue::I8(v) => v.to_string(),
            MetaValue::U16(v) => v.to_string(),
            MetaValue::I16(v) => v.to_string(),
            MetaValue::U32(v) => v.to_string(),
            MetaValue::I32(v) => v.to_string(),
            MetaValue::U64(v) => v.to_string(),
            MetaValue::I64(v) => v.to_string(),
            MetaValue::F32(v) => v.to_string(),
            MetaValue::F64(v) => v.to_string(),
            MetaValue::Bool(v) => v.to_string(),
            MetaValue::String(_) | MetaValue::Array(_) => String::new(),
        }
    }

    /// The value of an integer of any type, as i128 (which holds them all).
    fn integer(&self) -> Option<i128> {
        Some(match *self {
            MetaValue::U8(v) => v.into(),
            MetaValue::I8(v) => v.into(),
            MetaValue::U16(v) => v.into(),
            MetaValue::I16(v) => v.into(),
            MetaValue::U32(v) => v.into(),
            MetaValue::I32(v) => v.into(),
            MetaValue::U64(v) => v.into(),
            MetaValue::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// The string, when this is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::String(s) => Some(s),
            _ => None,
        }
    }

    /// An integer of any type that is not negative.
    pub fn as_u64(&self) -> Option<u64> {
        self.integer().and_then(|v| u64::try_from(v).ok())
    }

    /// An integer of any type that fits in i64.
    pub fn as_i64(&self) -> Option<i64> {
        self.integer().and_then(|v| i64::try_from(v).ok())
    }

    /// A float, or an integer of any type (rounded to the nearest f64).
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            MetaValue::F32(v) => Some(f64::from(v)),
            MetaValue::F64(v) => Some(v),
            _ => self.integer().map(|v| v as f64),
        }
    }

    /// The bool, when this is one.
    pub fn as_bool(&self) -> Option<bool> {
        match self {
            MetaValue::Bool(b) => Some(*b),
            _ => None,
        }
    }

    /// The items, when this is an array.
    pub fn as_array(&self) -> Option<&[MetaValue]> {
        match self {
            MetaValue::Array(items) => Some(items),
            _ => None,
        }
    }
}

/// One entry of the tensor table, checked by [`GgufFile::open`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// The tensor's name (`blk.0.attn_q.weight`).
    pub name: String,
    /// Dimensions in ggml order: `ne[0]` is the contiguous one (at most 4, none zero).
    pub dims: Vec<u64>,
    /// How its values are stored.
    pub ggml_type: GgmlType,
    /// Its first byte, absolute in the file (the file stores it relative to the data
    /// section).
    pub offset: u64,
    /// Its size in bytes.
    pub n_bytes: u64,
}

impl TensorInfo {
    /// The shape in PyTorch order (the dims reversed): `[out, in]` for a weight.
    pub fn shape(&self) -> Vec<usize> {
        // `open` checked that the element count fits in usize, so each dim does too.
        self.dims.iter().rev().map(|&d| d as usize).collect()
    }

    /// The number of values (1 for a tensor with no dimensions).
    pub fn n_elements(&self) -> u64 {
        // `open` checked that the product does not overflow.
        self.dims.iter().product()
    }
}

/// An open GGUF file: its metadata and tensor table, with the file memory-mapped for the
/// tensors' bytes.
pub struct GgufFile {
    path: PathBuf,
    map: Mmap,
    version: u32,
    alignment: u64,
    data_start: u64,
    metadata: BTreeMap<String, MetaValue>,
    tensors: Vec<TensorInfo>,
    by_name: HashMap<String, usize>,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("metadata", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

impl GgufFile {
    /// Maps the file at `path` and reads and checks its header, metadata and tensor table
    /// (see the [module docs](self) for what is checked). Tensor data is read only when
    /// asked for.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile, GgufError> {
        let path = path.as_ref();
        let read = |cause| GgufError::Read {
            path: path.to_path_buf(),
            cause,
        };
        let file = File::open(path).map_err(read)?;
        // SAFETY: the mapping is read-only and every read of it is bounds-checked against
        // its length; a file modified while mapped can change the values read (or, if it
        // is truncated, fault the process), as for any memory-mapped loader.
        let map = unsafe { Mmap::map(&file) }.map_err(read)?;
        let parsed = reader::parse(path, &map)?;
        Ok(GgufFile {
            path: path.to_path_buf(),
            map,
            version: parsed.version,
            alignment: parsed.alignment,
            data_start: parsed.data_start,
            metadata: parsed.metadata,
            tensors: parsed.tensors,
            by_name: parsed.by_name,
        })
    }

    /// The file's path, as given to [`open`](GgufFile::open).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The GGUF version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The data section's alignment (`general.alignment`, or 32).
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Where the data section starts, in bytes from the start of the file.
    pub fn data_start(&self) -> u64 {
        self.data_start
    }

    /// Every metadata entry, by key.
    pub fn metadata(&self) -> &BTreeMap<String, MetaValue> {
        &self.metadata
    }

    /// The value of `key`, if the file has it.
    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.metadata.get(key)
    }

    /// The value of `key`, or [`GgufError::MissingKey`].
    fn require(&self, key: &str) -> Result<&MetaValue, GgufError> {
        self.metadata.get(key).ok_or_else(|| GgufError::MissingKey {
            path: self.path.clone(),
            key: key.to_string(),
        })
    }

    fn wrong_type(&self, key: &str, expected: &'static str, got: &MetaValue) -> GgufError {
        GgufError::WrongType {
            path: self.path.clone(),
            key: key.to_string(),
            expected,
            got: got.describe(),
        }
    }

    /// The string at `key`.
    pub fn get_str(&self, key: &str) -> Result<&str, GgufError> {
        let v = self.require(key)?;
        v.as_str()
            .ok_or_else(|| self.wrong_type(key, "a string", v))
    }

    /// The integer at `key`, of any integer type, when it is not negative.
    pub fn get_u64(&self, key: &str) -> Result<u64, GgufError> {
        let v = self.require(key)?;
        v.as_u64()
            .ok_or_else(|| self.wrong_type(key, "a non-negative integer", v))
    }

    /// The number at `key`: f32 or f64 (widened exactly), or an integer.
    pub fn get_f64(&self, key: &str) -> Result<f64, GgufError> {
        let v = self.require(key)?;
        v.as_f64()
            .ok_or_else(|| self.wrong_type(key, "a number", v))
    }

    /// The bool at `key`.
    pub fn get_bool(&self, key: &str) -> Result<bool, GgufError> {
        let v = self.require(key)?;
        v.as_bool().ok_or_else(|| self.wrong_type(key, "a bool", v))
    }

    /// The array of strings at `key` (empty for an empty array).
    pub fn get_str_array(&self, key: &str) -> Result<Vec<&str>, GgufError> {
        let v = self.require(key)?;
        let items = v
            .as_array()
            .ok_or_else(|| self.wrong_type(key, "an array of strings", v))?;
        items
            .iter()
            .map(|item| item.as_str())
            .collect::<Option<Vec<&str>>>()
            .ok_or_else(|| self.wrong_type(key, "an array of strings", v))
    }

    /// The array of integers (of any type that fits in i64) at `key`.
    pub fn get_i64_array(&self, key: &str) -> Result<Vec<i64>, GgufError> {
        let v = self.require(key)?;
        let expected = "an array of integers that fit in i64";
        let items = v
            .as_array()
            .ok_or_else(|| self.wrong_type(key, expected, v))?;
        items
            .iter()
            .map(MetaValue::as_i64)
            .collect::<Option<Vec<i64>>>()
            .ok_or_else(|| self.wrong_type(key, expected, v))
    }

    /// The tensor table, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The tensor called `name`, if the file has it.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.by_name.get(name).map(|&i| &self.tensors[i])
    }

    /// Whether `t` is this file's entry for its name (not one from another file).
    fn owns(&self, t: &TensorInfo) -> bool {
        self.tensor(&t.name) == Some(t)
    }

    /// The raw bytes of tensor `t`, as stored. `t` must come from this file's
    /// [`tensors`](GgufFile::tensors); for any other, the slice is empty.
    pub fn data(&self, t: &TensorInfo) -> &[u8] {
        if !self.owns(t) {
            return &[];
        }
        // `open` checked offset + n_bytes <= the file's length.
        let start = t.offset as usize;
        self.map
            .get(start..start + t.n_bytes as usize)
            .unwrap_or(&[])
    }

    /// Tensor `t`'s values as f32, row-major in PyTorch order ([`TensorInfo::shape`]).
    /// Errors for a type without a dequantizer (see [`SUPPORTED`]) and for a `t` that is
    /// not this file's.
    pub fn dequantize(&self, t: &TensorInfo) -> Result<Vec<f32>, GgufError> {
        if !self.owns(t) {
            return Err(GgufError::ForeignTensor {
                path: self.path.clone(),
                tensor: t.name.clone(),
            });
        }
        if !t.ggml_type.is_supported() {
            return Err(GgufError::UnsupportedTensor {
                path: self.path.clone(),
                tensor: t.name.clone(),
                ty: t.ggml_type.to_string(),
                supported: SUPPORTED,
            });
        }
        dequantize(t.ggml_type, self.data(t), t.n_elements() as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meta_value_conversions() {
        assert_eq!(MetaValue::I8(5).as_u64(), Some(5));
        assert_eq!(MetaValue::I8(-5).as_u64(), None);
        assert_eq!(MetaValue::U64(u64::MAX).as_i64(), None);
        assert_eq!(MetaValue::U16(7).as_f64(), Some(7.0));
        assert_eq!(MetaValue::F32(0.1).as_f64(), Some(f64::from(0.1f32)));
        assert_eq!(MetaValue::F32(0.1).as_u64(), None);
        assert_eq!(MetaValue::Bool(true).as_u64(), None);
        assert_eq!(MetaValue::I32(-3).describe(), "i32 -3");
        let long = MetaValue::String("x".repeat(100)).describe();
        assert!(long.ends_with("...") && long.len() < 60, "{long}");
        let array = MetaValue::Array(vec![MetaValue::U8(1), MetaValue::U8(2)]);
        assert_eq!(array.describe(), "array of 2 u8");
        assert_eq!(MetaValue::Array(vec![]).describe(), "an empty array");
    }

    #[test]
    fn shape_reverses_dims() {
        let t = TensorInfo {
            name: "w".into(),
            dims: vec![576, 1536],
            ggml_type: GgmlType::Q4_1,
            offset: 0,
            n_bytes: 0,
        };
        assert_eq!(t.shape(), vec![1536, 576]);
        assert_eq!(t.n_elements(), 576 * 1536);
    }
}
