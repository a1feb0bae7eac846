//! Qwen2 / Qwen2.5: q/k/v biases, the head width `d / H`, default rotary frequencies, full
//! attention (no sliding window).

use shardes_hlo::problems::qwen2::{Qwen2Config, RopeScaling};

use super::{rope_settings, Family, Unsupported};

/// The Qwen2 family.
pub(super) const FAMILY: Family = Family {
    name: "qwen2",
    model_types: &["qwen2"],
    gguf_architectures: &["qwen2"],
    hf_settings,
    gguf_permutes_qk: false,
};

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
