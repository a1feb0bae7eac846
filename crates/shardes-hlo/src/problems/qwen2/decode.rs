//! Qwen2 as a [`crate::decode::Decoder`]: a prefill over the padded prompt and one-token
//! steps over a per-layer KV cache (`[R, KV, S, hd]` each for keys and values, per member
//! where the parameters are, in the compute dtype), every 2-D weight read through the
//! seams.
//!
//! The arithmetic is the forward's (`Qwen2::forward`): the same RMSNorm, RoPE tables
//! (positions as f32 times the inverse frequencies), projections, softmax and MLP; a step
//! rotates each row at its own position and attends grouped-query style (the query heads
//! of one KV head as rows of one product, so the cache is never repeated per head).

use crate::builder::{DType, Func, TensorType, Value};
use crate::decode::{DecodeShape, Decoder, StepAt};
use crate::es::{EsError, ModelParams};
use crate::nn::{self, Act};

use super::layers::{layer_of, put_layer, with_members, LayerStack};
use super::{apply_rope, convert, repeat_kv, reshape, rewrap, rope_tables, transpose, Qwen2};

/// The error of a looped step handed an unstacked cache.
fn stacked_cache_err() -> EsError {
    EsError::Invalid {
        message: "a qwen2 step with layers = \"loop\" takes the stacked keys and values \
                  (two cache tensors)"
            .into(),
        fix: "pass the cache the prefill returned, built with the same layers setting".into(),
    }
}

/// The keys and values a step's attention reads and writes its token into: one layer's
/// (`[R, KV, S, hd]` each), or the `[L, …]` stacks of a layer loop at layer `i`. The
/// stacks are only read inside the loop: the layer's slice is cut out and the token
/// written into that slice, and the step writes every layer's token into the stacks once,
/// after the loop. An update of the stacks inside the loop, with the slice read after it,
/// gives the same values, but newer XLA:CPUs (jax 0.11's) then copy the whole stack twice
/// a layer to keep the read and the in-place write apart.
enum StepCache<'a> {
    Layer(Act, Act),
    Stack { k: Act, v: Act, i: &'a Value },
}

/// `a` with the members of `like` (broadcast if `a` is shared and `like` is not).
fn members_like(a: &Act, like: &Act) -> Result<Act, EsError> {
    match (a.members(), like.members()) {
        (None, Some(c)) => {
            let mut shape = vec![c];
            shape.extend_from_slice(a.value().shape());
            let dims: Vec<usize> = (1..shape.len()).collect();
            Ok(Act::per_member(a.value().broadcast_in_dim(&shape, &dims)?)?)
        }
        _ => Ok(a.clone()),
    }
}

/// Sums the logical axis `axis` of `a` away.
fn sum_axis(a: &Act, axis: usize) -> Result<Act, EsError> {
    let off = usize::from(a.members().is_some());
    rewrap(a, a.value().reduce_sum(&[axis + off])?)
}

/// Rotary tables `(cos, sin)`, each `[R, hd]` f32, for per-row positions `pos` (i32 `[R]`):
/// the same arithmetic as [`rope_tables`] row by row.
fn rope_rows(f: &Func, pos: &Value, inv_freq: &[f32]) -> Result<(Value, Value), EsError> {
    let r = pos.shape()[0];
    let half = inv_freq.len() as i64;
    let inv = f.constant(&[half], inv_freq)?;
    let pos = pos.convert(DType::F32)?;
    let freqs = pos
        .broadcast_in_dim(&[r, half], &[0])?
        .mul(&inv.broadcast_in_dim(&[r, half], &[1])?)?;
    let emb = f.concatenate(&[&freqs, &freqs], 1)?;
    Ok((emb.cos()?, emb.sin()?))
}

/// Zeros for every layer's token of a `[L, R, KV, S, hd]` cache stack: `[L, R, KV, 1, hd]`,
/// held as the stack is.
fn token_stack(stack: &Act) -> Result<Act, EsError> {
    let v = stack.value();
    let mut shape = v.shape().to_vec();
    let r = shape.len();
    shape[r - 2] = 1;
    let z = v.func().scalar(0.0f32)?.convert(v.dtype())?;
    rewrap(stack, z.broadcast_in_dim(&shape, &[])?)
}

/// `stack` with every layer's token (`tokens`, from [`token_stack`]) written at `slot`.
fn write_tokens(stack: &Act, tokens: &Act, slot: &Value) -> Result<Act, EsError> {
    let tokens = with_members(tokens, stack.members())?;
    let zero = slot.func().scalar(0i32)?;
    let mut starts = vec![zero; stack.value().rank()];
    let r = starts.len();
    starts[r - 2] = slot.clone();
    let refs: Vec<&Value> = starts.iter().collect();
    rewrap(
        stack,
        stack.value().dynamic_update_slice(tokens.value(), &refs)?,
    )
}

impl Qwen2 {
    /// The q, k and v projections of `h` (`[R, s, d]`) as heads `[R, n, s, hd]`.
    fn qkv(&self, p: &ModelParams, l: usize, h: &Act) -> Result<[Act; 3], EsError> {
        let c = &self.config;
        let pre = format!("model.layers.{l}.self_attn");
        let hd = c.head_dim() as i64;
        let lg = h.logical_shape();
        let (b, s) = (lg[0], lg[1]);
        let proj = |name: &str, n: usize| -> Result<Act, EsError> {
            let y = nn::dense(h, &self.weight(p, &format!("{pre}.{name}_proj.weight"))?)?;
            let y = if c.attention_bias {
                y.add(&self.tensor(p, &format!("{pre}.{name}_proj.bias"))?)?
            } else {
                y
            };
            transpose(&reshape(&y, &[b, s, n as i64, hd])?, &[0, 2, 1, 3])
        };
        Ok([
            proj("q", c.num_attention_heads)?,
            proj("k", c.num_key_value_heads)?,
            proj("v", c.num_key_value_heads)?,
        ])
    }

    /// `o_proj` of attention output heads `[R, H, s, hd]`.
    fn out_proj(&self, p: &ModelParams, l: usize, o: &Act) -> Result<Act, EsError> {
        let lg = o.logical_shape().to_vec();
        let (b, nh, s, hd) = (lg[0], lg[1], lg[2], lg[3]);
        let o = reshape(&transpose(o, &[0, 2, 1, 3])?, &[b, s, nh * hd])?;
        let w = self.weight(p, &format!("model.layers.{l}.self_attn.o_proj.weight"))?;
        Ok(nn::dense(&o, &w)?)
    }

    /// Self-attention of the prompt (positions `0..P`, causal): the output and the
    /// layer's keys and values padded to `slots`.
    fn prefill_attention(
        &self,
        p: &ModelParams,
        l: usize,
        h: &Act,
        slots: i64,
    ) -> Result<(Act, Act, Act), EsError> {
        let c = &self.config;
        let (nh, nkv, hd) = (
            c.num_attention_heads as i64,
            c.num_key_value_heads as i64,
            c.head_dim() as i64,
        );
        let s = h.logical_shape()[1];
        let [q, k, v] = self.qkv(p, l, h)?;
        let f = h.value().func();
        let zero = f.scalar(0i32)?;
        let (cos, sin) = rope_tables(&f, &zero, s, &c.inv_freq())?;
        let dt = self.compute_dtype;
        let cos = convert(&Act::shared(cos), dt)?;
        let sin = convert(&Act::shared(sin), dt)?;
        let q = apply_rope(&q, &cos, &sin)?;
        let k = apply_rope(&k, &cos, &sin)?;
        let scores = q
            .bmm(&repeat_kv(&k, nh / nkv)?, true)?
            .scale(1.0 / (hd as f64).sqrt())?;
        let qi = f.iota(TensorType::i32(&[s, s]), 0)?;
        let kj = f.iota(TensorType::i32(&[s, s]), 1)?;
        let bias = kj.le(&qi)?.select(
            &f.full(0.0f32, &[s, s])?.convert(dt)?,
            &f.full(f32::NEG_INFINITY, &[s, s])?.convert(dt)?,
        )?;
        let a = scores.add(&Act::shared(bias))?.softmax_last()?;
        let o = a.bmm(&repeat_kv(&v, nh / nkv)?, false)?;
        let pad = |x: &Act| -> Result<Act, EsError> {
            let r = x.value().rank();
            let mut high = vec![0i64; r];
            high[r - 2] = slots - s;
            let z = f.scalar(0.0f32)?.convert(dt)?;
            rewrap(x, x.value().pad(&z, &vec![0; r], &high, &vec![0; r])?)
        };
        Ok((self.out_proj(p, l, &o)?, pad(&k)?, pad(&v)?))
    }

    /// Self-attention of one token per row at `at`: the output and, for one layer's
    /// cache, the cache with the token's keys and values written in; for the stacks, the
    /// token's keys and values (`[R, KV, 1, hd]`), which the step writes in after the loop.
    fn step_attention(
        &self,
        p: &ModelParams,
        l: usize,
        h: &Act,
        at: &StepAt,
        cache: StepCache,
    ) -> Result<(Act, Act, Act), EsError> {
        let c = &self.config;
        let (nh, nkv, hd) = (
            c.num_attention_heads as i64,
            c.num_key_value_heads as i64,
            c.head_dim() as i64,
        );
        let rows = h.logical_shape()[0];
        let [q, k, v] = self.qkv(p, l, h)?;
        let f = h.value().func();
        let (cos, sin) = rope_rows(&f, &at.pos, &c.inv_freq())?;
        let dt = self.compute_dtype;
        let table = |t: Value| convert(&Act::shared(t.reshape(&[rows, 1, 1, hd])?), dt);
        let (cos, sin) = (table(cos)?, table(sin)?);
        let q = apply_rope(&q, &cos, &sin)?;
        let k = apply_rope(&k, &cos, &sin)?;
        let zero = f.scalar(0i32)?;
        // The token `x` ([R, KV, 1, hd]) written at the step's slot of `cache`, one layer's.
        let write = |cache: &Act, x: &Act| -> Result<Act, EsError> {
            let cache = members_like(cache, x)?;
            let x = members_like(x, &cache)?;
            let mut at_slot = vec![zero.clone(); cache.value().rank()];
            let r = at_slot.len();
            at_slot[r - 2] = at.slot.clone();
            let refs: Vec<&Value> = at_slot.iter().collect();
            rewrap(
                &cache,
                cache.value().dynamic_update_slice(x.value(), &refs)?,
            )
        };
        // The caches to return (the layer's, or the layer's token for the loop to stack),
        // and the layer's keys and values to attend over.
        let ((kc, vc), (kl, vl)) = match cache {
            StepCache::Layer(kc, vc) => {
                let (kc, vc) = (write(&kc, &k)?, write(&vc, &v)?);
                ((kc.clone(), vc.clone()), (kc, vc))
            }
            StepCache::Stack { k: ks, v: vs, i } => {
                // One select over the slice, not a slice then an update of it: XLA fuses
                // the cut into the select, so the layer's cache is copied once.
                let layer = |stack: &Act, x: &Act| -> Result<Act, EsError> {
                    let old = layer_of(stack, i)?;
                    let x = with_members(x, stack.members())?;
                    let shape = old.value().shape().to_vec();
                    let r = shape.len();
                    let dims: Vec<usize> = (0..r).collect();
                    let slot = f
                        .iota(TensorType::i32(&shape), r - 2)?
                        .eq(&at.slot.broadcast_in_dim(&shape, &[])?)?;
                    let new = x.value().broadcast_in_dim(&shape, &dims)?;
                    rewrap(&old, slot.select(&new, old.value())?)
                };
                let layer = (layer(&ks, &k)?, layer(&vs, &v)?);
                ((k, v), layer)
            }
        };
        // Query heads h = kv·rep + j read KV head kv: [R, H, 1, hd] -> [R, KV, rep, hd].
        let rep = nh / nkv;
        let qg = reshape(&q, &[rows, nkv, rep, hd])?;
        let slots = kl.logical_shape()[2];
        let scores = qg.bmm(&kl, true)?.scale(1.0 / (hd as f64).sqrt())?;
        let bias = at
            .visible
            .select(
                &f.full(0.0f32, &[rows, slots])?.convert(dt)?,
                &f.full(f32::NEG_INFINITY, &[rows, slots])?.convert(dt)?,
            )?
            .reshape(&[rows, 1, 1, slots])?;
        let a = scores.add(&Act::shared(bias))?.softmax_last()?;
        let o = reshape(&a.bmm(&vl, false)?, &[rows, nh, 1, hd])?;
        Ok((self.out_proj(p, l, &o)?, kc, vc))
    }

    /// Prefill of decoder layer `l` on `x`: the next hidden states and the layer's keys
    /// and values padded to `slots`.
    fn prefill_layer(
        &self,
        p: &ModelParams,
        l: usize,
        x: &Act,
        slots: i64,
    ) -> Result<(Act, Act, Act), EsError> {
        let pre = format!("model.layers.{l}");
        let h = self.rms_norm(
            x,
            &self.tensor(p, &format!("{pre}.input_layernorm.weight"))?,
        )?;
        let (o, k, v) = self.prefill_attention(p, l, &h, slots)?;
        let x = x.add(&o)?;
        let h = self.rms_norm(
            &x,
            &self.tensor(p, &format!("{pre}.post_attention_layernorm.weight"))?,
        )?;
        Ok((x.add(&self.mlp(p, l, &h)?)?, k, v))
    }

    /// One decoding step of layer `l` on `x` over the layer's cache: the next hidden
    /// states and the cache.
    fn step_layer(
        &self,
        p: &ModelParams,
        l: usize,
        x: &Act,
        at: &StepAt,
        kv: StepCache,
    ) -> Result<(Act, Act, Act), EsError> {
        let pre = format!("model.layers.{l}");
        let h = self.rms_norm(
            x,
            &self.tensor(p, &format!("{pre}.input_layernorm.weight"))?,
        )?;
        let (o, k, v) = self.step_attention(p, l, &h, at, kv)?;
        let x = x.add(&o)?;
        let h = self.rms_norm(
            &x,
            &self.tensor(p, &format!("{pre}.post_attention_layernorm.weight"))?,
        )?;
        Ok((x.add(&self.mlp(p, l, &h)?)?, k, v))
    }

    /// The prefill's layers as a loop: the hidden states and the keys and values of every
    /// layer stacked as `[L, R, KV, slots, hd]` (per member where the loop is).
    fn prefill_loop(
        &self,
        stack: &LayerStack,
        p: &ModelParams,
        x: Act,
        slots: i64,
    ) -> Result<(Act, Vec<Act>), EsError> {
        let c = &self.config;
        let f = x.value().func();
        let rows = x.logical_shape()[0];
        let (layers, nkv, hd) = (
            c.num_hidden_layers as i64,
            c.num_key_value_heads as i64,
            c.head_dim() as i64,
        );
        let members = Self::loop_members(stack, &x);
        let mut shape: Vec<i64> = members.into_iter().collect();
        shape.extend([layers, rows, nkv, slots, hd]);
        let zero = f.scalar(0.0f32)?.convert(self.compute_dtype)?;
        let z = zero.broadcast_in_dim(&shape, &[])?;
        let z = match members {
            Some(_) => Act::per_member(z)?,
            None => Act::shared(z),
        };
        let body = |lp: &ModelParams, l: usize, i: &Value, x: &Act, st: Vec<Act>| {
            let [kc, vc] = <[Act; 2]>::try_from(st).map_err(|_| stacked_cache_err())?;
            let (y, k, v) = self.prefill_layer(lp, l, x, slots)?;
            Ok((y, vec![put_layer(&kc, i, &k)?, put_layer(&vc, i, &v)?]))
        };
        self.run_layers(stack, p, x, vec![z.clone(), z], &body)
    }

    /// The final norm and the LM head of hidden states `[R, .., d]`, as f32 logits.
    fn head(&self, p: &ModelParams, x: &Act) -> Result<Act, EsError> {
        let x = self.rms_norm(x, &self.tensor(p, "model.norm.weight")?)?;
        let head = if self.config.tie_word_embeddings {
            self.weight(p, "model.embed_tokens.weight")?
        } else {
            self.weight(p, "lm_head.weight")?
        };
        convert(&nn::dense(&x, &head)?, DType::F32)
    }
}

impl Decoder for Qwen2 {
    fn vocab(&self) -> i64 {
        self.config.vocab_size as i64
    }

    fn layers(&self) -> Option<crate::es::LayerLeaves> {
        self.layer_leaves()
    }

    fn prefill(
        &self,
        p: &ModelParams,
        ids: &Value,
        lens: &Value,
        slots: i64,
    ) -> Result<(Act, Vec<Act>), EsError> {
        if let Some(q) = self.following(p) {
            return q.prefill(p, ids, lens, slots);
        }
        let emb = self.weight(p, "model.embed_tokens.weight")?;
        let mut x = nn::embed(&emb, &Act::shared(ids.clone()))?;
        let mut cache = Vec::with_capacity(2 * self.config.num_hidden_layers);
        if let Some(stack) = self.layer_stack(p)? {
            (x, cache) = self.prefill_loop(&stack, p, x, slots)?;
        } else {
            for l in 0..self.config.num_hidden_layers {
                let (y, k, v) = self.prefill_layer(p, l, &x, slots)?;
                cache.push(k);
                cache.push(v);
                x = y;
            }
        }
        // Each row's last prompt position, as a one-hot sum over the positions (exact:
        // one term is not zero).
        let f = ids.func();
        let (r, s) = (ids.shape()[0], ids.shape()[1]);
        let last = lens.sub(&f.scalar(1i32)?)?;
        let pick = f
            .iota(TensorType::i32(&[r, s]), 1)?
            .eq(&last.broadcast_in_dim(&[r, s], &[0])?)?;
        let dt = self.compute_dtype;
        let d = self.config.hidden_size as i64;
        let pick = pick
            .select(
                &f.full(1.0f32, &[r, s])?.convert(dt)?,
                &f.full(0.0f32, &[r, s])?.convert(dt)?,
            )?
            .broadcast_in_dim(&[r, s, d], &[0, 1])?;
        let x = sum_axis(&x.mul(&Act::shared(pick))?, 1)?;
        Ok((self.head(p, &x)?, cache))
    }

    fn step(
        &self,
        p: &ModelParams,
        ids: &Act,
        at: &StepAt,
        cache: Vec<Act>,
    ) -> Result<(Act, Vec<Act>), EsError> {
        if let Some(q) = self.following(p) {
            return q.step(p, ids, at, cache);
        }
        let layers = self.config.num_hidden_layers;
        let stack = self.layer_stack(p)?;
        if stack.is_some() && cache.len() != 2 {
            return Err(stacked_cache_err());
        }
        if stack.is_none() && cache.len() != 2 * layers {
            return Err(EsError::Invalid {
                message: format!(
                    "a qwen2 step got {} cache tensors for {layers} layers",
                    cache.len()
                ),
                fix: "pass the cache the prefill returned (keys and values per layer)".into(),
            });
        }
        let rows = ids.logical_shape()[0];
        let d = self.config.hidden_size as i64;
        let emb = self.weight(p, "model.embed_tokens.weight")?;
        let mut x = reshape(&nn::embed(&emb, ids)?, &[rows, 1, d])?;
        let mut it = cache.into_iter();
        let mut out = Vec::with_capacity(2 * layers);
        if let Some(stack) = stack {
            let [ks, vs] = <[Act; 2]>::try_from(it.by_ref().collect::<Vec<_>>())
                .map_err(|_| stacked_cache_err())?;
            let (kt, vt) = (token_stack(&ks)?, token_stack(&vs)?);
            let body = |lp: &ModelParams, l: usize, i: &Value, x: &Act, st: Vec<Act>| {
                let [ks, vs, kt, vt] = <[Act; 4]>::try_from(st).map_err(|_| stacked_cache_err())?;
                let kv = StepCache::Stack {
                    k: ks.clone(),
                    v: vs.clone(),
                    i,
                };
                let (y, k, v) = self.step_layer(lp, l, x, at, kv)?;
                Ok((
                    y,
                    vec![ks, vs, put_layer(&kt, i, &k)?, put_layer(&vt, i, &v)?],
                ))
            };
            let st;
            (x, st) = self.run_layers(&stack, p, x, vec![ks, vs, kt, vt], &body)?;
            let [ks, vs, kt, vt] = <[Act; 4]>::try_from(st).map_err(|_| stacked_cache_err())?;
            out = vec![
                write_tokens(&ks, &kt, &at.slot)?,
                write_tokens(&vs, &vt, &at.slot)?,
            ];
        } else {
            for l in 0..layers {
                let (Some(k), Some(v)) = (it.next(), it.next()) else {
                    return Err(EsError::Invalid {
                        message: format!("the qwen2 cache ended before layer {l}"),
                        fix: "pass the cache the prefill returned".into(),
                    });
                };
                let (y, k, v) = self.step_layer(p, l, &x, at, StepCache::Layer(k, v))?;
                out.push(k);
                out.push(v);
                x = y;
            }
        }
        let logits = self.head(p, &x)?;
        Ok((
            reshape(&logits, &[rows, self.config.vocab_size as i64])?,
            out,
        ))
    }

    /// The KV cache of every layer (`2 × L × B × KV × S × hd` in the compute dtype) plus
    /// the widest activation: the prefill's `B × P × max(d, I)` or the logits' `B × V`,
    /// at 4 bytes.
    fn member_bytes(&self, shape: &DecodeShape) -> Option<usize> {
        let c = &self.config;
        let b = shape.batch;
        let act = b
            .saturating_mul(shape.prompt_len)
            .saturating_mul(c.hidden_size.max(c.intermediate_size))
            .max(b.saturating_mul(c.vocab_size))
            .saturating_mul(4);
        let bytes = if self.compute_dtype == DType::BF16 {
            2
        } else {
            4
        };
        let kv = b
            .saturating_mul(2 * c.num_hidden_layers)
            .saturating_mul(c.num_key_value_heads)
            .saturating_mul(shape.slots())
            .saturating_mul(c.head_dim())
            .saturating_mul(bytes);
        Some(kv.saturating_add(act))
    }
}
