//! Perturbation strategies: how a direction's noise is derived for each leaf.
//!
//! A strategy only says what the unit-scale noise of a batch of *directions* is for one
//! leaf; the generation program turns directions into members (pairing, signs), noise into
//! weights through the seams, and weighted noise into the update. Implement [`Strategy`]
//! to add your own.

use crate::builder::{Result, TensorType, Value};
use crate::prng::emit::{normal_of_bits, Keys};

use super::coupling::{hd_noise, sobol_normals, Coupling};
use super::spec::{with_coupling, StrategySpec};

/// What the program knows about a parameter leaf.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeafInfo {
    /// Position `j` in the JAX leaf order.
    pub index: usize,
    /// Leaf path, e.g. `wq` or `layers.0.wq`.
    pub path: String,
    /// The leaf's shape.
    pub shape: Vec<i64>,
}

/// Unit-scale noise of a batch of `d` directions for one leaf.
#[derive(Clone, Debug)]
pub enum Noise {
    /// Materialized noise `[d, ...leaf shape]`.
    Dense(Value),
    /// Rank-`r` factors of a 2-D `(m, k)` leaf: `E = A Bᵀ / √r` with `a [d, r, m]`,
    /// `b [d, r, k]`; never multiplied out.
    Factors {
        /// `[d, r, m]`.
        a: Value,
        /// `[d, r, k]`.
        b: Value,
    },
}

impl Noise {
    /// The number of directions.
    pub fn directions(&self) -> i64 {
        match self {
            Noise::Dense(v) | Noise::Factors { a: v, .. } => v.shape()[0],
        }
    }

    /// The values the noise is made of: `[e]` when dense, `[a, b]` for factors.
    pub fn values(&self) -> Vec<Value> {
        match self {
            Noise::Dense(e) => vec![e.clone()],
            Noise::Factors { a, b } => vec![a.clone(), b.clone()],
        }
    }

    /// Repeats each direction `p` times along dim 0 (`[d, ..] -> [d·p, ..]`).
    pub fn repeat(&self, p: i64) -> Result<Noise> {
        if p == 1 {
            return Ok(self.clone());
        }
        let rep = |v: &Value| -> Result<Value> {
            let s = v.shape();
            let mut wide = vec![s[0], p];
            wide.extend_from_slice(&s[1..]);
            let mut dims = vec![0];
            dims.extend(2..wide.len());
            let mut flat = vec![s[0] * p];
            flat.extend_from_slice(&s[1..]);
            v.broadcast_in_dim(&wide, &dims)?.reshape(&flat)
        };
        Ok(match self {
            Noise::Dense(v) => Noise::Dense(rep(v)?),
            Noise::Factors { a, b } => Noise::Factors {
                a: rep(a)?,
                b: rep(b)?,
            },
        })
    }

    /// Slices directions `[start, start + len)` with a traced start (i32 scalar).
    pub fn dynamic_rows(&self, start: &Value, len: i64) -> Result<Noise> {
        let cut = |v: &Value| -> Result<Value> {
            let f = v.func();
            let zero = f.scalar(0i32)?;
            let mut starts = vec![start.clone()];
            starts.extend(std::iter::repeat_n(zero, v.rank() - 1));
            let refs: Vec<&Value> = starts.iter().collect();
            let mut sizes = v.shape().to_vec();
            sizes[0] = len;
            v.dynamic_slice(&refs, &sizes)
        };
        Ok(match self {
            Noise::Dense(v) => Noise::Dense(cut(v)?),
            Noise::Factors { a, b } => Noise::Factors {
                a: cut(a)?,
                b: cut(b)?,
            },
        })
    }
}

/// A perturbation strategy.
pub trait Strategy {
    /// The canonical name, e.g. `lowrank(r=1)`.
    fn name(&self) -> String;

    /// Adjacent members sharing one direction (2 for antithetic pairs).
    fn pairing(&self) -> usize {
        1
    }

    /// Whether the noise of all local directions is generated once per generation and
    /// kept (IID Gaussian), instead of regenerated per member chunk.
    fn materialized(&self) -> bool {
        false
    }

    /// The preferred members per evaluation chunk, if the strategy has one.
    fn chunk(&self) -> Option<usize> {
        None
    }

    /// Emits the unit noise of directions `dirs` (`u32[d]`) for `leaf`, whose per-leaf stream
    /// key is `stream` (`fold_in(base_key, j)`).
    fn noise(&self, stream: &Keys, leaf: &LeafInfo, dirs: &Value) -> Result<Noise>;

    /// The noise of directions `dirs` for every leaf, `streams` holding the per-leaf stream
    /// keys (`u32` batch of shape `[L]`, key `j` for leaf `j`). The default draws leaf by
    /// leaf through [`Strategy::noise`]; a strategy whose noise is small can draw it for all
    /// leaves at once, which keeps the program (and its compile time) from growing with
    /// the number of leaves.
    fn noise_all(&self, streams: &Keys, leaves: &[LeafInfo], dirs: &Value) -> Result<Vec<Noise>> {
        leaves
            .iter()
            .enumerate()
            .map(|(j, l)| self.noise(&streams.at(j as i64)?, l, dirs))
            .collect()
    }

    /// [`Strategy::noise_all`] as `tell` regenerates it under `how = A`, for a consumer that
    /// reads each element once (the contraction): the same values, possibly emitted as ops
    /// that XLA fuses into that consumer. The default is [`Strategy::noise_all`].
    fn noise_contracted(
        &self,
        streams: &Keys,
        leaves: &[LeafInfo],
        dirs: &Value,
    ) -> Result<Vec<Noise>> {
        self.noise_all(streams, leaves, dirs)
    }

    /// Elements of one direction's noise for `leaf`, for memory planning (how many
    /// directions `tell` regenerates at once). The default, the leaf's size, is right for
    /// dense noise and an upper bound for any other.
    fn noise_elements(&self, leaf: &LeafInfo) -> usize {
        leaf_size(leaf)
    }
}

fn leaf_size(leaf: &LeafInfo) -> usize {
    leaf.shape.iter().map(|&d| d.max(0) as usize).product()
}

/// Full-rank noise `ε(i) = normal(fold_in(stream, i), [size])` reshaped to the leaf, for a
/// batch of directions: `[d, ...shape]`.
pub fn full_rank_noise(stream: &Keys, leaf: &LeafInfo, dirs: &Value) -> Result<Noise> {
    let size: i64 = leaf.shape.iter().product();
    let keys = stream.fold_in(dirs)?;
    let z = keys.normal(&[size])?;
    let mut shape = vec![dirs.shape()[0]];
    shape.extend_from_slice(&leaf.shape);
    Ok(Noise::Dense(z.reshape(&shape)?))
}

/// [`full_rank_noise`] drawn with threefry unrolled ([`Keys::normal_unrolled`]): the same
/// bits, as elementwise ops XLA fuses into the one consumer of each element.
fn full_rank_noise_unrolled(stream: &Keys, leaf: &LeafInfo, dirs: &Value) -> Result<Noise> {
    let size: i64 = leaf.shape.iter().product();
    let keys = stream.fold_in(dirs)?;
    let z = keys.normal_unrolled(&[size])?;
    let mut shape = vec![dirs.shape()[0]];
    shape.extend_from_slice(&leaf.shape);
    Ok(Noise::Dense(z.reshape(&shape)?))
}

/// EGGROLL low-rank noise (`r` columns); non-2-D leaves get full-rank noise.
#[derive(Clone, Copy, Debug)]
pub struct LowRank {
    /// The rank.
    pub r: usize,
}

impl Strategy for LowRank {
    fn name(&self) -> String {
        format!("lowrank(r={})", self.r)
    }

    fn noise_elements(&self, leaf: &LeafInfo) -> usize {
        match leaf.shape.as_slice() {
            [m, k] => self.r * (m + k).max(0) as usize,
            _ => leaf_size(leaf),
        }
    }

    fn noise(&self, stream: &Keys, leaf: &LeafInfo, dirs: &Value) -> Result<Noise> {
        let mut one = self.noise_all(&stream.reshape(&[1])?, std::slice::from_ref(leaf), dirs)?;
        Ok(one.remove(0))
    }

    /// Every leaf's noise from one threefry draw of each kind, whatever the number of
    /// leaves and r: the column keys `c_jq = fold_in(stream_j, q)` (`[L, 2r]`), the keys
    /// `fold_in(c_jq, i)` of every direction `i` (`[L, d, 2r]`), then all factors (`a` from
    /// columns `0..r` over `m`, `b` from `r..2r` over `k`) and the full-rank noise of
    /// non-2-D leaves (`normal(fold_in(stream_j, i), [size])`) as one draw of concatenated
    /// counters. threefry is elementwise in (key, counter), so each value has exactly the
    /// bits of its own per-leaf draw.
    fn noise_all(&self, streams: &Keys, leaves: &[LeafInfo], dirs: &Value) -> Result<Vec<Noise>> {
        let f = dirs.func();
        let (nl, d, r) = (leaves.len() as i64, dirs.shape()[0], self.r as i64);
        if nl == 0 {
            return Ok(Vec::new());
        }
        let cols = streams
            .reshape(&[nl, 1])?
            .fold_in(&f.iota(TensorType::u32(&[1, 2 * r]), 1)?)?
            .reshape(&[nl, 1, 2 * r])?;
        let factor_keys = cols.fold_in(&dirs.reshape(&[1, d, 1])?)?;
        let dense_keys = if leaves.iter().any(|l| l.shape.len() != 2) {
            Some(
                streams
                    .reshape(&[nl, 1])?
                    .fold_in(&dirs.reshape(&[1, d])?)?,
            )
        } else {
            None
        };
        // One segment per factor (or dense leaf): keys [d, q] drawn over `len` counters,
        // flattened to [d, q·len].
        let mut segments: Vec<(Keys, i64)> = Vec::new();
        for (j, leaf) in leaves.iter().enumerate() {
            let j = j as i64;
            let row = |keys: &Keys, lo: i64, hi: i64, q: i64| -> Result<Keys> {
                let (k0, k1) = keys.words();
                let cut = |w: &Value| -> Result<Value> {
                    let w = w.slice_in_dim(j, j + 1, 0)?;
                    let w = if q > 0 { w.slice_in_dim(lo, hi, 2)? } else { w };
                    w.reshape(&[d, (hi - lo).max(1)])
                };
                Keys::new(cut(k0)?, cut(k1)?)
            };
            match leaf.shape.as_slice() {
                [m, k] => {
                    segments.push((row(&factor_keys, 0, r, r)?, *m));
                    segments.push((row(&factor_keys, r, 2 * r, r)?, *k));
                }
                _ => {
                    let keys = dense_keys.as_ref().ok_or_else(|| {
                        crate::builder::HloError::InvalidAttribute {
                            op: "lowrank.noise".into(),
                            types: String::new(),
                            reason: "no dense keys for a non-2-D leaf".into(),
                        }
                    })?;
                    segments.push((row(keys, 0, 0, 0)?, leaf.shape.iter().product()));
                }
            }
        }
        let normals = concatenated_normals(&segments)?;
        let mut out = Vec::with_capacity(leaves.len());
        let mut parts = normals.into_iter();
        for leaf in leaves {
            let mut next = || {
                parts
                    .next()
                    .ok_or_else(|| crate::builder::HloError::InvalidAttribute {
                        op: "lowrank.noise".into(),
                        types: String::new(),
                        reason: "one draw per segment".into(),
                    })
            };
            out.push(match leaf.shape.as_slice() {
                [m, k] => Noise::Factors {
                    a: next()?.reshape(&[d, r, *m])?,
                    b: next()?.reshape(&[d, r, *k])?,
                },
                _ => {
                    let mut shape = vec![d];
                    shape.extend_from_slice(&leaf.shape);
                    Noise::Dense(next()?.reshape(&shape)?)
                }
            });
        }
        Ok(out)
    }
}

/// Standard normals for several segments in one threefry draw: segment `(keys [d, q], len)`
/// gets `normal(keys, [len])` flattened to `[d, q·len]`. The segments' keys and counters
/// are concatenated along the last axis, drawn once and cut apart again.
fn concatenated_normals(segments: &[(Keys, i64)]) -> Result<Vec<Value>> {
    let Some((first, _)) = segments.first() else {
        return Ok(Vec::new());
    };
    let f = first.words().0.func();
    let mut k0s = Vec::new();
    let mut k1s = Vec::new();
    let mut ctrs = Vec::new();
    let mut widths = Vec::new();
    for (keys, len) in segments {
        if *len >= 1 << 32 {
            return Err(crate::builder::HloError::InvalidAttribute {
                op: "lowrank.noise".into(),
                types: String::new(),
                reason: format!("a leaf of {len} elements; counters above 2^32 are not supported"),
            });
        }
        let (d, q) = (keys.shape()[0], keys.shape()[1]);
        let wide = [d, q, *len];
        let flat = [d, q * len];
        let spread =
            |w: &Value| -> Result<Value> { w.broadcast_in_dim(&wide, &[0, 1])?.reshape(&flat) };
        let (k0, k1) = keys.words();
        k0s.push(spread(k0)?);
        k1s.push(spread(k1)?);
        ctrs.push(
            f.iota(TensorType::u32(&[*len]), 0)?
                .broadcast_in_dim(&wide, &[2])?
                .reshape(&flat)?,
        );
        widths.push(q * len);
    }
    let cat = |vs: &[Value]| -> Result<Value> {
        if vs.len() == 1 {
            return Ok(vs[0].clone());
        }
        let refs: Vec<&Value> = vs.iter().collect();
        f.concatenate(&refs, 1)
    };
    let keys = Keys::new(cat(&k0s)?, cat(&k1s)?)?;
    let z = normal_of_bits(&keys.bits_at(&cat(&ctrs)?)?)?;
    let mut out = Vec::with_capacity(widths.len());
    let mut at = 0;
    for w in widths {
        out.push(z.slice_in_dim(at, at + w, 1)?);
        at += w;
    }
    Ok(out)
}

/// Full-rank noise regenerated from seeds, `chunk` members at a time.
#[derive(Clone, Copy, Debug)]
pub struct SeedRegenerated {
    /// Members per evaluation chunk (`None`: the program's default).
    pub chunk: Option<usize>,
}

impl Strategy for SeedRegenerated {
    fn name(&self) -> String {
        match self.chunk {
            Some(c) => format!("seed_regenerated(chunk={c})"),
            None => "seed_regenerated".into(),
        }
    }

    fn chunk(&self) -> Option<usize> {
        self.chunk
    }

    fn noise(&self, stream: &Keys, leaf: &LeafInfo, dirs: &Value) -> Result<Noise> {
        full_rank_noise(stream, leaf, dirs)
    }

    fn noise_contracted(
        &self,
        streams: &Keys,
        leaves: &[LeafInfo],
        dirs: &Value,
    ) -> Result<Vec<Noise>> {
        leaves
            .iter()
            .enumerate()
            .map(|(j, l)| full_rank_noise_unrolled(&streams.at(j as i64)?, l, dirs))
            .collect()
    }
}

/// Full-rank noise, materialized for every local direction at once (same numbers as
/// [`SeedRegenerated`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct IidGaussian;

impl Strategy for IidGaussian {
    fn name(&self) -> String {
        "iid_gaussian".into()
    }

    fn materialized(&self) -> bool {
        true
    }

    fn noise(&self, stream: &Keys, leaf: &LeafInfo, dirs: &Value) -> Result<Noise> {
        full_rank_noise(stream, leaf, dirs)
    }
}

/// Antithetic pairs: members `2k` (at `+σ`) and `2k+1` (at `−σ`) share direction `k`.
pub struct Mirrored(pub Box<dyn Strategy>);

impl Strategy for Mirrored {
    fn name(&self) -> String {
        format!("mirrored({})", self.0.name())
    }

    fn pairing(&self) -> usize {
        2 * self.0.pairing()
    }

    fn materialized(&self) -> bool {
        self.0.materialized()
    }

    fn chunk(&self) -> Option<usize> {
        self.0.chunk()
    }

    fn noise(&self, stream: &Keys, leaf: &LeafInfo, dirs: &Value) -> Result<Noise> {
        self.0.noise(stream, leaf, dirs)
    }

    fn noise_all(&self, streams: &Keys, leaves: &[LeafInfo], dirs: &Value) -> Result<Vec<Noise>> {
        self.0.noise_all(streams, leaves, dirs)
    }

    fn noise_contracted(
        &self,
        streams: &Keys,
        leaves: &[LeafInfo],
        dirs: &Value,
    ) -> Result<Vec<Noise>> {
        self.0.noise_contracted(streams, leaves, dirs)
    }

    fn noise_elements(&self, leaf: &LeafInfo) -> usize {
        self.0.noise_elements(leaf)
    }
}

/// Builds the strategy a [`StrategySpec`] names.
pub fn from_spec(spec: &StrategySpec) -> Box<dyn Strategy> {
    match spec {
        StrategySpec::LowRank { r } => Box::new(LowRank { r: *r }),
        StrategySpec::SeedRegenerated { chunk } => Box::new(SeedRegenerated { chunk: *chunk }),
        StrategySpec::IidGaussian => Box::new(IidGaussian),
        StrategySpec::Mirrored(inner) => Box::new(Mirrored(from_spec(inner))),
        StrategySpec::Coupled { inner, coupling } => match inner.as_ref() {
            // The parser never nests these; a spec built in code gets the same meaning.
            StrategySpec::Mirrored(x) => Box::new(Mirrored(from_spec(&StrategySpec::Coupled {
                inner: x.clone(),
                coupling: *coupling,
            }))),
            StrategySpec::Coupled { inner, .. } => from_spec(&StrategySpec::Coupled {
                inner: inner.clone(),
                coupling: *coupling,
            }),
            StrategySpec::LowRank { r } => Box::new(Coupled::lowrank(LowRank { r: *r }, *coupling)),
            other => Box::new(Coupled {
                inner: from_spec(other),
                rank: None,
                coupling: *coupling,
            }),
        },
    }
}

/// A strategy whose Gaussian directions are drawn jointly by a [`Coupling`]
/// (`es::coupling` defines each): low-rank factors, or full-rank noise regenerated
/// ([`SeedRegenerated`]) or materialized ([`IidGaussian`]). Under
/// [`Coupling::Gaussian`] it is its inner strategy, program for program.
pub struct Coupled {
    inner: Box<dyn Strategy>,
    /// `Some(r)` for low-rank factors.
    rank: Option<usize>,
    coupling: Coupling,
}

impl Coupled {
    /// Low-rank factors drawn by `coupling` (every coupling applies).
    pub fn lowrank(inner: LowRank, coupling: Coupling) -> Coupled {
        Coupled {
            rank: Some(inner.r),
            inner: Box::new(inner),
            coupling,
        }
    }

    /// Full-rank noise (`inner` a [`SeedRegenerated`] or [`IidGaussian`]) drawn by
    /// `coupling`; [`Coupling::Sobol`] is refused (it needs low-rank factors).
    pub fn full_rank(
        inner: Box<dyn Strategy>,
        coupling: Coupling,
    ) -> Result<Coupled, super::EsError> {
        if coupling.needs_factors() {
            return Err(super::error::invalid(
                format!(
                    "coupling={coupling} on {}, which draws full-rank noise",
                    inner.name()
                ),
                format!(
                    "use lowrank(r=R, coupling={coupling}) (the Sobol direction numbers cover \
                     21,201 dimensions, low-rank factors only), or coupling=orthogonal_hd"
                ),
            ));
        }
        Ok(Coupled {
            inner,
            rank: None,
            coupling,
        })
    }

    /// The coupling.
    pub fn coupling(&self) -> Coupling {
        self.coupling
    }

    fn refuse(&self, reason: String) -> crate::builder::HloError {
        crate::builder::HloError::InvalidAttribute {
            op: format!("{}.noise", self.name()),
            types: String::new(),
            reason,
        }
    }

    /// One leaf's coupled noise, `stream` its key (scalar batch).
    fn leaf_noise(&self, stream: &Keys, leaf: &LeafInfo, dirs: &Value) -> Result<Noise> {
        let d = dirs.shape()[0];
        let mut dense_shape = vec![d];
        dense_shape.extend_from_slice(&leaf.shape);
        let size: i64 = leaf.shape.iter().product();
        match (self.rank, leaf.shape.as_slice(), self.coupling) {
            (_, _, Coupling::Gaussian) => self.inner.noise(stream, leaf, dirs),
            (Some(r), [m, k], Coupling::OrthogonalHd) => {
                let f = dirs.func();
                let r = r as i64;
                let cols = stream.fold_in(&f.iota(TensorType::u32(&[2 * r]), 0)?)?;
                let half = |lo: i64| -> Result<Keys> {
                    let (k0, k1) = cols.words();
                    let cut = |w: &Value| w.slice_in_dim(lo, lo + r, 0)?.reshape(&[1, r]);
                    Keys::new(cut(k0)?, cut(k1)?)
                };
                let column = dirs.reshape(&[d, 1])?;
                Ok(Noise::Factors {
                    a: hd_noise(&half(0)?, &column, *m)?,
                    b: hd_noise(&half(r)?, &column, *k)?,
                })
            }
            (Some(r), [m, k], Coupling::Sobol) => {
                let dims = r as i64 * (m + k);
                let z = sobol_normals(stream, dirs, dims as usize)?;
                let rm = r as i64 * m;
                Ok(Noise::Factors {
                    a: z.slice_in_dim(0, rm, 1)?.reshape(&[d, r as i64, *m])?,
                    b: z.slice_in_dim(rm, dims, 1)?.reshape(&[d, r as i64, *k])?,
                })
            }
            (Some(_), _, Coupling::Sobol) => full_rank_noise(stream, leaf, dirs),
            (None, _, Coupling::Sobol) => Err(self.refuse(
                "sobol couples low-rank factors only; use lowrank(r=R, coupling=sobol)".into(),
            )),
            (_, _, Coupling::OrthogonalHd) => Ok(Noise::Dense(
                hd_noise(stream, dirs, size)?.reshape(&dense_shape)?,
            )),
        }
    }
}

impl Strategy for Coupled {
    fn name(&self) -> String {
        match self.coupling {
            Coupling::Gaussian => self.inner.name(),
            c => with_coupling(&self.inner.name(), c),
        }
    }

    fn pairing(&self) -> usize {
        self.inner.pairing()
    }

    fn materialized(&self) -> bool {
        self.inner.materialized()
    }

    fn chunk(&self) -> Option<usize> {
        self.inner.chunk()
    }

    fn noise(&self, stream: &Keys, leaf: &LeafInfo, dirs: &Value) -> Result<Noise> {
        self.leaf_noise(stream, leaf, dirs)
    }

    fn noise_all(&self, streams: &Keys, leaves: &[LeafInfo], dirs: &Value) -> Result<Vec<Noise>> {
        if self.coupling == Coupling::Gaussian {
            return self.inner.noise_all(streams, leaves, dirs);
        }
        leaves
            .iter()
            .enumerate()
            .map(|(j, l)| self.leaf_noise(&streams.at(j as i64)?, l, dirs))
            .collect()
    }

    fn noise_contracted(
        &self,
        streams: &Keys,
        leaves: &[LeafInfo],
        dirs: &Value,
    ) -> Result<Vec<Noise>> {
        if self.coupling == Coupling::Gaussian {
            return self.inner.noise_contracted(streams, leaves, dirs);
        }
        self.noise_all(streams, leaves, dirs)
    }

    fn noise_elements(&self, leaf: &LeafInfo) -> usize {
        self.inner.noise_elements(leaf)
    }
}
