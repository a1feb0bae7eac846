//! [`GgufError`]: everything reading or dequantizing a GGUF file can fail with.

use std::path::PathBuf;

use thiserror::Error;

/// Errors reading a GGUF file or dequantizing its tensors; each names the file (and the
/// key or tensor) and says what to do.
// The causes are part of each message rather than chained sources, so a report that
// prints the chain does not repeat them (as `hf::HfError`).
#[derive(Debug, Error)]
pub enum GgufError {
    /// The file could not be opened or mapped.
    #[error(
        "cannot read {}: {cause}; check the path and that the file is readable",
        path.display()
    )]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        cause: std::io::Error,
    },
    /// A field runs past the end of the file.
    #[error(
        "{} is truncated or damaged: {what} at byte {offset} needs {need} byte(s) but the \
         file ends at byte {len}; download or convert the file again",
        path.display()
    )]
    PastEnd {
        /// The file.
        path: PathBuf,
        /// The field (`tensor count`, `the name of tensor #3`, ...).
        what: String,
        /// Where the field starts.
        offset: u64,
        /// How many bytes it needs (a declared string length, or a count times the
        /// smallest size of one item).
        need: u64,
        /// The file's length.
        len: u64,
    },
    /// The file does not start with `GGUF`.
    #[error(
        "{} is not a GGUF file: it starts with {got:02x?} rather than the magic \"GGUF\"; \
         point at a llama.cpp .gguf model file",
        path.display()
    )]
    Magic {
        /// The file.
        path: PathBuf,
        /// Its first four bytes.
        got: [u8; 4],
    },
    /// A GGUF version other than 2 and 3.
    #[error(
        "{} is GGUF version {version}; only versions 2 and 3 are supported{hint}",
        path.display()
    )]
    Version {
        /// The file.
        path: PathBuf,
        /// The version read (little-endian).
        version: u32,
        /// Why, when it is recognisable (version 1, a big-endian file), with a leading `; `.
        hint: String,
    },
    /// A metadata value, or an array's items, of a type id GGUF does not define.
    #[error(
        "{}: metadata key `{key}` has value type id {type_id} at byte {offset}, which GGUF \
         does not define (0 to 12); the file is damaged or from a newer GGUF version",
        path.display()
    )]
    ValueType {
        /// The file.
        path: PathBuf,
        /// The key.
        key: String,
        /// The type id found.
        type_id: u32,
        /// Where it is.
        offset: u64,
    },
    /// A bool stored as a byte other than 0 or 1.
    #[error(
        "{}: metadata key `{key}` holds the bool byte {value} at byte {offset}; only 0 and \
         1 are valid, so the file is damaged",
        path.display()
    )]
    Bool {
        /// The file.
        path: PathBuf,
        /// The key.
        key: String,
        /// The byte found.
        value: u8,
        /// Where it is.
        offset: u64,
    },
    /// Arrays nested deeper than the reader follows.
    #[error(
        "{}: metadata key `{key}` nests arrays more than {max} deep; the file is damaged \
         (no model file nests arrays)",
        path.display()
    )]
    TooDeep {
        /// The file.
        path: PathBuf,
        /// The key.
        key: String,
        /// The deepest nesting read.
        max: usize,
    },
    /// A string that is not UTF-8 (a key, a value, a tensor name).
    #[error("{}: {what} at byte {offset} is not valid UTF-8; the file is damaged", path.display())]
    NotUtf8 {
        /// The file.
        path: PathBuf,
        /// The string (`the key of metadata entry #2`, ...).
        what: String,
        /// Where its bytes start.
        offset: u64,
    },
    /// The same metadata key twice.
    #[error("{}: metadata key `{key}` appears twice; the file is damaged", path.display())]
    DuplicateKey {
        /// The file.
        path: PathBuf,
        /// The key.
        key: String,
    },
    /// `general.alignment` is not a u32 power of two.
    #[error(
        "{}: general.alignment is {value}; it must be a u32 power of two (the default is \
         32), so the file is damaged",
        path.display()
    )]
    Alignment {
        /// The file.
        path: PathBuf,
        /// The value found, with its type.
        value: String,
    },
    /// The same tensor name twice.
    #[error(
        "{}: tensor `{name}` appears twice in the tensor table; the file is damaged",
        path.display()
    )]
    DuplicateTensor {
        /// The file.
        path: PathBuf,
        /// The name.
        name: String,
    },
    /// A tensor with more dimensions than ggml's four.
    #[error(
        "{}: tensor `{tensor}` has {n_dims} dimensions; ggml tensors have at most 4, so \
         the file is damaged",
        path.display()
    )]
    Dims {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// The count found.
        n_dims: u32,
    },
    /// A tensor with a dimension of size zero.
    #[error(
        "{}: tensor `{tensor}` has a zero dimension (ggml dims {dims:?}); the file is \
         damaged",
        path.display()
    )]
    ZeroDim {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// Its ggml dims (`ne[0]` first).
        dims: Vec<u64>,
    },
    /// A ggml type id that ggml does not define.
    #[error(
        "{}: tensor `{tensor}` has ggml type id {type_id}, which is not a known ggml type; \
         the file is damaged or needs a newer reader",
        path.display()
    )]
    UnknownType {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// The id found.
        type_id: u32,
    },
    /// A shape whose element or byte count does not fit in 64 bits.
    #[error(
        "{}: tensor `{tensor}` has ggml dims {dims:?}, whose element or byte count \
         overflows 64 bits; the file is damaged",
        path.display()
    )]
    Overflow {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// Its ggml dims.
        dims: Vec<u64>,
    },
    /// A row (`ne[0]`) that is not a whole number of the type's blocks.
    #[error(
        "{}: tensor `{tensor}` has rows of {row} values, not a multiple of {ty}'s block of \
         {block}; the file is damaged",
        path.display()
    )]
    RowBlocks {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// `ne[0]`.
        row: u64,
        /// The ggml type's name.
        ty: &'static str,
        /// Its block size.
        block: usize,
    },
    /// A tensor offset that is not a multiple of the alignment.
    #[error(
        "{}: tensor `{tensor}` starts at offset {offset} of the data section, not a \
         multiple of the alignment {alignment}; the file is damaged",
        path.display()
    )]
    Misaligned {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// Its offset relative to the data section.
        offset: u64,
        /// `general.alignment` (or 32).
        alignment: u64,
    },
    /// A tensor whose data does not lie inside the file.
    #[error(
        "{}: tensor `{tensor}` needs bytes {start}..{end} but the file has {len} bytes; \
         the file is truncated (download or convert it again)",
        path.display()
    )]
    DataPastEnd {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// Its first byte (absolute; saturated when it overflows).
        start: u64,
        /// One past its last byte (absolute; saturated when it overflows).
        end: u64,
        /// The file's length.
        len: u64,
    },
    /// Two tensors whose bytes overlap.
    #[error(
        "{}: tensors `{first}` (bytes {first_start}..{first_end}) and `{second}` (from \
         byte {second_start}) overlap; the file is damaged",
        path.display()
    )]
    Overlap {
        /// The file.
        path: PathBuf,
        /// The tensor that starts first.
        first: String,
        /// Its first byte.
        first_start: u64,
        /// One past its last byte.
        first_end: u64,
        /// The tensor that starts inside it.
        second: String,
        /// Its first byte.
        second_start: u64,
    },
    /// A metadata key that is not in the file.
    #[error(
        "{}: metadata key `{key}` is missing; the file is not a model of the kind \
         expected, or was converted by an old llama.cpp",
        path.display()
    )]
    MissingKey {
        /// The file.
        path: PathBuf,
        /// The key.
        key: String,
    },
    /// A metadata key holding another type than asked for.
    #[error(
        "{}: metadata key `{key}` holds {got}, not {expected}; the file is not a model of \
         the kind expected",
        path.display()
    )]
    WrongType {
        /// The file.
        path: PathBuf,
        /// The key.
        key: String,
        /// What the getter accepts.
        expected: &'static str,
        /// What the key holds (its type, and the value when short).
        got: String,
    },
    /// Dequantizing a tensor of a type without a dequantizer.
    #[error(
        "{}: tensor `{tensor}` is stored as {ty}, which shardes does not dequantize \
         (supported: {supported}); convert the model again with one of those types",
        path.display()
    )]
    UnsupportedTensor {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// Its type's name.
        ty: String,
        /// The types shardes dequantizes.
        supported: &'static str,
    },
    /// [`crate::gguf::GgufFile::data`] or `dequantize` got a tensor of another file.
    #[error(
        "tensor `{tensor}` is not one of {}'s tensors; pass a TensorInfo taken from the \
         same GgufFile",
        path.display()
    )]
    ForeignTensor {
        /// The file asked.
        path: PathBuf,
        /// The tensor's name.
        tensor: String,
    },
    /// [`crate::gguf::dequantize`] of a type without a dequantizer.
    #[error("cannot dequantize {ty}: shardes dequantizes only {supported}")]
    UnsupportedType {
        /// The type's name (and id when ggml does not know it).
        ty: String,
        /// The types shardes dequantizes.
        supported: &'static str,
    },
    /// [`crate::gguf::dequantize`] of a count or byte length that does not fit the type.
    #[error(
        "cannot dequantize {n} {ty} values from {got} bytes: {why}; pass the tensor's \
         element count and exactly its bytes"
    )]
    Length {
        /// The type's name.
        ty: &'static str,
        /// The element count asked for.
        n: usize,
        /// The bytes given.
        got: usize,
        /// What does not fit.
        why: String,
    },
}
