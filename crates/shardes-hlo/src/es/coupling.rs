//! Coupled noise: how the Gaussian directions of a population are drawn jointly.
//!
//! A coupling is a constructor argument of the strategies that draw Gaussian directions
//! (`lowrank(r=1, coupling=orthogonal_hd)`, `seed_regenerated(coupling=orthogonal_hd)`);
//! `gaussian` (independent draws, the spec's "Noise" section) is the default and emits
//! exactly the program it always did. Each coupled draw is a function of the global
//! direction id, so coupled noise is device-count invariant like the independent one.
//!
//! A *vector* here is one Gaussian vector of a direction: a full-rank leaf's noise
//! (`size_j` values, key `stream_j`), or one factor column of a low-rank leaf (`A[:, q]`,
//! `m` values, key `c_q`; `B[:, q]`, `k` values, key `c_{r+q}`), the keys of the spec.
//! Each vector is coupled on its own: different vectors (leaves, columns, `A` and `B`) stay
//! independent of each other, as under `gaussian`.
//!
//! - `orthogonal_hd`: a vector of length `len` is coupled in blocks of `P = 2^⌈log2 len⌉`
//!   directions. Direction `i` is row `t = i mod P` of block `b = i div P`, whose matrix is
//!   `M_b = H D₁ H D₂ H D₃ / P` with `H` the `P × P` Sylvester Hadamard matrix
//!   (`H[t, c] = (−1)^popcount(t & c)`) and `D_k` diagonal with Rademacher signs: bits
//!   `bits(fold_in(key, b), [3, P])`, row `k − 1`, sign `−1` where the top bit is set. The
//!   direction's vector is the first `len` entries of that row. `M_b` is orthogonal up to
//!   the factor `√P`: the `P` rows of one block are orthogonal with squared norm `P`, every
//!   entry has second moment 1, and with `len = P` a full block is exactly orthogonal
//!   (otherwise its truncated rows form a tight frame). The row is computed as
//!   `((((h_t ∘ d₁) H) ∘ d₂) H) ∘ d₃ / P` with `h_t` row `t` of `H` in closed form and both
//!   products with `H` by a fast Walsh–Hadamard transform ([`fwht`]); below `P = 4096` every
//!   intermediate is an integer, so the result is exact.
//! - `sobol`: for a low-rank leaf `(m, k)` of rank `r`, direction `i` is point `i` of the
//!   Sobol sequence of dimension `S = r (m + k)` (Joe–Kuo direction numbers,
//!   [`crate::prng::sobol`], so `S ≤ 21,201`), digitally shifted by `bits(stream_j, [S])`
//!   (XOR), each coordinate mapped through `Φ⁻¹` as `normal` maps random bits
//!   ([`normal_of_bits`]: the top 23 bits, then `√2 erf⁻¹`). Coordinates `q m .. (q + 1) m`
//!   are `A[:, q]`, then `r m + q k ..` are `B[:, q]`. The random shift makes every point
//!   marginally uniform, so each direction's noise is marginally the independent one's.
//!   Only low-rank factors are coupled this way; a full-rank strategy refuses `sobol`, and
//!   the non-2-D leaves of a low-rank strategy keep independent Gaussian noise.

use std::fmt;
use std::str::FromStr;

use crate::builder::{DType, HloError, Result, TensorType, Value};
use crate::prng::emit::{normal_of_bits, Keys};
use crate::prng::sobol::{direction_numbers, SOBOL_BITS, SOBOL_DIMS};

/// How the Gaussian directions of a population are drawn jointly.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Coupling {
    /// Independent draws, `normal(fold_in(key, i), ..)` (the default).
    #[default]
    Gaussian,
    /// Blocks of orthogonal rows of `H D₁ H D₂ H D₃` (see the module documentation).
    OrthogonalHd,
    /// A randomly digitally shifted Sobol sequence through `Φ⁻¹`; low-rank factors only.
    Sobol,
}

/// The names [`Coupling::from_str`] accepts, for error messages.
pub const COUPLING_NAMES: &[&str] = &["gaussian", "orthogonal_hd", "sobol"];

/// A coupling name that is not one of [`COUPLING_NAMES`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown coupling \"{input}\" (valid: {})", COUPLING_NAMES.join(", "))]
pub struct UnknownCoupling {
    /// The name that was given.
    pub input: String,
}

impl Coupling {
    /// The config name: `gaussian`, `orthogonal_hd` or `sobol`.
    pub fn name(self) -> &'static str {
        match self {
            Coupling::Gaussian => "gaussian",
            Coupling::OrthogonalHd => "orthogonal_hd",
            Coupling::Sobol => "sobol",
        }
    }

    /// Whether the coupling needs low-rank factors (it cannot couple full-rank noise).
    pub fn needs_factors(self) -> bool {
        self == Coupling::Sobol
    }
}

impl fmt::Display for Coupling {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Coupling {
    type Err = UnknownCoupling;

    fn from_str(input: &str) -> Result<Self, UnknownCoupling> {
        match input.to_ascii_lowercase().as_str() {
            "gaussian" => Ok(Coupling::Gaussian),
            "orthogonal_hd" | "orthogonalhd" | "hd" => Ok(Coupling::OrthogonalHd),
            "sobol" => Ok(Coupling::Sobol),
            _ => Err(UnknownCoupling {
                // A short quote of a long input, as the strategy parser's excerpts.
                input: if input.chars().count() > 60 {
                    format!("{}…", input.chars().take(60).collect::<String>())
                } else {
                    input.to_string()
                },
            }),
        }
    }
}

fn coupling_err(op: &str, reason: String) -> HloError {
    HloError::InvalidAttribute {
        op: format!("coupling.{op}"),
        types: String::new(),
        reason,
    }
}

/// The block size of `orthogonal_hd` for vectors of `len` values: the power of two at or
/// above `len` (at most 2^30).
pub fn hd_block(len: i64) -> Result<i64> {
    if !(1..=1 << 30).contains(&len) {
        return Err(coupling_err(
            "orthogonal_hd",
            format!("a vector of {len} values; orthogonal_hd couples vectors of 1 to 2^30"),
        ));
    }
    Ok((len as u64).next_power_of_two() as i64)
}

/// The unnormalized Walsh–Hadamard transform `x H` along the last axis (a power of two
/// long), Sylvester order: `log2 P` butterfly stages `(a, b) → (a + b, a − b)` at strides
/// `1, 2, 4, …`.
pub fn fwht(x: &Value) -> Result<Value> {
    let shape = x.shape().to_vec();
    let Some(&p) = shape.last() else {
        return Err(coupling_err(
            "fwht",
            "a scalar has no axis to transform".into(),
        ));
    };
    if p < 1 || p & (p - 1) != 0 {
        return Err(coupling_err(
            "fwht",
            format!("the last axis has {p} entries; the transform needs a power of two"),
        ));
    }
    let f = x.func();
    let lead = &shape[..shape.len() - 1];
    // The pair axis of [.., P / 2h, 2, h].
    let pair = lead.len() + 1;
    let mut y = x.clone();
    let mut h = 1;
    while h < p {
        let mut split = lead.to_vec();
        split.extend_from_slice(&[p / (2 * h), 2, h]);
        let s = y.reshape(&split)?;
        let a = s.slice_in_dim(0, 1, pair)?;
        let b = s.slice_in_dim(1, 2, pair)?;
        y = f
            .concatenate(&[&a.add(&b)?, &a.sub(&b)?], pair)?
            .reshape(&shape)?;
        h *= 2;
    }
    Ok(y)
}

/// `±1.0` (f32) from the top bit of random bits: `−1` where it is set.
fn rademacher(bits: &Value) -> Result<Value> {
    let f = bits.func();
    let top = bits
        .shift_right_logical(&f.scalar(31u32)?)?
        .convert(DType::F32)?;
    f.scalar(1.0f32)?.sub(&top.mul(&f.scalar(2.0f32)?)?)
}

/// Row `rows` (u32, batch shape `B`) of the Sylvester Hadamard matrix of order `p`:
/// f32 `B ++ [p]`, `(−1)^popcount(t & c)`.
pub fn hadamard_rows(rows: &Value, p: i64) -> Result<Value> {
    let f = rows.func();
    let mut full = rows.shape().to_vec();
    full.push(p);
    let b: Vec<usize> = (0..rows.rank()).collect();
    let c = f
        .iota(TensorType::u32(&[p]), 0)?
        .broadcast_in_dim(&full, &[rows.rank()])?;
    let mut x = rows.broadcast_in_dim(&full, &b)?.and(&c)?;
    for s in [16u32, 8, 4, 2, 1] {
        x = x.xor(&x.shift_right_logical(&f.scalar(s)?)?)?;
    }
    let parity = x.and(&f.scalar(1u32)?)?.convert(DType::F32)?;
    f.scalar(1.0f32)?.sub(&parity.mul(&f.scalar(2.0f32)?)?)
}

/// Row `rows` of `H D₁ H D₂ H D₃ / p` for the block keys `keys` (batch shape `B`, as
/// `rows`), its first `len` entries: f32 `B ++ [len]`.
pub fn hd_rows(keys: &Keys, rows: &Value, p: i64, len: i64) -> Result<Value> {
    if keys.shape() != rows.shape() || len > p {
        return Err(coupling_err(
            "hd_rows",
            format!(
                "keys {:?} and rows {:?} must have one shape, and len {len} ≤ p {p}",
                keys.shape(),
                rows.shape()
            ),
        ));
    }
    let f = rows.func();
    let rank = rows.rank();
    let signs = rademacher(&keys.bits(&[3, p])?)?;
    let mut row_shape = rows.shape().to_vec();
    row_shape.push(p);
    let diag =
        |k: i64| -> Result<Value> { signs.slice_in_dim(k, k + 1, rank)?.reshape(&row_shape) };
    let mut v = hadamard_rows(rows, p)?.mul(&diag(0)?)?;
    v = fwht(&v)?.mul(&diag(1)?)?;
    v = fwht(&v)?.mul(&diag(2)?)?;
    v = v.mul(&f.scalar(1.0f32 / p as f32)?)?;
    if len < p {
        v = v.slice_in_dim(0, len, rank)?;
    }
    Ok(v)
}

/// `orthogonal_hd` noise of length `len` for directions `dirs` (u32) under base keys `base`
/// (broadcast numpy-style against `dirs`): block keys `fold_in(base, i div P)`, rows
/// `i mod P`. Result: f32 `broadcast(base, dirs) ++ [len]`.
pub fn hd_noise(base: &Keys, dirs: &Value, len: i64) -> Result<Value> {
    let f = dirs.func();
    let p = hd_block(len)?;
    let log = p.trailing_zeros();
    let block = dirs.shift_right_logical(&f.scalar(log)?)?;
    let keys = base.fold_in(&block)?;
    let row = dirs.and(&f.scalar((p - 1) as u32)?)?;
    let row = if row.shape() == keys.shape() {
        row
    } else {
        row.broadcast_to(keys.shape())?
    };
    hd_rows(&keys, &row, p, len)
}

/// Unshifted Sobol points `dirs` (u32 `[d]`), coordinates `0 .. dims`: u32 `[d, dims]`.
pub fn sobol_bits(dirs: &Value, dims: usize) -> Result<Value> {
    if dims == 0 || dims > SOBOL_DIMS || dirs.rank() != 1 {
        return Err(coupling_err(
            "sobol",
            format!(
                "{dims} dimensions for directions {:?}; the Joe–Kuo direction numbers cover 1 \
                 to {SOBOL_DIMS}",
                dirs.shape()
            ),
        ));
    }
    let f = dirs.func();
    let d = dirs.shape()[0];
    let table = direction_numbers();
    // [32, dims]: row k holds V[c][k] for every coordinate c.
    let by_bit: Vec<u32> = (0..SOBOL_BITS)
        .flat_map(|k| table[..dims].iter().map(move |row| row[k]))
        .collect();
    let v = f.constant(&[SOBOL_BITS as i64, dims as i64], &by_bit)?;
    let gray = dirs.xor(&dirs.shift_right_logical(&f.scalar(1u32)?)?)?;
    let shape = [d, dims as i64];
    let mut acc = f.full(0u32, &shape)?;
    for k in 0..SOBOL_BITS as i64 {
        let bit = gray
            .shift_right_logical(&f.scalar(k as u32)?)?
            .and(&f.scalar(1u32)?)?;
        // 0 − bit: all ones where bit k of the Gray code is set.
        let mask = f.scalar(0u32)?.sub(&bit)?.broadcast_in_dim(&shape, &[0])?;
        let vk = v
            .slice_in_dim(k, k + 1, 0)?
            .reshape(&[dims as i64])?
            .broadcast_in_dim(&shape, &[1])?;
        acc = acc.xor(&vk.and(&mask)?)?;
    }
    Ok(acc)
}

/// Sobol noise: points `dirs` (u32 `[d]`) of dimension `dims`, XOR-shifted by
/// `bits(shift, [dims])` (`shift` a scalar key), through `Φ⁻¹`: f32 `[d, dims]`.
pub fn sobol_normals(shift: &Keys, dirs: &Value, dims: usize) -> Result<Value> {
    let points = sobol_bits(dirs, dims)?;
    let s = shift.bits(&[dims as i64])?;
    normal_of_bits(&points.xor(&s)?)
}

/// The host side of the couplings, for tests and oracles: the same numbers as the emitted
/// functions.
pub mod host {
    use crate::prng::host::{
        bits_at, bits_to_unit_f32, erf_inv_f32, fold_in, unit_to_range, Key, NORMAL_UNIFORM_LO,
    };
    use crate::prng::sobol::sobol_point;

    /// The Walsh–Hadamard transform `x H` in place (Sylvester order; `x.len()` a power of
    /// two).
    pub fn fwht(x: &mut [f32]) {
        let p = x.len();
        let mut h = 1;
        while h < p {
            for i in (0..p).step_by(2 * h) {
                for j in i..i + h {
                    let (a, b) = (x[j], x[j + h]);
                    x[j] = a + b;
                    x[j + h] = a - b;
                }
            }
            h *= 2;
        }
    }

    /// Row `t` of `H D₁ H D₂ H D₃ / p` for block key `key`, its first `len` entries.
    pub fn hd_row(key: Key, t: u32, p: usize, len: usize) -> Vec<f32> {
        let sign = |k: usize, c: usize| -> f32 {
            if bits_at(key, (k * p + c) as u64) >> 31 == 1 {
                -1.0
            } else {
                1.0
            }
        };
        let mut v: Vec<f32> = (0..p)
            .map(|c| {
                let h = if (t & c as u32).count_ones() % 2 == 1 {
                    -1.0
                } else {
                    1.0
                };
                h * sign(0, c)
            })
            .collect();
        fwht(&mut v);
        v.iter_mut().enumerate().for_each(|(c, x)| *x *= sign(1, c));
        fwht(&mut v);
        let inv = 1.0 / p as f32;
        v.iter_mut()
            .enumerate()
            .for_each(|(c, x)| *x = *x * sign(2, c) * inv);
        v.truncate(len);
        v
    }

    /// `orthogonal_hd` noise of direction `i` for a vector of `len` values under `base`.
    pub fn hd_noise(base: Key, i: u32, len: usize) -> Vec<f32> {
        let p = len.next_power_of_two();
        let log = p.trailing_zeros();
        hd_row(fold_in(base, i >> log), i & (p as u32 - 1), p, len)
    }

    /// `Φ⁻¹` of random bits as `normal` maps them.
    pub fn normal_of_bits(b: u32) -> f32 {
        let u = unit_to_range(bits_to_unit_f32(b), NORMAL_UNIFORM_LO, 1.0);
        std::f32::consts::SQRT_2 * erf_inv_f32(u)
    }

    /// Sobol noise of direction `i`: point `i` shifted by `bits(shift, [dims])`, through
    /// `Φ⁻¹`.
    pub fn sobol_normals(shift: Key, i: u32, dims: usize) -> Vec<f32> {
        sobol_point(i, dims)
            .into_iter()
            .enumerate()
            .map(|(c, x)| normal_of_bits(x ^ bits_at(shift, c as u64)))
            .collect()
    }
}
