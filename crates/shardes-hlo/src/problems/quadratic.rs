//! A quadratic with a known gradient, for measuring gradient estimators.
//!
//! Parameters: `b [k]` and `w (m, k)` (leaf order `b`, `w`), `θ = (b, w)`. The objective is
//!
//! ```text
//! f(θ) = ½ (θ − θ*)ᵀ H (θ − θ*) = ½ ‖S_P (w − w*) S_R‖²_F + ½ ‖S_R (b − b*)‖²
//! ```
//!
//! with `S_P = Q_P diag(√λ_P) Q_Pᵀ` (`m × m`) and `S_R = Q_R diag(√λ_R) Q_Rᵀ` (`k × k`)
//! symmetric positive definite, so `H` is block diagonal with blocks `R ⊗ P` (on
//! `vec(w)`) and `R` (on `b`), `P = S_P²`, `R = S_R²`. The eigenvalues of `P` run
//! geometrically from 1 to `κ_P`, those of `R` from 1 to `κ_R`, with `κ_P κ_R = κ` (the
//! `condition`, split evenly, or all on the side with more than one row): `H`'s eigenvalues
//! span `[1, κ]`, its condition number is `κ` (when `m k > 1`). The gradient is
//! `∇_w f = P (w − w*) R`, `∇_b f = R (b − b*)`; [`QuadraticInstance::gradient`] computes
//! it in f64 from the f32 matrices the program uses.
//!
//! Draws (key `k`): `Q_P` and `Q_R` are the Gram–Schmidt orthonormalizations of
//! `normal(fold_in(k, 0), [m, m])` and `normal(fold_in(k, 1), [k, k])`; `w* =
//! normal(fold_in(k, 2), [m, k])`, `b* = normal(fold_in(k, 3), [k])`. The initial point is
//! zero.
//!
//! The model reads `w` through the seam only: `Z = dense(S_R, w) − S_R w*ᵀ` (`k × m`, the
//! transpose of `(w − w*) S_R`), `Y = dense(Z, S_P) = ((S_P (w − w*) S_R))ᵀ`, and the loss is
//! `½ ΣY² + ½ Σ(dense(b, S_R) − S_R b*)²`, all in f32. Batch: `sr [k, k]`, `sp [m, m]`,
//! `wt [k, m]` (`= S_R w*ᵀ`), `bt [k]` (`= S_R b*`).

use crate::builder::{TensorType, Value};
use crate::es::{EsError, Model, ModelParams};
use crate::nn::{self, Act, Weight};
use crate::params::{Array, ParamTree};
use crate::prng::{fold_in, normal, Key};

use super::{ProblemError, ShapedPath};

/// The largest `rows` or `cols` (the program holds `S_P` and `S_R` as dense batch inputs).
pub const QUADRATIC_MAX_DIM: usize = 4096;

/// The quadratic's sizes and condition number.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Quadratic {
    /// `m`, rows of `w`.
    pub rows: usize,
    /// `k`, columns of `w` and the length of `b`.
    pub cols: usize,
    /// `κ ≥ 1`, the condition number of `H`.
    pub condition: f64,
}

impl Quadratic {
    /// Checks the sizes (1 to [`QUADRATIC_MAX_DIM`]) and the condition number (finite,
    /// at least 1).
    pub fn new(rows: usize, cols: usize, condition: f64) -> Result<Quadratic, ProblemError> {
        for (what, value) in [("rows", rows), ("cols", cols)] {
            if !(1..=QUADRATIC_MAX_DIM).contains(&value) {
                return Err(ProblemError::BadDimension {
                    what,
                    value,
                    fix: "use between 1 and 4096",
                });
            }
        }
        if !(condition.is_finite() && condition >= 1.0) {
            return Err(ProblemError::BadSetting {
                what: "condition",
                value: condition.to_string(),
                fix: "use a finite condition number of at least 1 (1 is ½‖θ − θ*‖²)",
            });
        }
        Ok(Quadratic {
            rows,
            cols,
            condition,
        })
    }

    /// `b [k]`, `w [m, k]`.
    pub fn param_shapes(&self) -> Vec<ShapedPath> {
        vec![
            ("b".into(), vec![self.cols]),
            ("w".into(), vec![self.rows, self.cols]),
        ]
    }

    /// The starting point, zero.
    pub fn init(&self) -> Result<ParamTree, ProblemError> {
        Ok(ParamTree::map([
            ("b", ParamTree::Leaf(Array::zeros(vec![self.cols])?)),
            (
                "w",
                ParamTree::Leaf(Array::zeros(vec![self.rows, self.cols])?),
            ),
        ]))
    }

    /// `(κ_P, κ_R)`: the condition split between the two sides.
    fn split_condition(&self) -> (f64, f64) {
        match (self.rows > 1, self.cols > 1) {
            (true, true) => (self.condition.sqrt(), self.condition.sqrt()),
            (true, false) => (self.condition, 1.0),
            (false, _) => (1.0, self.condition),
        }
    }

    /// The instance drawn from `key` (see the module documentation).
    pub fn instance(&self, key: Key) -> Result<QuadraticInstance, ProblemError> {
        let (m, k) = (self.rows, self.cols);
        let (kp, kr) = self.split_condition();
        let sp = spd_sqrt(fold_in(key, 0), m, kp)?;
        let sr = spd_sqrt(fold_in(key, 1), k, kr)?;
        let w_star = normal(fold_in(key, 2), &[m, k])?;
        let b_star = normal(fold_in(key, 3), &[k])?;
        Ok(QuadraticInstance {
            quad: *self,
            sp,
            sr,
            w_star,
            b_star,
        })
    }
}

/// `Q diag(√λ) Qᵀ` in f32 for a drawn orthonormal `Q` (`n × n`) and eigenvalues
/// `λ_i = κ^(i / (n − 1))`.
fn spd_sqrt(key: Key, n: usize, kappa: f64) -> Result<Vec<f32>, ProblemError> {
    let g = normal(key, &[n, n])?;
    // Columns of `g` orthonormalized (modified Gram–Schmidt, f64); `q[c]` is column c.
    let mut q: Vec<Vec<f64>> = (0..n)
        .map(|c| (0..n).map(|r| f64::from(g[r * n + c])).collect())
        .collect();
    for c in 0..n {
        for p in 0..c {
            let (done, rest) = q.split_at_mut(c);
            let (col, prev) = (&mut rest[0], &done[p]);
            let dot: f64 = col.iter().zip(prev).map(|(x, y)| x * y).sum();
            for (x, y) in col.iter_mut().zip(prev) {
                *x -= dot * y;
            }
        }
        let norm = q[c].iter().map(|x| x * x).sum::<f64>().sqrt();
        for x in q[c].iter_mut() {
            *x /= norm;
        }
    }
    let root = |i: usize| -> f64 {
        if n == 1 {
            1.0
        } else {
            kappa.powf(i as f64 / (n - 1) as f64).sqrt()
        }
    };
    let mut s = vec![0.0f32; n * n];
    for r in 0..n {
        for c in 0..n {
            let v: f64 = (0..n).map(|i| q[i][r] * root(i) * q[i][c]).sum();
            s[r * n + c] = v as f32;
        }
    }
    Ok(s)
}

/// One drawn quadratic: the matrices and the optimum.
#[derive(Clone, Debug)]
pub struct QuadraticInstance {
    /// The sizes and condition.
    pub quad: Quadratic,
    /// `S_P`, `m × m` row-major.
    pub sp: Vec<f32>,
    /// `S_R`, `k × k` row-major.
    pub sr: Vec<f32>,
    /// `w*`, `m × k` row-major.
    pub w_star: Vec<f32>,
    /// `b*`, length `k`.
    pub b_star: Vec<f32>,
}

/// `a · b` for row-major `n × n` times `n × p` in f64.
fn matmul(a: &[f64], b: &[f64], n: usize, inner: usize, p: usize) -> Vec<f64> {
    let mut out = vec![0.0; n * p];
    for i in 0..n {
        for t in 0..inner {
            let x = a[i * inner + t];
            if x != 0.0 {
                for j in 0..p {
                    out[i * p + j] += x * b[t * p + j];
                }
            }
        }
    }
    out
}

fn square(s: &[f32], n: usize) -> Vec<f64> {
    let s: Vec<f64> = s.iter().map(|&x| f64::from(x)).collect();
    matmul(&s, &s, n, n, n)
}

impl QuadraticInstance {
    /// The batch: `sr [k, k]`, `sp [m, m]`, `wt = S_R w*ᵀ [k, m]`, `bt = S_R b* [k]` (f32;
    /// products in f64, rounded once).
    pub fn batch(&self) -> Result<Vec<Array>, ProblemError> {
        let (m, k) = (self.quad.rows, self.quad.cols);
        let sr: Vec<f64> = self.sr.iter().map(|&x| f64::from(x)).collect();
        let mut wst = vec![0.0; k * m];
        for i in 0..m {
            for j in 0..k {
                wst[j * m + i] = f64::from(self.w_star[i * k + j]);
            }
        }
        let bs: Vec<f64> = self.b_star.iter().map(|&x| f64::from(x)).collect();
        let wt = matmul(&sr, &wst, k, k, m);
        let bt = matmul(&sr, &bs, k, k, 1);
        let f = |v: Vec<f64>| v.into_iter().map(|x| x as f32).collect::<Vec<f32>>();
        Ok(vec![
            Array::new(vec![k, k], self.sr.clone())?,
            Array::new(vec![m, m], self.sp.clone())?,
            Array::new(vec![k, m], f(wt))?,
            Array::new(vec![k], f(bt))?,
        ])
    }

    /// `(θ − θ*)` as `(δb, δw)` in f64.
    fn deltas(&self, params: &ParamTree) -> Result<(Vec<f64>, Vec<f64>), ProblemError> {
        let (m, k) = (self.quad.rows, self.quad.cols);
        let leaves = params.leaves();
        // Leaf `name` (of `len` values) minus its optimum `star`.
        let delta = |name: &str, len: usize, star: &[f32]| -> Result<Vec<f64>, ProblemError> {
            let a = leaves
                .iter()
                .find(|(p, a)| p.as_str() == name && a.data().len() == len)
                .map(|(_, a)| *a)
                .ok_or(ProblemError::BadSetting {
                    what: "params",
                    value: format!("a tree without `{name}` of {len} values"),
                    fix: "pass the quadratic's own tree (leaves b [cols] and w [rows, cols])",
                })?;
            Ok(a.data()
                .iter()
                .zip(star)
                .map(|(&x, &y)| f64::from(x) - f64::from(y))
                .collect())
        };
        Ok((
            delta("b", k, &self.b_star)?,
            delta("w", m * k, &self.w_star)?,
        ))
    }

    /// The exact gradient `(R δb, P δw R)` at `params`, flattened in leaf order (`b`, then
    /// `w` row-major), in f64.
    pub fn gradient(&self, params: &ParamTree) -> Result<Vec<f64>, ProblemError> {
        let (m, k) = (self.quad.rows, self.quad.cols);
        let (db, dw) = self.deltas(params)?;
        let p = square(&self.sp, m);
        let r = square(&self.sr, k);
        let mut g = matmul(&r, &db, k, k, 1);
        let pd = matmul(&p, &dw, m, m, k);
        g.extend(matmul(&pd, &r, m, k, k));
        Ok(g)
    }

    /// `f(params)` in f64.
    pub fn value(&self, params: &ParamTree) -> Result<f64, ProblemError> {
        let g = self.gradient(params)?;
        let (db, dw) = self.deltas(params)?;
        Ok(0.5
            * db.iter()
                .chain(&dw)
                .zip(&g)
                .map(|(d, g)| d * g)
                .sum::<f64>())
    }
}

impl Model for Quadratic {
    fn batch_types(&self) -> Vec<(String, TensorType)> {
        let (m, k) = (self.rows as i64, self.cols as i64);
        vec![
            ("sr".into(), TensorType::f32(&[k, k])),
            ("sp".into(), TensorType::f32(&[m, m])),
            ("wt".into(), TensorType::f32(&[k, m])),
            ("bt".into(), TensorType::f32(&[k])),
        ]
    }

    fn loss(&self, p: &ModelParams, batch: &[Value]) -> Result<Act, EsError> {
        let [sr, sp, wt, bt] = batch else {
            return Err(EsError::Invalid {
                message: format!("the quadratic takes 4 batch arrays, got {}", batch.len()),
                fix: "pass sr, sp, wt and bt (QuadraticInstance::batch)".into(),
            });
        };
        let z =
            nn::dense(&Act::shared(sr.clone()), &p.weight("w")?)?.sub(&Act::shared(wt.clone()))?;
        let y = nn::dense(&z, &Weight::Plain(sp.clone()))?;
        let zb = nn::dense(&p.tensor("b")?, &Weight::Plain(sr.clone()))?
            .sub(&Act::shared(bt.clone()))?;
        let nw = (self.rows * self.cols) as f64;
        let fw = y.mul(&y)?.mean_all()?.scale(nw / 2.0)?;
        let fb = zb.mul(&zb)?.mean_all()?.scale(self.cols as f64 / 2.0)?;
        Ok(fw.add(&fb)?)
    }

    fn member_bytes(&self) -> Option<usize> {
        Some(self.rows * self.cols * 4)
    }
}
