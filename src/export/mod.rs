//! Exporting a trained language model: the parameters of a run (Hugging Face leaf names,
//! as `shardes run` writes `params.safetensors`) with the settings, tokenizer and chat
//! template of the pretrained model the run started from ([`Source`]), written as
//!
//! - a Hugging Face directory ([`to_hf`]): `config.json` of the family, `model.safetensors`
//!   (f32 or bf16), `generation_config.json`, and the tokenizer (`tokenizer.json`,
//!   `tokenizer_config.json` with the chat template and the special tokens' strings);
//! - one GGUF file ([`to_gguf`]): the family's hyperparameter keys, the source's
//!   `general.*` and `tokenizer.*` keys, tensors under llama.cpp's names (q/k rows in
//!   llama.cpp's order for the families whose converter reorders them) as F32, F16 or
//!   Q8_0 (norms and biases stay F32, as llama.cpp's converter keeps them).
//!
//! Both read back with [`crate::pretrained::load`] to the same settings and, for f32, the
//! same leaves bit for bit.
//!
//! Writes are atomic: a GGUF file is written to a temporary beside the target, synced and
//! renamed; a directory is built as a temporary directory beside the target and renamed.
//! An existing target is replaced only with `force` (it is moved aside, the new one renamed
//! in, then the old one removed). The target is checked before any work: it must not exist
//! (unless `force`), its parent must be a directory, and one we can create files in.

use std::fs::{self, File};
use std::path::{Path, PathBuf};

use shardes_hlo::params::{Array, ParamTree};
use thiserror::Error;

use crate::family::{self, Family};
use crate::gguf::GgufWriteError;
use crate::io::{IoError, SafetensorsFile};
use crate::pretrained::{self, Format, Info, ModelError};

mod gguf;
mod hf;
mod vocab;

pub use gguf::{to_gguf, GgufType};
pub use hf::{to_hf, HfDtype};

/// Errors exporting a model; each names the path, tensor or setting and what to do.
#[derive(Debug, Error)]
pub enum ExportError {
    /// The target exists and `force` is off.
    #[error(
        "{} already exists; pass --force to replace it, or choose another path",
        path.display()
    )]
    Exists {
        /// The target.
        path: PathBuf,
    },
    /// The target exists as the other kind (a file where a directory goes, or the reverse).
    #[error(
        "{} is {is}, and the export writes {want} there; remove it or choose another path \
         (--force replaces only {want}s)",
        path.display()
    )]
    WrongKind {
        /// The target.
        path: PathBuf,
        /// What it is.
        is: &'static str,
        /// What the export writes.
        want: &'static str,
    },
    /// The target's parent is a file (or under one).
    #[error(
        "cannot write {}: {} is a file, not a directory; choose a path inside a directory",
        path.display(),
        file.display()
    )]
    ParentIsFile {
        /// The target.
        path: PathBuf,
        /// The file on the way.
        file: PathBuf,
    },
    /// The target's parent does not exist.
    #[error(
        "cannot write {}: the directory {} does not exist; create it first (mkdir -p)",
        path.display(),
        parent.display()
    )]
    ParentMissing {
        /// The target.
        path: PathBuf,
        /// Its parent.
        parent: PathBuf,
    },
    /// The target's parent refuses new files.
    #[error(
        "cannot write {}: the directory {} is not writable ({cause}); choose a directory \
         you can write to",
        path.display(),
        parent.display()
    )]
    NotWritable {
        /// The target.
        path: PathBuf,
        /// Its parent.
        parent: PathBuf,
        /// The OS error.
        cause: std::io::Error,
    },
    /// Writing, syncing or renaming failed.
    #[error("writing {} failed: {cause}; check the disk space and the directory", path.display())]
    Write {
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        cause: std::io::Error,
    },
    /// The parameters are not the model's.
    #[error(
        "{}: {message}; the parameters come from another model's run — pass the \
         params.safetensors of a run of this model (its config.toml names the model)",
        path.display()
    )]
    Params {
        /// The parameter file.
        path: PathBuf,
        /// Which tensor does not match, and how.
        message: String,
    },
    /// The parameter file could not be read.
    #[error(transparent)]
    ParamsRead(#[from] IoError),
    /// The source model could not be read.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// The model has a setting the target format cannot hold.
    #[error("{format} cannot hold `{field}` = {value}; {fix}")]
    Unsupported {
        /// `GGUF` or `config.json`.
        format: &'static str,
        /// The setting.
        field: String,
        /// Its value.
        value: String,
        /// What to do instead.
        fix: &'static str,
    },
    /// Encoding the GGUF file failed.
    #[error("{}: {source}", path.display())]
    Gguf {
        /// The target.
        path: PathBuf,
        /// What failed.
        source: GgufWriteError,
    },
    /// The tokenizer could not be converted.
    #[error("the tokenizer of {} cannot be exported: {message}; {fix}", path.display())]
    Tokenizer {
        /// The source model.
        path: PathBuf,
        /// What is wrong.
        message: String,
        /// What to do.
        fix: &'static str,
    },
}

impl ExportError {
    /// Whether the error is the caller's to fix (a path, a flag, a params file of
    /// another model) rather than a failure of the machine or the files.
    pub fn is_user_error(&self) -> bool {
        matches!(
            self,
            ExportError::Exists { .. }
                | ExportError::WrongKind { .. }
                | ExportError::ParentIsFile { .. }
                | ExportError::ParentMissing { .. }
                | ExportError::NotWritable { .. }
                | ExportError::Params { .. }
                | ExportError::Unsupported { .. }
        )
    }
}

/// The pretrained model a run started from: its files (whose tokenizer and metadata the
/// export copies) and what they say.
#[derive(Debug, Clone)]
pub struct Source {
    /// A Hugging Face directory or a GGUF file.
    pub path: PathBuf,
    /// Which of the two.
    pub format: Format,
    /// Its settings.
    pub info: Info,
    /// Its family.
    pub family: &'static Family,
}

impl Source {
    /// Reads the settings of the model at `path` (no weights).
    pub fn open(path: &Path) -> Result<Source, ExportError> {
        let format = pretrained::format_of(path)?;
        let info = pretrained::read_info(path)?;
        // `read_info` named a family of the table, so the lookup finds it.
        let family = family::FAMILIES
            .iter()
            .copied()
            .find(|f| f.name == info.family)
            .ok_or_else(|| ExportError::Unsupported {
                format: "shardes",
                field: "family".into(),
                value: info.family.into(),
                fix: "report this: the family table lost a family",
            })?;
        Ok(Source {
            path: path.to_path_buf(),
            format,
            info,
            family,
        })
    }
}

/// Reads the parameter file `path` and checks it against `source`'s model: the same
/// tensor names (the leaves of the config), each f32 of the leaf's shape, all finite.
/// A tensor missing, extra or of another shape is named.
pub fn read_params(path: &Path, source: &Source) -> Result<ParamTree, ExportError> {
    let file = SafetensorsFile::open(path)?;
    let bad = |message: String| ExportError::Params {
        path: path.to_path_buf(),
        message,
    };
    let want = source.info.config.param_shapes();
    let names = file.names();
    if let Some(extra) = names.iter().find(|n| !want.iter().any(|(w, _)| w == *n)) {
        return Err(bad(format!(
            "tensor `{extra}` is not a leaf of the {} model of {}",
            source.family.name,
            source.path.display()
        )));
    }
    let mut named = Vec::with_capacity(want.len());
    for (name, shape) in want {
        if !names.contains(&name) {
            return Err(bad(format!(
                "tensor `{name}` of the {} model of {} is missing",
                source.family.name,
                source.path.display()
            )));
        }
        let a: Array = file.f32(&name)?;
        if a.shape() != shape.as_slice() {
            return Err(bad(format!(
                "tensor `{name}` has shape {:?}, but the model of {} has {shape:?}",
                a.shape(),
                source.path.display()
            )));
        }
        if let Some((i, x)) = a.data().iter().enumerate().find(|(_, x)| !x.is_finite()) {
            return Err(bad(format!(
                "tensor `{name}` holds a non-finite value ({x}) at element {i} (a diverged \
                 run)"
            )));
        }
        named.push((name, a));
    }
    ParamTree::from_paths(named).map_err(|e| bad(e.to_string()))
}

/// What an export wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct Written {
    /// The directory or file.
    pub path: PathBuf,
    /// Each file written, with its size in bytes.
    pub files: Vec<(PathBuf, u64)>,
    /// The number of tensors.
    pub tensors: usize,
    /// How the tensors are stored (`f32`, `bf16`, `F16`, `Q8_0`, ...).
    pub dtype: String,
    /// The total size in bytes.
    pub bytes: u64,
    /// What the reader should know (a tensor kept in another type, a file not written).
    pub notes: Vec<String>,
}

/// Checks that `target` may be written: it does not exist (or `force` is set and it is
/// of the kind the export writes: a directory when `dir`), and its parent is an existing
/// directory. Writability is checked when the temporary is created.
pub fn check_target(target: &Path, force: bool, dir: bool) -> Result<(), ExportError> {
    if let Ok(m) = fs::symlink_metadata(target) {
        if !force {
            return Err(ExportError::Exists {
                path: target.to_path_buf(),
            });
        }
        let (is, want) = match (m.is_dir(), dir) {
            (true, false) => ("a directory", "a file"),
            (false, true) => ("a file", "a directory"),
            _ => ("", ""),
        };
        if !is.is_empty() {
            return Err(ExportError::WrongKind {
                path: target.to_path_buf(),
                is,
                want,
            });
        }
    }
    let parent = parent_of(target);
    match fs::metadata(&parent) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(ExportError::ParentIsFile {
            path: target.to_path_buf(),
            file: parent,
        }),
        Err(_) => {
            // Say which ancestor is in the way: a file somewhere up, or a missing directory.
            let file = parent
                .ancestors()
                .find(|a| fs::metadata(a).is_ok_and(|m| !m.is_dir()));
            match file {
                Some(f) => Err(ExportError::ParentIsFile {
                    path: target.to_path_buf(),
                    file: f.to_path_buf(),
                }),
                None => Err(ExportError::ParentMissing {
                    path: target.to_path_buf(),
                    parent,
                }),
            }
        }
    }
}

fn parent_of(target: &Path) -> PathBuf {
    match target.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// A path beside `target` named `.NAME.{tag}PID`.
fn beside(target: &Path, tag: &str) -> PathBuf {
    let name = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "export".into());
    parent_of(target).join(format!(".{name}.{tag}{}", std::process::id()))
}

/// A temporary file or directory beside the target, removed on drop unless committed.
struct Staging {
    tmp: PathBuf,
    target: PathBuf,
    dir: bool,
    committed: bool,
}

impl Staging {
    /// Checks the target ([`check_target`]) and creates the temporary (which is where
    /// an unwritable directory shows).
    fn new(target: &Path, force: bool, dir: bool) -> Result<Staging, ExportError> {
        check_target(target, force, dir)?;
        let tmp = beside(target, "tmp");
        // A temporary of an earlier export of this process that failed to clean up.
        let _ = fs::remove_dir_all(&tmp);
        let _ = fs::remove_file(&tmp);
        let made = if dir {
            fs::create_dir(&tmp)
        } else {
            File::create(&tmp).map(drop)
        };
        made.map_err(|cause| ExportError::NotWritable {
            path: target.to_path_buf(),
            parent: parent_of(target),
            cause,
        })?;
        Ok(Staging {
            tmp,
            target: target.to_path_buf(),
            dir,
            committed: false,
        })
    }

    /// Moves the temporary into place (the old target, with `force`, aside first and
    /// removed after), syncing the parent directory so the rename survives a crash.
    fn commit(mut self) -> Result<(), ExportError> {
        let err = |path: &Path| {
            let path = path.to_path_buf();
            move |cause| ExportError::Write { path, cause }
        };
        if self.dir {
            sync_dir(&self.tmp).map_err(err(&self.tmp))?;
        }
        let old = beside(&self.target, "old");
        let had_old = fs::symlink_metadata(&self.target).is_ok();
        if had_old {
            fs::rename(&self.target, &old).map_err(err(&self.target))?;
        }
        if let Err(cause) = fs::rename(&self.tmp, &self.target) {
            if had_old {
                // Put the old one back: the export failed, the target stays as it was.
                let _ = fs::rename(&old, &self.target);
            }
            return Err(ExportError::Write {
                path: self.target.clone(),
                cause,
            });
        }
        self.committed = true;
        if had_old {
            let removed = if self.dir {
                fs::remove_dir_all(&old)
            } else {
                fs::remove_file(&old)
            };
            removed.map_err(err(&old))?;
        }
        // Not every platform can open a directory to sync it; the rename has happened.
        let _ = sync_dir(&parent_of(&self.target));
        Ok(())
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if !self.committed {
            let _ = if self.dir {
                fs::remove_dir_all(&self.tmp)
            } else {
                fs::remove_file(&self.tmp)
            };
        }
    }
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Writes `bytes` to `path` (a new file inside a staging directory) and syncs it.
fn write_synced(path: &Path, bytes: &[u8]) -> Result<u64, ExportError> {
    use std::io::Write;
    let run = || -> std::io::Result<()> {
        let mut f = File::create(path)?;
        f.write_all(bytes)?;
        f.sync_all()
    };
    run().map_err(|cause| ExportError::Write {
        path: path.to_path_buf(),
        cause,
    })?;
    Ok(bytes.len() as u64)
}

/// The token ids a model's files name: beginning, end (several for some models) and
/// padding.
#[derive(Debug, Clone, Default, PartialEq)]
struct TokenIds {
    bos: Option<u32>,
    eos: Vec<u32>,
    pad: Option<u32>,
}

/// The token ids of `source`: from its GGUF keys, or its `config.json` and
/// `generation_config.json` (the latter first, as transformers reads them).
fn token_ids(source: &Source) -> Result<TokenIds, ExportError> {
    let mut ids = TokenIds {
        bos: None,
        eos: source.info.eos.clone(),
        pad: source.info.pad,
    };
    match source.format {
        Format::Gguf => {
            let file = crate::gguf::GgufFile::open(&source.path).map_err(ModelError::File)?;
            ids.bos = file
                .get("tokenizer.ggml.bos_token_id")
                .and_then(|v| v.as_u64())
                .and_then(|v| u32::try_from(v).ok());
        }
        Format::HfDir => {
            for name in ["generation_config.json", "config.json"] {
                let path = source.path.join(name);
                let Ok(text) = fs::read_to_string(&path) else {
                    continue;
                };
                let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| {
                    ModelError::Hf(crate::hf::HfError::Json {
                        path: path.clone(),
                        what: "config.json",
                        cause: e,
                    })
                })?;
                if let Some(b) = v
                    .get("bos_token_id")
                    .and_then(|b| b.as_u64())
                    .and_then(|b| u32::try_from(b).ok())
                {
                    ids.bos = Some(b);
                    break;
                }
            }
        }
    }
    Ok(ids)
}

/// The human form of a byte count (`98.4 MB`).
pub fn human_bytes(n: u64) -> String {
    let units = ["B", "kB", "MB", "GB", "TB"];
    let mut x = n as f64;
    let mut u = 0;
    while x >= 1000.0 && u + 1 < units.len() {
        x /= 1000.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{x:.1} {}", units[u])
    }
}
