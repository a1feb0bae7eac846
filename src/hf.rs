//! Loading Hugging Face Qwen2 checkpoints: `config.json` plus one `model.safetensors` or
//! several shards listed in `model.safetensors.index.json`.
//!
//! The files are memory-mapped and each tensor is converted straight from the mapping into
//! its f32 leaf (bf16, f16 and f32 are accepted), so the host holds one copy of the model
//! (the f32 master) plus whatever pages the OS keeps cached. Tensor names are the leaf
//! paths of [`Qwen2Config::param_shapes`]; extra tensors in the files are ignored.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use half::{bf16, f16};
use memmap2::Mmap;
use safetensors::tensor::{Dtype, SafeTensors};
use serde::Deserialize;
use shardes_hlo::params::{Array, ParamError, ParamTree};
use shardes_hlo::problems::qwen2::Qwen2Config;
use shardes_hlo::problems::ProblemError;
use thiserror::Error;

/// Errors loading a checkpoint; each names the file or tensor and what to do.
#[derive(Debug, Error)]
pub enum HfError {
    /// A file could not be opened or mapped.
    #[error("cannot read {}: {source}; check that the checkpoint directory is complete", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// `config.json` or the index is not the JSON we expect.
    #[error("{} is not a valid {what}: {source}", path.display())]
    Json {
        /// The file.
        path: PathBuf,
        /// `config.json` or `safetensors index`.
        what: &'static str,
        /// The parser's error.
        #[source]
        source: serde_json::Error,
    },
    /// The config describes another architecture.
    #[error("{} has model_type `{got}`; only `qwen2` checkpoints are supported", path.display())]
    ModelType {
        /// The config file.
        path: PathBuf,
        /// The model type found.
        got: String,
    },
    /// The config's sizes are inconsistent.
    #[error("config.json: {0}")]
    Config(#[from] ProblemError),
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
    /// A shard is not valid safetensors.
    #[error("{} is not a valid safetensors file: {message}", path.display())]
    Format {
        /// The shard.
        path: PathBuf,
        /// The parser's message.
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
    /// `config.json` asks for a feature the forward does not implement.
    #[error(
        "{}: `{field}` = {value} is not supported (shardes implements Qwen2 with SiLU, full \
         attention and default rotary embeddings); use a checkpoint without it",
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

#[derive(Deserialize)]
struct RawConfig {
    model_type: Option<String>,
    vocab_size: usize,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    rope_theta: Option<f64>,
    /// transformers ≥ 5 writes the rotary settings here instead of `rope_theta`.
    rope_parameters: Option<RopeParameters>,
    /// transformers 4 spelling of non-default rotary scaling.
    rope_scaling: Option<RopeParameters>,
    rms_norm_eps: Option<f64>,
    tie_word_embeddings: Option<bool>,
    hidden_act: Option<String>,
    use_sliding_window: Option<bool>,
}

#[derive(Deserialize)]
struct RopeParameters {
    rope_theta: Option<f64>,
    rope_type: Option<String>,
    #[serde(rename = "type")]
    kind: Option<String>,
}

/// Parses a Hugging Face Qwen2 `config.json` text. Missing optional fields take the
/// `transformers` defaults (`num_key_value_heads = num_attention_heads`,
/// `rope_theta = 10000`, `rms_norm_eps = 1e-6`, `tie_word_embeddings = false`).
pub fn parse_config(text: &str, path: &Path) -> Result<Qwen2Config, HfError> {
    let raw: RawConfig = serde_json::from_str(text).map_err(|source| HfError::Json {
        path: path.to_path_buf(),
        what: "config.json",
        source,
    })?;
    if let Some(t) = raw.model_type.as_deref() {
        if t != "qwen2" {
            return Err(HfError::ModelType {
                path: path.to_path_buf(),
                got: t.to_string(),
            });
        }
    }
    let unsupported = |field: &str, value: String| HfError::Unsupported {
        path: path.to_path_buf(),
        field: field.to_string(),
        value,
    };
    if let Some(act) = raw.hidden_act.as_deref() {
        if act != "silu" {
            return Err(unsupported("hidden_act", act.to_string()));
        }
    }
    if raw.use_sliding_window == Some(true) {
        return Err(unsupported("use_sliding_window", "true".into()));
    }
    for (field, rope) in [
        ("rope_parameters", &raw.rope_parameters),
        ("rope_scaling", &raw.rope_scaling),
    ] {
        if let Some(kind) = rope
            .as_ref()
            .and_then(|r| r.rope_type.as_deref().or(r.kind.as_deref()))
        {
            if kind != "default" {
                return Err(unsupported(field, format!("rope_type \"{kind}\"")));
            }
        }
    }
    let rope_theta = raw
        .rope_theta
        .or_else(|| raw.rope_parameters.as_ref().and_then(|r| r.rope_theta));
    let c = Qwen2Config {
        vocab_size: raw.vocab_size,
        hidden_size: raw.hidden_size,
        intermediate_size: raw.intermediate_size,
        num_hidden_layers: raw.num_hidden_layers,
        num_attention_heads: raw.num_attention_heads,
        num_key_value_heads: raw.num_key_value_heads.unwrap_or(raw.num_attention_heads),
        rope_theta: rope_theta.unwrap_or(10_000.0),
        rms_norm_eps: raw.rms_norm_eps.unwrap_or(1e-6),
        tie_word_embeddings: raw.tie_word_embeddings.unwrap_or(false),
    };
    c.validate()?;
    Ok(c)
}

/// Reads `dir/config.json`.
pub fn read_config(dir: impl AsRef<Path>) -> Result<Qwen2Config, HfError> {
    let path = dir.as_ref().join("config.json");
    let text = std::fs::read_to_string(&path).map_err(|source| HfError::Read {
        path: path.clone(),
        source,
    })?;
    parse_config(&text, &path)
}

#[derive(Deserialize)]
struct Index {
    weight_map: BTreeMap<String, String>,
}

fn map_file(path: &Path) -> Result<Mmap, HfError> {
    let file = File::open(path).map_err(|source| HfError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    // SAFETY: the mapping is read-only; a checkpoint modified while it is being loaded
    // could change the bytes we read, which safetensors' bounds checks keep memory-safe
    // for the header and which only affects values for the data.
    unsafe { Mmap::map(&file) }.map_err(|source| HfError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// Which weight file (an index into the file list) holds each tensor; `None` for a single
/// unindexed file, which holds everything.
type TensorIndex = Option<BTreeMap<String, usize>>;

/// The weight files of a checkpoint directory and where each tensor lives.
fn weight_files(dir: &Path) -> Result<(Vec<PathBuf>, TensorIndex), HfError> {
    let index_path = dir.join("model.safetensors.index.json");
    if index_path.exists() {
        let text = std::fs::read_to_string(&index_path).map_err(|source| HfError::Read {
            path: index_path.clone(),
            source,
        })?;
        let index: Index = serde_json::from_str(&text).map_err(|source| HfError::Json {
            path: index_path.clone(),
            what: "safetensors index",
            source,
        })?;
        let mut files: Vec<String> = index.weight_map.values().cloned().collect();
        files.sort();
        files.dedup();
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
        other => {
            return Err(HfError::UnsupportedDtype {
                name: name.to_string(),
                dtype: format!("{other:?}"),
            })
        }
    })
}

/// Loads the parameters of `config` from the weight files in `dir` into an f32
/// [`ParamTree`] (leaf paths = tensor names).
pub fn load_params(dir: impl AsRef<Path>, config: &Qwen2Config) -> Result<ParamTree, HfError> {
    let dir = dir.as_ref();
    let (files, index) = weight_files(dir)?;
    let maps = files
        .iter()
        .map(|p| map_file(p))
        .collect::<Result<Vec<_>, _>>()?;
    let parsed = maps
        .iter()
        .zip(&files)
        .map(|(m, p)| {
            SafeTensors::deserialize(m).map_err(|e| HfError::Format {
                path: p.clone(),
                message: e.to_string(),
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let searched = files
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let mut named = Vec::new();
    for (name, expected) in config.param_shapes() {
        let candidates: Vec<usize> = match &index {
            Some(map) => map.get(&name).copied().into_iter().collect(),
            None => (0..parsed.len()).collect(),
        };
        let view = candidates
            .into_iter()
            .find_map(|i| parsed[i].tensor(&name).ok())
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
        let data = to_f32(&name, view.dtype(), view.data())?;
        named.push((name, Array::new(expected, data)?));
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
        let e = parse_config(
            r#"{"model_type":"llama","vocab_size":64,"hidden_size":16,
                "intermediate_size":32,"num_hidden_layers":1,"num_attention_heads":2}"#,
            p,
        )
        .expect_err("llama is refused");
        assert!(e.to_string().contains("llama"), "{e}");
        let e = parse_config(r#"{"vocab_size":64}"#, p).expect_err("incomplete");
        assert!(e.to_string().contains("hidden_size"), "{e}");
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
