//! Writing GGUF files (version 3, little-endian): the header, metadata of every value type
//! (arrays and nested arrays included), the tensor table and the tensors' data, each
//! aligned to 32 bytes (GGUF's default `general.alignment`, so the key is not written).
//!
//! Tensors are given as f32 values in PyTorch order (row-major, `[out, in]` for a weight)
//! and encoded as [`GgmlType::F32`], [`GgmlType::F16`] or [`GgmlType::Q8_0`] while the
//! file is written ([`encode`]); their dimensions are stored in ggml order (`ne[0]` the
//! contiguous one), as [`super::GgufFile`] reads them. The encoders match the `gguf`
//! Python package's (`gguf.quants.quantize`) bit for bit: Q8_0 takes `d = max|x| / 127`
//! per block of 32 in f32, `q = round(x / d)` (half away from zero), and stores `d` as f16.

use std::io::Write;

use half::f16;
use thiserror::Error;

use super::{GgmlType, MetaValue};

/// The alignment of the tensor data (GGUF's default, used when `general.alignment` is
/// absent).
pub const ALIGNMENT: u64 = 32;

/// Errors encoding or writing a GGUF file.
#[derive(Debug, Error)]
pub enum GgufWriteError {
    /// The type has no encoder here.
    #[error(
        "tensor `{name}`: shardes writes GGUF tensors as F32, F16 or Q8_0, not {ty}; choose \
         one of those"
    )]
    Type {
        /// The tensor.
        name: String,
        /// The type asked for.
        ty: String,
    },
    /// A quantized type needs whole blocks per row.
    #[error(
        "tensor `{name}` has rows of {row} values, not a multiple of {ty}'s block of {block}; \
         write it as F32 or F16"
    )]
    Blocks {
        /// The tensor.
        name: String,
        /// The type asked for.
        ty: &'static str,
        /// The row length (the shape's last dimension).
        row: usize,
        /// The type's block size.
        block: usize,
    },
    /// The values do not fill the shape.
    #[error("tensor `{name}` has {got} values for shape {shape:?} ({want}); this is a bug in the caller")]
    Length {
        /// The tensor.
        name: String,
        /// Its shape.
        shape: Vec<usize>,
        /// Values expected.
        want: usize,
        /// Values given.
        got: usize,
    },
    /// GGUF holds at most four dimensions.
    #[error("tensor `{name}` has {dims} dimensions; GGUF holds at most 4")]
    Dims {
        /// The tensor.
        name: String,
        /// Its dimension count.
        dims: usize,
    },
    /// Two tensors or two keys share a name.
    #[error("{what} `{name}` is given twice; each name may appear once in a GGUF file")]
    Duplicate {
        /// `tensor` or `key`.
        what: &'static str,
        /// The name.
        name: String,
    },
    /// An array whose items are not all of one type.
    #[error(
        "metadata key `{key}` is an array of mixed types ({first} and {other}); GGUF arrays \
         hold one type"
    )]
    MixedArray {
        /// The key.
        key: String,
        /// The first item's type.
        first: &'static str,
        /// Another item's type.
        other: &'static str,
    },
    /// Writing failed.
    #[error("writing the GGUF data failed: {0}")]
    Io(#[from] std::io::Error),
}

/// One tensor to write: its name, its shape in PyTorch order, the type to store it as and
/// its f32 values (row-major).
#[derive(Debug, Clone, Copy)]
pub struct TensorOut<'a> {
    /// The GGUF tensor name (`blk.0.attn_q.weight`).
    pub name: &'a str,
    /// The shape in PyTorch order (`[out, in]`).
    pub shape: &'a [usize],
    /// How to store it.
    pub ty: GgmlType,
    /// The values, row-major in `shape`.
    pub data: &'a [f32],
}

/// The bytes `n` values of `ty` take; `None` when `ty` has no encoder or `n` is not a
/// whole number of blocks.
pub fn encoded_len(ty: GgmlType, n: usize) -> Option<usize> {
    match ty {
        GgmlType::F32 => Some(4 * n),
        GgmlType::F16 => Some(2 * n),
        GgmlType::Q8_0 => n.is_multiple_of(32).then_some(n / 32 * 34),
        _ => None,
    }
}

/// `values` encoded as `ty` (F32, F16 or Q8_0; for Q8_0 a whole number of blocks of 32).
pub fn encode(name: &str, ty: GgmlType, values: &[f32]) -> Result<Vec<u8>, GgufWriteError> {
    match ty {
        GgmlType::F32 => Ok(values.iter().flat_map(|x| x.to_le_bytes()).collect()),
        GgmlType::F16 => Ok(values
            .iter()
            .flat_map(|&x| f16::from_f32(x).to_le_bytes())
            .collect()),
        GgmlType::Q8_0 => {
            if !values.len().is_multiple_of(32) {
                return Err(GgufWriteError::Blocks {
                    name: name.to_string(),
                    ty: "Q8_0",
                    row: values.len(),
                    block: 32,
                });
            }
            let mut out = Vec::with_capacity(values.len() / 32 * 34);
            for block in values.chunks_exact(32) {
                quantize_q8_0_block(block, &mut out);
            }
            Ok(out)
        }
        other => Err(GgufWriteError::Type {
            name: name.to_string(),
            ty: other.to_string(),
        }),
    }
}

/// One Q8_0 block (32 values) appended to `out`: the f16 scale, then 32 i8 steps.
fn quantize_q8_0_block(block: &[f32], out: &mut Vec<u8>) {
    let amax = block.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    // As gguf-py: the scale in f32 quantizes, its f16 rounding is what is stored.
    let d = amax / 127.0;
    let id = if d == 0.0 { 0.0 } else { 1.0 / d };
    out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
    for &x in block {
        // `round` is half away from zero, as gguf-py's `np_roundf`; |x·id| ≤ 127 (up to
        // f32 rounding, which `as` saturates).
        out.push(((x * id).round() as i8) as u8);
    }
}

/// The GGUF type id of a metadata value.
fn type_id(v: &MetaValue) -> u32 {
    match v {
        MetaValue::U8(_) => 0,
        MetaValue::I8(_) => 1,
        MetaValue::U16(_) => 2,
        MetaValue::I16(_) => 3,
        MetaValue::U32(_) => 4,
        MetaValue::I32(_) => 5,
        MetaValue::F32(_) => 6,
        MetaValue::Bool(_) => 7,
        MetaValue::String(_) => 8,
        MetaValue::Array(_) => 9,
        MetaValue::U64(_) => 10,
        MetaValue::I64(_) => 11,
        MetaValue::F64(_) => 12,
    }
}

fn put_string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// A value's bytes (without its type id, which the caller writes).
fn put_value(out: &mut Vec<u8>, key: &str, v: &MetaValue) -> Result<(), GgufWriteError> {
    match v {
        MetaValue::U8(x) => out.push(*x),
        MetaValue::I8(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::Bool(x) => out.push(u8::from(*x)),
        MetaValue::String(s) => put_string(out, s),
        MetaValue::Array(items) => {
            // An empty array has no item to take a type from; u8 is as good as any.
            let item_type = items.first().map_or(0, type_id);
            if let Some(other) = items.iter().find(|i| type_id(i) != item_type) {
                return Err(GgufWriteError::MixedArray {
                    key: key.to_string(),
                    first: items[0].type_name(),
                    other: other.type_name(),
                });
            }
            out.extend_from_slice(&item_type.to_le_bytes());
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for item in items {
                put_value(out, key, item)?;
            }
        }
    }
    Ok(())
}

fn padding(len: u64) -> usize {
    ((ALIGNMENT - len % ALIGNMENT) % ALIGNMENT) as usize
}

/// Writes a GGUF v3 file to `out`: `metadata` in the order given, then `tensors` (each
/// encoded as its type when its turn comes, so only one tensor's bytes are held at a
/// time). Returns the number of bytes written.
pub fn write_gguf<W: Write>(
    out: &mut W,
    metadata: &[(String, MetaValue)],
    tensors: &[TensorOut<'_>],
) -> Result<u64, GgufWriteError> {
    let mut seen = std::collections::HashSet::new();
    for (k, _) in metadata {
        if !seen.insert(k.as_str()) {
            return Err(GgufWriteError::Duplicate {
                what: "key",
                name: k.clone(),
            });
        }
    }
    seen.clear();
    // Sizes first: the tensor table holds every tensor's offset.
    let mut sizes = Vec::with_capacity(tensors.len());
    for t in tensors {
        if !seen.insert(t.name) {
            return Err(GgufWriteError::Duplicate {
                what: "tensor",
                name: t.name.to_string(),
            });
        }
        if t.shape.len() > 4 {
            return Err(GgufWriteError::Dims {
                name: t.name.to_string(),
                dims: t.shape.len(),
            });
        }
        let n: usize = t.shape.iter().product();
        if n != t.data.len() {
            return Err(GgufWriteError::Length {
                name: t.name.to_string(),
                shape: t.shape.to_vec(),
                want: n,
                got: t.data.len(),
            });
        }
        let row = t.shape.last().copied().unwrap_or(1);
        if let (Some(block), true) = (t.ty.block_size(), t.ty == GgmlType::Q8_0) {
            if !row.is_multiple_of(block) {
                return Err(GgufWriteError::Blocks {
                    name: t.name.to_string(),
                    ty: t.ty.name(),
                    row,
                    block,
                });
            }
        }
        let size = encoded_len(t.ty, n).ok_or_else(|| GgufWriteError::Type {
            name: t.name.to_string(),
            ty: t.ty.to_string(),
        })?;
        sizes.push(size as u64);
    }
    let mut head = Vec::new();
    head.extend_from_slice(b"GGUF");
    head.extend_from_slice(&3u32.to_le_bytes());
    head.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    head.extend_from_slice(&(metadata.len() as u64).to_le_bytes());
    for (k, v) in metadata {
        put_string(&mut head, k);
        head.extend_from_slice(&type_id(v).to_le_bytes());
        put_value(&mut head, k, v)?;
    }
    let mut offset = 0u64;
    for (t, &size) in tensors.iter().zip(&sizes) {
        put_string(&mut head, t.name);
        head.extend_from_slice(&(t.shape.len() as u32).to_le_bytes());
        for &d in t.shape.iter().rev() {
            head.extend_from_slice(&(d as u64).to_le_bytes());
        }
        head.extend_from_slice(&t.ty.id().to_le_bytes());
        head.extend_from_slice(&offset.to_le_bytes());
        offset += size;
        offset += padding(offset) as u64;
    }
    head.resize(head.len() + padding(head.len() as u64), 0);
    out.write_all(&head)?;
    let mut written = head.len() as u64;
    for t in tensors {
        let bytes = encode(t.name, t.ty, t.data)?;
        out.write_all(&bytes)?;
        let pad = padding(bytes.len() as u64);
        out.write_all(&vec![0u8; pad])?;
        written += (bytes.len() + pad) as u64;
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q8_0_block_is_the_scale_and_rounded_steps() {
        // max |x| = 127 · 0.5, so d = 0.5 (exact in f16) and q = x / 0.5, rounded half
        // away from zero.
        let mut block = [0.0f32; 32];
        block[0] = 63.5;
        block[1] = -63.5;
        block[2] = 0.25; // 0.5 steps: rounds away from zero to 1
        block[3] = -0.75; // -1.5 steps: to -2
        block[4] = 1.0;
        let bytes = encode("t", GgmlType::Q8_0, &block).unwrap();
        assert_eq!(bytes.len(), 34);
        assert_eq!(&bytes[..2], &f16::from_f32(0.5).to_le_bytes());
        let q: Vec<i8> = bytes[2..].iter().map(|&b| b as i8).collect();
        assert_eq!(&q[..6], &[127, -127, 1, -2, 2, 0]);
        let back = crate::gguf::dequantize(GgmlType::Q8_0, &bytes, 32).unwrap();
        assert_eq!(&back[..5], &[63.5, -63.5, 0.5, -1.0, 1.0]);
        // An all-zero block has scale 0 and zero steps.
        let zero = encode("z", GgmlType::Q8_0, &[0.0; 32]).unwrap();
        assert!(zero.iter().all(|&b| b == 0));
        assert!(matches!(
            encode("odd", GgmlType::Q8_0, &[1.0; 31]),
            Err(GgufWriteError::Blocks { .. })
        ));
    }

    #[test]
    fn f16_and_f32_round_trip_through_the_reader() {
        let values: Vec<f32> = (0..64).map(|i| (i as f32 - 20.0) * 0.37).collect();
        let f32s = encode("a", GgmlType::F32, &values).unwrap();
        assert_eq!(
            crate::gguf::dequantize(GgmlType::F32, &f32s, 64).unwrap(),
            values
        );
        let f16s = encode("a", GgmlType::F16, &values).unwrap();
        let back = crate::gguf::dequantize(GgmlType::F16, &f16s, 64).unwrap();
        for (x, y) in values.iter().zip(&back) {
            assert_eq!(*y, f16::from_f32(*x).to_f32());
        }
        assert!(matches!(
            encode("q", GgmlType::Q4_1, &values),
            Err(GgufWriteError::Type { .. })
        ));
    }

    #[test]
    fn mixed_arrays_and_duplicates_are_refused() {
        let mut sink = Vec::new();
        let mixed = vec![(
            "k".to_string(),
            MetaValue::Array(vec![MetaValue::U32(1), MetaValue::I32(2)]),
        )];
        assert!(matches!(
            write_gguf(&mut sink, &mixed, &[]),
            Err(GgufWriteError::MixedArray { .. })
        ));
        let twice = vec![
            ("k".to_string(), MetaValue::U8(1)),
            ("k".to_string(), MetaValue::U8(2)),
        ];
        assert!(matches!(
            write_gguf(&mut sink, &twice, &[]),
            Err(GgufWriteError::Duplicate { .. })
        ));
    }
}
