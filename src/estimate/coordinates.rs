//! The coordinate directions central differences evaluate: direction `c` is the unit vector
//! of parameter `c` (leaf order, row-major within a leaf), zero past the last parameter.
//!
//! A 2-D leaf's unit vector `e_(row, col)` is the rank-1 product `e_row e_colᵀ`, so it goes
//! through the seams as low-rank factors (`a = e_row`, `b = e_col`, `r = 1`) and the model
//! evaluates `x (W ± h e_row e_colᵀ)ᵀ` without forming a member-sized weight; any other
//! leaf gets its one-hot dense noise.

use shardes_hlo::builder::{DType, Result, TensorType, Value};
use shardes_hlo::es::{LeafInfo, Noise, Strategy};
use shardes_hlo::prng::Keys;

/// Unit vectors along every parameter of `leaves` (see the module documentation).
pub struct Coordinates {
    /// `(offset, size)` of each leaf in the flattened parameters.
    spans: Vec<(u64, u64)>,
}

impl Coordinates {
    /// The coordinates of `leaves` (the program's leaves, in order).
    pub fn new(leaves: &[LeafInfo]) -> Coordinates {
        let mut at = 0u64;
        let spans = leaves
            .iter()
            .map(|l| {
                let size: u64 = l.shape.iter().map(|&d| d.max(0) as u64).product();
                let span = (at, size);
                at += size;
                span
            })
            .collect();
        Coordinates { spans }
    }

    /// The number of parameters.
    pub fn len(&self) -> u64 {
        self.spans.last().map_or(0, |(o, s)| o + s)
    }

    /// Whether there are no parameters.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn one_hot(&self, leaf: &LeafInfo, dirs: &Value) -> Result<Noise> {
        let f = dirs.func();
        let d = dirs.shape()[0];
        let (offset, size) = self.spans.get(leaf.index).copied().unwrap_or((0, 0));
        // dirs − offset wraps below the leaf, so one unsigned compare bounds both sides.
        let local = dirs.sub(&f.scalar(offset as u32)?)?;
        let inside = local.lt(&f.scalar(size as u32)?)?;
        let hot = |index: &Value, len: i64| -> Result<Value> {
            let shape = [d, len];
            let pos = f
                .iota(TensorType::u32(&[len]), 0)?
                .broadcast_in_dim(&shape, &[1])?;
            let want = index.broadcast_in_dim(&shape, &[0])?;
            let mask = inside.broadcast_in_dim(&shape, &[0])?;
            pos.eq(&want)?.and(&mask)?.convert(DType::F32)
        };
        Ok(match leaf.shape.as_slice() {
            [m, k] => {
                let kk = f.scalar(*k as u32)?;
                Noise::Factors {
                    a: hot(&local.div(&kk)?, *m)?.reshape(&[d, 1, *m])?,
                    b: hot(&local.rem(&kk)?, *k)?.reshape(&[d, 1, *k])?,
                }
            }
            shape => {
                let mut full = vec![d];
                full.extend_from_slice(shape);
                Noise::Dense(hot(&local, size as i64)?.reshape(&full)?)
            }
        })
    }
}

impl Strategy for Coordinates {
    fn name(&self) -> String {
        "coordinates".into()
    }

    fn noise(&self, _stream: &Keys, leaf: &LeafInfo, dirs: &Value) -> Result<Noise> {
        self.one_hot(leaf, dirs)
    }

    fn noise_elements(&self, leaf: &LeafInfo) -> usize {
        match leaf.shape.as_slice() {
            [m, k] => (m + k).max(0) as usize,
            s => s.iter().map(|&d| d.max(0) as usize).product(),
        }
    }
}
