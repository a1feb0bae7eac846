//! The transformer_block problem (`shared/spec/transformer_block.md`).
//!
//! One transformer block: six square `(d, d)` matrices, no learnable norm parameters, a
//! single attention head, every matmul through `dense(x, W) = x · Wᵀ` (weights stored
//! `(out, in)`). With `x` of shape `(batch, seq, d)`:
//!
//! ```text
//! rms(x)  = x · rsqrt(mean(x², last axis) + 1e-6)          # no learnable scale
//! h       = rms(x)
//! q, k, v = dense(h, wq), dense(h, wk), dense(h, wv)
//! a       = softmax(q kᵀ · d^-0.5, over keys)                # single head, no mask
//! x       = x + dense(a v, wo)
//! h       = rms(x)
//! out     = x + dense(gelu_tanh(dense(h, w_up)), w_down)
//! loss    = mean((out − target)²)                            # reduced in f32
//! ```
//!
//! with `gelu_tanh(x) = 0.5 x (1 + tanh(sqrt(2/π) (x + 0.044715 x³)))`.
//!
//! This file is organised in sections: configuration and constants, host initialisation
//! and data (here), then the emitted forward and loss (added with the builder; they must
//! route every matmul through the ES `dense` seam so low-rank members are evaluated without
//! forming a perturbed matrix).

use crate::builder::{TensorType, Value};
use crate::es::{EsError, Model, ModelParams};
use crate::nn::{self, Act};
use crate::params::{Array, ParamTree};
use crate::prng::{fold_in, normal, Key};

use super::ProblemError;

// ---------------------------------------------------------------------------------------
// Configuration and constants
// ---------------------------------------------------------------------------------------

/// Leaf names in creation order: matrix `q` of this list is drawn from `fold_in(key, q)`.
///
/// The leaf order for noise is the sorted order `w_down, w_up, wk, wo, wq, wv`.
pub const CREATION_ORDER: [&str; 6] = ["wq", "wk", "wv", "wo", "w_up", "w_down"];

/// The epsilon inside `rms`.
pub const RMS_EPS: f32 = 1e-6;

/// The cubic coefficient of `gelu_tanh`.
pub const GELU_CUBIC: f32 = 0.044_715;

/// The default `d_model` of the spec.
pub const DEFAULT_D_MODEL: usize = 512;

/// A transformer_block problem: model width and batch geometry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TransformerBlock {
    /// Model width `d` (every matrix is `(d, d)`).
    pub d_model: usize,
    /// Sequences per batch.
    pub batch: usize,
    /// Tokens per sequence.
    pub seq: usize,
}

impl TransformerBlock {
    /// The quickstart's geometry: `d_model = 64, batch = 8, seq = 32`.
    pub const QUICKSTART: TransformerBlock = TransformerBlock {
        d_model: 64,
        batch: 8,
        seq: 32,
    };

    /// Initial parameters for this `d_model`; see [`init`].
    pub fn init(&self, key: Key) -> Result<ParamTree, ProblemError> {
        init(key, self.d_model)
    }

    /// A batch of this geometry; see [`make_batch`].
    pub fn make_batch(&self, key: Key) -> Result<Batch, ProblemError> {
        make_batch(key, self.d_model, self.batch, self.seq)
    }

    /// Every leaf path with its shape, `(d_model, d_model)` each, in [`CREATION_ORDER`]:
    /// the parameters [`Self::init`] draws, described without allocating them.
    pub fn param_shapes(&self) -> Vec<super::ShapedPath> {
        CREATION_ORDER
            .iter()
            .map(|name| (name.to_string(), vec![self.d_model, self.d_model]))
            .collect()
    }

    /// The shape of `x` and `target`: `(batch, seq, d_model)`.
    pub fn batch_shape(&self) -> [usize; 3] {
        [self.batch, self.seq, self.d_model]
    }

    /// FLOPs (multiply-add = 2) of one inference pass of `n` members: with `T = batch·seq`
    /// tokens per member, `S = seq` and width `d`, six `d × d` products `12 T d²` and
    /// attention `4 T S d` per member.
    pub fn inference_flops(&self, n: usize) -> f64 {
        let (t, s, d) = self.tsd();
        n as f64 * (12.0 * t * d * d + 4.0 * t * s * d)
    }

    /// Useful FLOPs of one ES generation: `n` members, `n / pairing` noise directions, the
    /// population split over `devices`, noise of rank `rank` for 2-D leaves (`None`: dense).
    ///
    /// - low rank `r`: `wq, wk, wv` read the shared input, so their base products run once
    ///   per device (`6 T d²` each); per member `wo, w_up, w_down` (`6 T d²`), six rank-`r`
    ///   corrections (`24 T d r`) and attention; the update `2 r d²` per leaf and direction;
    /// - dense noise: per member the inference work; the update `2 d²` per leaf and
    ///   direction.
    ///
    /// This is the work the algorithm must do, not what a program happens to emit: the
    /// update contraction counts once (not the `how = A` duplicates).
    pub fn generation_flops(
        &self,
        n: usize,
        pairing: usize,
        devices: usize,
        rank: Option<usize>,
    ) -> f64 {
        let (t, s, d) = self.tsd();
        let nf = n as f64;
        let dirs = nf / pairing as f64;
        let attention = 4.0 * t * s * d;
        match rank {
            Some(r) => {
                let r = r as f64;
                devices as f64 * 6.0 * t * d * d
                    + nf * (6.0 * t * d * d + 24.0 * t * d * r + attention)
                    + 6.0 * dirs * 2.0 * r * d * d
            }
            None => self.inference_flops(n) + 6.0 * dirs * 2.0 * d * d,
        }
    }

    /// `(T, S, d)` of the FLOP formulas as floats.
    fn tsd(&self) -> (f64, f64, f64) {
        (
            (self.batch * self.seq) as f64,
            self.seq as f64,
            self.d_model as f64,
        )
    }
}

/// `d^-0.5` as the f32 the reference uses: computed in f64 (a Python float) and rounded
/// once to f32 when it meets an f32 array. Used for both the init scale and the attention
/// temperature.
pub fn inv_sqrt_d(d: usize) -> f32 {
    // Rounding to f32 is the point; d is a model width, far below 2^53.
    (1.0 / (d as f64).sqrt()) as f32
}

fn check_dim(what: &'static str, value: usize) -> Result<(), ProblemError> {
    if value == 0 {
        return Err(ProblemError::BadDimension {
            what,
            value,
            fix: "use a positive size",
        });
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Host initialisation and data
// ---------------------------------------------------------------------------------------

/// `init(key, d)`: six `(d, d)` matrices; the one at creation position `q`
/// ([`CREATION_ORDER`]) is `normal(fold_in(key, q), (d, d)) · d^-0.5`.
pub fn init(key: Key, d_model: usize) -> Result<ParamTree, ProblemError> {
    check_dim("d_model", d_model)?;
    let scale = inv_sqrt_d(d_model);
    let mut leaves = Vec::with_capacity(CREATION_ORDER.len());
    for (q, name) in (0u32..).zip(CREATION_ORDER) {
        let shape = vec![d_model, d_model];
        let data: Vec<f32> = normal(fold_in(key, q), &shape)?
            .into_iter()
            .map(|z| z * scale)
            .collect();
        leaves.push((name, ParamTree::Leaf(Array::new(shape, data)?)));
    }
    Ok(ParamTree::map(leaves))
}

/// One batch: the model input and the regression target, both `(batch, seq, d)`.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    /// The input.
    pub x: Array,
    /// The target the output is compared with.
    pub target: Array,
}

/// `make_batch(key, d, batch, seq)`: `x = normal(fold_in(key, 0), (batch, seq, d))`,
/// `target = normal(fold_in(key, 1), (batch, seq, d))`.
pub fn make_batch(
    key: Key,
    d_model: usize,
    batch: usize,
    seq: usize,
) -> Result<Batch, ProblemError> {
    check_dim("d_model", d_model)?;
    check_dim("batch", batch)?;
    check_dim("seq", seq)?;
    let shape = vec![batch, seq, d_model];
    let x = Array::new(shape.clone(), normal(fold_in(key, 0), &shape)?)?;
    let target = Array::new(shape.clone(), normal(fold_in(key, 1), &shape)?)?;
    Ok(Batch { x, target })
}

// ---------------------------------------------------------------------------------------
// Emitted forward and loss (through the seams)
// ---------------------------------------------------------------------------------------

/// `rms(x) = x · rsqrt(mean(x², last axis) + eps)`, no learnable scale.
pub fn rms(x: &Act) -> Result<Act, EsError> {
    let ms = x.mul(x)?.mean_last()?.add_scalar(f64::from(RMS_EPS))?;
    Ok(x.mul(&ms.map(|v| v.rsqrt())?)?)
}

/// `gelu_tanh(x) = 0.5 x (1 + tanh(sqrt(2/π) (x + 0.044715 x³)))`.
pub fn gelu_tanh(x: &Act) -> Result<Act, EsError> {
    let c = (2.0f64 / std::f64::consts::PI).sqrt();
    let x3 = x.mul(x)?.mul(x)?;
    let inner = x.add(&x3.scale(f64::from(GELU_CUBIC))?)?.scale(c)?;
    let t = inner.map(|v| v.tanh())?.add_scalar(1.0)?;
    Ok(x.mul(&t)?.scale(0.5)?)
}

impl TransformerBlock {
    /// The forward pass `x (batch, seq, d) → (batch, seq, d)`, every matmul through
    /// [`nn::dense`].
    pub fn forward(&self, p: &ModelParams, x: &Act) -> Result<Act, EsError> {
        let h = rms(x)?;
        let q = nn::dense(&h, &p.weight("wq")?)?;
        let k = nn::dense(&h, &p.weight("wk")?)?;
        let v = nn::dense(&h, &p.weight("wv")?)?;
        let scores = q
            .bmm(&k, true)?
            .scale(f64::from(inv_sqrt_d(self.d_model)))?;
        let a = scores.softmax_last()?;
        let x = x.add(&nn::dense(&a.bmm(&v, false)?, &p.weight("wo")?)?)?;
        let h = rms(&x)?;
        let up = gelu_tanh(&nn::dense(&h, &p.weight("w_up")?)?)?;
        Ok(x.add(&nn::dense(&up, &p.weight("w_down")?)?)?)
    }
}

impl Model for TransformerBlock {
    fn batch_types(&self) -> Vec<(String, TensorType)> {
        let shape = [self.batch as i64, self.seq as i64, self.d_model as i64];
        vec![
            ("x".into(), TensorType::f32(&shape)),
            ("target".into(), TensorType::f32(&shape)),
        ]
    }

    /// `mean((forward(x) − target)²)`, reduced in f32, one value per member.
    fn loss(&self, p: &ModelParams, batch: &[Value]) -> Result<Act, EsError> {
        let [x, target] = batch else {
            return Err(EsError::Invalid {
                message: format!(
                    "transformer_block takes 2 batch arrays, got {}",
                    batch.len()
                ),
                fix: "pass x and target".into(),
            });
        };
        let out = self.forward(p, &Act::shared(x.clone()))?;
        let diff = out.sub(&Act::shared(target.clone()))?;
        Ok(diff.mul(&diff)?.mean_all()?)
    }

    /// Every activation is `[batch, seq, d_model]` f32 (attention scores are
    /// `[batch, seq, seq]`, no wider while `seq ≤ d_model`).
    fn member_bytes(&self) -> Option<usize> {
        // Saturating: a config too large to run must not wrap to a small chunk size.
        Some(
            self.batch
                .saturating_mul(self.seq)
                .saturating_mul(self.d_model.max(self.seq))
                .saturating_mul(4),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn init_has_sorted_leaves_and_scale() {
        let key = Key::from_data([0, 0]);
        let t = init(key, 4).expect("valid d");
        assert_eq!(t.leaf_paths(), ["w_down", "w_up", "wk", "wo", "wq", "wv"]);
        // wk is creation position 1: normal(fold_in(key, 1)) / 2.
        let raw = normal(fold_in(key, 1), &[4, 4]).expect("small shape");
        let wk = t.get("wk").expect("wk exists");
        assert_eq!(wk.shape(), &[4, 4]);
        for (a, b) in wk.data().iter().zip(raw) {
            assert_eq!(*a, b * 0.5);
        }
    }

    #[test]
    fn zero_dims_are_errors() {
        let key = Key::from_data([0, 0]);
        assert!(init(key, 0).is_err());
        let err = make_batch(key, 4, 0, 3).expect_err("batch 0 is invalid");
        assert!(err.to_string().contains("batch"), "{err}");
    }

    #[test]
    fn inv_sqrt_d_of_powers_of_four_is_exact() {
        assert_eq!(inv_sqrt_d(64), 0.125);
        assert_eq!(inv_sqrt_d(4), 0.5);
    }
}
