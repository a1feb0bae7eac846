//! The LLaMA family (LLaMA 2 and 3, SmolLM2, Mistral-style checkpoints): q/k/v biases only
//! where `attention_bias` says, an explicit `head_dim` where the config sets one, rotary
//! scaling `linear` or `llama3`, a tied or untied output head.

use shardes_hlo::problems::qwen2::{Qwen2Config, RopeScaling};

use super::{rope_settings, Family, Unsupported};

/// The LLaMA family.
pub(super) const FAMILY: Family = Family {
    name: "llama",
    model_types: &["llama", "mistral"],
    gguf_architectures: &["llama"],
    hf_settings,
    gguf_permutes_qk: true,
};

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
