//! Deterministic draws for tasks, from the project's host threefry PRNG.
//!
//! Every stream is a key plus a counter: draw `c` is `bits_at(key, c)`, so a stream's
//! values depend only on how its key was derived (seed, task tag, generation, item), never
//! on threads or on what was drawn elsewhere.

use crate::hlo::prng::{bits_at, fold_in, key, Key, PrngError};

/// A task's root key: `fold_in(key(seed), tag)`. The tag keeps a task's streams apart from
/// the ES noise and sampling streams derived from the same run seed.
pub(crate) fn task_key(seed: u64, tag: u32) -> Result<Key, PrngError> {
    Ok(fold_in(key(seed)?, tag))
}

/// `fold_in` of both halves of a 64-bit value (low word first).
pub(crate) fn fold_in_u64(k: Key, v: u64) -> Key {
    // The two 32-bit halves are the point.
    fold_in(fold_in(k, v as u32), (v >> 32) as u32)
}

/// A hash of `bytes` under `k`: the length, then each little-endian 4-byte word
/// (zero-padded), folded in turn. A pure function of `(k, bytes)`.
pub(crate) fn hash_bytes(k: Key, bytes: &[u8]) -> [u32; 2] {
    let mut h = fold_in_u64(k, bytes.len() as u64);
    for chunk in bytes.chunks(4) {
        let mut w = [0u8; 4];
        w[..chunk.len()].copy_from_slice(chunk);
        h = fold_in(h, u32::from_le_bytes(w));
    }
    h.data()
}

/// A counter-based stream of random u32 values.
pub(crate) struct Draws {
    key: Key,
    counter: u64,
}

impl Draws {
    /// The stream of `key`, from its first value.
    pub(crate) fn new(key: Key) -> Draws {
        Draws { key, counter: 0 }
    }

    /// The next 32 random bits.
    pub(crate) fn next_u32(&mut self) -> u32 {
        let b = bits_at(self.key, self.counter);
        self.counter += 1;
        b
    }

    /// Uniform in `0..n` without modulo bias (rejection); `n = 0` gives 0.
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        if n <= 1 {
            return 0;
        }
        if n <= 1 << 32 {
            // The largest multiple of n not above 2^32: draws at or past it are redrawn,
            // so every residue is equally likely (at most half the draws are rejected).
            let limit = (1u64 << 32) - (1u64 << 32) % n;
            loop {
                let x = u64::from(self.next_u32());
                if x < limit {
                    return x % n;
                }
            }
        }
        // Wider ranges draw 64 bits (two draws, low word first), rejecting the last
        // 2^64 mod n values.
        let rem = (u64::MAX % n + 1) % n;
        loop {
            let x = u64::from(self.next_u32()) | (u64::from(self.next_u32()) << 32);
            if rem == 0 || x < rem.wrapping_neg() {
                return x % n;
            }
        }
    }

    /// Uniform in `lo..=hi` (`lo <= hi`, `hi - lo < u64::MAX`).
    pub(crate) fn between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn below_covers_the_range_evenly() {
        let mut d = Draws::new(Key::from_data([1, 2]));
        let mut counts = [0u32; 3];
        for _ in 0..3000 {
            counts[d.below(3) as usize] += 1;
        }
        assert!(
            counts.iter().all(|&c| (900..1100).contains(&c)),
            "{counts:?}"
        );
        assert_eq!(d.below(1), 0);
        assert!((5..=7).contains(&d.between(5, 7)));
        let wide = (1u64 << 40) + 3;
        assert!((0..20).all(|_| d.below(wide) < wide));
    }

    #[test]
    fn hash_depends_on_length_and_content() {
        let k = Key::from_data([0, 7]);
        assert_ne!(hash_bytes(k, b"ab"), hash_bytes(k, b"ab\0"));
        assert_ne!(hash_bytes(k, b"ab"), hash_bytes(k, b"ba"));
        assert_eq!(hash_bytes(k, b"abcde"), hash_bytes(k, b"abcde"));
    }
}
