//! Perturbation strategies: how a direction's noise is derived for each leaf.
//!
//! A strategy only says what the unit-scale noise of a batch of *directions* is for one
//! leaf; the generation program turns directions into members (pairing, signs), noise into
//! weights through the seams, and weighted noise into the update. Implement [`Strategy`]
//! to add your own.

use crate::builder::{Result, TensorType, Value};
use crate::prng::emit::Keys;

use super::spec::StrategySpec;

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
        let [m, k] = match leaf.shape.as_slice() {
            [m, k] => [*m, *k],
            _ => return full_rank_noise(stream, leaf, dirs),
        };
        let f = dirs.func();
        let d = dirs.shape()[0];
        let r = self.r as i64;
        // Column keys c_q = fold_in(stream, q) for all 2r columns at once, then one key per
        // (direction, column): a single batched draw whatever r is.
        let cols = stream.fold_in(&f.iota(TensorType::u32(&[2 * r]), 0)?)?;
        let cols = cols.broadcast_in_dim(&[d, 2 * r], &[1])?;
        let keys = cols.fold_in(&dirs.broadcast_in_dim(&[d, 2 * r], &[0])?)?;
        let (k0, k1) = keys.words();
        let half = |lo: i64| -> Result<Keys> {
            Keys::new(
                k0.slice_in_dim(lo, lo + r, 1)?,
                k1.slice_in_dim(lo, lo + r, 1)?,
            )
        };
        if m == k {
            let z = keys.normal(&[m])?;
            return Ok(Noise::Factors {
                a: z.slice_in_dim(0, r, 1)?,
                b: z.slice_in_dim(r, 2 * r, 1)?,
            });
        }
        Ok(Noise::Factors {
            a: half(0)?.normal(&[m])?,
            b: half(r)?.normal(&[k])?,
        })
    }
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
    }
}
