//! [`Cursor`]: bounds-checked reads of a GGUF file's fields, metadata values included.
//!
//! Every read checks the bytes that remain, and every count or length the file declares
//! is checked against them before anything sized by it is allocated.

use std::path::Path;

use super::{GgufError, MetaValue};

/// The deepest array nesting followed; model files nest none, and the limit keeps a
/// hostile file from overflowing the stack.
pub(crate) const MAX_DEPTH: usize = 8;

/// A count already checked against the file's length, as usize (saturating: on a 32-bit
/// target a count that large could not have passed the check anyway).
pub(crate) fn to_usize(n: u64) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

/// A position in the file's bytes; every read checks the bytes that remain.
pub(crate) struct Cursor<'a> {
    pub path: &'a Path,
    pub bytes: &'a [u8],
    pub pos: usize,
}

impl<'a> Cursor<'a> {
    fn past_end(&self, what: String, need: u64) -> GgufError {
        GgufError::PastEnd {
            path: self.path.to_path_buf(),
            what,
            offset: self.pos as u64,
            need,
            len: self.bytes.len() as u64,
        }
    }

    /// The error for the unknown value type `type_id` of metadata key `key`, read at byte
    /// `at`.
    fn bad_type(&self, key: &str, type_id: u32, at: usize) -> GgufError {
        GgufError::ValueType {
            path: self.path.to_path_buf(),
            key: key.to_string(),
            type_id,
            offset: at as u64,
        }
    }

    fn remaining(&self) -> u64 {
        (self.bytes.len() - self.pos) as u64
    }

    /// Errors unless `count` items of at least `each` bytes fit in what remains (`what`
    /// describes them, built only on error).
    pub(crate) fn fits(
        &self,
        count: u64,
        each: u64,
        what: impl FnOnce() -> String,
    ) -> Result<(), GgufError> {
        match count.checked_mul(each) {
            Some(need) if need <= self.remaining() => Ok(()),
            need => Err(self.past_end(what(), need.unwrap_or(u64::MAX))),
        }
    }

    /// The next `n` bytes.
    fn take(&mut self, n: u64, what: impl FnOnce() -> String) -> Result<&'a [u8], GgufError> {
        if n > self.remaining() {
            return Err(self.past_end(what(), n));
        }
        // n <= remaining, so it fits in usize.
        let n = n as usize;
        let out = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    pub(crate) fn array<const N: usize>(
        &mut self,
        what: impl FnOnce() -> String,
    ) -> Result<[u8; N], GgufError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N as u64, what)?);
        Ok(out)
    }

    pub(crate) fn u32(&mut self, what: impl FnOnce() -> String) -> Result<u32, GgufError> {
        self.array(what).map(u32::from_le_bytes)
    }

    pub(crate) fn u64(&mut self, what: impl FnOnce() -> String) -> Result<u64, GgufError> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// A GGUF string: u64 length, then UTF-8 bytes.
    pub(crate) fn string(&mut self, what: impl Fn() -> String) -> Result<String, GgufError> {
        let n = self.u64(|| format!("the length of {}", what()))?;
        let at = self.pos as u64;
        let bytes = self.take(n, || format!("{} ({n} bytes)", what()))?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_owned()),
            Err(_) => Err(GgufError::NotUtf8 {
                path: self.path.to_path_buf(),
                what: what(),
                offset: at,
            }),
        }
    }

    /// A metadata value of type id `ty` (read at byte `at`) for `key`, arrays nested
    /// `depth` deep.
    pub(crate) fn value(
        &mut self,
        ty: u32,
        at: usize,
        key: &str,
        depth: usize,
    ) -> Result<MetaValue, GgufError> {
        let what = || format!("the value of metadata key `{key}`");
        Ok(match ty {
            0 => MetaValue::U8(self.array::<1>(what)?[0]),
            1 => MetaValue::I8(i8::from_le_bytes(self.array(what)?)),
            2 => MetaValue::U16(u16::from_le_bytes(self.array(what)?)),
            3 => MetaValue::I16(i16::from_le_bytes(self.array(what)?)),
            4 => MetaValue::U32(u32::from_le_bytes(self.array(what)?)),
            5 => MetaValue::I32(i32::from_le_bytes(self.array(what)?)),
            6 => MetaValue::F32(f32::from_le_bytes(self.array(what)?)),
            7 => {
                let offset = self.pos as u64;
                match self.array::<1>(what)?[0] {
                    0 => MetaValue::Bool(false),
                    1 => MetaValue::Bool(true),
                    value => {
                        return Err(GgufError::Bool {
                            path: self.path.to_path_buf(),
                            key: key.to_string(),
                            value,
                            offset,
                        })
                    }
                }
            }
            8 => MetaValue::String(self.string(what)?),
            9 => self.array_value(key, depth)?,
            10 => MetaValue::U64(u64::from_le_bytes(self.array(what)?)),
            11 => MetaValue::I64(i64::from_le_bytes(self.array(what)?)),
            12 => MetaValue::F64(f64::from_le_bytes(self.array(what)?)),
            type_id => return Err(self.bad_type(key, type_id, at)),
        })
    }

    /// An array value: u32 item type, u64 count, the items.
    fn array_value(&mut self, key: &str, depth: usize) -> Result<MetaValue, GgufError> {
        if depth >= MAX_DEPTH {
            return Err(GgufError::TooDeep {
                path: self.path.to_path_buf(),
                key: key.to_string(),
                max: MAX_DEPTH,
            });
        }
        let at = self.pos;
        let ty = self.u32(|| format!("the item type of metadata key `{key}`"))?;
        let min = match ty {
            0 | 1 | 7 => 1,
            2 | 3 => 2,
            4..=6 => 4,
            8 | 10..=12 => 8,
            9 => 12,
            type_id => return Err(self.bad_type(key, type_id, at)),
        };
        let count = self.u64(|| format!("the item count of metadata key `{key}`"))?;
        self.fits(count, min, || {
            format!("the {count} items of metadata key `{key}` (at least {min} bytes each)")
        })?;
        // Bounded by the check above: at most one item per byte that remains.
        let mut items = Vec::with_capacity(to_usize(count));
        for _ in 0..count {
            items.push(self.value(ty, at, key, depth + 1)?);
        }
        Ok(MetaValue::Array(items))
    }
}
