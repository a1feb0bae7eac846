//! Host (CPU) evaluation of the JAX-compatible threefry PRNG.
//!
//! Everything here follows `shared/spec/semantics.md`, "Keys and random bits", and is checked
//! against JAX's own numbers in `shared/testdata/jax_prng.json` (root package test
//! `prng_vectors`): keys, threefry and bits exactly; uniform exactly; normal within 1e-6
//! (bit-exact on almost all elements, the rest differ in the last bit of `erf_inv`).

use thiserror::Error;

/// The largest seed [`key`] accepts, plus one: seeds must lie in `[0, 2^63)`.
pub const SEED_LIMIT: u64 = 1 << 63;

/// Threefry's key-schedule parity constant: `k2 = k0 ^ k1 ^ THREEFRY_PARITY`.
pub const THREEFRY_PARITY: u32 = 0x1BD1_1BDA;

/// Rotation distances of the two alternating groups of four rounds (`R0`, `R1`).
///
/// Group `g` (`g = 0..5`) uses `THREEFRY_ROTATIONS[g % 2]`.
pub const THREEFRY_ROTATIONS: [[u32; 4]; 2] = [[13, 15, 26, 6], [17, 29, 16, 24]];

/// Number of four-round groups (5 groups × 4 rounds = 20 rounds).
pub const THREEFRY_GROUPS: usize = 5;

/// The key schedule: before group `g` (and once more after the last one, `g = 5`), add
/// `ks[THREEFRY_INJECTIONS[g][0]]` to `x0` and `ks[THREEFRY_INJECTIONS[g][1]] + g` to `x1`
/// (wrapping), where `ks = [k0, k1, k0 ^ k1 ^ THREEFRY_PARITY]`.
pub const THREEFRY_INJECTIONS: [[usize; 2]; THREEFRY_GROUPS + 1] =
    [[0, 1], [1, 2], [2, 0], [0, 1], [1, 2], [2, 0]];

/// Bits OR-ed into the top of the mantissa to build a float in `[1, 2)`.
pub const UNIFORM_EXPONENT_BITS: u32 = 0x3F80_0000;

/// Mantissa shift: `uniform` keeps the top 23 of the 32 random bits.
pub const UNIFORM_MANTISSA_SHIFT: u32 = 9;

// The literals are XLA's, digit for digit, so they can be checked against its source; they
// round to the same f32 values either way.
#[allow(clippy::excessive_precision)]
/// Giles' `erf_inv` coefficients for `w < 5`, highest power first (Horner in `w - 2.5`).
pub const ERF_INV_COEFFS_LT5: [f32; 9] = [
    2.810_226_36e-08,
    3.432_739_39e-07,
    -3.523_387_7e-06,
    -4.391_506_54e-06,
    0.000_218_580_87,
    -0.001_253_725_03,
    -0.004_177_681_64,
    0.246_640_727,
    1.501_409_41,
];

#[allow(clippy::excessive_precision)]
/// Giles' `erf_inv` coefficients for `w >= 5`, highest power first (Horner in `sqrt(w) - 3`).
pub const ERF_INV_COEFFS_GE5: [f32; 9] = [
    -0.000_200_214_257,
    0.000_100_950_558,
    0.001_349_343_22,
    -0.003_673_428_44,
    0.005_739_507_73,
    -0.007_622_461_3,
    0.009_438_870_47,
    1.001_674_06,
    2.832_976_82,
];

/// Errors of the host PRNG.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PrngError {
    /// The seed does not fit the key format.
    #[error(
        "seed {seed} is out of range: seeds must lie in [0, 2^63) (below {limit}); \
         pass a smaller seed, e.g. seed % 2^63"
    )]
    SeedTooLarge {
        /// The rejected seed.
        seed: u64,
        /// The exclusive upper limit, 2^63.
        limit: u64,
    },
    /// The number of elements of a requested shape overflows `usize`.
    #[error("shape {shape:?} has more elements than fit in usize; use a smaller shape")]
    ShapeOverflow {
        /// The requested shape.
        shape: Vec<usize>,
    },
}

/// A threefry key: two u32 words `(k0, k1)`, as `jax.random.key_data` shows them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Key {
    words: [u32; 2],
}

impl Key {
    /// The two words `[k0, k1]` (JAX's `key_data`).
    pub fn data(self) -> [u32; 2] {
        self.words
    }

    /// The key with words `[k0, k1]` (JAX's `wrap_key_data`).
    pub fn from_data(words: [u32; 2]) -> Key {
        Key { words }
    }
}

/// The key of a seed: `(seed >> 32, seed & 0xFFFFFFFF)`, so `key(42) = (0, 42)`.
///
/// Seeds `>= 2^63` are rejected ([`PrngError::SeedTooLarge`]). Note the one deliberate
/// difference from JAX: in its default 32-bit mode (`jax_enable_x64 = False`) JAX silently
/// drops the high word of seeds `>= 2^32` (giving `(0, seed & 0xFFFFFFFF)`); we keep it, as
/// the spec says, which is what JAX gives with `jax_enable_x64 = True`.
pub fn key(seed: u64) -> Result<Key, PrngError> {
    if seed >= SEED_LIMIT {
        return Err(PrngError::SeedTooLarge {
            seed,
            limit: SEED_LIMIT,
        });
    }
    // Truncations are the point: the two 32-bit halves of the seed.
    Ok(Key::from_data([(seed >> 32) as u32, seed as u32]))
}

/// threefry2x32 with 20 rounds: hashes the counter pair `x` under `key`.
pub fn threefry2x32(key: Key, x: [u32; 2]) -> [u32; 2] {
    let [k0, k1] = key.words;
    let ks = [k0, k1, k0 ^ k1 ^ THREEFRY_PARITY];
    let [mut x0, mut x1] = x;
    for (g, inj) in THREEFRY_INJECTIONS.iter().enumerate() {
        // The injection counter is the group index, at most 5: the cast cannot truncate.
        x0 = x0.wrapping_add(ks[inj[0]]);
        x1 = x1.wrapping_add(ks[inj[1]]).wrapping_add(g as u32);
        if g == THREEFRY_GROUPS {
            break;
        }
        for &r in &THREEFRY_ROTATIONS[g % 2] {
            x0 = x0.wrapping_add(x1);
            x1 = x1.rotate_left(r);
            x1 ^= x0;
        }
    }
    [x0, x1]
}

/// `fold_in(key, d) = threefry2x32(key, (0, d))`; the two output words are the new key.
pub fn fold_in(key: Key, data: u32) -> Key {
    Key::from_data(threefry2x32(key, [0, data]))
}

/// `split(key, n)[q] = fold_in(key, q)` (JAX's partitionable mode).
pub fn split(key: Key, n: u32) -> Vec<Key> {
    (0..n).map(|q| fold_in(key, q)).collect()
}

/// Number of elements of `shape`, or an error if it overflows.
pub fn shape_size(shape: &[usize]) -> Result<usize, PrngError> {
    shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| PrngError::ShapeOverflow {
            shape: shape.to_vec(),
        })
}

/// The random bits of element `c` (row-major flat index) of any `bits(key, shape)`.
///
/// Each element depends only on its own index, which is what lets noise shard freely.
pub fn bits_at(key: Key, c: u64) -> u32 {
    // Splitting the 64-bit counter into its two words is the definition.
    let [y0, y1] = threefry2x32(key, [(c >> 32) as u32, c as u32]);
    y0 ^ y1
}

/// `bits(key, shape)`: u32 random bits, row-major, element `c` = [`bits_at`]`(key, c)`.
pub fn bits(key: Key, shape: &[usize]) -> Result<Vec<u32>, PrngError> {
    let n = shape_size(shape)?;
    Ok((0..n as u64).map(|c| bits_at(key, c)).collect())
}

/// Maps 32 random bits to a float in `[0, 1)` using the top 23 bits.
pub fn bits_to_unit_f32(b: u32) -> f32 {
    f32::from_bits((b >> UNIFORM_MANTISSA_SHIFT) | UNIFORM_EXPONENT_BITS) - 1.0
}

/// Scales a unit float to `[lo, hi)`: `max(lo, fma(u, hi - lo, lo))`.
///
/// One fused multiply-add, because that is what XLA:CPU evaluates; the two-rounding form
/// is one ulp off for some elements with general bounds.
pub fn unit_to_range(u: f32, lo: f32, hi: f32) -> f32 {
    u.mul_add(hi - lo, lo).max(lo)
}

/// `uniform(key, shape, lo, hi)`: f32 in `[lo, hi)`, row-major.
pub fn uniform(key: Key, shape: &[usize], lo: f32, hi: f32) -> Result<Vec<f32>, PrngError> {
    let n = shape_size(shape)?;
    Ok((0..n as u64)
        .map(|c| unit_to_range(bits_to_unit_f32(bits_at(key, c)), lo, hi))
        .collect())
}

/// The lower bound of `normal`'s uniform draw: `nextafter(-1, 0)` in f32.
pub const NORMAL_UNIFORM_LO: f32 = -0.999_999_94;

/// Element `c` of `normal(key, shape)` for any shape.
pub fn normal_at(key: Key, c: u64) -> f32 {
    let u = unit_to_range(bits_to_unit_f32(bits_at(key, c)), NORMAL_UNIFORM_LO, 1.0);
    std::f32::consts::SQRT_2 * erf_inv_f32(u)
}

/// `normal(key, shape)`: standard normal f32, `sqrt(2) * erf_inv(uniform(key, shape,
/// nextafter(-1, 0), 1))`, row-major.
pub fn normal(key: Key, shape: &[usize]) -> Result<Vec<f32>, PrngError> {
    let n = shape_size(shape)?;
    Ok((0..n as u64).map(|c| normal_at(key, c)).collect())
}

/// XLA's f32 `erf_inv` (Giles' single-precision approximation).
///
/// `w = -log1p(-x²)`; a degree-8 polynomial in `w - 2.5` (`w < 5`) or `sqrt(w) - 3`,
/// evaluated by Horner with fused multiply-adds; result `p · x`. `|x| = 1` gives
/// `x · f32::MAX`, as XLA does (the true value is infinite).
pub fn erf_inv_f32(x: f32) -> f32 {
    let w = -(-(x * x)).ln_1p();
    let (t, coeffs) = if w < 5.0 {
        (w - 2.5, &ERF_INV_COEFFS_LT5)
    } else {
        (w.sqrt() - 3.0, &ERF_INV_COEFFS_GE5)
    };
    let p = coeffs[1..].iter().fold(coeffs[0], |p, &c| p.mul_add(t, c));
    if x.abs() == 1.0 {
        x * f32::MAX
    } else {
        p * x
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normal_lower_bound_is_nextafter_minus_one() {
        // nextafter(-1, 0): one ulp of [0.5, 1) towards zero.
        assert_eq!(NORMAL_UNIFORM_LO, f32::from_bits((-1.0f32).to_bits() - 1));
        assert_eq!(NORMAL_UNIFORM_LO.to_bits(), 0xBF7F_FFFF);
    }

    #[test]
    fn random123_known_answer() {
        // Random123's published KAT for threefry2x32_20 with zero key and counter.
        let y = threefry2x32(Key::from_data([0, 0]), [0, 0]);
        assert_eq!(y, [0x6B20_0159, 0x99BA_4EFE]);
    }

    #[test]
    fn seeds_at_or_above_2_pow_63_are_rejected() {
        assert!(key((1 << 63) - 1).is_ok());
        let err = key(1 << 63).unwrap_err();
        assert!(err.to_string().contains("2^63"), "{err}");
    }

    #[test]
    fn huge_shape_is_an_error() {
        assert!(matches!(
            bits(Key::from_data([0, 0]), &[usize::MAX, 2]),
            Err(PrngError::ShapeOverflow { .. })
        ));
    }

    #[test]
    #[allow(clippy::excessive_precision)]
    fn erf_inv_edges() {
        assert_eq!(erf_inv_f32(0.0), 0.0);
        assert_eq!(erf_inv_f32(1.0), f32::MAX);
        assert_eq!(erf_inv_f32(-1.0), -f32::MAX);
        // erf(0.5) = 0.5204998778; erf_inv inverts it.
        assert!((erf_inv_f32(0.520_499_88) - 0.5).abs() < 1e-6);
        // Deep tail (w >= 5 branch): erf(2.5) = 0.999593047982555.
        assert!((erf_inv_f32(0.999_593_05) - 2.5).abs() < 2e-3);
    }
}
