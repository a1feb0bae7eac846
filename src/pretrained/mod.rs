//! A pretrained model's files, whatever their format: a Hugging Face directory
//! (`config.json`, safetensors, `tokenizer.json`, `tokenizer_config.json`) or one GGUF file
//! (settings, tensors, tokenizer and chat template in one).
//!
//! Everything downstream — loss problems, decoding, `check`, the tasks' text codecs —
//! reads a model through this module: [`read_info`] for its settings, [`check_weights`]
//! and [`load_params`] for its tensors, [`tokenizer`] and [`chat_template`] for its text.
//! The family (Qwen2, LLaMA, …) is decided in one place, [`crate::family`].

use std::io::Read;
use std::path::{Path, PathBuf};

use shardes_hlo::params::{ParamError, ParamTree};
use shardes_hlo::problems::qwen2::Qwen2Config;
use thiserror::Error;

use crate::gguf::GgufError;
use crate::hf::HfError;
use crate::tasks::chat::ChatTemplate;
use crate::tasks::TaskError;
use crate::tokenizer::{Tokenizer, TokenizerError};

mod gguf;

/// Errors reading a pretrained model; each names the file and what to do.
#[derive(Debug, Error)]
pub enum ModelError {
    /// A Hugging Face directory's files.
    #[error(transparent)]
    Hf(#[from] HfError),
    /// A GGUF file's container.
    #[error(transparent)]
    File(GgufError),
    /// A GGUF file whose keys or tensors do not make a model shardes reads.
    #[error("{}: {message}; {fix}", path.display())]
    Gguf {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
        /// What to do.
        fix: String,
    },
    /// The path is neither a directory nor a GGUF file.
    #[error(
        "{} is neither a Hugging Face model directory nor a GGUF file; give a directory with \
         config.json and model.safetensors, a .gguf file, or a model name (`shardes models` \
         lists them)",
        path.display()
    )]
    NotAModel {
        /// The path.
        path: PathBuf,
    },
    /// The tokenizer could not be built.
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    /// The chat template could not be read.
    #[error(transparent)]
    Chat(#[from] TaskError),
    /// Assembling the tree failed.
    #[error(transparent)]
    Param(#[from] ParamError),
}

/// How a model's files are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// A Hugging Face directory.
    HfDir,
    /// One GGUF file.
    Gguf,
}

/// The format of the model at `path`: a directory is a Hugging Face one; a file is GGUF
/// when it starts with the GGUF magic.
pub fn format_of(path: &Path) -> Result<Format, ModelError> {
    if path.is_dir() {
        return Ok(Format::HfDir);
    }
    let mut magic = [0u8; 4];
    let is_gguf = std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok()
        && &magic == b"GGUF";
    if is_gguf {
        return Ok(Format::Gguf);
    }
    if path.extension().is_some_and(|e| e == "gguf") && path.is_file() {
        // Let the reader say what is wrong with it.
        return Ok(Format::Gguf);
    }
    Err(ModelError::NotAModel {
        path: path.to_path_buf(),
    })
}

/// What a model's files say about it, besides its weights.
#[derive(Debug, Clone, PartialEq)]
pub struct Info {
    /// The decoder's settings.
    pub config: Qwen2Config,
    /// The family's name ([`crate::family::Family::name`]).
    pub family: &'static str,
    /// The longest sequence the model was trained for, where the files say.
    pub max_positions: Option<usize>,
    /// The ids that end a generation (empty: none does).
    pub eos: Vec<u32>,
    /// The id written after a sequence ended, where the files name one.
    pub pad: Option<u32>,
}

/// The settings of the model at `path` (no weights read).
pub fn read_info(path: &Path) -> Result<Info, ModelError> {
    match format_of(path)? {
        Format::HfDir => {
            let hf = crate::hf::read_hf_config(path)?;
            let ids = crate::hf::read_generation_ids(path)?;
            Ok(Info {
                config: hf.config,
                family: hf.family,
                max_positions: hf.max_position_embeddings,
                eos: ids.eos,
                pad: ids.pad,
            })
        }
        Format::Gguf => gguf::read_info(&gguf::open(path)?),
    }
}

/// Checks the weights of the model at `path` against `config` from their headers alone
/// (names, shapes, dtypes, the layer count).
pub fn check_weights(path: &Path, config: &Qwen2Config) -> Result<(), ModelError> {
    match format_of(path)? {
        Format::HfDir => Ok(crate::hf::check_checkpoint(path, config)?),
        Format::Gguf => gguf::check_tensors(&gguf::open(path)?, config),
    }
}

/// The f32 parameters of `config` from the model at `path` (leaf paths are Hugging Face
/// tensor names); a non-finite value is refused, naming its tensor.
pub fn load_params(path: &Path, config: &Qwen2Config) -> Result<ParamTree, ModelError> {
    match format_of(path)? {
        Format::HfDir => Ok(crate::hf::load_params(path, config)?),
        Format::Gguf => {
            let file = gguf::open(path)?;
            let family = gguf::family_of(&file)?;
            gguf::load_params(&file, family, config)
        }
    }
}

/// The settings and parameters of the model at `path`.
pub fn load(path: &Path) -> Result<(Info, ParamTree), ModelError> {
    let info = read_info(path)?;
    let params = load_params(path, &info.config)?;
    Ok((info, params))
}

/// The model's own tokenizer: a directory's `tokenizer.json` (`None` when it has none),
/// a GGUF file's from its metadata.
pub fn tokenizer(path: &Path) -> Result<Option<Tokenizer>, ModelError> {
    match format_of(path)? {
        Format::HfDir => {
            let file = path.join("tokenizer.json");
            if file.is_file() {
                Ok(Some(Tokenizer::from_file(file)?))
            } else {
                Ok(None)
            }
        }
        Format::Gguf => Ok(Some(Tokenizer::from_gguf(path)?)),
    }
}

/// Whether the model at `path` ships a chat template.
pub fn has_chat_template(path: &Path) -> bool {
    match format_of(path) {
        Ok(Format::HfDir) => {
            path.join("tokenizer_config.json").is_file()
                || path.join("chat_template.jinja").is_file()
        }
        Ok(Format::Gguf) => crate::gguf::GgufFile::open(path)
            .map(|f| f.get("tokenizer.chat_template").is_some())
            .unwrap_or(false),
        Err(_) => false,
    }
}

/// The model's chat template: a directory's `tokenizer_config.json` (or
/// `chat_template.jinja`), a GGUF file's `tokenizer.chat_template`.
pub fn chat_template(path: &Path) -> Result<ChatTemplate, ModelError> {
    match format_of(path)? {
        Format::HfDir => Ok(ChatTemplate::from_checkpoint(path)?),
        Format::Gguf => {
            let file = gguf::open(path)?;
            let vocab = crate::gguf_tokenizer::GgufVocab::from_gguf(&file).map_err(|e| {
                ModelError::Gguf {
                    path: path.to_path_buf(),
                    message: e.to_string(),
                    fix: "the file's tokenizer metadata is damaged; use another copy".into(),
                }
            })?;
            crate::gguf_tokenizer::chat_template(&vocab)
                .map_err(|e| ModelError::Gguf {
                    path: path.to_path_buf(),
                    message: e.to_string(),
                    fix: "the file's chat template does not parse; use another copy".into(),
                })?
                .ok_or_else(|| ModelError::Gguf {
                    path: path.to_path_buf(),
                    message: "has no tokenizer.chat_template".into(),
                    fix: "use an Instruct model's file, or set task.chat = false".into(),
                })
        }
    }
}
