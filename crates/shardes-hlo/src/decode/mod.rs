//! KV-cache decoding under every member's perturbation: the [`Decoder`] trait (a model
//! family's prefill and step over its cache) and [`DecodeSpec`], which turns a decoder into
//! a [`MemberOutputs`] model for [`crate::es::ShardedES::outputs_program`].
//!
//! Inputs: `prompt i32[B, P]`, right-padded, and `lens i32[B]` (each row's prompt length,
//! `1..=P`). Outputs: `tokens i32[B, T]` and `lengths i32[B]`.
//!
//! - The prefill runs the whole padded prompt at positions `0..P` with a causal mask, so
//!   row `b`'s real tokens (`0..lens[b]`) never see its padding; its first token comes from
//!   the logits at position `lens[b] − 1`. The cache has `S = P + T − 1` slots: slots
//!   `0..P` hold the prompt, and generated token `t − 1` is fed at step `t` at its row's own
//!   position `lens[b] + t − 1` (per-row RoPE) and written to slot `P + t − 1` (the same slot
//!   for every row). Row `b` attends to slots `j < lens[b]` and `P ≤ j ≤ P + t − 1`, which
//!   are exactly its own tokens, each rotated at its true position: the row decodes as it
//!   would alone.
//! - A row ends when it emits one of the EOS ids: the EOS token is written and counted in
//!   `lengths`; every later token of the row is the pad id. `lengths[b]` is the number of
//!   tokens before the padding (at most `T`). A chunk stops early once all its rows ended.
//! - Greedy decoding takes the argmax; sampling ([`Sampling::Sample`]) draws token `t` of
//!   row `b` with the uniform number `uniform(fold_in(key_i, t), [B])[b]`, `key_i` the
//!   member's sampling key ([`crate::es::MemberInfo::keys`]), so a resumed run samples the
//!   same tokens.
//! - In the plain program ([`crate::es::ShardedES::plain_outputs_program`]) the members of
//!   a chunk share the parameters: with [`PlainRows::Shared`] the `B` rows are decoded once
//!   for the chunk (evaluation; under sampling each member still draws its own tokens),
//!   with [`PlainRows::Tiled`] the chunk's `c × B` rows are decoded as one batch through
//!   the plain weights, the same work as the perturbed program minus the perturbation (the
//!   baseline of the decode benchmark).

mod sample;

pub use sample::Sampling;

use crate::builder::{DType, TensorType, Value};
use crate::es::{
    ChunkPolicy, EsError, LayerLeaves, MemberInfo, MemberOutputs, ModelParams, BATCH_BYTES,
};
use crate::nn::Act;

/// Where a decode step's token sits, for [`Decoder::step`].
#[derive(Clone, Debug)]
pub struct StepAt {
    /// Each row's position (i32 `[R]`): the RoPE position of the token fed.
    pub pos: Value,
    /// The cache slot the step writes (i32 scalar, the same for every row).
    pub slot: Value,
    /// Which cache slots each row attends to (i1 `[R, S]`, the written slot included).
    pub visible: Value,
}

/// A decoder-only model family with a KV cache: one implementation per family
/// ([`crate::problems::qwen2::Qwen2`] is the first). Read 2-D weights through the seams,
/// so every strategy works (low rank never forms a perturbed matrix); where the
/// parameters are per member, the cache is per member too. Caches are opaque to the
/// caller: whatever [`Decoder::prefill`] returns is threaded through [`Decoder::step`].
pub trait Decoder {
    /// The vocabulary size (the logits' last axis).
    fn vocab(&self) -> i64;

    /// The most positions (prompt and generated tokens) the model supports, if bounded.
    fn max_positions(&self) -> Option<usize> {
        None
    }

    /// The model's repeated layers, when prefill and step read them in a loop over the
    /// layer index ([`crate::es::Model::layers`]).
    fn layers(&self) -> Option<LayerLeaves> {
        None
    }

    /// Runs the right-padded prompt `ids` (i32 `[R, P]`, shared by the members) at
    /// positions `0..P` with a causal mask and returns each row's logits at position
    /// `lens[r] − 1` (f32 `[R, V]`, per member where the parameters are) and a cache of
    /// `slots` positions (`≥ P`) holding the prompt in slots `0..P`, in the compute dtype.
    fn prefill(
        &self,
        params: &ModelParams,
        ids: &Value,
        lens: &Value,
        slots: i64,
    ) -> Result<(Act, Vec<Act>), EsError>;

    /// Feeds one token per row (`ids` i32 `[R]`, shared or per member) at `at`, writing
    /// its keys and values into `at.slot`: the next logits (f32 `[R, V]`) and the cache.
    fn step(
        &self,
        params: &ModelParams,
        ids: &Act,
        at: &StepAt,
        cache: Vec<Act>,
    ) -> Result<(Act, Vec<Act>), EsError>;

    /// Bytes one member holds while decoding `shape`, if known: its KV cache over every
    /// layer and its largest activation. Sizes the member chunk
    /// ([`crate::es::ChunkPolicy::Batch`]): as many members per chunk as fit
    /// [`crate::es::BATCH_BYTES`].
    fn member_bytes(&self, shape: &DecodeShape) -> Option<usize> {
        let _ = shape;
        None
    }
}

/// A decoder whose positions are bounded (a checkpoint's `max_position_embeddings`):
/// everything else is `inner`'s.
#[derive(Clone, Debug, PartialEq)]
pub struct Bounded<D> {
    /// The model.
    pub inner: D,
    /// The most positions it supports.
    pub max_positions: usize,
}

impl<D: Decoder> Decoder for Bounded<D> {
    fn vocab(&self) -> i64 {
        self.inner.vocab()
    }

    fn max_positions(&self) -> Option<usize> {
        Some(self.max_positions)
    }

    fn layers(&self) -> Option<LayerLeaves> {
        self.inner.layers()
    }

    fn prefill(
        &self,
        params: &ModelParams,
        ids: &Value,
        lens: &Value,
        slots: i64,
    ) -> Result<(Act, Vec<Act>), EsError> {
        self.inner.prefill(params, ids, lens, slots)
    }

    fn step(
        &self,
        params: &ModelParams,
        ids: &Act,
        at: &StepAt,
        cache: Vec<Act>,
    ) -> Result<(Act, Vec<Act>), EsError> {
        self.inner.step(params, ids, at, cache)
    }

    fn member_bytes(&self, shape: &DecodeShape) -> Option<usize> {
        self.inner.member_bytes(shape)
    }
}

/// How the plain program decodes a chunk of members that share the parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlainRows {
    /// The `B` rows once for the chunk (evaluation).
    Shared,
    /// The chunk's `c × B` rows as one batch (the benchmark's baseline).
    Tiled,
}

/// The geometry of a decode: `B` rows of prompts right-padded to `P`, `T` new tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeShape {
    /// Rows `B`.
    pub batch: usize,
    /// Prompt slots `P`.
    pub prompt_len: usize,
    /// New tokens `T`.
    pub max_new: usize,
}

impl DecodeShape {
    /// The cache slots, `P + T − 1`.
    pub fn slots(&self) -> usize {
        self.prompt_len + self.max_new - 1
    }
}

/// A [`Decoder`] as a [`MemberOutputs`] model: inputs `prompt i32[B, P]` and `lens
/// i32[B]`, outputs `tokens i32[B, T]` and `lengths i32[B]` (see the module
/// documentation).
pub struct DecodeSpec<D> {
    /// The model.
    pub decoder: D,
    /// `B`, `P`, `T`.
    pub shape: DecodeShape,
    /// Token ids that end a row (may be empty).
    pub eos: Vec<u32>,
    /// The id written after a row ended.
    pub pad: u32,
    /// Greedy or sampled.
    pub sampling: Sampling,
    /// How the plain program decodes a chunk.
    pub plain: PlainRows,
}

impl<D: Decoder> DecodeSpec<D> {
    /// A greedy decode of `shape` with the given EOS ids and pad id, rows shared in the
    /// plain program. Refuses an empty shape, ids outside the vocabulary and, for a model
    /// with bounded positions, `P + T` beyond them.
    pub fn new(decoder: D, shape: DecodeShape, eos: Vec<u32>, pad: u32) -> Result<Self, EsError> {
        let spec = DecodeSpec {
            decoder,
            shape,
            eos,
            pad,
            sampling: Sampling::Greedy,
            plain: PlainRows::Shared,
        };
        spec.check()?;
        Ok(spec)
    }

    /// This spec with another token choice.
    pub fn with_sampling(mut self, sampling: Sampling) -> Result<Self, EsError> {
        sampling.check()?;
        self.sampling = sampling;
        Ok(self)
    }

    /// This spec with another plain-program row policy.
    pub fn with_plain(mut self, plain: PlainRows) -> Self {
        self.plain = plain;
        self
    }

    fn check(&self) -> Result<(), EsError> {
        let s = self.shape;
        let bad = |message: String, fix: &str| EsError::Invalid {
            message,
            fix: fix.into(),
        };
        if s.batch == 0 || s.prompt_len == 0 || s.max_new == 0 {
            return Err(bad(
                format!(
                    "decoding {} rows of {} prompt tokens and {} new tokens",
                    s.batch, s.prompt_len, s.max_new
                ),
                "use at least one row, one prompt slot and one new token",
            ));
        }
        if i32::try_from(s.prompt_len + s.max_new).is_err() {
            return Err(bad(
                format!("{} positions", s.prompt_len + s.max_new),
                "use fewer than 2^31 prompt and new tokens",
            ));
        }
        if let Some(max) = self.decoder.max_positions() {
            if s.prompt_len + s.max_new > max {
                return Err(bad(
                    format!(
                        "prompt_len {} + max_new {} = {} positions, more than the model's {max}",
                        s.prompt_len,
                        s.max_new,
                        s.prompt_len + s.max_new
                    ),
                    "lower prompt_len or max_new",
                ));
            }
        }
        let v = self.decoder.vocab();
        for (what, id) in self
            .eos
            .iter()
            .map(|&e| ("EOS", e))
            .chain([("pad", self.pad)])
        {
            if i64::from(id) >= v {
                return Err(bad(
                    format!("{what} id {id} is outside the vocabulary of {v} tokens"),
                    "use ids below the vocabulary size",
                ));
            }
        }
        self.sampling.check()
    }
}

/// `a` with `c` members (broadcast if shared); `None` leaves it as it is.
fn to_members(a: &Act, c: Option<i64>) -> Result<Act, EsError> {
    match (c, a.members()) {
        (Some(c), None) => {
            let mut shape = vec![c];
            shape.extend_from_slice(a.value().shape());
            let dims: Vec<usize> = (1..shape.len()).collect();
            Ok(Act::per_member(a.value().broadcast_in_dim(&shape, &dims)?)?)
        }
        _ => Ok(a.clone()),
    }
}

/// `v` as an Act with `c` members (leading dim) or shared.
fn wrap(v: Value, c: Option<i64>) -> Result<Act, EsError> {
    Ok(match c {
        Some(_) => Act::per_member(v)?,
        None => Act::shared(v),
    })
}

/// `x [R, ..]` repeated `c` times along a new leading axis and flattened: `[c·R, ..]`.
fn tile(x: &Value, c: i64) -> Result<Value, EsError> {
    let mut wide = vec![c];
    wide.extend_from_slice(x.shape());
    let dims: Vec<usize> = (1..wide.len()).collect();
    let mut flat = x.shape().to_vec();
    flat[0] *= c;
    Ok(x.broadcast_in_dim(&wide, &dims)?.reshape(&flat)?)
}

impl<D: Decoder> MemberOutputs for DecodeSpec<D> {
    fn input_types(&self) -> Vec<(String, TensorType)> {
        let (b, p) = (self.shape.batch as i64, self.shape.prompt_len as i64);
        vec![
            ("prompt".into(), TensorType::i32(&[b, p])),
            ("lens".into(), TensorType::i32(&[b])),
        ]
    }

    fn output_types(&self) -> Vec<(String, TensorType)> {
        let (b, t) = (self.shape.batch as i64, self.shape.max_new as i64);
        vec![
            ("tokens".into(), TensorType::i32(&[b, t])),
            ("lengths".into(), TensorType::i32(&[b])),
        ]
    }

    fn member_bytes(&self) -> Option<usize> {
        self.decoder.member_bytes(&self.shape)
    }

    /// Every token reads every matrix: they are transposed once per call.
    fn matrices_in_out(&self) -> bool {
        true
    }

    /// A chunk's members' rows are one batch through the weights: as many as fit.
    fn chunk_policy(&self) -> ChunkPolicy {
        ChunkPolicy::Batch { bytes: BATCH_BYTES }
    }

    fn layers(&self) -> Option<LayerLeaves> {
        self.decoder.layers()
    }

    fn outputs(
        &self,
        params: &ModelParams,
        inputs: &[Value],
        member: &MemberInfo,
    ) -> Result<Vec<Act>, EsError> {
        let [prompt, lens] = inputs else {
            return Err(EsError::Invalid {
                message: format!("decoding takes 2 inputs, got {}", inputs.len()),
                fix: "pass prompt (i32[B, P]) and lens (i32[B])".into(),
            });
        };
        Decoding::new(self, member)?.run(params, prompt, lens)
    }
}

/// One chunk's decode: the rows decoded and how they map to members.
struct Decoding<'a, D> {
    spec: &'a DecodeSpec<D>,
    member: &'a MemberInfo,
    /// The chunk's members when rows are held per member.
    members: Option<i64>,
    /// Whether the chunk's `c × B` rows are decoded as one shared batch.
    tiled: bool,
    /// Rows per member or per shared batch (`B`, or `c·B` tiled).
    rows: i64,
}

impl<'a, D: Decoder> Decoding<'a, D> {
    fn new(spec: &'a DecodeSpec<D>, member: &'a MemberInfo) -> Result<Self, EsError> {
        let c = member.chunk();
        let b = spec.shape.batch as i64;
        let tiled = !member.perturbed && spec.plain == PlainRows::Tiled;
        let per_member = !tiled && (member.perturbed || spec.sampling.is_random());
        Ok(Decoding {
            spec,
            member,
            members: per_member.then_some(c),
            tiled,
            rows: if tiled { c * b } else { b },
        })
    }

    /// The uniform numbers of token `t` (i32 scalar) for every row, in the rows' layout.
    fn uniforms(&self, t: &Value) -> Result<Option<Act>, EsError> {
        if !self.spec.sampling.is_random() {
            return Ok(None);
        }
        let b = self.spec.shape.batch as i64;
        let step = t.convert(DType::U32)?;
        let u = self.member.keys.fold_in(&step)?.uniform(&[b], 0.0, 1.0)?;
        Ok(Some(if self.tiled {
            Act::shared(u.reshape(&[self.rows])?)
        } else {
            wrap(u, self.members)?
        }))
    }

    /// The token each row picks from `logits` for token index `t`.
    fn choose(&self, logits: &Act, t: &Value) -> Result<Act, EsError> {
        let u = self.uniforms(t)?;
        let logits = match &u {
            Some(u) if u.members().is_some() => to_members(logits, u.members())?,
            _ => logits.clone(),
        };
        let tok = sample::choose(
            logits.value(),
            u.as_ref().map(Act::value),
            &self.spec.sampling,
        )?;
        wrap(tok, logits.members())
    }

    /// Whether each token is an EOS id (i1, same shape).
    fn is_eos(&self, tok: &Value) -> Result<Value, EsError> {
        let f = tok.func();
        let mut out = f.full(false, tok.shape())?;
        for &e in &self.spec.eos {
            // EOS ids are below the vocabulary size, which fits i32 (checked).
            let id = f.full(e as i32, tok.shape())?;
            out = out.or(&tok.eq(&id)?)?;
        }
        Ok(out)
    }

    fn run(&self, params: &ModelParams, prompt: &Value, lens: &Value) -> Result<Vec<Act>, EsError> {
        let f = prompt.func();
        let s = self.spec.shape;
        let (p, t_max) = (s.prompt_len as i64, s.max_new as i64);
        let slots = s.slots() as i64;
        let c = self.member.chunk();
        // Positions stay in range whatever the lengths (the host refuses others).
        let lens = lens.clamp(&f.scalar(1i32)?, &f.scalar(p as i32)?)?;
        let (ids, lens) = if self.tiled {
            (tile(prompt, c)?, tile(&lens, c)?)
        } else {
            (prompt.clone(), lens)
        };
        let rows = self.rows;
        let (logits, cache) = self.spec.decoder.prefill(params, &ids, &lens, slots)?;
        let m = self.members;
        let cache = cache
            .iter()
            .map(|a| to_members(a, m))
            .collect::<Result<Vec<_>, _>>()?;
        let zero = f.scalar(0i32)?;
        let tok = to_members(&self.choose(&logits, &zero)?, m)?;
        let lead: Vec<i64> = m.into_iter().chain([rows]).collect();
        let mut tshape = lead.clone();
        tshape.push(t_max);
        let col = |v: &Value| -> Result<Value, EsError> {
            let mut sh = v.shape().to_vec();
            sh.push(1);
            Ok(v.reshape(&sh)?)
        };
        let at_col = |t: &Value| -> Vec<Value> {
            let mut at = vec![zero.clone(); lead.len()];
            at.push(t.clone());
            at
        };
        let put = |tokens: &Value, v: &Value, t: &Value| -> Result<Value, EsError> {
            let at = at_col(t);
            let at: Vec<&Value> = at.iter().collect();
            Ok(tokens.dynamic_update_slice(&col(v)?, &at)?)
        };
        let tokens = put(&f.full(self.spec.pad as i32, &tshape)?, tok.value(), &zero)?;
        let lengths = f.full(1i32, &lead)?;
        let done = self.is_eos(tok.value())?;
        let members_of: Vec<Option<i64>> = cache.iter().map(Act::members).collect();
        let t1 = f.scalar(1i32)?;
        let mut init: Vec<&Value> = vec![&t1, tok.value(), &tokens, &lengths, &done];
        init.extend(cache.iter().map(Act::value));
        let pad = f.full(self.spec.pad as i32, &lead)?;
        let one = f.full(1i32, &lead)?;
        let nothing = f.full(0i32, &lead)?;
        // Slot j is visible to row r at step t iff j < lens[r] or P <= j <= P + t - 1.
        let slot_ids = f.iota(TensorType::i32(&[rows, slots]), 1)?;
        let own = slot_ids.lt(&lens.broadcast_in_dim(&[rows, slots], &[0])?)?;
        let generated = slot_ids.ge(&f.full(p as i32, &[rows, slots])?)?;
        let dims: Vec<usize> = (0..lead.len()).collect();
        let out = f.while_loop(
            &init,
            |carry| -> Result<Value, EsError> {
                let more = carry[0].lt(&f.scalar(t_max as i32)?)?;
                let all_done = carry[4]
                    .convert(DType::I32)?
                    .reduce_min(&dims)?
                    .eq(&f.scalar(1i32)?)?;
                Ok(more.and(&all_done.not()?)?)
            },
            |carry| -> Result<Vec<Value>, EsError> {
                let t = &carry[0];
                let tm1 = t.sub(&f.scalar(1i32)?)?;
                let pos = lens.add(&tm1.broadcast_in_dim(&[rows], &[])?)?;
                let slot = tm1.add(&f.scalar(p as i32)?)?;
                let upto = slot_ids.le(&slot.broadcast_in_dim(&[rows, slots], &[])?)?;
                let visible = own.or(&generated.and(&upto)?)?;
                let cache = carry[5..]
                    .iter()
                    .zip(&members_of)
                    .map(|(v, &cm)| wrap(v.clone(), cm))
                    .collect::<Result<Vec<_>, _>>()?;
                let fed = wrap(carry[1].clone(), m)?;
                let at = StepAt { pos, slot, visible };
                let (logits, cache) = self.spec.decoder.step(params, &fed, &at, cache)?;
                let tok = to_members(&self.choose(&logits, t)?, m)?;
                let done = &carry[4];
                let out_tok = done.select(&pad, tok.value())?;
                let tokens = put(&carry[2], &out_tok, t)?;
                let lengths = carry[3].add(&done.select(&nothing, &one)?)?;
                let done = done.or(&self.is_eos(tok.value())?)?;
                let mut next = vec![t.add(&f.scalar(1i32)?)?, out_tok, tokens, lengths, done];
                for (a, &cm) in cache.iter().zip(&members_of) {
                    let a = to_members(a, cm)?;
                    if a.members() != cm {
                        return Err(EsError::Invalid {
                            message: "the decoder's step returned a cache held per member \
                                      where its prefill returned a shared one"
                                .into(),
                            fix: "return the cache with the members of the prefill's".into(),
                        });
                    }
                    next.push(a.value().clone());
                }
                Ok(next)
            },
        )?;
        let (tokens, lengths) = (out[2].clone(), out[3].clone());
        if self.tiled {
            let b = s.batch as i64;
            return Ok(vec![
                Act::per_member(tokens.reshape(&[c, b, t_max])?)?,
                Act::per_member(lengths.reshape(&[c, b])?)?,
            ]);
        }
        Ok(vec![wrap(tokens, m)?, wrap(lengths, m)?])
    }
}
