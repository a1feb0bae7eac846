//! The LLaMA family (LLaMA 2 and 3, SmolLM2, Mistral-style checkpoints): q/k/v biases only
//! where `attention_bias` says, an explicit `head_dim` where the config sets one, rotary
//! scaling `linear` or `llama3`, a tied or untied output head.

use serde_json::{json, Map, Value};
use shardes_hlo::problems::qwen2::{Qwen2Config, RopeScaling};

use super::{rope_settings, Family, GgufKeys, Unsupported};
use crate::gguf::MetaValue;

/// The LLaMA family.
pub(super) const FAMILY: Family = Family {
    name: "llama",
    model_types: &["llama", "mistral"],
    gguf_architectures: &["llama"],
    hf_settings,
    gguf_permutes_qk: true,
    hf_architecture: "LlamaForCausalLM",
    hf_keys,
    gguf_keys,
};

fn hf_keys(c: &Qwen2Config, m: &mut Map<String, Value>) {
    m.insert("attention_bias".into(), json!(c.attention_bias));
    m.insert("mlp_bias".into(), json!(false));
    // Only where set apart, so the directory reads back to the same config.
    if let Some(h) = c.explicit_head_dim {
        m.insert("head_dim".into(), json!(h));
    }
    if c.rope_scaling != RopeScaling::None {
        // transformers 4 reads the scaling here (without the base); 5 reads
        // `rope_parameters`, which the shared keys hold.
        let mut r = super::rope_parameters(c);
        if let Some(o) = r.as_object_mut() {
            o.remove("rope_theta");
        }
        m.insert("rope_scaling".into(), r);
    }
}

fn gguf_keys(c: &Qwen2Config, arch: &str, out: &mut GgufKeys) -> Result<(), Unsupported> {
    match c.rope_scaling {
        RopeScaling::None => {}
        RopeScaling::Linear { factor } => {
            out.push((
                format!("{arch}.rope.scaling.type"),
                MetaValue::String("linear".into()),
            ));
            out.push((
                format!("{arch}.rope.scaling.factor"),
                MetaValue::F32(factor as f32),
            ));
        }
        // llama.cpp stores LLaMA 3 scaling as a `rope_freqs.weight` tensor of frequency
        // factors, which shardes does not read back; such a model is exported to a
        // Hugging Face directory instead.
        RopeScaling::Llama3 { .. } => {
            return Err(Unsupported::new(
                "rope_scaling",
                "llama3 (GGUF holds it as rope_freqs.weight, which shardes does not write)",
            ))
        }
    }
    Ok(())
}

fn hf_settings(v: &serde_json::Value, c: &mut Qwen2Config) -> Result<(), Unsupported> {
    if v.get("mlp_bias").and_then(|x| x.as_bool()) == Some(true) {
        return Err(Unsupported::new("mlp_bias", "true"));
    }
    // Mistral's sliding window attends to the last `sliding_window` keys only; a full
    // causal mask would read further back, so such a checkpoint is refused.
    if let Some(w) = v.get("sliding_window").filter(|w| !w.is_null()) {
        return Err(Unsupported::new("sliding_window", w));
    }
    c.attention_bias = v
        .get("attention_bias")
        .and_then(|x| x.as_bool())
        .unwrap_or(false);
    c.explicit_head_dim = match v.get("head_dim").filter(|h| !h.is_null()) {
        Some(h) => Some(
            h.as_u64()
                .and_then(|h| usize::try_from(h).ok())
                .ok_or_else(|| Unsupported::new("head_dim", h))?,
        ),
        None => None,
    };
    c.rope_scaling = match rope_settings(v) {
        None => RopeScaling::None,
        Some((field, kind, r)) => {
            let num = |key: &str| -> Result<f64, Unsupported> {
                r.get(key).and_then(|x| x.as_f64()).ok_or_else(|| {
                    Unsupported::new(
                        field,
                        format!("rope_type \"{kind}\" without a numeric `{key}`"),
                    )
                })
            };
            match kind.as_str() {
                "default" => RopeScaling::None,
                "linear" => RopeScaling::Linear {
                    factor: num("factor")?,
                },
                "llama3" => RopeScaling::Llama3 {
                    factor: num("factor")?,
                    low_freq_factor: num("low_freq_factor")?,
                    high_freq_factor: num("high_freq_factor")?,
                    original_max_position_embeddings: num("original_max_position_embeddings")?,
                },
                other => {
                    return Err(Unsupported::new(
                        field,
                        format!("rope_type \"{other}\" (shardes reads default, linear and llama3)"),
                    ))
                }
            }
        }
    };
    Ok(())
}
