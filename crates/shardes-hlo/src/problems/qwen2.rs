//! Qwen2 / Qwen2.5 decoder-only language models through the ES seams.
//!
//! The parameter tree mirrors the Hugging Face checkpoint names and layout (weights stored
//! `(out, in)`, no transposition), so a checkpoint's tensors load leaf for leaf:
//!
//! ```text
//! model.embed_tokens.weight                      (V, d)
//! model.layers.{i}.input_layernorm.weight        (d)
//! model.layers.{i}.self_attn.{q,k,v}_proj.weight (H·hd | KV·hd, d)   + .bias
//! model.layers.{i}.self_attn.o_proj.weight       (d, H·hd)
//! model.layers.{i}.post_attention_layernorm.weight (d)
//! model.layers.{i}.mlp.{gate,up}_proj.weight     (I, d)
//! model.layers.{i}.mlp.down_proj.weight          (d, I)
//! model.norm.weight                              (d)
//! lm_head.weight                                 (V, d)   only when embeddings are untied
//! ```
//!
//! The forward is the Hugging Face one: RMSNorm (`x · rsqrt(mean(x²) + eps) · w`), rotary
//! embeddings with the `rotate_half` convention, grouped-query attention (query head `h`
//! reads KV head `h / (H / KV)`), a causal mask, a SwiGLU MLP and, with tied embeddings, the
//! token table read through [`nn::embed`] on the way in and through [`nn::dense`] as the LM
//! head. Every 2-D leaf goes through a seam, so under a low-rank strategy no member ever
//! holds a perturbed `(V, d)` or `(out, in)` matrix; norm weights and biases are 1-D and are
//! read with [`ModelParams::tensor`].
//!
//! The loss is the teacher-forced next-token NLL: `targets[b, t]` is the token that should
//! follow position `t`, `mask[b, t]` is 1 where it counts, and the loss is
//! `Σ mask · (logsumexp(logits) − logits[target]) / max(Σ mask, 1)`, computed in f32.

use crate::builder::{DType, Func, Module, TensorType, Value};
use crate::es::{EsError, Model, ModelParams};
use crate::nn::{self, Act, Weight};
use crate::params::ParamTree;

use super::ProblemError;

/// The decoder's hyperparameters and their checks, its leaves and random parameters.
mod config;
/// Qwen2 as a [`crate::decode::Decoder`] (prefill and step over a KV cache).
pub mod decode;
/// The decoder layers as one `while` over the layer index ([`Layers::Loop`]).
mod layers;

pub use config::{Qwen2Config, RopeScaling, MAX_LAYERS};

/// A Qwen2 problem: the model plus the batch geometry and the compute dtype.
#[derive(Debug, Clone, PartialEq)]
pub struct Qwen2 {
    /// Hyperparameters.
    pub config: Qwen2Config,
    /// Sequences per batch.
    pub batch: usize,
    /// Tokens per sequence.
    pub seq: usize,
    /// The dtype the forward runs in (`F32` or `BF16`); the loss is always reduced in f32.
    pub compute_dtype: DType,
    /// How the decoder layers are emitted (unrolled by default).
    pub layers: Layers,
}

/// How a Qwen2 program emits its decoder layers (config key `problem.layers`).
///
/// Both run the same ops on the same values, layer by layer, and decode the same tokens;
/// the loop compiles one layer's ops whatever the depth. Fitness and updates are the same
/// bits, except under mirrored low rank on one device, where LLVM forms fused
/// multiply-adds differently in the unrolled kernels than in the loop body and a loss can
/// differ in its last bits (measured: at most 3 ulp, `tests/suite/qwen2_layers.rs`); the
/// unrolled program stays the default so that existing runs reproduce bit for bit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Layers {
    /// One `while` over the layer index. The ES programs hold each layer leaf name as one
    /// `[L, …]` argument on the devices (checkpoints and the tree keep the per-layer
    /// tensors), the body reads layer `i`'s rows, and under low-rank strategies the noise
    /// is drawn and contracted in loops over the layer index too
    /// ([`crate::es::Model::layers`]), so the generation's compile time is nearly flat in
    /// depth and a leaf name's update is one kernel for every layer (docs/performance.md,
    /// "Qwen2 layers as a loop").
    Loop,
    /// Every layer's ops emitted one after the other (compile time grows with depth).
    #[default]
    Unrolled,
}

impl Layers {
    /// The config names, in the order [`Layers::parse`] lists them.
    pub const NAMES: [&'static str; 2] = ["loop", "unrolled"];

    /// Parses `"loop"` or `"unrolled"`.
    pub fn parse(s: &str) -> Result<Self, ProblemError> {
        match s {
            "loop" => Ok(Layers::Loop),
            "unrolled" => Ok(Layers::Unrolled),
            _ => Err(ProblemError::BadSetting {
                what: "layers",
                value: format!("\"{}\"", crate::es::spec::excerpt(s)),
                fix: "use layers = \"loop\" (one while over the layer index) or \
                      \"unrolled\" (every layer emitted in turn, the default)",
            }),
        }
    }

    /// The config name.
    pub fn name(self) -> &'static str {
        match self {
            Layers::Loop => "loop",
            Layers::Unrolled => "unrolled",
        }
    }
}

impl Qwen2 {
    /// A problem in f32, its layers unrolled ([`Layers`] says why).
    pub fn new(config: Qwen2Config, batch: usize, seq: usize) -> Self {
        Qwen2 {
            config,
            batch,
            seq,
            compute_dtype: DType::F32,
            layers: Layers::Unrolled,
        }
    }

    /// Emits the decoder layers as `layers` says.
    pub fn with_layers(mut self, layers: Layers) -> Self {
        self.layers = layers;
        self
    }

    /// Runs the forward in `dtype` (parameters and noise stay f32 in the master). Under an
    /// ES prefer [`crate::es::ShardedES::with_compute_dtype`], which runs this forward in
    /// bf16 too and rounds the noise once, so `apply` and `tell` see the same bf16 noise;
    /// set here alone, the forward rounds each perturbed weight itself.
    pub fn with_compute_dtype(mut self, dtype: DType) -> Self {
        self.compute_dtype = dtype;
        self
    }

    /// This model in the dtype `p` is given in, where the ES's compute dtype
    /// ([`ModelParams::compute_dtype`]) is narrower than the model's own.
    fn following(&self, p: &ModelParams) -> Option<Qwen2> {
        let dt = p.compute_dtype();
        (dt != DType::F32 && dt != self.compute_dtype).then(|| self.clone().with_compute_dtype(dt))
    }
}

// ---------------------------------------------------------------------------------------
// Act helpers for reshapes that keep the member axis in front
// ---------------------------------------------------------------------------------------

fn rewrap(like: &Act, v: Value) -> Result<Act, EsError> {
    Ok(match like.members() {
        Some(_) => Act::per_member(v)?,
        None => Act::shared(v),
    })
}

fn reshape(a: &Act, logical: &[i64]) -> Result<Act, EsError> {
    let mut shape: Vec<i64> = a.members().into_iter().collect();
    shape.extend_from_slice(logical);
    rewrap(a, a.value().reshape(&shape)?)
}

fn transpose(a: &Act, perm: &[usize]) -> Result<Act, EsError> {
    let off = usize::from(a.members().is_some());
    let mut full: Vec<usize> = (0..off).collect();
    full.extend(perm.iter().map(|p| p + off));
    rewrap(a, a.value().transpose(&full)?)
}

/// `[.., KV, s, hd] → [.., KV·rep, s, hd]` with query head `h` reading KV head `h / rep`.
fn repeat_kv(a: &Act, rep: i64) -> Result<Act, EsError> {
    if rep == 1 {
        return Ok(a.clone());
    }
    let v = a.value();
    let r = v.rank();
    let s = v.shape();
    let mut big: Vec<i64> = s[..r - 2].to_vec();
    big.push(rep);
    big.extend_from_slice(&s[r - 2..]);
    let mut dims: Vec<usize> = (0..r - 2).collect();
    dims.extend([r - 1, r]);
    let b = v.broadcast_in_dim(&big, &dims)?;
    let mut out: Vec<i64> = s[..r - 3].to_vec();
    out.push(s[r - 3] * rep);
    out.extend_from_slice(&s[r - 2..]);
    rewrap(a, b.reshape(&out)?)
}

fn convert(a: &Act, dtype: DType) -> Result<Act, EsError> {
    if a.dtype() == dtype {
        return Ok(a.clone());
    }
    rewrap(a, a.value().convert(dtype)?)
}

fn convert_weight(w: Weight, dtype: DType) -> Result<Weight, EsError> {
    if dtype == DType::F32 {
        return Ok(w);
    }
    let c = |v: Value| v.convert(dtype);
    Ok(match w {
        Weight::Plain(v) => Weight::Plain(c(v)?),
        Weight::Members(v) => Weight::Members(c(v)?),
        Weight::LowRank { base, a, b, scale } => Weight::LowRank {
            base: c(base)?,
            a: c(a)?,
            b: c(b)?,
            scale: c(scale)?,
        },
        Weight::InOut(w) => Weight::InOut(Box::new(convert_weight(*w, dtype)?)),
    })
}

/// Rotary tables `(cos, sin)`, each `[s, hd]`, for positions `pos0 + 0..s`, in f32.
fn rope_tables(
    f: &Func,
    pos0: &Value,
    s: i64,
    inv_freq: &[f32],
) -> Result<(Value, Value), EsError> {
    let half = inv_freq.len() as i64;
    let inv = f.constant(&[half], inv_freq)?;
    let pos = f
        .iota(TensorType::i32(&[s]), 0)?
        .add(&pos0.broadcast_in_dim(&[s], &[])?)?
        .convert(DType::F32)?;
    let freqs = pos
        .broadcast_in_dim(&[s, half], &[0])?
        .mul(&inv.broadcast_in_dim(&[s, half], &[1])?)?;
    let emb = f.concatenate(&[&freqs, &freqs], 1)?;
    Ok((emb.cos()?, emb.sin()?))
}

/// `x · cos + rotate_half(x) · sin` over the last axis, `rotate_half(x) = [-x2, x1]`.
fn apply_rope(x: &Act, cos: &Act, sin: &Act) -> Result<Act, EsError> {
    let rot = x.map(|v| {
        let r = v.rank() - 1;
        let hd = v.shape()[r];
        let x1 = v.slice_in_dim(0, hd / 2, r)?;
        let x2 = v.slice_in_dim(hd / 2, hd, r)?;
        v.func().concatenate(&[&x2.neg()?, &x1], r)
    })?;
    Ok(x.mul(cos)?.add(&rot.mul(sin)?)?)
}

/// A per-layer KV cache, `[b, KV, T, hd]` each, for the decoding program.
struct LayerCache {
    k: Value,
    v: Value,
}

impl Qwen2 {
    fn weight(&self, p: &ModelParams, path: &str) -> Result<Weight, EsError> {
        convert_weight(p.weight(path)?, self.compute_dtype)
    }

    fn tensor(&self, p: &ModelParams, path: &str) -> Result<Act, EsError> {
        convert(&p.tensor(path)?, self.compute_dtype)
    }

    fn rms_norm(&self, x: &Act, w: &Act) -> Result<Act, EsError> {
        // Hugging Face normalises in f32 whatever the compute dtype, then scales in it.
        let x32 = convert(x, DType::F32)?;
        let ms = x32
            .mul(&x32)?
            .mean_last()?
            .add_scalar(self.config.rms_norm_eps)?;
        let n = convert(&x32.mul(&ms.map(|v| v.rsqrt())?)?, self.compute_dtype)?;
        Ok(n.mul(w)?)
    }

    /// Self-attention of one layer on `h` (`[b, s, d]`) at positions `pos0 + 0..s`. With a
    /// cache, the new keys/values are written at `pos0` and attention reads the whole cache
    /// (slots past `pos0 + i` masked).
    fn attention(
        &self,
        p: &ModelParams,
        l: usize,
        h: &Act,
        pos0: &Value,
        cache: Option<&mut LayerCache>,
    ) -> Result<Act, EsError> {
        let c = &self.config;
        let pre = format!("model.layers.{l}.self_attn");
        let (nh, nkv, hd) = (
            c.num_attention_heads as i64,
            c.num_key_value_heads as i64,
            c.head_dim() as i64,
        );
        let lg = h.logical_shape();
        let (b, s) = (lg[0], lg[1]);
        let proj = |name: &str| -> Result<Act, EsError> {
            let y = nn::dense(h, &self.weight(p, &format!("{pre}.{name}_proj.weight"))?)?;
            if !c.attention_bias {
                return Ok(y);
            }
            Ok(y.add(&self.tensor(p, &format!("{pre}.{name}_proj.bias"))?)?)
        };
        let heads = |a: Act, n: i64| -> Result<Act, EsError> {
            transpose(&reshape(&a, &[b, s, n, hd])?, &[0, 2, 1, 3])
        };
        let q = heads(proj("q")?, nh)?;
        let k = heads(proj("k")?, nkv)?;
        let v = heads(proj("v")?, nkv)?;
        let f = h.value().func();
        let (cos, sin) = rope_tables(&f, pos0, s, &c.inv_freq())?;
        let cos = convert(&Act::shared(cos), self.compute_dtype)?;
        let sin = convert(&Act::shared(sin), self.compute_dtype)?;
        let q = apply_rope(&q, &cos, &sin)?;
        let k = apply_rope(&k, &cos, &sin)?;
        let (k, v) = match cache {
            Some(cache) => {
                let zero = f.scalar(0i32)?;
                let starts = [&zero, &zero, pos0, &zero];
                cache.k = cache.k.dynamic_update_slice(k.value(), &starts)?;
                cache.v = cache.v.dynamic_update_slice(v.value(), &starts)?;
                (Act::shared(cache.k.clone()), Act::shared(cache.v.clone()))
            }
            None => (k, v),
        };
        let sk = k.logical_shape()[2];
        let k = repeat_kv(&k, nh / nkv)?;
        let v = repeat_kv(&v, nh / nkv)?;
        let scores = q.bmm(&k, true)?.scale(1.0 / (hd as f64).sqrt())?;
        // Query i sits at pos0 + i and may read key slot j iff j <= pos0 + i.
        let qi = f
            .iota(TensorType::i32(&[s, sk]), 0)?
            .add(&pos0.broadcast_in_dim(&[s, sk], &[])?)?;
        let kj = f.iota(TensorType::i32(&[s, sk]), 1)?;
        let dt = self.compute_dtype;
        let bias = kj.le(&qi)?.select(
            &f.full(0.0f32, &[s, sk])?.convert(dt)?,
            &f.full(f32::NEG_INFINITY, &[s, sk])?.convert(dt)?,
        )?;
        let a = scores.add(&Act::shared(bias))?.softmax_last()?;
        let o = transpose(&a.bmm(&v, false)?, &[0, 2, 1, 3])?;
        let o = reshape(&o, &[b, s, nh * hd])?;
        Ok(nn::dense(
            &o,
            &self.weight(p, &format!("{pre}.o_proj.weight"))?,
        )?)
    }

    fn mlp(&self, p: &ModelParams, l: usize, h: &Act) -> Result<Act, EsError> {
        let pre = format!("model.layers.{l}.mlp");
        let gate = nn::dense(h, &self.weight(p, &format!("{pre}.gate_proj.weight"))?)?;
        let up = nn::dense(h, &self.weight(p, &format!("{pre}.up_proj.weight"))?)?;
        let silu = gate.mul(&gate.map(|v| v.logistic())?)?;
        Ok(nn::dense(
            &silu.mul(&up)?,
            &self.weight(p, &format!("{pre}.down_proj.weight"))?,
        )?)
    }

    /// Decoder layer `l` on the hidden states `x`: attention and MLP, each with its norm
    /// and residual.
    fn layer(
        &self,
        p: &ModelParams,
        l: usize,
        x: &Act,
        pos0: &Value,
        cache: Option<&mut LayerCache>,
    ) -> Result<Act, EsError> {
        let pre = format!("model.layers.{l}");
        let h = self.rms_norm(
            x,
            &self.tensor(p, &format!("{pre}.input_layernorm.weight"))?,
        )?;
        let x = x.add(&self.attention(p, l, &h, pos0, cache)?)?;
        let h = self.rms_norm(
            &x,
            &self.tensor(p, &format!("{pre}.post_attention_layernorm.weight"))?,
        )?;
        Ok(x.add(&self.mlp(p, l, &h)?)?)
    }

    fn forward_impl(
        &self,
        p: &ModelParams,
        ids: &Value,
        pos0: &Value,
        mut caches: Option<&mut [LayerCache]>,
    ) -> Result<Act, EsError> {
        let emb = self.weight(p, "model.embed_tokens.weight")?;
        let mut x = nn::embed(&emb, &Act::shared(ids.clone()))?;
        // The KV-cache greedy program keeps one cache per layer and stays unrolled.
        let looped = match (&caches, self.layers) {
            (None, Layers::Loop) => {
                self.loop_layers(p, x.clone(), &|lp, l, x| self.layer(lp, l, x, pos0, None))?
            }
            _ => None,
        };
        match looped {
            Some(y) => x = y,
            None => {
                for l in 0..self.config.num_hidden_layers {
                    let cache = caches.as_deref_mut().and_then(|c| c.get_mut(l));
                    x = self.layer(p, l, &x, pos0, cache)?;
                }
            }
        }
        let x = self.rms_norm(&x, &self.tensor(p, "model.norm.weight")?)?;
        let head = if self.config.tie_word_embeddings {
            emb
        } else {
            self.weight(p, "lm_head.weight")?
        };
        Ok(nn::dense(&x, &head)?)
    }

    /// Logits `[b, s, V]` (per member when the parameters are perturbed) for token ids
    /// `i32[b, s]` at positions `0..s`, in the compute dtype.
    pub fn forward(&self, p: &ModelParams, ids: &Value) -> Result<Act, EsError> {
        let pos0 = ids.func().scalar(0i32)?;
        self.forward_impl(p, ids, &pos0, None)
    }

    /// The masked next-token NLL of `logits` (`[b, s, V]`), reduced in f32.
    pub fn nll(logits: &Act, targets: &Value, mask: &Value) -> Result<Act, EsError> {
        let logits = convert(logits, DType::F32)?;
        let lg = logits.logical_shape().to_vec();
        let (b, s, v) = (lg[0], lg[1], lg[2]);
        let f = targets.func();
        let m = logits.max_last()?;
        let lse = logits
            .sub(&m)?
            .map(|x| x.exp())?
            .sum_last()?
            .map(|x| x.log())?
            .add(&m)?;
        let onehot = f
            .iota(TensorType::i32(&[b, s, v]), 2)?
            .eq(&targets.broadcast_in_dim(&[b, s, v], &[0, 1])?)?
            .select(&f.full(1.0f32, &[b, s, v])?, &f.full(0.0f32, &[b, s, v])?)?;
        let picked = logits.mul(&Act::shared(onehot))?.sum_last()?;
        let tok = reshape(&lse.sub(&picked)?, &[b, s])?;
        let masked = tok.mul(&Act::shared(mask.clone()))?;
        let count = mask.reduce_sum(&[0, 1])?.max(&f.scalar(1.0f32)?)?;
        // mean over b·s, rescaled to a mean over the counted tokens.
        let scale = f.scalar((b * s) as f32)?.div(&count)?;
        Ok(masked.mean_all()?.mul(&Act::shared(scale))?)
    }
}

impl Model for Qwen2 {
    fn batch_types(&self) -> Vec<(String, TensorType)> {
        let shape = [self.batch as i64, self.seq as i64];
        vec![
            ("ids".into(), TensorType::i32(&shape)),
            ("targets".into(), TensorType::i32(&shape)),
            ("mask".into(), TensorType::f32(&shape)),
        ]
    }

    fn loss(&self, p: &ModelParams, batch: &[Value]) -> Result<Act, EsError> {
        if let Some(q) = self.following(p) {
            return q.loss(p, batch);
        }
        let [ids, targets, mask] = batch else {
            return Err(EsError::Invalid {
                message: format!("qwen2 takes 3 batch arrays, got {}", batch.len()),
                fix: "pass ids (i32[b, s]), targets (i32[b, s]) and mask (f32[b, s])".into(),
            });
        };
        let logits = self.forward(p, ids)?;
        Self::nll(&logits, targets, mask)
    }

    fn layers(&self) -> Option<crate::es::LayerLeaves> {
        self.layer_leaves()
    }

    /// The widest activation per token is the hidden state, the MLP's intermediate or the
    /// logits, counted at 4 bytes (the logits and the loss are f32 in either dtype).
    fn member_bytes(&self) -> Option<usize> {
        let c = &self.config;
        let width = c.hidden_size.max(c.intermediate_size).max(c.vocab_size);
        // Saturating: a config too large to run must not wrap to a small chunk size.
        Some(
            self.batch
                .saturating_mul(self.seq)
                .saturating_mul(width)
                .saturating_mul(4),
        )
    }
}

// ---------------------------------------------------------------------------------------
// Stand-alone programs: logits and greedy decoding (unperturbed parameters)
// ---------------------------------------------------------------------------------------

fn plain_params(f: &Func, tree: &ParamTree) -> Result<(ModelParams<'static>, usize), EsError> {
    let mut leaves = Vec::new();
    for (path, a) in tree.leaves() {
        let shape: Vec<i64> = a.shape().iter().map(|&d| d as i64).collect();
        leaves.push((path.clone(), f.arg(&path, TensorType::f32(&shape))?));
    }
    let n = leaves.len();
    Ok((ModelParams::plain(leaves), n))
}

impl Qwen2 {
    /// A one-device program `(leaves..., ids i32[b, s]) -> logits f32[b, s, V]`, leaves in
    /// `tree`'s order (only their shapes are used).
    pub fn logits_program(&self, tree: &ParamTree) -> Result<Module, EsError> {
        let mut m = Module::new("qwen2_logits");
        let f = m.func("main");
        let (p, _) = plain_params(&f, tree)?;
        let ids = f.arg(
            "ids",
            TensorType::i32(&[self.batch as i64, self.seq as i64]),
        )?;
        let logits = convert(&self.forward(&p, &ids)?, DType::F32)?;
        f.output(logits.value())?;
        m.add(f.finish()?)?;
        Ok(m)
    }

    /// A one-device greedy decoding program `(leaves..., prompt i32[b, P]) -> tokens
    /// i32[b, max_new]`: one prefill over the prompt fills a KV cache of `P + max_new`
    /// slots, then a `while` loop feeds back one argmax token per step.
    pub fn greedy_program(
        &self,
        tree: &ParamTree,
        prompt_len: usize,
        max_new: usize,
    ) -> Result<Module, EsError> {
        if prompt_len == 0 || max_new == 0 {
            return Err(EsError::Invalid {
                message: format!(
                    "greedy decoding with prompt_len {prompt_len} and max_new {max_new}"
                ),
                fix: "use a non-empty prompt and at least one new token".into(),
            });
        }
        let c = &self.config;
        let (b, pl, mn) = (self.batch as i64, prompt_len as i64, max_new as i64);
        let (nkv, hd) = (c.num_key_value_heads as i64, c.head_dim() as i64);
        let total = pl + mn;
        let mut m = Module::new("qwen2_greedy");
        let f = m.func("main");
        let (p, _) = plain_params(&f, tree)?;
        let prompt = f.arg("prompt", TensorType::i32(&[b, pl]))?;
        let dt = self.compute_dtype;
        let mut caches = Vec::new();
        for _ in 0..c.num_hidden_layers {
            let z = f.full(0.0f32, &[b, nkv, total, hd])?.convert(dt)?;
            caches.push(LayerCache { k: z.clone(), v: z });
        }
        let zero = f.scalar(0i32)?;
        let last = |logits: &Act, s: i64| -> Result<Value, EsError> {
            let v = logits.value().slice_in_dim(s - 1, s, 1)?;
            Ok(v.argmax(2)?)
        };
        let logits = self.forward_impl(&p, &prompt, &zero, Some(&mut caches))?;
        let tok = last(&logits, pl)?;
        let tokens = f
            .full(0i32, &[b, mn])?
            .dynamic_update_slice(&tok, &[&zero, &zero])?;
        let mut init: Vec<&Value> = vec![&tok, &tokens];
        for cache in &caches {
            init.push(&cache.k);
            init.push(&cache.v);
        }
        let layers = c.num_hidden_layers;
        let out = f.fori_loop(1, mn as i32, &init, |i, carry| {
            let pos0 = i.add(&f.scalar(pl as i32 - 1)?)?;
            let mut caches: Vec<LayerCache> = (0..layers)
                .map(|l| LayerCache {
                    k: carry[2 + 2 * l].clone(),
                    v: carry[3 + 2 * l].clone(),
                })
                .collect();
            let logits = self.forward_impl(&p, &carry[0], &pos0, Some(&mut caches))?;
            let tok = last(&logits, 1)?;
            let z = f.scalar(0i32)?;
            let tokens = carry[1].dynamic_update_slice(&tok, &[&z, i])?;
            let mut next = vec![tok, tokens];
            for cache in caches {
                next.push(cache.k);
                next.push(cache.v);
            }
            Ok::<_, EsError>(next)
        })?;
        f.output(&out[1])?;
        m.add(f.finish()?)?;
        Ok(m)
    }
}
