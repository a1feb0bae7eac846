//! transformer_block forward and loss, from `shared/spec/transformer_block.md`.
//!
//! Activations are row-major `(tokens, d)` with `tokens = batch · seq`. Every matmul with a
//! parameter goes through the `dense` callback so the ES reference can substitute a
//! member's weights (full rank) or add its low-rank term.

/// `dense(x, W) = x · Wᵀ` for `x` `(rows, k)` and `W` `(m, k)`: `(rows, m)`, f32 sequential sums.
pub fn dense(x: &[f32], rows: usize, w: &[f32], m: usize, k: usize) -> Vec<f32> {
    assert_eq!(x.len(), rows * k);
    assert_eq!(w.len(), m * k);
    let mut out = vec![0.0f32; rows * m];
    for r in 0..rows {
        let xr = &x[r * k..(r + 1) * k];
        for o in 0..m {
            let wo = &w[o * k..(o + 1) * k];
            let mut acc = 0.0f32;
            for c in 0..k {
                acc += xr[c] * wo[c];
            }
            out[r * m + o] = acc;
        }
    }
    out
}

/// `x · rsqrt(mean(x², last axis) + 1e-6)`.
pub fn rms(x: &[f32], d: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; x.len()];
    for (row, o) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        let mut ss = 0.0f32;
        for v in row {
            ss += v * v;
        }
        let inv = 1.0 / (ss / d as f32 + 1e-6).sqrt();
        for (oi, v) in o.iter_mut().zip(row) {
            *oi = v * inv;
        }
    }
    out
}

/// `0.5 x (1 + tanh(sqrt(2/π) (x + 0.044715 x³)))`.
pub fn gelu_tanh(x: f32) -> f32 {
    let c = (2.0f32 / std::f32::consts::PI).sqrt();
    0.5 * x * (1.0 + (c * (x + 0.044_715 * x * x * x)).tanh())
}

/// The `dense` seam: `(leaf name, x, rows) -> x · W_nameᵀ`.
pub type DenseFn<'a> = dyn Fn(&str, &[f32], usize) -> Vec<f32> + 'a;

/// The forward pass. `dense(name, x, rows)` must return `x · W_nameᵀ` of shape `(rows, d)`.
pub fn forward(x: &[f32], batch: usize, seq: usize, d: usize, dense: &DenseFn<'_>) -> Vec<f32> {
    let t = batch * seq;
    assert_eq!(x.len(), t * d);
    let h = rms(x, d);
    let q = dense("wq", &h, t);
    let k = dense("wk", &h, t);
    let v = dense("wv", &h, t);
    let scale = (1.0 / (d as f64).sqrt()) as f32;
    let mut av = vec![0.0f32; t * d];
    let mut scores = vec![0.0f32; seq];
    for b in 0..batch {
        for s in 0..seq {
            let qs = &q[(b * seq + s) * d..(b * seq + s + 1) * d];
            for (u, sc) in scores.iter_mut().enumerate() {
                let ku = &k[(b * seq + u) * d..(b * seq + u + 1) * d];
                let mut acc = 0.0f32;
                for c in 0..d {
                    acc += qs[c] * ku[c];
                }
                *sc = acc * scale;
            }
            let mx = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut sum = 0.0f32;
            for sc in scores.iter_mut() {
                *sc = (*sc - mx).exp();
                sum += *sc;
            }
            let row = &mut av[(b * seq + s) * d..(b * seq + s + 1) * d];
            for c in 0..d {
                let mut acc = 0.0f32;
                for (u, sc) in scores.iter().enumerate() {
                    acc += (sc / sum) * v[(b * seq + u) * d + c];
                }
                row[c] = acc;
            }
        }
    }
    let o = dense("wo", &av, t);
    let x1: Vec<f32> = x.iter().zip(&o).map(|(a, b)| a + b).collect();
    let h2 = rms(&x1, d);
    let up: Vec<f32> = dense("w_up", &h2, t).into_iter().map(gelu_tanh).collect();
    let down = dense("w_down", &up, t);
    x1.iter().zip(&down).map(|(a, b)| a + b).collect()
}

/// Pairwise f32 sum: a long sequential f32 sum drifts by up to `n·ε`, far more than the
/// tolerances the reference is held to; halving keeps the error near `log2(n)·ε`.
pub fn pairwise_sum(v: &[f32]) -> f32 {
    if v.len() <= 16 {
        let mut acc = 0.0f32;
        for x in v {
            acc += x;
        }
        return acc;
    }
    let (a, b) = v.split_at(v.len() / 2);
    pairwise_sum(a) + pairwise_sum(b)
}

/// `mean((out − target)²)`, accumulated in f32 (pairwise).
pub fn mse(out: &[f32], target: &[f32]) -> f32 {
    assert_eq!(out.len(), target.len());
    let sq: Vec<f32> = out
        .iter()
        .zip(target)
        .map(|(o, t)| (o - t) * (o - t))
        .collect();
    pairwise_sum(&sq) / out.len() as f32
}
