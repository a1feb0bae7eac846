//! A decoder from a GGUF file: the config from its architecture's keys, each tensor
//! dequantized into its f32 leaf, the q/k rows of llama.cpp's rotary layout put back in
//! Hugging Face order.

use std::path::Path;

use shardes_hlo::params::{Array, ParamTree};
use shardes_hlo::problems::qwen2::{Qwen2Config, RopeScaling};

use super::{Info, ModelError};
use crate::family::{self, Family};
use crate::gguf::{GgufError, GgufFile};

/// An error about the model a GGUF file holds (its keys or its tensors).
fn bad(file: &GgufFile, message: String, fix: &str) -> ModelError {
    ModelError::Gguf {
        path: file.path().to_path_buf(),
        message,
        fix: fix.to_string(),
    }
}

/// A size key as a `usize`.
fn size(file: &GgufFile, key: &str) -> Result<usize, ModelError> {
    let v = file.get_u64(key)?;
    usize::try_from(v).map_err(|_| {
        bad(
            file,
            format!("`{key}` = {v} does not fit this machine's sizes"),
            "the file is damaged or not a model shardes can hold",
        )
    })
}

/// An optional size key.
fn optional_size(file: &GgufFile, key: &str) -> Result<Option<usize>, ModelError> {
    match file.get(key) {
        None => Ok(None),
        Some(_) => size(file, key).map(Some),
    }
}

/// An optional float key.
fn optional_f64(file: &GgufFile, key: &str) -> Result<Option<f64>, ModelError> {
    match file.get(key) {
        None => Ok(None),
        Some(_) => Ok(Some(file.get_f64(key)?)),
    }
}

/// An optional token id key.
fn optional_id(file: &GgufFile, key: &str) -> Result<Option<u32>, ModelError> {
    match file.get(key) {
        None => Ok(None),
        Some(_) => {
            let v = file.get_u64(key)?;
            u32::try_from(v).map(Some).map_err(|_| {
                bad(
                    file,
                    format!("`{key}` = {v} is not a token id"),
                    "the file is damaged; use another copy",
                )
            })
        }
    }
}

/// The family of `file`, from `general.architecture`.
pub(super) fn family_of(file: &GgufFile) -> Result<&'static Family, ModelError> {
    let arch = file.get_str("general.architecture")?;
    family::by_gguf_architecture(arch).ok_or_else(|| {
        bad(
            file,
            format!(
                "general.architecture = `{}` is a family shardes does not read",
                shardes_hlo::es::spec::excerpt(arch)
            ),
            &format!(
                "use a GGUF file of a family shardes reads ({})",
                family::known_gguf_architectures()
            ),
        )
    })
}

/// The model's settings from the file's keys (under `{architecture}.`) and tensor table;
/// no tensor's values are read.
pub(super) fn read_info(file: &GgufFile) -> Result<Info, ModelError> {
    let family = family_of(file)?;
    let arch = file.get_str("general.architecture")?.to_string();
    let key = |k: &str| format!("{arch}.{k}");
    let hidden = size(file, &key("embedding_length"))?;
    let heads = size(file, &key("attention.head_count"))?;
    let kv_heads = optional_size(file, &key("attention.head_count_kv"))?.unwrap_or(heads);
    let layers = size(file, &key("block_count"))?;
    let embed = file.tensor("token_embd.weight").ok_or_else(|| {
        bad(
            file,
            "has no tensor `token_embd.weight`".into(),
            "the file is not a complete model; use another copy",
        )
    })?;
    let vocab = match optional_size(file, &key("vocab_size"))? {
        Some(v) => v,
        None => embed.shape().first().copied().unwrap_or(0),
    };
    let head_dim = optional_size(file, &key("attention.key_length"))?;
    if let (Some(k), Some(v)) = (
        head_dim,
        optional_size(file, &key("attention.value_length"))?,
    ) {
        if k != v {
            return Err(bad(
                file,
                format!("keys of width {k} and values of width {v}"),
                "shardes reads models whose keys and values have one head width",
            ));
        }
    }
    let default_hd = hidden.checked_div(heads).unwrap_or(0);
    let explicit_head_dim = head_dim.filter(|&h| h != default_hd || hidden % heads.max(1) != 0);
    let hd = head_dim.unwrap_or(default_hd);
    if let Some(rot) = optional_size(file, &key("rope.dimension_count"))? {
        if rot != hd {
            return Err(bad(
                file,
                format!("rotary embeddings over {rot} of the head's {hd} dimensions"),
                "shardes reads models whose rotary embeddings cover the whole head",
            ));
        }
    }
    let rope_scaling = match file.get(&key("rope.scaling.type")) {
        None => RopeScaling::None,
        Some(_) => match file.get_str(&key("rope.scaling.type"))? {
            "none" => RopeScaling::None,
            "linear" => RopeScaling::Linear {
                factor: file.get_f64(&key("rope.scaling.factor"))?,
            },
            other => {
                return Err(bad(
                    file,
                    format!(
                        "`{}` = `{}` is not supported",
                        key("rope.scaling.type"),
                        shardes_hlo::es::spec::excerpt(other)
                    ),
                    "shardes reads default and linear rotary scaling from GGUF files",
                ))
            }
        },
    };
    if file.tensor("rope_freqs.weight").is_some() {
        return Err(bad(
            file,
            "holds `rope_freqs.weight` (LLaMA 3 rotary scaling as frequency factors)".into(),
            "load the model's Hugging Face directory instead, where rope_scaling says llama3",
        ));
    }
    let config = Qwen2Config {
        vocab_size: vocab,
        hidden_size: hidden,
        intermediate_size: size(file, &key("feed_forward_length"))?,
        num_hidden_layers: layers,
        num_attention_heads: heads,
        num_key_value_heads: kv_heads,
        rope_theta: optional_f64(file, &key("rope.freq_base"))?.unwrap_or(10_000.0),
        rms_norm_eps: optional_f64(file, &key("attention.layer_norm_rms_epsilon"))?.unwrap_or(1e-5),
        tie_word_embeddings: file.tensor("output.weight").is_none(),
        attention_bias: file.tensor("blk.0.attn_q.bias").is_some(),
        explicit_head_dim,
        rope_scaling,
    };
    config.validate().map_err(|e| {
        bad(
            file,
            e.to_string(),
            "the file's settings are inconsistent; use another copy",
        )
    })?;
    let eos = optional_id(file, "tokenizer.ggml.eos_token_id")?;
    let pad = optional_id(file, "tokenizer.ggml.padding_token_id")?;
    Ok(Info {
        config,
        family: family.name,
        max_positions: optional_size(file, &key("context_length"))?,
        eos: eos.into_iter().collect(),
        pad,
    })
}

/// The GGUF tensors of `config`'s leaves, each checked against its shape and type, and
/// no decoder layer past the config's: `(leaf path, shape, tensor index)`.
fn find(
    file: &GgufFile,
    config: &Qwen2Config,
) -> Result<Vec<(String, Vec<usize>, usize)>, ModelError> {
    let layers = config.num_hidden_layers;
    for t in file.tensors() {
        if let Some(l) = t
            .name
            .strip_prefix("blk.")
            .and_then(|r| r.split('.').next())
            .and_then(|l| l.parse::<usize>().ok())
        {
            if l >= layers {
                return Err(bad(
                    file,
                    format!(
                        "tensor `{}` is of layer {l}, but the file's block_count is {layers}",
                        t.name
                    ),
                    "the file's keys and tensors disagree; use another copy",
                ));
            }
        }
    }
    let mut found = Vec::new();
    for (path, shape) in config.param_shapes() {
        let name = family::gguf_tensor_of_leaf(&path).ok_or_else(|| {
            bad(
                file,
                format!("no GGUF tensor holds the leaf `{path}`"),
                "report this: the family table lacks a tensor name",
            )
        })?;
        let index = file
            .tensors()
            .iter()
            .position(|t| t.name == name)
            .ok_or_else(|| {
                bad(
                    file,
                    format!("tensor `{name}` (the leaf `{path}`) is missing"),
                    "the file is not a complete model of its architecture; use another copy",
                )
            })?;
        let t = &file.tensors()[index];
        if t.shape() != shape {
            return Err(bad(
                file,
                format!(
                    "tensor `{name}` has shape {:?}, but the file's keys imply {shape:?}",
                    t.shape()
                ),
                "the file's keys and tensors disagree; use another copy",
            ));
        }
        if !t.ggml_type.is_supported() {
            return Err(bad(
                file,
                format!("tensor `{name}` is stored as {}", t.ggml_type.name()),
                "shardes dequantizes F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K \
                 and Q6_K; requantize the file to one of them",
            ));
        }
        found.push((path, shape, index));
    }
    Ok(found)
}

/// Checks that every tensor `config` needs is in the file with its shape and a type
/// shardes dequantizes, reading no tensor's values.
pub(super) fn check_tensors(file: &GgufFile, config: &Qwen2Config) -> Result<(), ModelError> {
    find(file, config).map(|_| ())
}

/// The f32 parameters of `config` from `file`, leaf by leaf.
pub(super) fn load_params(
    file: &GgufFile,
    family: &Family,
    config: &Qwen2Config,
) -> Result<ParamTree, ModelError> {
    let mut named = Vec::new();
    for (path, shape, index) in find(file, config)? {
        let t = &file.tensors()[index];
        let mut data = file.dequantize(t)?;
        if family.gguf_permutes_qk {
            if let Some(heads) = family::permuted_heads(&path, config) {
                let rows = shape[0];
                let cols = shape.get(1).copied().unwrap_or(1);
                data = family::unpermute_rows(&data, rows, cols, heads);
            }
        }
        if let Some((i, x)) = data.iter().enumerate().find(|(_, x)| !x.is_finite()) {
            return Err(bad(
                file,
                format!(
                    "tensor `{}` holds a non-finite value ({x}) at element {i}",
                    t.name
                ),
                "the file is corrupt; use another copy",
            ));
        }
        named.push((path, Array::new(shape, data)?));
    }
    Ok(ParamTree::from_paths(named)?)
}

/// Opens a GGUF file (the errors name it).
pub(super) fn open(path: &Path) -> Result<GgufFile, ModelError> {
    GgufFile::open(path).map_err(ModelError::from)
}

impl From<GgufError> for ModelError {
    fn from(e: GgufError) -> ModelError {
        ModelError::File(e)
    }
}
