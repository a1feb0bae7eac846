//! One ES generation on the host: noise, member evaluation and update (semantics.md).

use shardes::hlo::params::{Array, ParamTree};
use shardes::hlo::prng::{fold_in, normal, Key};

use super::model;

/// The inner noise of a strategy.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Inner {
    /// `ε(i) = normal(fold_in(stream_j, i), [size_j])` for every leaf.
    FullRank,
    /// Rank-`r` factors for 2-D leaves, full rank for the others.
    LowRank(usize),
}

/// Strategy and hyper-parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Es {
    /// Inner noise.
    pub inner: Inner,
    /// `Mirrored(inner)` pairing.
    pub mirrored: bool,
    /// Population size.
    pub n: usize,
    /// Noise scale.
    pub sigma: f32,
    /// Learning rate.
    pub lr: f32,
}

/// One leaf's noise for one inner id.
#[derive(Debug, Clone, PartialEq)]
pub enum LeafNoise {
    /// Dense `ε`, row-major in the leaf's shape.
    Full(Vec<f32>),
    /// Low-rank factors: `a` is `(m, r)`, `b` is `(k, r)`, row-major.
    LowRank {
        /// `A`, `(m, r)`.
        a: Vec<f32>,
        /// `B`, `(k, r)`.
        b: Vec<f32>,
        /// Rows of the leaf.
        m: usize,
        /// Columns of the leaf.
        k: usize,
        /// Rank.
        r: usize,
    },
}

/// The batch every member sees: `x` and `target`, `(batch, seq, d)` row-major.
#[derive(Debug, Clone, Copy)]
pub struct Data<'a> {
    /// Model input.
    pub x: &'a [f32],
    /// Regression target.
    pub target: &'a [f32],
    /// Sequences.
    pub batch: usize,
    /// Tokens per sequence.
    pub seq: usize,
}

/// One leaf as a member sees it: weights (already perturbed under full rank) and, under
/// low rank, the factors `(A, B, r)` added through the dense seam.
struct MemberLeaf {
    path: String,
    shape: Vec<usize>,
    w: Vec<f32>,
    factors: Option<(Vec<f32>, Vec<f32>, usize)>,
}

/// `base_key = fold_in(state.key, generation)`.
pub fn base_key(state_key: Key, generation: u32) -> Key {
    fold_in(state_key, generation)
}

/// `stream_j = fold_in(base_key, j)`.
pub fn stream(base: Key, leaf: usize) -> Key {
    fold_in(base, u32::try_from(leaf).expect("leaf index fits u32"))
}

/// Low-rank factors of a `(m, k)` leaf for inner id `i`: column keys `c_q = fold_in(stream, q)`;
/// `A[:, q] = normal(fold_in(c_q, i), [m])`, `B[:, q] = normal(fold_in(c_{r+q}, i), [k])`.
pub fn low_rank_factors(stream: Key, i: u32, m: usize, k: usize, r: usize) -> (Vec<f32>, Vec<f32>) {
    let mut a = vec![0.0f32; m * r];
    let mut b = vec![0.0f32; k * r];
    for q in 0..r {
        let cq = fold_in(stream, q as u32);
        let crq = fold_in(stream, (r + q) as u32);
        let col_a = normal(fold_in(cq, i), &[m]).expect("small shape");
        let col_b = normal(fold_in(crq, i), &[k]).expect("small shape");
        for row in 0..m {
            a[row * r + q] = col_a[row];
        }
        for row in 0..k {
            b[row * r + q] = col_b[row];
        }
    }
    (a, b)
}

impl Es {
    /// Number of distinct noise directions (inner ids).
    pub fn directions(&self) -> usize {
        if self.mirrored {
            self.n / 2
        } else {
            self.n
        }
    }

    /// Inner id and sign of member `i`.
    pub fn member(&self, i: usize) -> (u32, f32) {
        if self.mirrored {
            ((i / 2) as u32, if i & 1 == 0 { 1.0 } else { -1.0 })
        } else {
            (i as u32, 1.0)
        }
    }

    /// The noise of leaf `j` (shape `shape`) for inner id `i`.
    pub fn leaf_noise(&self, base: Key, j: usize, shape: &[usize], i: u32) -> LeafNoise {
        let s = stream(base, j);
        match (self.inner, shape) {
            (Inner::LowRank(r), &[m, k]) => {
                let (a, b) = low_rank_factors(s, i, m, k, r);
                LeafNoise::LowRank { a, b, m, k, r }
            }
            _ => LeafNoise::Full(normal(fold_in(s, i), shape).expect("small shape")),
        }
    }

    /// Loss of member `i` on the transformer_block with `(batch, seq, d)` input `x`.
    pub fn member_loss(&self, params: &ParamTree, base: Key, i: usize, data: Data<'_>) -> f32 {
        let Data {
            x,
            target,
            batch,
            seq,
        } = data;
        let (id, s) = self.member(i);
        let ssigma = s * self.sigma;
        let mut leaves: Vec<MemberLeaf> = Vec::new();
        for (j, (path, w)) in params.leaves().into_iter().enumerate() {
            let shape = w.shape().to_vec();
            leaves.push(match self.leaf_noise(base, j, w.shape(), id) {
                LeafNoise::Full(eps) => {
                    let wi = w
                        .data()
                        .iter()
                        .zip(&eps)
                        .map(|(t, e)| t + ssigma * e)
                        .collect();
                    MemberLeaf {
                        path,
                        shape,
                        w: wi,
                        factors: None,
                    }
                }
                LeafNoise::LowRank { a, b, r, .. } => MemberLeaf {
                    path,
                    shape,
                    w: w.data().to_vec(),
                    factors: Some((a, b, r)),
                },
            });
        }
        let d = x.len() / (batch * seq);
        let dense = |name: &str, h: &[f32], rows: usize| -> Vec<f32> {
            let leaf = leaves
                .iter()
                .find(|l| l.path == name)
                .unwrap_or_else(|| panic!("no leaf {name}"));
            let (m, k) = (leaf.shape[0], leaf.shape[1]);
            let mut out = model::dense(h, rows, &leaf.w, m, k);
            if let Some((a, b, r)) = &leaf.factors {
                let r = *r;
                let coef = ssigma / (r as f32).sqrt();
                // (x B): (rows, r); then (x B) Aᵀ: (rows, m).
                let xb = model::dense(h, rows, &transpose(b, k, r), r, k);
                let pert = model::dense(&xb, rows, a, m, r);
                for (o, p) in out.iter_mut().zip(&pert) {
                    *o += p * coef;
                }
            }
            out
        };
        let out = model::forward(x, batch, seq, d, &dense);
        model::mse(&out, target)
    }

    /// All `n` member losses, in global member order (two threads).
    pub fn evaluate(&self, params: &ParamTree, base: Key, data: Data<'_>) -> Vec<f32> {
        let threads = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(8);
        let mut fitness = vec![0.0f32; self.n];
        let chunk = self.n.div_ceil(threads).max(1);
        std::thread::scope(|sc| {
            for (c, out) in fitness.chunks_mut(chunk).enumerate() {
                sc.spawn(move || {
                    for (o, f) in out.iter_mut().enumerate() {
                        *f = self.member_loss(params, base, c * chunk + o, data);
                    }
                });
            }
        });
        fitness
    }

    /// The contraction `u` per leaf: `Σ_i w_i s_i ε(i)` (mirrored: `Σ_k (w_2k − w_2k+1) ε(k)`;
    /// low rank: `Σ coef_k A_k B_kᵀ / √r`), accumulated in f32.
    pub fn contraction(&self, params: &ParamTree, base: Key, weights: &[f32]) -> Vec<Vec<f32>> {
        assert_eq!(weights.len(), self.n, "one weight per member");
        let coefs: Vec<f32> = (0..self.directions())
            .map(|k| {
                if self.mirrored {
                    weights[2 * k] - weights[2 * k + 1]
                } else {
                    weights[k]
                }
            })
            .collect();
        let mut out = Vec::new();
        for (j, (_, w)) in params.leaves().into_iter().enumerate() {
            let mut u = vec![0.0f32; w.len()];
            for (k, &c) in coefs.iter().enumerate() {
                match self.leaf_noise(base, j, w.shape(), k as u32) {
                    LeafNoise::Full(eps) => {
                        for (ui, e) in u.iter_mut().zip(&eps) {
                            *ui += c * e;
                        }
                    }
                    LeafNoise::LowRank {
                        a,
                        b,
                        m,
                        k: cols,
                        r,
                    } => {
                        for row in 0..m {
                            for col in 0..cols {
                                let mut acc = 0.0f32;
                                for q in 0..r {
                                    acc += (c * a[row * r + q]) * b[col * r + q];
                                }
                                u[row * cols + col] += acc;
                            }
                        }
                    }
                }
            }
            if let Inner::LowRank(r) = self.inner {
                if w.ndim() == 2 {
                    let inv = 1.0 / (r as f32).sqrt();
                    u.iter_mut().for_each(|x| *x *= inv);
                }
            }
            out.push(u);
        }
        out
    }

    /// `θ ← θ − lr/(nσ) · u`: the new parameters.
    pub fn update(&self, params: &ParamTree, base: Key, weights: &[f32]) -> ParamTree {
        let u = self.contraction(params, base, weights);
        let step = self.lr / (self.n as f32 * self.sigma);
        let mut it = u.into_iter();
        params.map_leaves(|_, w| {
            let u = it.next().expect("one contraction per leaf");
            let data = w.data().iter().zip(&u).map(|(t, x)| t - step * x).collect();
            Array::new(w.shape().to_vec(), data).expect("same shape")
        })
    }
}

/// Transposes a row-major `(rows, cols)` matrix.
pub fn transpose(x: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut t = vec![0.0f32; x.len()];
    for i in 0..rows {
        for j in 0..cols {
            t[j * rows + i] = x[i * cols + j];
        }
    }
    t
}
