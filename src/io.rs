//! Reading and writing parameter trees as safetensors.
//!
//! A [`ParamTree`] is stored as one f32 tensor per leaf, named by the leaf's path
//! (`"wq"`, `"layers.0.wq"`), little-endian, row-major. Writes are atomic: the bytes go to a
//! temporary file in the destination's directory, which is synced and then renamed over
//! the destination, so a crash never leaves a half-written checkpoint under the real name.
//!
//! [`SafetensorsFile`] reads arbitrary named f32 and u32 tensors (test vectors, checkpoints
//! with extra entries such as a key).

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

use safetensors::tensor::{Dtype, SafeTensorError, SafeTensors, TensorView};
use shardes_hlo::params::{Array, ParamError, ParamTree};
use thiserror::Error;

/// Errors reading or writing safetensors files.
#[derive(Debug, Error)]
pub enum IoError {
    /// The file could not be read.
    #[error("cannot read {}: {source}; check the path and its permissions", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The file (or its temporary sibling) could not be written, synced or renamed.
    #[error(
        "cannot write {}: {source}; check that the directory exists, is writable and has space",
        path.display()
    )]
    Write {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid safetensors.
    // The parser's error is described in the message, not chained as a source: its own
    // text is only its variant's name, which a chain would print a second time.
    #[error(
        "{} is not a valid safetensors file: {}; {}",
        path.display(),
        describe_safetensors_error(cause),
        SAFETENSORS_FIX
    )]
    Format {
        /// The file.
        path: PathBuf,
        /// The parser's error.
        cause: SafeTensorError,
    },
    /// The tensors could not be serialized.
    #[error(
        "cannot serialize tensors for {}: {}",
        path.display(),
        describe_safetensors_error(cause)
    )]
    Serialize {
        /// The destination file.
        path: PathBuf,
        /// The serializer's error.
        cause: SafeTensorError,
    },
    /// A tensor that was asked for is not in the file.
    #[error(
        "{} has no tensor named `{name}` (it has: {available}); check the name, or that the \
         file was written from a tree of the same structure",
        path.display()
    )]
    MissingTensor {
        /// The file.
        path: PathBuf,
        /// The missing name.
        name: String,
        /// The names the file does have, comma-separated.
        available: String,
    },
    /// A tensor has another dtype than the one asked for.
    #[error(
        "tensor `{name}` in {} is {found}, expected {expected}; convert it to {expected} \
         before loading",
        path.display()
    )]
    WrongDtype {
        /// The file.
        path: PathBuf,
        /// The tensor.
        name: String,
        /// The dtype asked for.
        expected: &'static str,
        /// The dtype found.
        found: String,
    },
    /// A tensor has another shape than the template's leaf.
    #[error(
        "tensor `{name}` in {} has shape {found:?} but the parameter tree expects {expected:?}; \
         load it with a template of the same model size",
        path.display()
    )]
    WrongShape {
        /// The file.
        path: PathBuf,
        /// The tensor.
        name: String,
        /// The template's shape.
        expected: Vec<usize>,
        /// The file's shape.
        found: Vec<usize>,
    },
    /// Two tensors to write share a name.
    #[error(
        "two tensors to write to {} are both named `{name}`; give each tensor a distinct name",
        path.display()
    )]
    DuplicateName {
        /// The destination file.
        path: PathBuf,
        /// The repeated name.
        name: String,
    },
    /// The tensors do not form a valid tree (conflicting names).
    #[error("tensors in {} do not form a parameter tree: {source}", path.display())]
    Tree {
        /// The file.
        path: PathBuf,
        /// The tree error.
        #[source]
        source: ParamError,
    },
}

/// What to do about a file that is not valid safetensors.
const SAFETENSORS_FIX: &str = "the file is damaged or is not a safetensors file; restore it from \
                               a good copy or write it again";

/// What a safetensors parser error means for the file, in words (the error's own `Display`
/// is its variant's name).
pub fn describe_safetensors_error(e: &SafeTensorError) -> String {
    match e {
        SafeTensorError::HeaderTooSmall => {
            "it is shorter than the 8-byte header length every safetensors file starts with \
             (empty or truncated)"
                .into()
        }
        SafeTensorError::HeaderTooLarge => {
            "its first 8 bytes announce a header larger than safetensors allows (not a \
             safetensors file, or its start is overwritten)"
                .into()
        }
        SafeTensorError::InvalidHeaderLength => {
            "its header length points past the end of the file (truncated)".into()
        }
        SafeTensorError::InvalidHeader => "its header is not UTF-8 text".into(),
        SafeTensorError::InvalidHeaderStart => "its header does not start with '{'".into(),
        SafeTensorError::InvalidHeaderDeserialization => {
            "its header is not the JSON table of tensors safetensors expects".into()
        }
        SafeTensorError::MetadataIncompleteBuffer => {
            "its size does not match the tensors its header lists (truncated, or with bytes \
             appended)"
                .into()
        }
        SafeTensorError::InvalidOffset(name) => {
            format!("the header's byte range of tensor `{name}` is out of order or overlaps")
        }
        SafeTensorError::TensorInvalidInfo => {
            "a tensor's shape and dtype do not match its byte range".into()
        }
        SafeTensorError::ValidationOverflow => "a tensor's shape is too large to address".into(),
        SafeTensorError::TensorNotFound(name) => format!("it has no tensor `{name}`"),
        SafeTensorError::IoError(e) => format!("reading it failed: {e}"),
        SafeTensorError::JsonError(e) => format!("its header is not valid JSON: {e}"),
        SafeTensorError::InvalidTensorView(dtype, shape, len) => {
            format!("a {dtype:?} tensor of shape {shape:?} does not fit its {len} bytes")
        }
    }
}

/// Writes `tree` to `path`, one f32 tensor per leaf named by its path; atomic.
pub fn write_params(path: impl AsRef<Path>, tree: &ParamTree) -> Result<(), IoError> {
    let named: Vec<(String, &Array)> = tree.leaves();
    write_named(path, &named)
}

/// Writes named f32 arrays to `path` as safetensors; atomic.
pub fn write_named<S: AsRef<str>>(
    path: impl AsRef<Path>,
    tensors: &[(S, &Array)],
) -> Result<(), IoError> {
    let path = path.as_ref();
    let mut bytes: HashMap<&str, Vec<u8>> = HashMap::with_capacity(tensors.len());
    for (name, a) in tensors {
        let name = name.as_ref();
        let le: Vec<u8> = a.data().iter().flat_map(|x| x.to_le_bytes()).collect();
        if bytes.insert(name, le).is_some() {
            return Err(IoError::DuplicateName {
                path: path.to_path_buf(),
                name: name.to_string(),
            });
        }
    }
    let mut views = Vec::with_capacity(tensors.len());
    for (name, a) in tensors {
        let name = name.as_ref();
        let data = bytes.get(name).map(Vec::as_slice).unwrap_or(&[]);
        let view = TensorView::new(Dtype::F32, a.shape().to_vec(), data).map_err(|cause| {
            IoError::Serialize {
                path: path.to_path_buf(),
                cause,
            }
        })?;
        views.push((name, view));
    }
    let buf = safetensors::serialize(views, &None).map_err(|cause| IoError::Serialize {
        path: path.to_path_buf(),
        cause,
    })?;
    write_atomic(path, &buf)
}

/// Writes `bytes` to `path` atomically: a temporary sibling (`.NAME.tmpPID`) is written,
/// synced and renamed over `path`, and the directory is synced so the rename survives a
/// crash. A reader sees the old file or the new one, never a part.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), IoError> {
    let err = |source| IoError::Write {
        path: path.to_path_buf(),
        source,
    };
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let file_name = path.file_name().ok_or_else(|| {
        err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "the path names no file",
        ))
    })?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(file_name);
    tmp_name.push(format!(".tmp{}", std::process::id()));
    let tmp = dir.join(tmp_name);
    let result = (|| {
        let mut f = File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        drop(f);
        fs::rename(&tmp, path)?;
        // The rename is durable only once the directory entry is; not every platform can
        // open a directory for syncing, so a failure there is not an error.
        if let Ok(d) = File::open(&dir) {
            let _ = d.sync_all();
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result.map_err(err)
}

/// Reads a tree with `template`'s structure from `path`: each leaf from the tensor named by
/// its path, which must be f32 of the leaf's shape. Extra tensors in the file are ignored.
pub fn read_params(path: impl AsRef<Path>, template: &ParamTree) -> Result<ParamTree, IoError> {
    let file = SafetensorsFile::open(path)?;
    let mut leaves = Vec::with_capacity(template.num_leaves());
    for (name, t) in template.leaves() {
        let a = file.f32(&name)?;
        if a.shape() != t.shape() {
            return Err(IoError::WrongShape {
                path: file.path.clone(),
                name,
                expected: t.shape().to_vec(),
                found: a.shape().to_vec(),
            });
        }
        leaves.push(a);
    }
    ParamTree::from_leaves(template, leaves).map_err(|source| IoError::Tree {
        path: file.path.clone(),
        source,
    })
}

/// Reads every tensor of `path` (all must be f32) into a tree, inferring its structure from
/// the names as [`ParamTree::from_paths`] does (levels named `0..n-1` become lists).
pub fn read_params_inferred(path: impl AsRef<Path>) -> Result<ParamTree, IoError> {
    let file = SafetensorsFile::open(path)?;
    let mut named = Vec::new();
    for name in file.names() {
        let a = file.f32(&name)?;
        named.push((name, a));
    }
    ParamTree::from_paths(named).map_err(|source| IoError::Tree {
        path: file.path.clone(),
        source,
    })
}

/// A safetensors file loaded in memory, for reading named tensors of any supported dtype.
#[derive(Debug)]
pub struct SafetensorsFile {
    path: PathBuf,
    bytes: Vec<u8>,
}

impl SafetensorsFile {
    /// Reads and validates the file at `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<SafetensorsFile, IoError> {
        let path = path.as_ref().to_path_buf();
        let bytes = fs::read(&path).map_err(|source| IoError::Read {
            path: path.clone(),
            source,
        })?;
        let file = SafetensorsFile { path, bytes };
        file.parsed()?;
        Ok(file)
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn parsed(&self) -> Result<SafeTensors<'_>, IoError> {
        SafeTensors::deserialize(&self.bytes).map_err(|cause| IoError::Format {
            path: self.path.clone(),
            cause,
        })
    }

    /// The tensor names, sorted.
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .parsed()
            .map(|st| st.names().into_iter().cloned().collect())
            .unwrap_or_default();
        names.sort();
        names
    }

    fn raw(
        &self,
        name: &str,
        want: Dtype,
        label: &'static str,
    ) -> Result<(Vec<usize>, Vec<[u8; 4]>), IoError> {
        let st = self.parsed()?;
        let view = st.tensor(name).map_err(|_| IoError::MissingTensor {
            path: self.path.clone(),
            name: name.to_string(),
            available: self.names().join(", "),
        })?;
        if view.dtype() != want {
            return Err(IoError::WrongDtype {
                path: self.path.clone(),
                name: name.to_string(),
                expected: label,
                found: format!("{:?}", view.dtype()),
            });
        }
        // The parser checked that the byte length equals shape × 4 for a 4-byte dtype.
        let words = view
            .data()
            .chunks_exact(4)
            .map(|c| [c[0], c[1], c[2], c[3]])
            .collect();
        Ok((view.shape().to_vec(), words))
    }

    /// The f32 tensor `name` as an [`Array`]; errors if missing or not f32.
    pub fn f32(&self, name: &str) -> Result<Array, IoError> {
        let (shape, words) = self.raw(name, Dtype::F32, "F32")?;
        let data = words.into_iter().map(f32::from_le_bytes).collect();
        Array::new(shape, data).map_err(|source| IoError::Tree {
            path: self.path.clone(),
            source,
        })
    }

    /// The u32 tensor `name` as `(shape, data)`; errors if missing or not u32.
    pub fn u32(&self, name: &str) -> Result<(Vec<usize>, Vec<u32>), IoError> {
        let (shape, words) = self.raw(name, Dtype::U32, "U32")?;
        Ok((shape, words.into_iter().map(u32::from_le_bytes).collect()))
    }
}

/// [`params_to_bytes`] consuming `tree`: each leaf is freed as soon as its bytes are in
/// the output, so the peak is the output plus one leaf's bytes, not the tree beside it.
/// The bytes are those [`params_to_bytes`] gives for the same tree.
pub fn params_into_bytes(path: &Path, tree: ParamTree) -> Result<Vec<u8>, IoError> {
    fn take(t: ParamTree, path: String, out: &mut Vec<(String, Array)>) {
        let join = |seg: &str| {
            if path.is_empty() {
                seg.to_string()
            } else {
                format!("{path}.{seg}")
            }
        };
        // The order of `ParamTree::leaves`: maps by key, lists by position.
        match t {
            ParamTree::Leaf(a) => out.push((path, a)),
            ParamTree::Map(m) => {
                for (k, v) in m {
                    let p = join(&k);
                    take(v, p, out);
                }
            }
            ParamTree::List(l) => {
                for (i, v) in l.into_iter().enumerate() {
                    let p = join(&i.to_string());
                    take(v, p, out);
                }
            }
        }
    }
    let mut named = Vec::new();
    take(tree, String::new(), &mut named);
    let mut seen = std::collections::HashSet::with_capacity(named.len());
    for (name, _) in &named {
        if !seen.insert(name.clone()) {
            return Err(IoError::DuplicateName {
                path: path.to_path_buf(),
                name: name.clone(),
            });
        }
    }
    // The serializer drops each view right after copying its bytes out.
    let views: Vec<(String, LeOwned)> = named.into_iter().map(|(n, a)| (n, LeOwned(a))).collect();
    safetensors::serialize(views, &None).map_err(|cause| IoError::Serialize {
        path: path.to_path_buf(),
        cause,
    })
}

/// [`LeBytes`] owning its array, which goes when the view does.
struct LeOwned(Array);

impl safetensors::View for LeOwned {
    fn dtype(&self) -> Dtype {
        Dtype::F32
    }

    fn shape(&self) -> &[usize] {
        self.0.shape()
    }

    fn data(&self) -> std::borrow::Cow<'_, [u8]> {
        LeBytes(&self.0).data().into_owned().into()
    }

    fn data_len(&self) -> usize {
        LeBytes(&self.0).data_len()
    }
}

/// An f32 array as a safetensors view whose bytes are produced when the serializer asks.
struct LeBytes<'a>(&'a Array);

impl safetensors::View for LeBytes<'_> {
    fn dtype(&self) -> Dtype {
        Dtype::F32
    }

    fn shape(&self) -> &[usize] {
        self.0.shape()
    }

    fn data(&self) -> std::borrow::Cow<'_, [u8]> {
        std::borrow::Cow::Owned(self.0.data().iter().flat_map(|x| x.to_le_bytes()).collect())
    }

    fn data_len(&self) -> usize {
        self.0.len() * std::mem::size_of::<f32>()
    }
}

/// Serializes `tree` as safetensors in memory, one f32 tensor per leaf named by its path, as
/// [`write_params`] writes it; `path` only names the destination in errors. A caller that
/// hashes the bytes before writing them (`rundir`'s checkpoints) needs no re-read.
pub fn params_to_bytes(path: &Path, tree: &ParamTree) -> Result<Vec<u8>, IoError> {
    named_to_bytes(path, &tree.leaves())
}

/// Serializes named f32 arrays as safetensors in memory (as [`write_named`] writes them);
/// `path` only names the destination in errors.
pub fn named_to_bytes<S: AsRef<str>>(
    path: &Path,
    tensors: &[(S, &Array)],
) -> Result<Vec<u8>, IoError> {
    // Each tensor's little-endian bytes are made only while the serializer copies them into
    // the output (`LeBytes`), so the peak is the output plus one tensor, not twice the tree.
    let mut seen = std::collections::HashSet::with_capacity(tensors.len());
    let mut views = Vec::with_capacity(tensors.len());
    for (name, a) in tensors {
        if !seen.insert(name.as_ref()) {
            return Err(IoError::DuplicateName {
                path: path.to_path_buf(),
                name: name.as_ref().to_string(),
            });
        }
        views.push((name.as_ref(), LeBytes(a)));
    }
    safetensors::serialize(views, &None).map_err(|cause| IoError::Serialize {
        path: path.to_path_buf(),
        cause,
    })
}

impl SafetensorsFile {
    /// Validates `bytes` (already read, e.g. to check their hash first) as the contents of
    /// the safetensors file at `path`, which names the file in errors.
    pub fn from_bytes(path: impl AsRef<Path>, bytes: Vec<u8>) -> Result<SafetensorsFile, IoError> {
        let file = SafetensorsFile {
            path: path.as_ref().to_path_buf(),
            bytes,
        };
        file.parsed()?;
        Ok(file)
    }
}
