//! Loading Hugging Face decoder checkpoints (the families of [`crate::family`]): `config.json` plus one `model.safetensors` or
//! several shards listed in `model.safetensors.index.json`.
//!
//! The files are memory-mapped and each tensor is converted straight from the mapping into
//! its f32 leaf (bf16, f16 and f32 are accepted), so the host holds one copy of the model
//! (the f32 master) plus whatever pages the OS keeps cached. Tensor names are the leaf
//! paths of [`Qwen2Config::param_shapes`]. Extra tensors in the files are ignored, except
//! decoder layers beyond `num_hidden_layers` (a config that does not match its weights),
//! and a tensor holding NaN or infinity is refused.
//!
//! [`check_checkpoint`] makes every check that needs only the safetensors headers (names,
//! shapes, dtypes, the layer count) without reading a tensor's values, for programs built
//! from shapes alone.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::path::{Path, PathBuf};

use half::{bf16, f16};
use memmap2::Mmap;
use safetensors::tensor::{Dtype, SafeTensors, TensorView};
use serde::Deserialize;
use shardes_hlo::params::{Array, ParamError, ParamTree};
use shardes_hlo::problems::qwen2::Qwen2Config;
use shardes_hlo::problems::ProblemError;
use thiserror::Error;

use crate::io::describe_safetensors_error;

/// Errors loading a checkpoint; each names the file or tensor and what to do.
// The causes are part of each message rather than chained sources, so a report that
// prints the chain does not repeat them.
#[derive(Debug, Error)]
pub enum HfError {
    /// A file could not be opened or mapped.
    #[error("cannot read {}: {cause}; check that the checkpoint directory is complete", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        cause: std::io::Error,
    },
    /// `config.json` or the index is not the JSON we expect.
    #[error("{} is not a valid {what}: {cause}", path.display())]
    Json {
        /// The file.
        path: PathBuf,
        /// `config.json` or `safetensors index`.
        what: &'static str,
        /// The parser's error.
        cause: serde_json::Error,
    },
    /// The config describes another architecture.
    #[error(
        "{} has model_type `{got}`, a family shardes does not read; it reads {}",
        path.display(),
        crate::family::known_model_types()
    )]
    ModelType {
        /// The config file.
        path: PathBuf,
        /// The model type found.
        got: String,
    },
    /// The config's sizes or settings are invalid.
    #[error("{}: {error}", path.display())]
    Config {
        /// The config file.
        path: PathBuf,
        /// What is wrong, naming the field.
        error: ProblemError,
    },
    /// Neither `model.safetensors` nor an index exists.
    #[error(
        "{} has neither model.safetensors nor model.safetensors.index.json; point \
         `checkpoint` at a Hugging Face model directory",
        dir.display()
    )]
    NoWeights {
        /// The checkpoint directory.
        dir: PathBuf,
    },
    /// The index names a shard outside the checkpoint directory.
    #[error(
        "{} lists the shard \"{file}\", which is not a file name in the checkpoint \
         directory; shards are plain file names next to the index",
        index.display()
    )]
    BadShard {
        /// The index file.
        index: PathBuf,
        /// The shard name it lists.
        file: String,
    },
    /// A shard is not valid safetensors.
    #[error("{} is not a valid safetensors file: {message}; the checkpoint is damaged or incomplete (download it again)", path.display())]
    Format {
        /// The shard.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },
    /// A tensor the model needs is in no file.
    #[error(
        "tensor `{name}` is missing from the checkpoint (searched {searched}); the \
         checkpoint does not match config.json (check tie_word_embeddings and \
         num_hidden_layers)"
    )]
    MissingTensor {
        /// The tensor name.
        name: String,
        /// The files searched.
        searched: String,
    },
    /// `config.json` and the weights disagree on the number of decoder layers.
    #[error(
        "config.json has num_hidden_layers = {config_layers} but the checkpoint holds \
         {checkpoint_layers} layers ({detail}); set num_hidden_layers to {checkpoint_layers} \
         or use the config.json that came with the weights"
    )]
    LayerCount {
        /// The config's layer count.
        config_layers: usize,
        /// Layers found in the weights (the highest layer index + 1).
        checkpoint_layers: usize,
        /// The tensors that do not fit, named.
        detail: String,
    },
    /// A tensor has a different shape than the config implies.
    #[error(
        "tensor `{name}` has shape {got:?} but config.json implies {expected:?}; the \
         weights and config.json come from different models"
    )]
    ShapeMismatch {
        /// The tensor name.
        name: String,
        /// The shape from the config.
        expected: Vec<usize>,
        /// The shape in the file.
        got: Vec<usize>,
    },
    /// A tensor is stored in a dtype we do not convert.
    #[error(
        "tensor `{name}` is stored as {dtype}; only BF16, F16 and F32 load into the f32 \
         master (dequantize the checkpoint first)"
    )]
    UnsupportedDtype {
        /// The tensor name.
        name: String,
        /// The dtype in the file.
        dtype: String,
    },
    /// A tensor holds NaN or infinity, which would make every fitness NaN.
    #[error(
        "tensor `{name}` in {} holds {count} non-finite value(s) (the first, {first}, at \
         element {index}); the checkpoint is corrupt or was saved from a diverged run, use \
         another one",
        path.display()
    )]
    NonFinite {
        /// The tensor name.
        name: String,
        /// The file holding it.
        path: PathBuf,
        /// How many of its values are NaN or infinite.
        count: usize,
        /// The first such value's flat index.
        index: usize,
        /// The first such value (`NaN`, `inf`, `-inf`).
        first: f32,
    },
    /// `config.json` asks for a feature the forward does not implement.
    #[error(
        "{}: `{field}` = {value} is not supported (shardes implements decoders with SiLU, \
         full attention and default, linear or llama3 rotary embeddings); use a checkpoint \
         without it",
        path.display()
    )]
    Unsupported {
        /// The `config.json` path.
        path: PathBuf,
        /// The field.
        field: String,
        /// Its value.
        value: String,
    },
    /// Assembling the tree failed.
    #[error(transparent)]
    Param(#[from] ParamError),
}

/// The `config.json` fields that are sizes (whole numbers).
const SIZE_FIELDS: [&str; 7] = [
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "max_position_embeddings",
];

#[derive(Deserialize)]
struct RawConfig {
    model_type: Option<String>,
    vocab_size: usize,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    max_position_embeddings: Option<usize>,
    rope_theta: Option<f64>,
    /// transformers ≥ 5 writes the rotary settings here instead of `rope_theta`.
    rope_parameters: Option<RopeParameters>,
    rms_norm_eps: Option<f64>,
    tie_word_embeddings: Option<bool>,
    hidden_act: Option<String>,
}

#[derive(Deserialize)]
struct RopeParameters {
    rope_theta: Option<f64>,
}

/// A `config.json` as read: the model's hyperparameters plus the fields that bound its
/// inputs.
#[derive(Debug, Clone, PartialEq)]
pub struct HfConfig {
    /// What the forward needs.
    pub config: Qwen2Config,
    /// The family `model_type` names ([`crate::family::Family::name`]).
    pub family: &'static str,
    /// The longest sequence the model was trained for, when the file says.
    pub max_position_embeddings: Option<usize>,
}

/// Parses a Hugging Face `config.json` text of a family [`crate::family`] reads. Missing optional fields take the
/// `transformers` defaults (`num_key_value_heads = num_attention_heads`,
/// `rope_theta = 10000`, `rms_norm_eps = 1e-6`, `tie_word_embeddings = false`).
pub fn parse_config(text: &str, path: &Path) -> Result<Qwen2Config, HfError> {
    Ok(parse_hf_config(text, path)?.config)
}

/// [`parse_config`] with the input bounds (`max_position_embeddings`); the values are
/// validated ([`Qwen2Config::validate`]: sizes, head divisibility, a positive finite
/// `rms_norm_eps` and `rope_theta`).
pub fn parse_hf_config(text: &str, path: &Path) -> Result<HfConfig, HfError> {
    let json_error = |cause| HfError::Json {
        path: path.to_path_buf(),
        what: "config.json",
        cause,
    };
    let value: serde_json::Value = serde_json::from_str(text).map_err(json_error)?;
    // serde's own error for a negative or fractional size names the column, not the key.
    for field in SIZE_FIELDS {
        match value.get(field) {
            Some(v) if !v.is_null() && v.as_u64().is_none() => {
                return Err(HfError::Config {
                    path: path.to_path_buf(),
                    error: ProblemError::BadSetting {
                        what: field,
                        value: shardes_hlo::es::spec::excerpt(&v.to_string()),
                        fix: "a size is a whole number of at least 1",
                    },
                });
            }
            _ => {}
        }
    }
    // From the text again, not the value: a key given twice stays an error.
    let raw: RawConfig = serde_json::from_str(text).map_err(json_error)?;
    // A config without `model_type` is read as Qwen2, as shardes always did.
    let model_type = raw.model_type.as_deref().unwrap_or("qwen2");
    let family = crate::family::by_model_type(model_type).ok_or_else(|| HfError::ModelType {
        path: path.to_path_buf(),
        got: shardes_hlo::es::spec::excerpt(model_type),
    })?;
    let unsupported = |field: &str, value: String| HfError::Unsupported {
        path: path.to_path_buf(),
        field: field.to_string(),
        value: shardes_hlo::es::spec::excerpt(&value),
    };
    if let Some(act) = raw.hidden_act.as_deref() {
        if act != "silu" {
            return Err(unsupported("hidden_act", act.to_string()));
        }
    }
    let rope_theta = raw
        .rope_theta
        .or_else(|| raw.rope_parameters.as_ref().and_then(|r| r.rope_theta));
    let mut c = Qwen2Config {
        vocab_size: raw.vocab_size,
        hidden_size: raw.hidden_size,
        intermediate_size: raw.intermediate_size,
        num_hidden_layers: raw.num_hidden_layers,
        num_attention_heads: raw.num_attention_heads,
        num_key_value_heads: raw.num_key_value_heads.unwrap_or(raw.num_attention_heads),
        rope_theta: rope_theta.unwrap_or(10_000.0),
        rms_norm_eps: raw.rms_norm_eps.unwrap_or(1e-6),
        tie_word_embeddings: raw.tie_word_embeddings.unwrap_or(false),
        ..Qwen2Config::tiny()
    };
    (family.hf_settings)(&value, &mut c).map_err(|u| unsupported(&u.field, u.value))?;
    let config_error = |error| HfError::Config {
        path: path.to_path_buf(),
        error,
    };
    c.validate().map_err(config_error)?;
    if raw.max_position_embeddings == Some(0) {
        return Err(config_error(ProblemError::BadDimension {
            what: "max_position_embeddings",
            value: 0,
            fix: "use the positive length the model was trained for, or remove the field",
        }));
    }
    Ok(HfConfig {
        config: c,
        family: family.name,
        max_position_embeddings: raw.max_position_embeddings,
    })
}

/// Reads `dir/config.json`.
pub fn read_config(dir: impl AsRef<Path>) -> Result<Qwen2Config, HfError> {
    Ok(read_hf_config(dir)?.config)
}

/// Reads `dir/config.json` with its input bounds ([`parse_hf_config`]).
pub fn read_hf_config(dir: impl AsRef<Path>) -> Result<HfConfig, HfError> {
    let path = dir.as_ref().join("config.json");
    let text = std::fs::read_to_string(&path).map_err(|cause| HfError::Read {
        path: path.clone(),
        cause,
    })?;
    parse_hf_config(&text, &path)
}

#[derive(Deserialize)]
struct Index {
    weight_map: BTreeMap<String, String>,
}

fn map_file(path: &Path) -> Result<Mmap, HfError> {
    let file = File::open(path).map_err(|cause| HfError::Read {
        path: path.to_path_buf(),
        cause,
    })?;
    // SAFETY: the mapping is read-only; a checkpoint modified while it is being loaded
    // could change the bytes we read, which safetensors' bounds checks keep memory-safe
    // for the header and which only affects values for the data.
    unsafe { Mmap::map(&file) }.map_err(|cause| HfError::Read {
        path: path.to_path_buf(),
        cause,
    })
}

/// Which weight file (an index into the file list) holds each tensor; `None` for a single
/// unindexed file, which holds everything.
type TensorIndex = Option<BTreeMap<String, usize>>;

/// The weight files of a checkpoint directory and where each tensor lives.
fn weight_files(dir: &Path) -> Result<(Vec<PathBuf>, TensorIndex), HfError> {
    let index_path = dir.join("model.safetensors.index.json");
    if index_path.exists() {
        let text = std::fs::read_to_string(&index_path).map_err(|cause| HfError::Read {
            path: index_path.clone(),
            cause,
        })?;
        let index: Index = serde_json::from_str(&text).map_err(|cause| HfError::Json {
            path: index_path.clone(),
            what: "safetensors index",
            cause,
        })?;
        let mut files: Vec<String> = index.weight_map.values().cloned().collect();
        files.sort();
        files.dedup();
        // A shard is a file next to the index: a path would read outside the checkpoint.
        if let Some(bad) = files.iter().find(|f| {
            let p = Path::new(f.as_str());
            p.file_name().map(|n| n.to_string_lossy()) != Some(f.as_str().into())
        }) {
            return Err(HfError::BadShard {
                index: index_path.clone(),
                file: shardes_hlo::es::spec::excerpt(bad),
            });
        }
        let pos: BTreeMap<&str, usize> = files
            .iter()
            .enumerate()
            .map(|(i, f)| (f.as_str(), i))
            .collect();
        let map = index
            .weight_map
            .iter()
            .filter_map(|(name, f)| pos.get(f.as_str()).map(|&i| (name.clone(), i)))
            .collect();
        return Ok((files.iter().map(|f| dir.join(f)).collect(), Some(map)));
    }
    let single = dir.join("model.safetensors");
    if single.exists() {
        return Ok((vec![single], None));
    }
    Err(HfError::NoWeights {
        dir: dir.to_path_buf(),
    })
}

fn to_f32(name: &str, dtype: Dtype, bytes: &[u8]) -> Result<Vec<f32>, HfError> {
    Ok(match dtype {
        Dtype::F32 => bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        Dtype::BF16 => bytes
            .chunks_exact(2)
            .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        Dtype::F16 => bytes
            .chunks_exact(2)
            .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        other => return Err(unsupported_dtype(name, other)),
    })
}

fn unsupported_dtype(name: &str, dtype: Dtype) -> HfError {
    HfError::UnsupportedDtype {
        name: name.to_string(),
        dtype: format!("{dtype:?}"),
    }
}

/// The mapped weight files of a checkpoint directory.
struct Weights {
    files: Vec<PathBuf>,
    maps: Vec<Mmap>,
    index: TensorIndex,
}

/// One tensor the model needs, found in the headers: its name, shape, and file.
struct Found<'a> {
    name: String,
    shape: Vec<usize>,
    file: usize,
    view: TensorView<'a>,
}

impl Weights {
    fn open(dir: &Path) -> Result<Weights, HfError> {
        let (files, index) = weight_files(dir)?;
        let maps = files
            .iter()
            .map(|p| map_file(p))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Weights { files, maps, index })
    }

    /// Parses every header (no tensor values are read).
    fn parsed(&self) -> Result<Vec<SafeTensors<'_>>, HfError> {
        self.maps
            .iter()
            .zip(&self.files)
            .map(|(m, p)| {
                SafeTensors::deserialize(m).map_err(|e| HfError::Format {
                    path: p.clone(),
                    message: describe_safetensors_error(&e),
                })
            })
            .collect()
    }

    /// Every tensor name the checkpoint lists (the index's, or the files').
    fn names(&self, parsed: &[SafeTensors<'_>]) -> BTreeSet<String> {
        match &self.index {
            Some(map) => map.keys().cloned().collect(),
            None => parsed
                .iter()
                .flat_map(|st| st.names().into_iter().cloned())
                .collect(),
        }
    }

    /// Finds every tensor of `config` in the headers and checks its shape and dtype, and
    /// that the checkpoint has no more and no fewer decoder layers than the config.
    fn find<'a>(
        &self,
        parsed: &'a [SafeTensors<'a>],
        config: &Qwen2Config,
    ) -> Result<Vec<Found<'a>>, HfError> {
        check_layer_count(&self.names(parsed), config)?;
        let searched = if self.files.is_empty() {
            "no files: the index lists none".to_string()
        } else {
            self.files
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        };
        let mut found = Vec::new();
        for (name, expected) in config.param_shapes() {
            let candidates: Vec<usize> = match &self.index {
                Some(map) => map.get(&name).copied().into_iter().collect(),
                None => (0..parsed.len()).collect(),
            };
            let (file, view) = candidates
                .into_iter()
                .find_map(|i| parsed[i].tensor(&name).ok().map(|v| (i, v)))
                .ok_or_else(|| HfError::MissingTensor {
                    name: name.clone(),
                    searched: searched.clone(),
                })?;
            if view.shape() != expected.as_slice() {
                return Err(HfError::ShapeMismatch {
                    name,
                    expected,
                    got: view.shape().to_vec(),
                });
            }
            if !matches!(view.dtype(), Dtype::F32 | Dtype::BF16 | Dtype::F16) {
                return Err(unsupported_dtype(&name, view.dtype()));
            }
            found.push(Found {
                name,
                shape: expected,
                file,
                view,
            });
        }
        Ok(found)
    }
}

/// The layer index of a `model.layers.{i}.…` tensor name.
fn layer_of(name: &str) -> Option<usize> {
    name.strip_prefix("model.layers.")?
        .split('.')
        .next()?
        .parse()
        .ok()
}

/// Refuses a checkpoint whose decoder layers are not exactly `0..num_hidden_layers`,
/// naming the tensors that do not fit (a config with fewer layers would otherwise drop the
/// rest without a word).
fn check_layer_count(names: &BTreeSet<String>, config: &Qwen2Config) -> Result<(), HfError> {
    let want = config.num_hidden_layers;
    let Some(have) = names
        .iter()
        .filter_map(|n| layer_of(n))
        .max()
        .map(|l| l + 1)
    else {
        // No layer tensors at all: the missing-tensor check names the first one.
        return Ok(());
    };
    const SHOWN: usize = 3;
    let listed = |items: Vec<String>| -> String {
        let more = items.len().saturating_sub(SHOWN);
        let mut s = items
            .into_iter()
            .take(SHOWN)
            .map(|n| format!("`{n}`"))
            .collect::<Vec<_>>()
            .join(", ");
        if more > 0 {
            s.push_str(&format!(" and {more} more"));
        }
        s
    };
    if have > want {
        let extra: Vec<String> = names
            .iter()
            .filter(|n| layer_of(n).is_some_and(|l| l >= want))
            .cloned()
            .collect();
        return Err(HfError::LayerCount {
            config_layers: want,
            checkpoint_layers: have,
            detail: format!(
                "tensors of layers {want}..{have} would be ignored: {}",
                listed(extra)
            ),
        });
    }
    if have < want {
        let missing: Vec<String> = (have..want)
            .map(|l| format!("model.layers.{l}.input_layernorm.weight"))
            .collect();
        return Err(HfError::LayerCount {
            config_layers: want,
            checkpoint_layers: have,
            detail: format!("layers {have}..{want} are missing: {}", listed(missing)),
        });
    }
    Ok(())
}

/// Checks the weight files in `dir` against `config` from their headers alone: every
/// tensor present with its shape and a convertible dtype, and exactly `num_hidden_layers`
/// decoder layers. No tensor's values are read (see [`load_params`] for the finiteness
/// check).
pub fn check_checkpoint(dir: impl AsRef<Path>, config: &Qwen2Config) -> Result<(), HfError> {
    let weights = Weights::open(dir.as_ref())?;
    let parsed = weights.parsed()?;
    weights.find(&parsed, config)?;
    Ok(())
}

/// Loads the parameters of `config` from the weight files in `dir` into an f32
/// [`ParamTree`] (leaf paths = tensor names), after the checks of [`check_checkpoint`];
/// a tensor holding NaN or infinity is refused, naming it.
pub fn load_params(dir: impl AsRef<Path>, config: &Qwen2Config) -> Result<ParamTree, HfError> {
    let weights = Weights::open(dir.as_ref())?;
    let parsed = weights.parsed()?;
    let found = weights.find(&parsed, config)?;
    let mut named = Vec::with_capacity(found.len());
    for f in found {
        let data = to_f32(&f.name, f.view.dtype(), f.view.data())?;
        let mut bad = data.iter().enumerate().filter(|(_, x)| !x.is_finite());
        if let Some((index, &first)) = bad.next() {
            return Err(HfError::NonFinite {
                count: 1 + bad.count(),
                name: f.name,
                path: weights.files[f.file].clone(),
                index,
                first,
            });
        }
        named.push((f.name, Array::new(f.shape, data)?));
    }
    Ok(ParamTree::from_paths(named)?)
}

/// Loads `config.json` and the weights of a checkpoint directory.
pub fn load_checkpoint(dir: impl AsRef<Path>) -> Result<(Qwen2Config, ParamTree), HfError> {
    let dir = dir.as_ref();
    let config = read_config(dir)?;
    let params = load_params(dir, &config)?;
    Ok((config, params))
}

/// The token ids that end and pad a generation, as Hugging Face `generate` reads them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GenerationIds {
    /// `eos_token_id`: any of these ends a sequence (empty: none does).
    pub eos: Vec<u32>,
    /// `pad_token_id`, written after a sequence ended.
    pub pad: Option<u32>,
}

/// The `eos_token_id` (one id or a list) and `pad_token_id` of one JSON file's text;
/// absent or null fields are `None`.
fn generation_fields(text: &str, path: &Path) -> Result<(Option<Vec<u32>>, Option<u32>), HfError> {
    let value: serde_json::Value = serde_json::from_str(text).map_err(|cause| HfError::Json {
        path: path.to_path_buf(),
        what: "generation config",
        cause,
    })?;
    let bad = |what: &'static str, v: &serde_json::Value| HfError::Config {
        path: path.to_path_buf(),
        error: ProblemError::BadSetting {
            what,
            value: shardes_hlo::es::spec::excerpt(&v.to_string()),
            fix: "a token id is a whole number from 0 to 2^32 - 1 (a list for several EOS ids)",
        },
    };
    let id = |what: &'static str, v: &serde_json::Value| -> Result<u32, HfError> {
        v.as_u64()
            .and_then(|x| u32::try_from(x).ok())
            .ok_or_else(|| bad(what, v))
    };
    let eos = match value.get("eos_token_id") {
        None | Some(serde_json::Value::Null) => None,
        Some(serde_json::Value::Array(items)) => Some(
            items
                .iter()
                .map(|v| id("eos_token_id", v))
                .collect::<Result<Vec<_>, _>>()?,
        ),
        Some(v) => Some(vec![id("eos_token_id", v)?]),
    };
    let pad = match value.get("pad_token_id") {
        None | Some(serde_json::Value::Null) => None,
        Some(v) => Some(id("pad_token_id", v)?),
    };
    Ok((eos, pad))
}

/// The EOS and pad ids of a checkpoint directory: `generation_config.json`'s (what
/// `generate` uses) where it has them, else `config.json`'s; a missing file counts as
/// empty.
pub fn read_generation_ids(dir: impl AsRef<Path>) -> Result<GenerationIds, HfError> {
    let dir = dir.as_ref();
    let mut fields = Vec::new();
    for name in ["generation_config.json", "config.json"] {
        let path = dir.join(name);
        if !path.is_file() {
            continue;
        }
        let text = std::fs::read_to_string(&path).map_err(|cause| HfError::Read {
            path: path.clone(),
            cause,
        })?;
        fields.push(generation_fields(&text, &path)?);
    }
    let eos = fields
        .iter()
        .find_map(|(e, _)| e.clone())
        .unwrap_or_default();
    let pad = fields.iter().find_map(|(_, p)| *p);
    Ok(GenerationIds { eos, pad })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_defaults_and_model_type() {
        let p = Path::new("config.json");
        let c = parse_config(
            r#"{"model_type":"qwen2","vocab_size":64,"hidden_size":16,
                "intermediate_size":32,"num_hidden_layers":1,"num_attention_heads":2}"#,
            p,
        )
        .expect("minimal config");
        assert_eq!(c.num_key_value_heads, 2);
        assert!(!c.tie_word_embeddings);
        assert_eq!(c.rope_theta, 10_000.0);
        let l = parse_config(
            r#"{"model_type":"llama","vocab_size":64,"hidden_size":16,
                "intermediate_size":32,"num_hidden_layers":1,"num_attention_heads":2}"#,
            p,
        )
        .expect("llama is a family shardes reads");
        assert!(!l.attention_bias && !l.tie_word_embeddings);
        let e = parse_config(
            r#"{"model_type":"gpt2","vocab_size":64,"hidden_size":16,
                "intermediate_size":32,"num_hidden_layers":1,"num_attention_heads":2}"#,
            p,
        )
        .expect_err("gpt2 is refused");
        assert!(
            e.to_string().contains("gpt2") && e.to_string().contains("`llama`"),
            "{e}"
        );
        let e = parse_config(r#"{"vocab_size":64}"#, p).expect_err("incomplete");
        assert!(e.to_string().contains("hidden_size"), "{e}");
    }

    #[test]
    fn generation_ids_take_one_id_or_a_list_and_refuse_others() {
        let p = Path::new("generation_config.json");
        let f = |t: &str| generation_fields(t, p);
        assert_eq!(f(r#"{"eos_token_id": 2}"#).unwrap(), (Some(vec![2]), None));
        assert_eq!(
            f(r#"{"eos_token_id": [151645, 151643], "pad_token_id": 151643}"#).unwrap(),
            (Some(vec![151645, 151643]), Some(151643))
        );
        assert_eq!(f(r#"{"eos_token_id": null}"#).unwrap(), (None, None));
        let e = f(r#"{"eos_token_id": -1}"#).unwrap_err().to_string();
        assert!(
            e.contains("eos_token_id") && e.contains("whole number"),
            "{e}"
        );
        let e = f(r#"{"pad_token_id": "x"}"#).unwrap_err().to_string();
        assert!(e.contains("pad_token_id"), "{e}");
    }

    #[test]
    fn rope_settings_in_both_spellings_and_unsupported_features() {
        let p = Path::new("config.json");
        let base = r#""model_type":"qwen2","vocab_size":64,"hidden_size":16,
            "intermediate_size":32,"num_hidden_layers":1,"num_attention_heads":2"#;
        let parse = |extra: &str| parse_config(&format!("{{{base},{extra}}}"), p);
        // transformers 4 (published Qwen2.5 checkpoints) and transformers 5.
        let v4 = parse(r#""rope_theta":1000000.0,"rope_scaling":null,"hidden_act":"silu","use_sliding_window":false"#)
            .expect("v4 config");
        assert_eq!(v4.rope_theta, 1e6);
        let v5 = parse(r#""rope_parameters":{"rope_theta":500.0,"rope_type":"default"}"#)
            .expect("v5 config");
        assert_eq!(v5.rope_theta, 500.0);
        for (extra, field) in [
            (
                r#""rope_scaling":{"type":"yarn","factor":4.0}"#,
                "rope_scaling",
            ),
            (
                r#""rope_parameters":{"rope_theta":1.0,"rope_type":"linear"}"#,
                "rope_parameters",
            ),
            (r#""hidden_act":"gelu""#, "hidden_act"),
            (r#""use_sliding_window":true"#, "use_sliding_window"),
        ] {
            let e = parse(extra).expect_err(extra);
            assert!(
                matches!(&e, HfError::Unsupported { field: f, .. } if f == field),
                "{e}"
            );
            assert!(e.to_string().contains("not supported"), "{e}");
        }
    }
}
