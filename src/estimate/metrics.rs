//! How good a gradient estimator is: metrics over repeated estimates against a reference.
//!
//! For estimates `ĝ_1 … ĝ_R` (independent repeats: generations `0 … R − 1`, so each uses its
//! own base key) of a gradient `g`, with `ḡ` their mean:
//!
//! - **cosine**: the mean over repeats of `cos(ĝ_r, g) = ĝ_r·g / (‖ĝ_r‖ ‖g‖)`;
//! - **relative bias**: `‖ḡ − g‖ / ‖g‖`, with its standard error `√(tr Ĉov(ĝ) / R) / ‖g‖`
//!   (an unbiased estimator has a relative bias of about one standard error);
//! - **relative variance**: `tr Ĉov(ĝ) / ‖g‖²`, `Ĉov` with the `R − 1` denominator: the
//!   spread of one estimate;
//! - **relative MSE**: the mean over repeats of `‖ĝ_r − g‖² / ‖g‖²` (bias² + variance).
//!
//! The **sampling dimension** of a strategy over a parameter tree is the number of scalar
//! Gaussian (or quasi-random) coordinates one direction is drawn from: `r (m + k)` for a 2-D
//! leaf `(m, k)` under `lowrank(r)`, the leaf's size for every other leaf, summed over the
//! leaves (mirroring and coupling do not change it). It is what the sampler explores per
//! direction: the Sobol dimension under `coupling=sobol`, and for the isotropic full-rank
//! estimator on a quadratic with mirrored pairs, where it is the parameter count `d`, the
//! relative MSE is exactly `(d + 1) / (n / 2)`.

use shardes_hlo::es::{LeafInfo, Strategy};

/// `a·b / (‖a‖ ‖b‖)`; 0 when either is zero.
pub fn cosine(a: &[f64], b: &[f64]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let na = norm(a);
    let nb = norm(b);
    if na == 0.0 || nb == 0.0 {
        0.0
    } else {
        dot / (na * nb)
    }
}

/// The Euclidean norm.
pub fn norm(a: &[f64]) -> f64 {
    a.iter().map(|x| x * x).sum::<f64>().sqrt()
}

/// The sampling dimension of `strategy` over `leaves` (see the module documentation).
pub fn sampling_dimension(strategy: &dyn Strategy, leaves: &[LeafInfo]) -> usize {
    leaves.iter().map(|l| strategy.noise_elements(l)).sum()
}

/// The metrics of repeated estimates against a reference (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Quality {
    /// Repeats.
    pub repeats: usize,
    /// Mean cosine similarity of one estimate with the reference.
    pub cosine: f64,
    /// The standard deviation of that cosine over repeats.
    pub cosine_sd: f64,
    /// `‖ḡ − g‖ / ‖g‖`.
    pub relative_bias: f64,
    /// Its standard error, `√(tr Ĉov / R) / ‖g‖`.
    pub bias_se: f64,
    /// `tr Ĉov(ĝ) / ‖g‖²`.
    pub relative_variance: f64,
    /// Mean `‖ĝ_r − g‖² / ‖g‖²`.
    pub relative_mse: f64,
}

impl Quality {
    /// The metrics of `estimates` (each as long as `truth`, at least two) against `truth`.
    /// `None` when there are fewer than two estimates, a length differs, or `truth` is zero.
    pub fn of(estimates: &[Vec<f64>], truth: &[f64]) -> Option<Quality> {
        let r = estimates.len();
        let g2 = norm(truth).powi(2);
        if r < 2 || g2 == 0.0 || estimates.iter().any(|e| e.len() != truth.len()) {
            return None;
        }
        let rf = r as f64;
        let dim = truth.len();
        let mean: Vec<f64> = (0..dim)
            .map(|i| estimates.iter().map(|e| e[i]).sum::<f64>() / rf)
            .collect();
        let trace: f64 = (0..dim)
            .map(|i| {
                estimates
                    .iter()
                    .map(|e| (e[i] - mean[i]).powi(2))
                    .sum::<f64>()
            })
            .sum::<f64>()
            / (rf - 1.0);
        let bias = mean
            .iter()
            .zip(truth)
            .map(|(a, b)| (a - b).powi(2))
            .sum::<f64>()
            .sqrt();
        let mse = estimates
            .iter()
            .map(|e| {
                e.iter()
                    .zip(truth)
                    .map(|(a, b)| (a - b).powi(2))
                    .sum::<f64>()
            })
            .sum::<f64>()
            / rf
            / g2;
        let cos: Vec<f64> = estimates.iter().map(|e| cosine(e, truth)).collect();
        let cm = cos.iter().sum::<f64>() / rf;
        let csd = (cos.iter().map(|c| (c - cm).powi(2)).sum::<f64>() / (rf - 1.0)).sqrt();
        let gn = g2.sqrt();
        Some(Quality {
            repeats: r,
            cosine: cm,
            cosine_sd: csd,
            relative_bias: bias / gn,
            bias_se: (trace / rf).sqrt() / gn,
            relative_variance: trace / g2,
            relative_mse: mse,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_of_known_estimates() {
        let g = vec![1.0, 0.0];
        let est = vec![vec![1.0, 1.0], vec![1.0, -1.0]];
        let q = Quality::of(&est, &g).unwrap();
        assert!((q.cosine - 0.5f64.sqrt()).abs() < 1e-12);
        assert_eq!(q.relative_bias, 0.0);
        // Ĉov: variance 2 in the second coordinate (R − 1 = 1), so tr = 2.
        assert!((q.relative_variance - 2.0).abs() < 1e-12);
        assert!((q.bias_se - 1.0).abs() < 1e-12);
        assert!((q.relative_mse - 1.0).abs() < 1e-12);
        assert!(Quality::of(&est[..1], &g).is_none());
        assert!(Quality::of(&est, &[0.0, 0.0]).is_none());
        assert_eq!(cosine(&[0.0], &[1.0]), 0.0);
    }
}
