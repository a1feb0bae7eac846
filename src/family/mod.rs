//! Model families: the one place that maps a checkpoint's architecture name to the code
//! that reads its settings.
//!
//! A Hugging Face `config.json` names its family in `model_type`, a GGUF file in
//! `general.architecture`; [`by_model_type`] and [`by_gguf_architecture`] look both up in
//! [`FAMILIES`]. Every family shares one decoder ([`shardes_hlo::problems::qwen2::Qwen2`]:
//! RMSNorm, rotary attention with grouped KV heads, a SwiGLU MLP), so a family is the
//! settings that set it apart — q/k/v biases, an explicit head width, rotary scaling — read
//! by its own module, and the tensor layout of its GGUF files. Adding a family is its
//! module plus one line in [`FAMILIES`].
//!
//! GGUF files name tensors the llama.cpp way (`blk.{l}.attn_q.weight`); [`GGUF_TENSORS`]
//! maps those names to the Hugging Face leaf paths the decoder reads.
//!
//! The way back is here too, for `shardes export`: [`hf_config_json`] writes a
//! `config.json` and [`gguf_hparams`] a GGUF file's hyperparameter keys, each from the
//! keys every family shares plus the family's own ([`Family::hf_keys`],
//! [`Family::gguf_keys`]).

use serde_json::{json, Map, Value};
use shardes_hlo::problems::qwen2::Qwen2Config;

use crate::gguf::MetaValue;

mod llama;
mod qwen2;

/// A setting of a checkpoint's config that the decoder does not implement: the key and its
/// value as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unsupported {
    /// The config key.
    pub field: String,
    /// Its value, as the file writes it.
    pub value: String,
}

impl Unsupported {
    fn new(field: &str, value: impl ToString) -> Unsupported {
        Unsupported {
            field: field.to_string(),
            value: value.to_string(),
        }
    }
}

/// The rotary settings of a `config.json`: the key they are under (`rope_parameters`, as
/// transformers 5 writes it, or `rope_scaling`, as transformers 4 did), their
/// `rope_type` (or `type`; `default` when absent) and the object itself. `None` when
/// neither key holds an object.
fn rope_settings(v: &serde_json::Value) -> Option<(&'static str, String, &serde_json::Value)> {
    ["rope_parameters", "rope_scaling"]
        .into_iter()
        .find_map(|field| {
            let r = v.get(field).filter(|r| r.is_object())?;
            let kind = r
                .get("rope_type")
                .or_else(|| r.get("type"))
                .and_then(|t| t.as_str())
                .unwrap_or("default");
            Some((field, kind.to_string(), r))
        })
}

/// One model family.
#[derive(Debug)]
pub struct Family {
    /// The family's name (the `model_type` of its Hugging Face configs).
    pub name: &'static str,
    /// The `model_type` values of Hugging Face configs of this family.
    pub model_types: &'static [&'static str],
    /// The `general.architecture` values of GGUF files of this family.
    pub gguf_architectures: &'static [&'static str],
    /// Reads the family's own keys of a `config.json` (parsed as JSON) into `config`, whose
    /// sizes, norm epsilon, rotary base and tying are already set from the keys every
    /// family shares.
    pub hf_settings: fn(&serde_json::Value, &mut Qwen2Config) -> Result<(), Unsupported>,
    /// Whether llama.cpp's converter reordered the rows of `attn_q` and `attn_k` for its
    /// interleaved rotary layout (undone on load: [`unpermute_rows`]).
    pub gguf_permutes_qk: bool,
    /// The `architectures` entry of the family's Hugging Face configs
    /// (`Qwen2ForCausalLM`).
    pub hf_architecture: &'static str,
    /// Writes the family's own `config.json` keys for `config` (the inverse of
    /// [`Family::hf_settings`]): biases, head width, rotary settings.
    pub hf_keys: fn(&Qwen2Config, &mut Map<String, Value>),
    /// Appends the family's own GGUF keys for `config` under `{architecture}.` (the
    /// second argument), or names the setting a GGUF file of the family cannot hold.
    pub gguf_keys: fn(&Qwen2Config, &str, &mut GgufKeys) -> Result<(), Unsupported>,
}

/// Every family shardes reads, by name.
pub const FAMILIES: &[&Family] = &[&qwen2::FAMILY, &llama::FAMILY];

/// The family of a Hugging Face `model_type`.
pub fn by_model_type(model_type: &str) -> Option<&'static Family> {
    FAMILIES
        .iter()
        .copied()
        .find(|f| f.model_types.contains(&model_type))
}

/// The family of a GGUF `general.architecture`.
pub fn by_gguf_architecture(arch: &str) -> Option<&'static Family> {
    FAMILIES
        .iter()
        .copied()
        .find(|f| f.gguf_architectures.contains(&arch))
}

/// The `model_type`s every family reads, for error messages.
pub fn known_model_types() -> String {
    FAMILIES
        .iter()
        .flat_map(|f| f.model_types.iter())
        .map(|t| format!("`{t}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The GGUF architectures every family reads, for error messages.
pub fn known_gguf_architectures() -> String {
    FAMILIES
        .iter()
        .flat_map(|f| f.gguf_architectures.iter())
        .map(|t| format!("`{t}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// GGUF metadata keys and their values, in the order they are written.
pub type GgufKeys = Vec<(String, MetaValue)>;

/// What a `config.json` says besides the decoder's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct HfExtras {
    /// `max_position_embeddings` (left out when unknown: transformers' default applies).
    pub max_positions: Option<usize>,
    /// `bos_token_id`.
    pub bos: Option<u32>,
    /// `eos_token_id` (one id is written as a number, several as a list).
    pub eos: Vec<u32>,
    /// `pad_token_id`.
    pub pad: Option<u32>,
    /// `torch_dtype` (and `dtype`, as transformers 5 writes it): `float32` or `bfloat16`.
    pub torch_dtype: &'static str,
}

/// A token id list as `config.json` writes it: one id as a number, several as a list,
/// none as null.
pub fn ids_json(ids: &[u32]) -> Value {
    match ids {
        [] => Value::Null,
        [one] => json!(one),
        many => json!(many),
    }
}

/// The `rope_parameters` object of `config` (transformers 5's form: `rope_type`,
/// `rope_theta` and the scaling's own fields).
pub fn rope_parameters(config: &Qwen2Config) -> Value {
    use shardes_hlo::problems::qwen2::RopeScaling;
    let mut r = json!({ "rope_type": config.rope_scaling.name(), "rope_theta": config.rope_theta });
    match config.rope_scaling {
        RopeScaling::None => {}
        RopeScaling::Linear { factor } => r["factor"] = json!(factor),
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        } => {
            r["factor"] = json!(factor);
            r["low_freq_factor"] = json!(low_freq_factor);
            r["high_freq_factor"] = json!(high_freq_factor);
            // transformers reads it as an integer.
            r["original_max_position_embeddings"] = json!(original_max_position_embeddings as u64);
        }
    }
    r
}

/// A Hugging Face `config.json` of `family` for `config`: the keys every family shares
/// (sizes, norm epsilon, rotary base, tying, token ids, dtype) and the family's own.
/// [`crate::hf::parse_hf_config`] reads it back to `config`.
pub fn hf_config_json(family: &Family, config: &Qwen2Config, extras: &HfExtras) -> Value {
    let mut m = Map::new();
    m.insert("architectures".into(), json!([family.hf_architecture]));
    m.insert("model_type".into(), json!(family.name));
    m.insert("vocab_size".into(), json!(config.vocab_size));
    m.insert("hidden_size".into(), json!(config.hidden_size));
    m.insert("intermediate_size".into(), json!(config.intermediate_size));
    m.insert("num_hidden_layers".into(), json!(config.num_hidden_layers));
    m.insert(
        "num_attention_heads".into(),
        json!(config.num_attention_heads),
    );
    m.insert(
        "num_key_value_heads".into(),
        json!(config.num_key_value_heads),
    );
    m.insert("hidden_act".into(), json!("silu"));
    m.insert("rms_norm_eps".into(), json!(config.rms_norm_eps));
    m.insert("rope_theta".into(), json!(config.rope_theta));
    m.insert("rope_parameters".into(), rope_parameters(config));
    m.insert(
        "tie_word_embeddings".into(),
        json!(config.tie_word_embeddings),
    );
    if let Some(p) = extras.max_positions {
        m.insert("max_position_embeddings".into(), json!(p));
    }
    if let Some(b) = extras.bos {
        m.insert("bos_token_id".into(), json!(b));
    }
    if !extras.eos.is_empty() {
        m.insert("eos_token_id".into(), ids_json(&extras.eos));
    }
    if let Some(p) = extras.pad {
        m.insert("pad_token_id".into(), json!(p));
    }
    m.insert("torch_dtype".into(), json!(extras.torch_dtype));
    m.insert("dtype".into(), json!(extras.torch_dtype));
    m.insert("use_cache".into(), json!(true));
    (family.hf_keys)(config, &mut m);
    Value::Object(m)
}

/// The hyperparameter keys of a GGUF file of `family` for `config`, as llama.cpp's
/// converter writes them: `general.architecture` and `{arch}.block_count`,
/// `context_length` (where known), `embedding_length`, `feed_forward_length`,
/// `attention.head_count(_kv)`, `rope.freq_base`, `attention.layer_norm_rms_epsilon`,
/// `vocab_size`, `rope.dimension_count`, the head width where it is set apart, and the
/// family's own keys. Errors name a setting such a file cannot hold.
pub fn gguf_hparams(
    family: &Family,
    config: &Qwen2Config,
    context_length: Option<usize>,
) -> Result<GgufKeys, Unsupported> {
    let arch = family
        .gguf_architectures
        .first()
        .copied()
        .unwrap_or(family.name);
    let key = |k: &str| format!("{arch}.{k}");
    // llama.cpp's sizes are u32; a model whose sizes do not fit is refused.
    let u32_of = |name: &str, v: usize| -> Result<MetaValue, Unsupported> {
        u32::try_from(v)
            .map(MetaValue::U32)
            .map_err(|_| Unsupported::new(name, v))
    };
    let mut out = vec![(
        "general.architecture".to_string(),
        MetaValue::String(arch.to_string()),
    )];
    out.push((
        key("block_count"),
        u32_of("num_hidden_layers", config.num_hidden_layers)?,
    ));
    if let Some(c) = context_length {
        out.push((key("context_length"), u32_of("max_position_embeddings", c)?));
    }
    out.push((
        key("embedding_length"),
        u32_of("hidden_size", config.hidden_size)?,
    ));
    out.push((
        key("feed_forward_length"),
        u32_of("intermediate_size", config.intermediate_size)?,
    ));
    out.push((
        key("attention.head_count"),
        u32_of("num_attention_heads", config.num_attention_heads)?,
    ));
    out.push((
        key("attention.head_count_kv"),
        u32_of("num_key_value_heads", config.num_key_value_heads)?,
    ));
    out.push((
        key("rope.freq_base"),
        MetaValue::F32(config.rope_theta as f32),
    ));
    out.push((
        key("attention.layer_norm_rms_epsilon"),
        MetaValue::F32(config.rms_norm_eps as f32),
    ));
    out.push((key("vocab_size"), u32_of("vocab_size", config.vocab_size)?));
    out.push((
        key("rope.dimension_count"),
        u32_of("head_dim", config.head_dim())?,
    ));
    if config.explicit_head_dim.is_some() {
        out.push((
            key("attention.key_length"),
            u32_of("head_dim", config.head_dim())?,
        ));
        out.push((
            key("attention.value_length"),
            u32_of("head_dim", config.head_dim())?,
        ));
    }
    (family.gguf_keys)(config, arch, &mut out)?;
    Ok(out)
}

/// llama.cpp's tensor names (after `blk.{l}.` for a layer's) and the Hugging Face leaf
/// names (after `model.layers.{l}.`) they hold; the model-wide ones are in
/// [`GGUF_GLOBAL_TENSORS`].
pub const GGUF_TENSORS: &[(&str, &str)] = &[
    ("attn_norm.weight", "input_layernorm.weight"),
    ("ffn_norm.weight", "post_attention_layernorm.weight"),
    ("attn_q.weight", "self_attn.q_proj.weight"),
    ("attn_q.bias", "self_attn.q_proj.bias"),
    ("attn_k.weight", "self_attn.k_proj.weight"),
    ("attn_k.bias", "self_attn.k_proj.bias"),
    ("attn_v.weight", "self_attn.v_proj.weight"),
    ("attn_v.bias", "self_attn.v_proj.bias"),
    ("attn_output.weight", "self_attn.o_proj.weight"),
    ("ffn_gate.weight", "mlp.gate_proj.weight"),
    ("ffn_up.weight", "mlp.up_proj.weight"),
    ("ffn_down.weight", "mlp.down_proj.weight"),
];

/// llama.cpp's model-wide tensor names and the Hugging Face leaf paths they hold.
pub const GGUF_GLOBAL_TENSORS: &[(&str, &str)] = &[
    ("token_embd.weight", "model.embed_tokens.weight"),
    ("output_norm.weight", "model.norm.weight"),
    ("output.weight", "lm_head.weight"),
];

/// The Hugging Face leaf path of a GGUF tensor name, or `None` for a name no family reads.
pub fn leaf_of_gguf_tensor(name: &str) -> Option<String> {
    if let Some(&(_, leaf)) = GGUF_GLOBAL_TENSORS.iter().find(|(g, _)| *g == name) {
        return Some(leaf.to_string());
    }
    let rest = name.strip_prefix("blk.")?;
    let (layer, tail) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let &(_, leaf) = GGUF_TENSORS.iter().find(|(g, _)| *g == tail)?;
    Some(format!("model.layers.{layer}.{leaf}"))
}

/// The GGUF tensor name of a Hugging Face leaf path (the inverse of
/// [`leaf_of_gguf_tensor`]).
pub fn gguf_tensor_of_leaf(path: &str) -> Option<String> {
    if let Some(&(g, _)) = GGUF_GLOBAL_TENSORS.iter().find(|(_, l)| *l == path) {
        return Some(g.to_string());
    }
    let rest = path.strip_prefix("model.layers.")?;
    let (layer, tail) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let &(g, _) = GGUF_TENSORS.iter().find(|(_, l)| *l == tail)?;
    Some(format!("blk.{layer}.{g}"))
}

/// The heads whose rows llama.cpp reorders in leaf `path` of a family that permutes q/k
/// ([`Family::gguf_permutes_qk`]): the query heads of a `q_proj`, the key-value heads of a
/// `k_proj` (weight or bias), `None` for every other leaf.
pub fn permuted_heads(path: &str, config: &Qwen2Config) -> Option<usize> {
    if path.contains(".q_proj.") {
        Some(config.num_attention_heads)
    } else if path.contains(".k_proj.") {
        Some(config.num_key_value_heads)
    } else {
        None
    }
}

/// Undoes llama.cpp's q/k row order: the `rows × cols` matrix (or `rows` vector, `cols =
/// 1`) `data` with `heads` heads, whose rows llama.cpp stored per head as `[hd/2, 2]`,
/// back to Hugging Face's `[2, hd/2]` (rotate-half rotary). [`permute_rows`] is its
/// inverse.
pub fn unpermute_rows(data: &[f32], rows: usize, cols: usize, heads: usize) -> Vec<f32> {
    reorder_rows(data, rows, cols, heads, false)
}

/// llama.cpp's q/k row order from Hugging Face's (the inverse of [`unpermute_rows`]).
pub fn permute_rows(data: &[f32], rows: usize, cols: usize, heads: usize) -> Vec<f32> {
    reorder_rows(data, rows, cols, heads, true)
}

fn reorder_rows(data: &[f32], rows: usize, cols: usize, heads: usize, to_gguf: bool) -> Vec<f32> {
    let hd = rows / heads.max(1);
    let half = hd / 2;
    let mut out = vec![0.0f32; data.len()];
    for h in 0..heads {
        for j in 0..2 {
            for i in 0..half {
                // Hugging Face row h·hd + j·hd/2 + i is llama.cpp's row h·hd + 2i + j.
                let hf = h * hd + j * half + i;
                let gg = h * hd + 2 * i + j;
                let (src, dst) = if to_gguf { (hf, gg) } else { (gg, hf) };
                out[dst * cols..(dst + 1) * cols]
                    .copy_from_slice(&data[src * cols..(src + 1) * cols]);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_is_in_one_family() {
        for f in FAMILIES {
            for t in f.model_types {
                assert_eq!(by_model_type(t).map(|g| g.name), Some(f.name));
            }
            for a in f.gguf_architectures {
                assert_eq!(by_gguf_architecture(a).map(|g| g.name), Some(f.name));
            }
        }
        assert!(by_model_type("gpt2").is_none());
    }

    #[test]
    fn tensor_names_map_both_ways() {
        for name in [
            "token_embd.weight",
            "output.weight",
            "output_norm.weight",
            "blk.0.attn_q.weight",
            "blk.29.ffn_down.weight",
            "blk.3.attn_k.bias",
        ] {
            let leaf = leaf_of_gguf_tensor(name).expect(name);
            assert_eq!(gguf_tensor_of_leaf(&leaf).as_deref(), Some(name));
        }
        assert_eq!(
            leaf_of_gguf_tensor("blk.7.attn_output.weight").as_deref(),
            Some("model.layers.7.self_attn.o_proj.weight")
        );
        assert!(leaf_of_gguf_tensor("rope_freqs.weight").is_none());
        assert!(leaf_of_gguf_tensor("blk.x.attn_q.weight").is_none());
    }

    #[test]
    fn unpermute_matches_the_view_and_swap_and_inverts() {
        // 2 heads of hd 4, 3 columns: row r holds r·10 + c.
        let (heads, hd, cols) = (2, 4, 3);
        let rows = heads * hd;
        let data: Vec<f32> = (0..rows * cols)
            .map(|k| ((k / cols) * 10 + k % cols) as f32)
            .collect();
        let hf = unpermute_rows(&data, rows, cols, heads);
        // View [n, hd/2, 2], swap the last two axes: per head, rows 0,2,1,3.
        let order = [0, 2, 1, 3, 4, 6, 5, 7];
        for (dst, &src) in order.iter().enumerate() {
            assert_eq!(hf[dst * cols], (src * 10) as f32);
        }
        assert_eq!(permute_rows(&hf, rows, cols, heads), data);
    }
}
