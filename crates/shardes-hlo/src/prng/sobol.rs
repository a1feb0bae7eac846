//! Sobol points with the Joe–Kuo direction numbers (host side; the program side is
//! `es::coupling`).
//!
//! The direction numbers are `new-joe-kuo-6.21201` by S. Joe and F. Y. Kuo ("Constructing
//! Sobol sequences with better two-dimensional projections", SIAM J. Sci. Comput. 30,
//! 2635–2654, 2008; <https://web.maths.unsw.edu.au/~fkuo/sobol/>), 21,201 dimensions, taken
//! from the copy SciPy ships (`scipy/stats/_sobol_direction_numbers.npz`) by
//! `tools/sobol_tables.py` and embedded bit-packed (`data/sobol_joe_kuo_6_21201.bin`,
//! 0.4 MB). The format: the magic `SOBOLJK1`, the number of dimensions after the first
//! (u32, little-endian), then an LSB-first bit stream holding, for each dimension `1 ..
//! 21200`, the degree `s` (5 bits), the coefficients `a` of the primitive polynomial (`s − 1`
//! bits) and the initial values `m_1 .. m_s`, each odd and below `2^i`, stored as `m_i >> 1`
//! in `i − 1` bits. Dimension 0 is van der Corput's.
//!
//! Point `i` is in Gray-code order, as Joe and Kuo's generator and
//! `scipy.stats.qmc.Sobol(scramble=False)` produce it: coordinate `c` of point `i` is the XOR
//! of the direction numbers `V[c][k]` over the set bits `k` of `i ^ (i >> 1)`, a 32-bit
//! fraction of the unit interval.

use std::sync::OnceLock;

/// Dimensions the direction numbers cover.
pub const SOBOL_DIMS: usize = 21_201;

/// Bits of every coordinate (and of every direction number).
pub const SOBOL_BITS: usize = 32;

const DATA: &[u8] = include_bytes!("../../data/sobol_joe_kuo_6_21201.bin");
const MAGIC: &[u8] = b"SOBOLJK1";

/// The 32 direction numbers of each dimension, `[dim][k]`, decoded once.
pub fn direction_numbers() -> &'static [[u32; SOBOL_BITS]] {
    static TABLE: OnceLock<Vec<[u32; SOBOL_BITS]>> = OnceLock::new();
    TABLE.get_or_init(decode)
}

/// The embedded table is a build input checked by this crate's tests, never user input:
/// a malformed one is a packaging bug, reported as loudly as one.
fn decode() -> Vec<[u32; SOBOL_BITS]> {
    assert!(DATA.starts_with(MAGIC), "sobol table: bad magic");
    let count = u32::from_le_bytes([DATA[8], DATA[9], DATA[10], DATA[11]]) as usize;
    assert_eq!(count + 1, SOBOL_DIMS, "sobol table: dimension count");
    let mut bits = BitReader {
        data: &DATA[12..],
        pos: 0,
    };
    let mut table = Vec::with_capacity(SOBOL_DIMS);
    let mut first = [0u32; SOBOL_BITS];
    for (k, v) in first.iter_mut().enumerate() {
        *v = 1 << (31 - k);
    }
    table.push(first);
    for _ in 0..count {
        let s = bits.take(5) as usize;
        assert!((1..=SOBOL_BITS).contains(&s), "sobol table: degree {s}");
        let a = bits.take(s - 1);
        let mut v = [0u32; SOBOL_BITS];
        for (i, slot) in v.iter_mut().enumerate().take(s) {
            let m = (bits.take(i) << 1) | 1;
            *slot = m << (31 - i);
        }
        for k in s..SOBOL_BITS {
            let mut x = v[k - s] ^ (v[k - s] >> s);
            for i in 1..s {
                if (a >> (s - 1 - i)) & 1 == 1 {
                    x ^= v[k - i];
                }
            }
            v[k] = x;
        }
        table.push(v);
    }
    table
}

struct BitReader<'a> {
    data: &'a [u8],
    pos: usize,
}

impl BitReader<'_> {
    /// The next `width` bits (at most 32), least significant first.
    fn take(&mut self, width: usize) -> u32 {
        let mut out = 0u64;
        for b in 0..width {
            let p = self.pos + b;
            let bit = (self.data[p / 8] >> (p % 8)) & 1;
            out |= u64::from(bit) << b;
        }
        self.pos += width;
        out as u32
    }
}

/// Coordinates `0 .. dims` of Sobol point `i` (unshifted), as 32-bit fractions; `dims` is
/// capped at [`SOBOL_DIMS`].
pub fn sobol_point(i: u32, dims: usize) -> Vec<u32> {
    let v = direction_numbers();
    let g = i ^ (i >> 1);
    v[..dims.min(SOBOL_DIMS)]
        .iter()
        .map(|row| {
            (0..SOBOL_BITS)
                .filter(|k| (g >> k) & 1 == 1)
                .fold(0u32, |x, k| x ^ row[k])
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_decodes_to_joe_kuo_and_van_der_corput() {
        let v = direction_numbers();
        assert_eq!(v.len(), SOBOL_DIMS);
        // Joe–Kuo's file begins `2 1 0 1`, `3 2 1 1 3`, `4 3 1 1 3 1`.
        assert_eq!(v[1][0], 1 << 31);
        assert_eq!(v[2][..2], [1 << 31, 3 << 30]);
        assert_eq!(v[3][..3], [1 << 31, 3 << 30, 1 << 29]);
        let vdc: Vec<u32> = (0..8).map(|i| sobol_point(i, 1)[0]).collect();
        let half = 1u32 << 31;
        assert_eq!(
            vdc,
            [
                0,
                half,
                3 << 30,
                1 << 30,
                3 << 29,
                7 << 29,
                5 << 29,
                1 << 29
            ]
        );
        // V[c][k] = m_(k+1) · 2^(31 − k) with m odd: its lowest set bit is bit 31 − k.
        for row in v {
            for (k, &x) in row.iter().enumerate() {
                assert_eq!(x.trailing_zeros() as usize, 31 - k, "{k}");
            }
        }
    }
}
