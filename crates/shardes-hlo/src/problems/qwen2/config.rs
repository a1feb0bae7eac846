//! Qwen2Config: the hyperparameters of the decoder (every family [`super`] serves), their
//! checks, the leaves they imply and random parameters of those shapes.

use crate::params::{Array, ParamTree};
use crate::prng::{fold_in, normal, Key};

use super::super::ProblemError;

/// The most decoder layers [`Qwen2Config::validate`] accepts: far above any published
/// model, and low enough that describing the layers' leaves stays cheap.
pub const MAX_LAYERS: usize = 10_000;

/// Hyperparameters of a Qwen2 model (the fields of a Hugging Face `config.json` that the
/// forward needs).
#[derive(Debug, Clone, PartialEq)]
pub struct Qwen2Config {
    /// Vocabulary size `V`.
    pub vocab_size: usize,
    /// Model width `d`.
    pub hidden_size: usize,
    /// MLP width `I`.
    pub intermediate_size: usize,
    /// Number of decoder layers.
    pub num_hidden_layers: usize,
    /// Query heads `H`.
    pub num_attention_heads: usize,
    /// Key/value heads `KV` (divides `H`).
    pub num_key_value_heads: usize,
    /// Rotary base.
    pub rope_theta: f64,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f64,
    /// Whether the LM head reuses `model.embed_tokens.weight`.
    pub tie_word_embeddings: bool,
    /// Whether the q, k and v projections carry a bias (Qwen2 always; LLaMA-family
    /// checkpoints where `attention_bias` says so, usually not).
    pub attention_bias: bool,
    /// The per-head width where the checkpoint sets it apart from
    /// `hidden_size / num_attention_heads` (`head_dim` in a LLaMA-family config).
    pub explicit_head_dim: Option<usize>,
    /// How the rotary frequencies are rescaled (`rope_scaling`; none for Qwen2).
    pub rope_scaling: RopeScaling,
}

/// How a model rescales its rotary frequencies for contexts longer than it was trained
/// on, as Hugging Face's `rope_scaling` / `rope_parameters` name it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub enum RopeScaling {
    /// `theta^(-2i/hd)` as is (`rope_type = "default"`).
    #[default]
    None,
    /// Every frequency divided by `factor` (`rope_type = "linear"`).
    Linear {
        /// The divisor.
        factor: f64,
    },
    /// LLaMA 3's piecewise rule (`rope_type = "llama3"`): wavelengths longer than
    /// `original_max_position_embeddings / low_freq_factor` are divided by `factor`, those
    /// shorter than `… / high_freq_factor` kept, and those between interpolated.
    Llama3 {
        /// The divisor of the low frequencies.
        factor: f64,
        /// Sets the long-wavelength bound.
        low_freq_factor: f64,
        /// Sets the short-wavelength bound.
        high_freq_factor: f64,
        /// The context length the model was first trained for.
        original_max_position_embeddings: f64,
    },
}

impl RopeScaling {
    /// The `rope_type` name of this scaling.
    pub fn name(&self) -> &'static str {
        match self {
            RopeScaling::None => "default",
            RopeScaling::Linear { .. } => "linear",
            RopeScaling::Llama3 { .. } => "llama3",
        }
    }

    /// `inv` (the default frequencies, f64) rescaled, as `transformers`'
    /// `ROPE_INIT_FUNCTIONS` compute them.
    fn apply(&self, inv: f64) -> f64 {
        match *self {
            RopeScaling::None => inv,
            RopeScaling::Linear { factor } => inv / factor,
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings: old,
            } => {
                let wavelen = 2.0 * std::f64::consts::PI / inv;
                if wavelen > old / low_freq_factor {
                    inv / factor
                } else if wavelen < old / high_freq_factor {
                    inv
                } else {
                    let smooth =
                        (old / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
                    (1.0 - smooth) * inv / factor + smooth * inv
                }
            }
        }
    }

    /// Checks that the scaling's numbers give finite positive frequencies.
    fn validate(&self) -> Result<(), ProblemError> {
        let bad = |value: String| ProblemError::BadSetting {
            what: "rope_scaling",
            value,
            fix: "use a positive finite factor (and, for llama3, low_freq_factor < \
                  high_freq_factor and a positive original_max_position_embeddings)",
        };
        let ok = |x: f64| x.is_finite() && x > 0.0;
        match *self {
            RopeScaling::None => Ok(()),
            RopeScaling::Linear { factor } if ok(factor) => Ok(()),
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } if ok(factor)
                && ok(low_freq_factor)
                && ok(high_freq_factor)
                && low_freq_factor < high_freq_factor
                && ok(original_max_position_embeddings) =>
            {
                Ok(())
            }
            other => Err(bad(format!("{other:?}"))),
        }
    }
}

impl Qwen2Config {
    /// A tiny model for tests: `V = 128, d = 32, I = 64`, 2 layers, 4 query heads, 2 KV
    /// heads (head size 8), tied embeddings.
    pub fn tiny() -> Self {
        Qwen2Config {
            vocab_size: 128,
            hidden_size: 32,
            intermediate_size: 64,
            num_hidden_layers: 2,
            num_attention_heads: 4,
            num_key_value_heads: 2,
            rope_theta: 10_000.0,
            rms_norm_eps: 1e-6,
            tie_word_embeddings: true,
            attention_bias: true,
            explicit_head_dim: None,
            rope_scaling: RopeScaling::None,
        }
    }

    /// Qwen2.5-0.5B as published (`Qwen/Qwen2.5-0.5B/config.json`).
    pub fn qwen2_5_0_5b() -> Self {
        Qwen2Config {
            vocab_size: 151_936,
            hidden_size: 896,
            intermediate_size: 4864,
            num_hidden_layers: 24,
            num_attention_heads: 14,
            num_key_value_heads: 2,
            rope_theta: 1_000_000.0,
            rms_norm_eps: 1e-6,
            tie_word_embeddings: true,
            attention_bias: true,
            explicit_head_dim: None,
            rope_scaling: RopeScaling::None,
        }
    }

    /// Qwen2.5-1.5B as published (`Qwen/Qwen2.5-1.5B/config.json`): the 0.5B's family
    /// settings (vocabulary, key/value heads, RoPE, norm, tied embeddings, biases) at a
    /// larger width and depth.
    pub fn qwen2_5_1_5b() -> Self {
        Qwen2Config {
            hidden_size: 1536,
            intermediate_size: 8960,
            num_hidden_layers: 28,
            num_attention_heads: 12,
            ..Self::qwen2_5_0_5b()
        }
    }

    /// A named preset: `tiny`, `0.5b` or `1.5b` (also `qwen2.5-0.5b`, `qwen2.5-1.5b`).
    pub fn by_size(size: &str) -> Result<Self, ProblemError> {
        match size.to_ascii_lowercase().as_str() {
            "tiny" => Ok(Self::tiny()),
            "0.5b" | "qwen2.5-0.5b" => Ok(Self::qwen2_5_0_5b()),
            "1.5b" | "qwen2.5-1.5b" => Ok(Self::qwen2_5_1_5b()),
            _ => Err(ProblemError::BadSetting {
                what: "size",
                value: format!("\"{}\"", crate::es::spec::excerpt(size)),
                fix: "use size = \"tiny\", \"0.5b\" (or \"qwen2.5-0.5b\") or \"1.5b\" (or \
                      \"qwen2.5-1.5b\"), or dimensions over the tiny preset as comma-separated \
                      key=value pairs of vocab, d, ffn, layers, heads and kv, e.g. \
                      \"vocab=4096,d=256,ffn=1024,layers=4,heads=4,kv=2\" (as a config's \
                      problem.size or through shardes::problem::qwen2::config_of_size), or \
                      load a checkpoint",
            }),
        }
    }

    /// The per-head width: the checkpoint's own where it sets one, else `d / H`.
    pub fn head_dim(&self) -> usize {
        self.explicit_head_dim
            .unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
    }

    /// The rotary inverse frequencies `theta^(-2i/hd)`, `i < hd/2`, rescaled as
    /// [`Self::rope_scaling`] says, computed in f64 and rounded once to f32.
    pub fn inv_freq(&self) -> Vec<f32> {
        let hd = self.head_dim();
        (0..hd / 2)
            .map(|i| {
                let inv = 1.0 / self.rope_theta.powf((2 * i) as f64 / hd as f64);
                self.rope_scaling.apply(inv) as f32
            })
            .collect()
    }

    /// Checks the sizes and divisibility constraints the forward relies on, and that the
    /// RMSNorm epsilon and the rotary base give finite f32 values (a zero or negative
    /// epsilon or base makes the forward NaN from the first generation).
    pub fn validate(&self) -> Result<(), ProblemError> {
        let dims = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
        ];
        for (what, value) in dims {
            if value == 0 {
                return Err(ProblemError::BadDimension {
                    what,
                    value,
                    fix: "use a positive size",
                });
            }
        }
        if let Some(hd) = self.explicit_head_dim {
            if hd == 0 || !hd.is_multiple_of(2) {
                return Err(ProblemError::BadDimension {
                    what: "head_dim",
                    value: hd,
                    fix: "head_dim must be a positive even number (rotary embeddings rotate \
                          pairs)",
                });
            }
        } else if !self.hidden_size.is_multiple_of(self.num_attention_heads)
            || !self.head_dim().is_multiple_of(2)
        {
            return Err(ProblemError::BadDimension {
                what: "hidden_size",
                value: self.hidden_size,
                fix: "hidden_size must be num_attention_heads × an even head size",
            });
        }
        if !self
            .num_attention_heads
            .is_multiple_of(self.num_key_value_heads)
        {
            return Err(ProblemError::BadDimension {
                what: "num_key_value_heads",
                value: self.num_key_value_heads,
                fix: "num_attention_heads must be a multiple of num_key_value_heads",
            });
        }
        if self.num_hidden_layers > MAX_LAYERS {
            return Err(ProblemError::BadDimension {
                what: "num_hidden_layers",
                value: self.num_hidden_layers,
                fix: "use at most 10000 layers (published Qwen2 models have 24 to 80)",
            });
        }
        // Token ids are i32 program inputs.
        if i32::try_from(self.vocab_size).is_err() {
            return Err(ProblemError::BadDimension {
                what: "vocab_size",
                value: self.vocab_size,
                fix: "use a vocabulary below 2^31 tokens (token ids are i32 in the program)",
            });
        }
        let eps = self.rms_norm_eps as f32;
        if !(self.rms_norm_eps.is_finite() && eps.is_finite() && eps > 0.0) {
            return Err(ProblemError::BadSetting {
                what: "rms_norm_eps",
                value: self.rms_norm_eps.to_string(),
                fix: "use a small positive number that f32 can hold, e.g. 1e-6 (what \
                      published Qwen2 models use); zero or negative makes the forward NaN",
            });
        }
        // The rotary frequencies theta^(-2i/hd) must be finite f32 numbers; the extreme
        // ones are i = 0 (always 1) and the last.
        let hd = self.head_dim() as f64;
        let last = 1.0 / self.rope_theta.powf((hd - 2.0) / hd);
        if !(self.rope_theta.is_finite()
            && self.rope_theta > 0.0
            && (last as f32).is_finite()
            && last as f32 > 0.0)
        {
            return Err(ProblemError::BadSetting {
                what: "rope_theta",
                value: self.rope_theta.to_string(),
                fix: "use a positive rotary base, e.g. 10000 or 1000000 (what published \
                      Qwen2 models use); zero or negative makes the forward NaN",
            });
        }
        self.rope_scaling.validate()?;
        Ok(())
    }

    /// Every leaf path with its shape, in the checkpoint's naming (sorted as the tree
    /// orders them is not guaranteed here; see [`ParamTree::leaf_paths`]).
    pub fn param_shapes(&self) -> Vec<(String, Vec<usize>)> {
        let (v, d, i) = (self.vocab_size, self.hidden_size, self.intermediate_size);
        let hd = self.head_dim();
        let (qd, kvd) = (self.num_attention_heads * hd, self.num_key_value_heads * hd);
        let mut out = vec![
            ("model.embed_tokens.weight".to_string(), vec![v, d]),
            ("model.norm.weight".to_string(), vec![d]),
        ];
        if !self.tie_word_embeddings {
            out.push(("lm_head.weight".to_string(), vec![v, d]));
        }
        for l in 0..self.num_hidden_layers {
            let p = format!("model.layers.{l}");
            let entries: [(&str, Vec<usize>); 12] = [
                ("input_layernorm.weight", vec![d]),
                ("post_attention_layernorm.weight", vec![d]),
                ("self_attn.q_proj.weight", vec![qd, d]),
                ("self_attn.q_proj.bias", vec![qd]),
                ("self_attn.k_proj.weight", vec![kvd, d]),
                ("self_attn.k_proj.bias", vec![kvd]),
                ("self_attn.v_proj.weight", vec![kvd, d]),
                ("self_attn.v_proj.bias", vec![kvd]),
                ("self_attn.o_proj.weight", vec![d, qd]),
                ("mlp.gate_proj.weight", vec![i, d]),
                ("mlp.up_proj.weight", vec![i, d]),
                ("mlp.down_proj.weight", vec![d, i]),
            ];
            for (name, shape) in entries {
                if !self.attention_bias && name.ends_with(".bias") {
                    continue;
                }
                out.push((format!("{p}.{name}"), shape));
            }
        }
        out
    }

    /// Random parameters: matrices and biases `normal · std`, norm weights `1 + normal · std`
    /// (so tests see non-trivial norm scales). Leaf `q` of [`Self::param_shapes`] is drawn
    /// from `fold_in(key, q)`.
    pub fn init(&self, key: Key, std: f32) -> Result<ParamTree, ProblemError> {
        self.validate()?;
        let mut named = Vec::new();
        for (q, (path, shape)) in (0u32..).zip(self.param_shapes()) {
            let z = normal(fold_in(key, q), &shape)?;
            let norm = path.ends_with("layernorm.weight") || path == "model.norm.weight";
            let data = z
                .into_iter()
                .map(|z| if norm { 1.0 + z * std } else { z * std })
                .collect();
            named.push((path, Array::new(shape, data)?));
        }
        Ok(ParamTree::from_paths(named)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_validate_and_tiny_tree_mirrors_hf_names() {
        for c in [
            Qwen2Config::tiny(),
            Qwen2Config::qwen2_5_0_5b(),
            Qwen2Config::qwen2_5_1_5b(),
        ] {
            c.validate().expect("published configs are consistent");
        }
        assert_eq!(Qwen2Config::qwen2_5_0_5b().head_dim(), 64);
        assert_eq!(Qwen2Config::qwen2_5_1_5b().head_dim(), 128);
        let t = Qwen2Config::tiny()
            .init(Key::from_data([0, 1]), 0.02)
            .expect("tiny init");
        let paths = t.leaf_paths();
        assert!(paths.contains(&"model.layers.1.self_attn.k_proj.bias".to_string()));
        assert!(!paths.iter().any(|p| p.starts_with("lm_head")));
        assert_eq!(
            t.get("model.layers.0.self_attn.o_proj.weight")
                .map(|a| a.shape().to_vec()),
            Some(vec![32, 32])
        );
        assert_eq!(
            t.get("model.layers.0.self_attn.k_proj.weight")
                .map(|a| a.shape().to_vec()),
            Some(vec![16, 32])
        );
    }

    #[test]
    fn bad_configs_name_the_field() {
        let mut c = Qwen2Config::tiny();
        c.num_key_value_heads = 3;
        let e = c.validate().expect_err("4 heads over 3 kv heads");
        assert!(e.to_string().contains("num_key_value_heads"), "{e}");
        let e = Qwen2Config::by_size("huge").expect_err("no such preset");
        assert!(e.to_string().contains("size = \"huge\""), "{e}");
        assert!(!e.to_string().contains("size = 0"), "{e}");
        for (edit, what) in [
            (
                (|c: &mut Qwen2Config| c.rms_norm_eps = -1.0) as fn(&mut Qwen2Config),
                "rms_norm_eps = -1",
            ),
            (|c| c.rms_norm_eps = 0.0, "rms_norm_eps = 0"),
            (|c| c.rms_norm_eps = 1e-50, "rms_norm_eps"),
            (|c| c.rms_norm_eps = f64::NAN, "rms_norm_eps = NaN"),
            (|c| c.rms_norm_eps = 1e300, "rms_norm_eps"),
            (|c| c.rope_theta = 0.0, "rope_theta = 0"),
            (|c| c.rope_theta = -10.0, "rope_theta = -10"),
            (|c| c.rope_theta = f64::INFINITY, "rope_theta = inf"),
            (|c| c.rope_theta = 1e-300, "rope_theta"),
            (|c| c.num_hidden_layers = 1_000_000_000, "num_hidden_layers"),
            (|c| c.vocab_size = 1 << 40, "vocab_size"),
            (|c| c.hidden_size = 30, "hidden_size"),
            (|c| c.num_attention_heads = 0, "num_attention_heads = 0"),
        ] {
            let mut c = Qwen2Config::tiny();
            edit(&mut c);
            let e = c.validate().expect_err(what);
            assert!(e.to_string().contains(what), "{what}: {e}");
        }
    }
}
