//! Parsing a GGUF file's header, metadata and tensor table from its bytes.
//!
//! Every read is bounds-checked against the bytes that remain, and every count or length
//! the file declares is checked against them before anything sized by it is allocated, so
//! a damaged or hostile file gives an error (naming the field and its byte offset) rather
//! than a panic or a huge allocation.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use super::cursor::{to_usize, Cursor};
use super::{GgmlType, GgufError, MetaValue, TensorInfo};

/// `general.alignment` when the file does not set it.
const DEFAULT_ALIGNMENT: u64 = 32;

/// ggml's limit on a tensor's dimensions.
const MAX_DIMS: u32 = 4;

/// Fewest bytes one metadata entry can take: key length (8), type (4), a 1-byte value.
const MIN_KV_BYTES: u64 = 13;

/// Fewest bytes one tensor-table entry can take: name length (8), dimension count (4),
/// type (4), offset (8).
const MIN_TENSOR_BYTES: u64 = 24;

/// What [`parse`] finds in a file.
pub(crate) struct Parsed {
    pub version: u32,
    pub alignment: u64,
    pub data_start: u64,
    pub metadata: BTreeMap<String, MetaValue>,
    pub tensors: Vec<TensorInfo>,
    pub by_name: HashMap<String, usize>,
}

/// Parses and validates the whole file `bytes` (read from `path`, named in errors).
pub(crate) fn parse(path: &Path, bytes: &[u8]) -> Result<Parsed, GgufError> {
    let mut c = Cursor {
        path,
        bytes,
        pos: 0,
    };
    let magic: [u8; 4] = c.array(|| "the magic".into())?;
    if &magic != b"GGUF" {
        return Err(GgufError::Magic {
            path: path.to_path_buf(),
            got: magic,
        });
    }
    let version = c.u32(|| "the version".into())?;
    if version != 2 && version != 3 {
        let hint = if version == 1 {
            "; version 1 is the 2023 pre-release format, convert the model again with a \
             current llama.cpp"
        } else if matches!(version.swap_bytes(), 1..=3) {
            "; the file is big-endian, and only little-endian files are supported"
        } else {
            ""
        };
        return Err(GgufError::Version {
            path: path.to_path_buf(),
            version,
            hint: hint.to_string(),
        });
    }
    let n_tensors = c.u64(|| "the tensor count".into())?;
    let n_kv = c.u64(|| "the metadata count".into())?;
    // Both tables follow, so each count alone must fit in what remains.
    c.fits(n_kv, MIN_KV_BYTES, || {
        format!("{n_kv} metadata entries (at least {MIN_KV_BYTES} bytes each)")
    })?;
    c.fits(n_tensors, MIN_TENSOR_BYTES, || {
        format!("{n_tensors} tensor-table entries (at least {MIN_TENSOR_BYTES} bytes each)")
    })?;

    let mut metadata = BTreeMap::new();
    for i in 0..n_kv {
        let key = c.string(|| format!("the key of metadata entry #{i}"))?;
        let at = c.pos;
        let ty = c.u32(|| format!("the value type of metadata key `{key}`"))?;
        let value = c.value(ty, at, &key, 0)?;
        if metadata.contains_key(&key) {
            return Err(GgufError::DuplicateKey {
                path: path.to_path_buf(),
                key,
            });
        }
        metadata.insert(key, value);
    }
    let alignment = alignment(path, metadata.get("general.alignment"))?;

    c.fits(n_tensors, MIN_TENSOR_BYTES, || {
        format!("the tensor table's {n_tensors} entries (at least {MIN_TENSOR_BYTES} bytes each)")
    })?;
    // Bounded by the check above: at most one entry per 24 bytes of the file.
    let mut tensors = Vec::with_capacity(to_usize(n_tensors));
    let mut by_name = HashMap::with_capacity(to_usize(n_tensors));
    for i in 0..n_tensors {
        let name = c.string(|| format!("the name of tensor #{i}"))?;
        let n_dims = c.u32(|| format!("the dimension count of tensor `{name}`"))?;
        if n_dims > MAX_DIMS {
            return Err(GgufError::Dims {
                path: path.to_path_buf(),
                tensor: name,
                n_dims,
            });
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for d in 0..n_dims {
            dims.push(c.u64(|| format!("dimension {d} of tensor `{name}`"))?);
        }
        if dims.contains(&0) {
            return Err(GgufError::ZeroDim {
                path: path.to_path_buf(),
                tensor: name,
                dims,
            });
        }
        let type_id = c.u32(|| format!("the type of tensor `{name}`"))?;
        let Some(ggml_type) = GgmlType::from_id(type_id) else {
            return Err(GgufError::UnknownType {
                path: path.to_path_buf(),
                tensor: name,
                type_id,
            });
        };
        // Relative to the data section until its start is known, below.
        let offset = c.u64(|| format!("the data offset of tensor `{name}`"))?;
        if by_name.insert(name.clone(), tensors.len()).is_some() {
            return Err(GgufError::DuplicateTensor {
                path: path.to_path_buf(),
                name,
            });
        }
        tensors.push(TensorInfo {
            name,
            dims,
            ggml_type,
            offset,
            n_bytes: 0,
        });
    }

    let len = bytes.len() as u64;
    // The tables end well inside a file no longer than u64::MAX, so this cannot overflow.
    let data_start = (c.pos as u64).div_ceil(alignment) * alignment;
    for t in &mut tensors {
        place(path, t, alignment, data_start, len)?;
    }
    check_overlaps(path, &tensors)?;
    Ok(Parsed {
        version,
        alignment,
        data_start,
        metadata,
        tensors,
        by_name,
    })
}

/// `general.alignment`: a u32 power of two, or the default.
fn alignment(path: &Path, value: Option<&MetaValue>) -> Result<u64, GgufError> {
    match value {
        None => Ok(DEFAULT_ALIGNMENT),
        Some(MetaValue::U32(a)) if a.is_power_of_two() => Ok(u64::from(*a)),
        Some(v) => Err(GgufError::Alignment {
            path: path.to_path_buf(),
            value: v.describe(),
        }),
    }
}

/// Checks one tensor's shape, alignment and bounds, and sets its absolute offset and byte
/// count.
fn place(
    path: &Path,
    t: &mut TensorInfo,
    alignment: u64,
    data_start: u64,
    len: u64,
) -> Result<(), GgufError> {
    let overflow = || GgufError::Overflow {
        path: path.to_path_buf(),
        tensor: t.name.clone(),
        dims: t.dims.clone(),
    };
    let n = t
        .dims
        .iter()
        .try_fold(1u64, |n, &d| n.checked_mul(d))
        .filter(|&n| usize::try_from(n).is_ok())
        .ok_or_else(overflow)?;
    // `from_id` made the type, so ggml knows its layout.
    let (block, size) = match (t.ggml_type.block_size(), t.ggml_type.type_size()) {
        (Some(block), Some(size)) => (block as u64, size as u64),
        _ => {
            return Err(GgufError::UnknownType {
                path: path.to_path_buf(),
                tensor: t.name.clone(),
                type_id: t.ggml_type.id(),
            })
        }
    };
    let row = t.dims.first().copied().unwrap_or(1);
    if !row.is_multiple_of(block) {
        return Err(GgufError::RowBlocks {
            path: path.to_path_buf(),
            tensor: t.name.clone(),
            row,
            ty: t.ggml_type.name(),
            block: block as usize,
        });
    }
    let n_bytes = (n / block).checked_mul(size).ok_or_else(overflow)?;
    if !t.offset.is_multiple_of(alignment) {
        return Err(GgufError::Misaligned {
            path: path.to_path_buf(),
            tensor: t.name.clone(),
            offset: t.offset,
            alignment,
        });
    }
    let start = data_start.saturating_add(t.offset);
    let end = start.saturating_add(n_bytes);
    if end > len {
        return Err(GgufError::DataPastEnd {
            path: path.to_path_buf(),
            tensor: t.name.clone(),
            start,
            end,
            len,
        });
    }
    t.offset = start;
    t.n_bytes = n_bytes;
    Ok(())
}

/// Errors when two tensors share bytes.
fn check_overlaps(path: &Path, tensors: &[TensorInfo]) -> Result<(), GgufError> {
    let mut order: Vec<&TensorInfo> = tensors.iter().collect();
    order.sort_by_key(|t| t.offset);
    for pair in order.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        if a.offset + a.n_bytes > b.offset {
            return Err(GgufError::Overlap {
                path: path.to_path_buf(),
                first: a.name.clone(),
                first_start: a.offset,
                first_end: a.offset + a.n_bytes,
                second: b.name.clone(),
                second_start: b.offset,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::cursor::MAX_DEPTH;
    use super::*;

    /// A header with `n_tensors` and `n_kv`, then `rest`.
    fn file(version: u32, n_tensors: u64, n_kv: u64, rest: &[u8]) -> Vec<u8> {
        let mut b = b"GGUF".to_vec();
        b.extend(version.to_le_bytes());
        b.extend(n_tensors.to_le_bytes());
        b.extend(n_kv.to_le_bytes());
        b.extend(rest);
        b
    }

    fn string(s: &[u8]) -> Vec<u8> {
        let mut b = (s.len() as u64).to_le_bytes().to_vec();
        b.extend(s);
        b
    }

    fn err(bytes: &[u8]) -> String {
        match parse(Path::new("x.gguf"), bytes) {
            Ok(_) => panic!("parsed"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn empty_file_and_versions() {
        let p = parse(Path::new("x.gguf"), &file(2, 0, 0, &[])).unwrap();
        assert_eq!((p.version, p.alignment, p.tensors.len()), (2, 32, 0));
        assert!(err(&[]).contains("the magic at byte 0 needs 4 byte(s)"));
        assert!(err(&file(0x0300_0000, 0, 0, &[])).contains("big-endian"));
        assert!(err(&file(1, 0, 0, &[])).contains("version 1 is the 2023"));
    }

    #[test]
    fn values_and_nesting() {
        // key "k": array of 1 array of 2 u16.
        let mut kv = string(b"k");
        kv.extend(9u32.to_le_bytes());
        kv.extend(9u32.to_le_bytes());
        kv.extend(1u64.to_le_bytes());
        kv.extend(2u32.to_le_bytes());
        kv.extend(2u64.to_le_bytes());
        kv.extend([1, 0, 2, 0]);
        let p = parse(Path::new("x.gguf"), &file(3, 0, 1, &kv)).unwrap();
        let want = MetaValue::Array(vec![MetaValue::Array(vec![
            MetaValue::U16(1),
            MetaValue::U16(2),
        ])]);
        assert_eq!(p.metadata["k"], want);

        // Arrays nested past the limit: each level is type 9 + count 1.
        let mut kv = string(b"deep");
        kv.extend(9u32.to_le_bytes());
        for _ in 0..MAX_DEPTH + 2 {
            kv.extend(9u32.to_le_bytes());
            kv.extend(1u64.to_le_bytes());
        }
        kv.extend([0; 16]);
        assert!(err(&file(3, 0, 1, &kv)).contains("nests arrays more than 8 deep"));

        let mut kv = string(b"b");
        kv.extend(7u32.to_le_bytes());
        kv.push(2);
        assert!(err(&file(3, 0, 1, &kv)).contains("bool byte 2"));

        let mut kv = string(b"t");
        kv.extend(13u32.to_le_bytes());
        kv.extend([0; 8]);
        assert!(err(&file(3, 0, 1, &kv)).contains("value type id 13"));

        let mut kv = string(b"general.alignment");
        kv.extend(4u32.to_le_bytes());
        kv.extend(48u32.to_le_bytes());
        assert!(err(&file(3, 0, 1, &kv)).contains("general.alignment is u32 48"));
    }

    #[test]
    fn scalar_tensor_and_zero_dims_count() {
        // A 0-dimensional F32 tensor: one value, shape [].
        let mut t = string(b"s");
        // 0 dimensions (u32), type 0 = F32 (u32), offset 0 (u64).
        t.extend([0u8; 16]);
        let mut b = file(3, 1, 0, &t);
        b.resize(64, 0);
        b.extend(1.5f32.to_le_bytes());
        let p = parse(Path::new("x.gguf"), &b).unwrap();
        assert_eq!(p.data_start, 64);
        assert_eq!(p.tensors[0].shape(), Vec::<usize>::new());
        assert_eq!((p.tensors[0].offset, p.tensors[0].n_bytes), (64, 4));
    }
}
