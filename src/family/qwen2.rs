//! Qwen2 / Qwen2.5: q/k/v biases, the head width `d / H`, default rotary frequencies, full
//! attention (no sliding window).

use serde_json::{json, Map, Value};
use shardes_hlo::problems::qwen2::{Qwen2Config, RopeScaling};

use super::{rope_settings, Family, GgufKeys, Unsupported};

/// The Qwen2 family.
pub(super) const FAMILY: Family = Family {
    name: "qwen2",
    model_types: &["qwen2"],
    gguf_architectures: &["qwen2"],
    hf_settings,
    gguf_permutes_qk: false,
    hf_architecture: "Qwen2ForCausalLM",
    hf_keys,
    gguf_keys,
};

fn hf_keys(c: &Qwen2Config, m: &mut Map<String, Value>) {
    // Full attention in every layer: the sliding window is off.
    m.insert("use_sliding_window".into(), json!(false));
    m.insert("sliding_window".into(), Value::Null);
    m.insert("max_window_layers".into(), json!(c.num_hidden_layers));
    m.insert(
        "layer_types".into(),
        json!(vec!["full_attention"; c.num_hidden_layers]),
    );
}

fn gguf_keys(c: &Qwen2Config, _arch: &str, _out: &mut GgufKeys) -> Result<(), Unsupported> {
    // Qwen2 reads no rotary scaling and carries its q/k/v biases as tensors; a config
    // that is not what the family reads (built by hand) is refused rather than written
    // into a file that would load differently.
    if c.rope_scaling != RopeScaling::None {
        return Err(Unsupported::new("rope_scaling", c.rope_scaling.name()));
    }
    if !c.attention_bias {
        return Err(Unsupported::new("attention_bias", "false"));
    }
    Ok(())
}

fn hf_settings(v: &serde_json::Value, c: &mut Qwen2Config) -> Result<(), Unsupported> {
    if v.get("use_sliding_window").and_then(|x| x.as_bool()) == Some(true) {
        return Err(Unsupported::new("use_sliding_window", "true"));
    }
    if let Some((field, kind, _)) = rope_settings(v) {
        if kind != "default" {
            return Err(Unsupported::new(field, format!("rope_type \"{kind}\"")));
        }
    }
    c.attention_bias = true;
    c.explicit_head_dim = None;
    c.rope_scaling = RopeScaling::None;
    Ok(())
}
