//! Per-leaf σ, separable σ and frozen leaves (semantics.md, "Per-leaf σ and frozen leaves").
//!
//! A [`ShardedES`] has one scalar σ; beside it, each leaf may get its own σ (a
//! [`LeafSigma`]: a scalar, or `p qᵀ` for a 2-D leaf) or be frozen (no noise, no update,
//! read as a plain weight). The library sets them for an exact tree
//! ([`ShardedES::with_sigma_leaves`], [`ShardedES::with_sigma_separable`],
//! [`ShardedES::with_freeze`]); a config sets them with glob patterns over the leaf paths
//! ([`EsSpec::sigma_leaves`], [`EsSpec::freeze`]). Both are resolved against the leaves
//! when a program is built ([`ShardedES::leaf_scales`]): a tree with a missing or an extra
//! leaf, or a pattern that matches no leaf, is an error, never a silent broadcast.
//!
//! Leaf `j` keeps its stream `fold_in(base_key, j)` whatever is frozen, and the update's
//! factor `lr / (n σ_j)` is one f32 scalar per leaf (`lr / n` for a separable leaf, whose
//! update divides by `p qᵀ` elementwise). With nothing set, the programs are exactly those
//! of the scalar σ.

use std::collections::BTreeMap;

use glob::Pattern;

use crate::builder::{Func, Value};

use super::error::{invalid, EsError};
pub use super::leaf_sigma::{LeafScale, LeafSigma, SigmaPatterns};
use super::leaf_sigma::{LeafSettings, Names};
use super::settings::{EsSpec, ShardedES};
use super::strategy::LeafInfo;

/// The leaf paths for a message, at most 40 of them.
fn listing(leaves: &[LeafInfo]) -> String {
    let mut names: Vec<&str> = leaves.iter().take(40).map(|l| l.path.as_str()).collect();
    let more = leaves.len().saturating_sub(40);
    if more > 0 {
        names.push("…");
    }
    let tail = if more > 0 {
        format!(" ({more} more)")
    } else {
        String::new()
    };
    format!("{}{tail}", names.join(", "))
}

/// Checks one σ as the scalar σ is checked: finite, positive, not subnormal (XLA flushes
/// it to zero), and `lr / (n σ)` finite.
fn check_value(what: &str, sigma: f32, lr: f32, n: usize, fix_key: &str) -> Result<(), EsError> {
    if !(sigma.is_finite() && sigma > 0.0) {
        return Err(invalid(
            format!("{what} = {sigma} is not a finite number > 0"),
            format!("set {fix_key} to small positive numbers, e.g. 0.01"),
        ));
    }
    if sigma < f32::MIN_POSITIVE {
        return Err(invalid(
            format!(
                "{what} = {sigma:e} is too small for float32: below {:e} it is flushed to zero \
                 and perturbs nothing",
                f32::MIN_POSITIVE
            ),
            format!("set {fix_key} to small positive numbers, e.g. 0.01"),
        ));
    }
    if !(lr / (n as f32 * sigma)).is_finite() {
        return Err(invalid(
            format!("lr / (n · {what}) = {lr} / ({n} · {sigma:e}) overflows float32"),
            format!("raise {fix_key} or lower lr"),
        ));
    }
    Ok(())
}

/// Checks a separable σ's vectors: every entry as [`check_value`], and every product
/// `p_i q_j` a normal f32 (the update divides by it).
fn check_separable(
    what: &str,
    p: &[f32],
    q: &[f32],
    lr: f32,
    n: usize,
    fix_key: &str,
) -> Result<(), EsError> {
    for (name, v) in [("p", p), ("q", q)] {
        if v.is_empty() {
            return Err(invalid(
                format!("{what}: {name} is empty"),
                format!("give {fix_key} one entry per row (p) and per column (q)"),
            ));
        }
        for (i, x) in v.iter().enumerate() {
            if !(x.is_finite() && *x > 0.0) {
                return Err(invalid(
                    format!("{what}: {name}[{i}] = {x} is not a finite number > 0"),
                    format!("set {fix_key} to positive numbers"),
                ));
            }
        }
    }
    let range = |v: &[f32]| {
        v.iter()
            .fold((f32::INFINITY, 0.0f32), |(a, b), &x| (a.min(x), b.max(x)))
    };
    let ((plo, phi), (qlo, qhi)) = (range(p), range(q));
    let (lo, hi) = (plo * qlo, phi * qhi);
    check_value(&format!("{what} (smallest p·q)"), lo, lr, n, fix_key)?;
    if !hi.is_finite() {
        return Err(invalid(
            format!("{what}: the largest p·q overflows float32"),
            format!("lower {fix_key}"),
        ));
    }
    Ok(())
}

impl ShardedES {
    /// Gives every leaf its own σ: `tree` maps each leaf path to its [`LeafSigma`] and must
    /// name exactly the leaves of the tree the programs are built for (checked then: a
    /// missing or an extra leaf is an error). The same scalar on every leaf runs exactly as
    /// the scalar σ. Refuses a σ that is not finite and positive, and a separable σ with an
    /// empty or non-positive vector.
    pub fn with_sigma_leaves(
        mut self,
        tree: BTreeMap<String, LeafSigma>,
    ) -> Result<ShardedES, EsError> {
        for (path, s) in &tree {
            let what = format!("sigma_leaves[\"{path}\"]");
            match s {
                LeafSigma::Scalar(x) => check_value(&what, *x, self.lr, self.n, "sigma_leaves")?,
                LeafSigma::Separable { p, q } => {
                    check_separable(&what, p, q, self.lr, self.n, "sigma_leaves")?
                }
            }
        }
        self.leaf_sigma.tree = Some(tree);
        Ok(self)
    }

    /// Separable σ `p qᵀ` for some 2-D leaves, by path (`(p, q)`, lengths `m` and `k`),
    /// over whatever else sets their σ (the tree or a pattern); the other leaves keep
    /// theirs. Replaces a separable set before. A path that names no 2-D leaf of the tree,
    /// or vectors of other lengths, are an error when a program is built.
    pub fn with_sigma_separable(
        mut self,
        leaves: BTreeMap<String, (Vec<f32>, Vec<f32>)>,
    ) -> Result<ShardedES, EsError> {
        let names = self.leaf_sigma.names;
        let key = names.key("sigma_separable", "es.sigma_separable");
        for (path, (p, q)) in &leaves {
            let what = names.key(
                &format!("sigma_separable[\"{path}\"]"),
                &format!("es.sigma_separable: {path}"),
            );
            check_separable(&what, p, q, self.lr, self.n, &key)?;
        }
        self.leaf_sigma.separable = leaves;
        Ok(self)
    }

    /// Freezes the leaves whose paths match any of `patterns` (globs: `*` matches any run
    /// of characters, dots included; a plain path matches itself): no noise, no update,
    /// read by the model as plain weights. Every other leaf keeps its noise stream. A
    /// pattern that matches no leaf is an error when a program is built.
    pub fn with_freeze<S: AsRef<str>>(mut self, patterns: &[S]) -> Result<ShardedES, EsError> {
        let key = self.leaf_sigma.names.key("freeze", "es.freeze");
        self.leaf_sigma.freeze = patterns
            .iter()
            .map(|p| glob(p.as_ref(), &key))
            .collect::<Result<_, _>>()?;
        Ok(self)
    }

    /// Whether every leaf takes the scalar σ and none is frozen.
    pub fn sigma_is_scalar(&self) -> bool {
        self.leaf_sigma.is_scalar()
    }

    /// The leaves of `leaves` that get noise (all but the frozen ones), in order: the
    /// leaves `tell` sums over members ([`crate::es::ProgramKind::Partial`]).
    pub fn active_leaves(&self, leaves: &[LeafInfo]) -> Result<Vec<LeafInfo>, EsError> {
        Ok(active(leaves, &self.leaf_scales(leaves)?))
    }

    /// What the programs do with each of `leaves` (in order): frozen, or perturbed and
    /// updated with its σ. Errors name the setting (the config key for an ES built from an
    /// [`EsSpec`]): a library tree with a missing or an extra leaf, a pattern that matches
    /// no leaf, a separable σ for a leaf that is not 2-D or whose vectors do not have its
    /// lengths, every leaf frozen.
    pub fn leaf_scales(&self, leaves: &[LeafInfo]) -> Result<Vec<LeafScale>, EsError> {
        let s = &self.leaf_sigma;
        let names = s.names;
        let scalar = LeafSigma::Scalar(self.sigma);
        let mut out: Vec<LeafScale> = match &s.tree {
            Some(tree) => {
                if let Some(extra) = tree.keys().find(|k| !leaves.iter().any(|l| l.path == **k)) {
                    return Err(invalid(
                        format!(
                            "sigma_leaves[\"{extra}\"] names no leaf; the tree's leaves are: {}",
                            listing(leaves)
                        ),
                        "give exactly one σ per leaf of the tree".into(),
                    ));
                }
                leaves
                    .iter()
                    .map(|l| {
                        tree.get(&l.path)
                            .cloned()
                            .map(LeafScale::Sigma)
                            .ok_or_else(|| {
                                invalid(
                                    format!(
                                        "sigma_leaves has no σ for leaf \"{}\"; the tree's leaves \
                                     are: {}",
                                        l.path,
                                        listing(leaves)
                                    ),
                                    "give exactly one σ per leaf of the tree".into(),
                                )
                            })
                    })
                    .collect::<Result<_, _>>()?
            }
            None => leaves
                .iter()
                .map(|l| {
                    let found = s.patterns.iter().find(|(p, _)| p.matches(&l.path));
                    LeafScale::Sigma(found.map_or(scalar.clone(), |(_, x)| LeafSigma::Scalar(*x)))
                })
                .collect(),
        };
        for (p, _) in &s.patterns {
            if !leaves.iter().any(|l| p.matches(&l.path)) {
                return Err(invalid(
                    format!(
                        "{}: pattern \"{}\" matches no leaf; the leaves are: {}",
                        names.key("sigma_leaves", "es.sigma_leaves"),
                        p.as_str(),
                        listing(leaves)
                    ),
                    "fix or remove the pattern (`*` matches any characters, dots included)".into(),
                ));
            }
        }
        let sep_key = names.key("sigma_separable", "es.sigma_separable");
        for (path, (p, q)) in &s.separable {
            let Some(j) = leaves.iter().position(|l| l.path == *path) else {
                return Err(invalid(
                    format!(
                        "{sep_key}: \"{path}\" names no leaf; the leaves are: {}",
                        listing(leaves)
                    ),
                    "name 2-D leaves by their paths".into(),
                ));
            };
            let [m, k] = leaves[j].shape[..] else {
                return Err(invalid(
                    format!(
                        "{sep_key}: leaf \"{path}\" has shape {:?}; separable σ is for 2-D leaves",
                        leaves[j].shape
                    ),
                    format!("give \"{path}\" a scalar σ instead"),
                ));
            };
            if (p.len() as i64, q.len() as i64) != (m, k) {
                return Err(invalid(
                    format!(
                        "{sep_key}: leaf \"{path}\" is ({m}, {k}) but p has {} entries and q {}",
                        p.len(),
                        q.len()
                    ),
                    format!("give \"{path}\" p of length {m} (rows) and q of length {k} (columns)"),
                ));
            }
            out[j] = LeafScale::Sigma(LeafSigma::Separable {
                p: p.clone(),
                q: q.clone(),
            });
        }
        let key = names.key("freeze", "es.freeze");
        for p in &s.freeze {
            if !leaves.iter().any(|l| p.matches(&l.path)) {
                return Err(invalid(
                    format!(
                        "{key}: pattern \"{}\" matches no leaf; the leaves are: {}",
                        p.as_str(),
                        listing(leaves)
                    ),
                    "fix or remove the pattern (`*` matches any characters, dots included)".into(),
                ));
            }
        }
        for (l, scale) in leaves.iter().zip(out.iter_mut()) {
            if s.freeze.iter().any(|p| p.matches(&l.path)) {
                *scale = LeafScale::Frozen;
            }
        }
        if !leaves.is_empty() && out.iter().all(|s| *s == LeafScale::Frozen) {
            return Err(invalid(
                format!("{key} freezes every leaf: nothing would be trained"),
                "leave at least one leaf unfrozen".into(),
            ));
        }
        Ok(out)
    }
}

/// A glob pattern, or the error naming `key`.
fn glob(pattern: &str, key: &str) -> Result<Pattern, EsError> {
    Pattern::new(pattern).map_err(|e| {
        invalid(
            format!("{key}: \"{pattern}\" is not a glob pattern: {}", e.msg),
            "write a glob over leaf paths, e.g. \"layers.*.wq\" (`*` any characters, `?` one, \
             `[ab]` one of)"
                .into(),
        )
    })
}

impl EsSpec {
    /// The per-leaf settings of these keys (`es.sigma_leaves`, `es.freeze`; the
    /// separable file is read by the front end, [`ShardedES::with_sigma_separable`]),
    /// each value checked with the errors naming its key.
    pub(crate) fn leaf_settings(&self) -> Result<LeafSettings, EsError> {
        let mut patterns = Vec::with_capacity(self.sigma_leaves.0.len());
        for (pattern, sigma) in &self.sigma_leaves.0 {
            let what = format!("es.sigma_leaves.\"{pattern}\"");
            check_value(&what, *sigma, self.lr, self.n, &what)?;
            patterns.push((glob(pattern, "es.sigma_leaves")?, *sigma));
        }
        let freeze = self
            .freeze
            .iter()
            .map(|p| glob(p, "es.freeze"))
            .collect::<Result<_, _>>()?;
        Ok(LeafSettings {
            names: Names::Config,
            tree: None,
            patterns,
            separable: BTreeMap::new(),
            freeze,
        })
    }
}

/// The emission side: per-leaf factors for `perturbed` and `tell`.
///
/// Each distinct value becomes one constant, emitted in leaf order where it first occurs,
/// so one σ on every leaf emits exactly the scalar program.
pub(super) struct Emission<'a> {
    scales: &'a [LeafScale],
}

/// How `perturbed` scales one leaf's unit noise for a chunk.
pub(super) enum Perturb {
    /// Frozen: read as a plain weight.
    Frozen,
    /// `s σ_j` per member (`f32[c]`).
    Scalar(Value),
    /// `p qᵀ`: the noise is scaled by `p` and `q` first, then by the signs.
    Separable {
        /// `f32[m]`.
        p: Value,
        /// `f32[k]`.
        q: Value,
    },
}

/// How `tell` turns one leaf's contraction `u` into its update.
pub(super) enum Step {
    /// Frozen: unchanged.
    Frozen,
    /// `θ − u · lr/(n σ_j)`.
    Scalar(Value),
    /// `θ − (u ⊘ p qᵀ) · lr/n`.
    Separable {
        /// `p qᵀ`, `f32[m, k]`.
        s: Value,
        /// `lr / n`.
        scale: Value,
    },
}

impl<'a> Emission<'a> {
    pub(super) fn new(scales: &'a [LeafScale]) -> Self {
        Emission { scales }
    }

    /// Per leaf, what `perturbed` multiplies the noise by, for members with `signs`.
    pub(super) fn perturb(&self, signs: &Value) -> Result<Vec<Perturb>, EsError> {
        let f = signs.func();
        let mut memo: Vec<(u32, Value)> = Vec::new();
        self.scales
            .iter()
            .map(|s| {
                Ok(match s {
                    LeafScale::Frozen => Perturb::Frozen,
                    LeafScale::Sigma(LeafSigma::Scalar(x)) => {
                        Perturb::Scalar(memoized(&mut memo, *x, |x| Ok(signs.mul(&f.scalar(x)?)?))?)
                    }
                    LeafScale::Sigma(LeafSigma::Separable { p, q }) => Perturb::Separable {
                        p: f.constant(&[p.len() as i64], p)?,
                        q: f.constant(&[q.len() as i64], q)?,
                    },
                })
            })
            .collect()
    }

    /// Per leaf, the update's factor for `lr` and `n` members (computed once, in f32).
    pub(super) fn steps(&self, f: &Func, lr: f32, n: usize) -> Result<Vec<Step>, EsError> {
        let mut memo: Vec<(u32, Value)> = Vec::new();
        self.scales
            .iter()
            .map(|s| {
                Ok(match s {
                    LeafScale::Frozen => Step::Frozen,
                    LeafScale::Sigma(LeafSigma::Scalar(x)) => {
                        let factor = lr / (n as f32 * x);
                        Step::Scalar(memoized(&mut memo, factor, |v| Ok(f.scalar(v)?))?)
                    }
                    LeafScale::Sigma(LeafSigma::Separable { p, q }) => {
                        let (m, k) = (p.len() as i64, q.len() as i64);
                        let pv = f.constant(&[m], p)?.broadcast_in_dim(&[m, k], &[0])?;
                        let qv = f.constant(&[k], q)?.broadcast_in_dim(&[m, k], &[1])?;
                        Step::Separable {
                            s: pv.mul(&qv)?,
                            scale: f.scalar(lr / n as f32)?,
                        }
                    }
                })
            })
            .collect()
    }
}

/// The value for `x` from `memo`, or `make(x)` remembered under its bits.
fn memoized(
    memo: &mut Vec<(u32, Value)>,
    x: f32,
    make: impl FnOnce(f32) -> Result<Value, EsError>,
) -> Result<Value, EsError> {
    if let Some((_, v)) = memo.iter().find(|(b, _)| *b == x.to_bits()) {
        return Ok(v.clone());
    }
    let v = make(x)?;
    memo.push((x.to_bits(), v.clone()));
    Ok(v)
}

/// The stream ids of `leaves` (their whole-tree indices), as a `u32` constant.
pub(super) fn leaf_ids(f: &Func, leaves: &[LeafInfo]) -> Result<Value, EsError> {
    let ids: Vec<u32> = leaves.iter().map(|l| l.index as u32).collect();
    Ok(f.constant(&[ids.len() as i64], &ids)?)
}

/// Scales unit noise `[c, ...]` by a separable σ: factors `a [c, r, m]` by `p` and
/// `b [c, r, k]` by `q`; dense noise `[c, m, k]` by `p qᵀ`.
pub(super) fn separable_noise(
    noise: super::strategy::Noise,
    p: &Value,
    q: &Value,
) -> Result<super::strategy::Noise, EsError> {
    use super::strategy::Noise;
    Ok(match noise {
        Noise::Factors { a, b } => Noise::Factors {
            a: a.mul(&p.broadcast_in_dim(a.shape(), &[2])?)?,
            b: b.mul(&q.broadcast_in_dim(b.shape(), &[2])?)?,
        },
        Noise::Dense(e) => {
            let s = e.shape().to_vec();
            let pq = p
                .broadcast_in_dim(&s[1..], &[0])?
                .mul(&q.broadcast_in_dim(&s[1..], &[1])?)?;
            Noise::Dense(e.mul(&pq.broadcast_in_dim(&s, &[1, 2])?)?)
        }
    })
}

/// The leaves of `leaves` whose scale (`scales`, one per leaf) is not frozen, in order.
pub(super) fn active(leaves: &[LeafInfo], scales: &[LeafScale]) -> Vec<LeafInfo> {
    leaves
        .iter()
        .zip(scales)
        .filter(|(_, s)| **s != LeafScale::Frozen)
        .map(|(l, _)| l.clone())
        .collect()
}
