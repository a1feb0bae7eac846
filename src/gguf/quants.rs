//! ggml tensor types ([`GgmlType`]) and their dequantization to f32 ([`dequantize`]).
//!
//! The block layouts are ggml's (`ggml-common.h`); each loop reproduces the `gguf` Python
//! package's `gguf.quants.dequantize` bit for bit, including the order of the f32
//! multiplications and additions (`tests/pretrained/gguf_read.rs` checks every type against it).
//! Rust does not contract `a * b + c` into a fused multiply-add, so the roundings are
//! numpy's.

use half::f16;

use super::GgufError;

/// The types [`dequantize`] accepts, for error messages.
pub const SUPPORTED: &str = "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K";

/// Every ggml type id a GGUF file may hold: (id, name, values per block, bytes per block),
/// as `gguf.constants.GGML_QUANT_SIZES` (ids 4, 5 and 31 to 33, 36 to 38 were removed
/// from ggml and are unknown).
const KNOWN: [(u32, &str, usize, usize); 33] = [
    (0, "F32", 1, 4),
    (1, "F16", 1, 2),
    (2, "Q4_0", 32, 18),
    (3, "Q4_1", 32, 20),
    (6, "Q5_0", 32, 22),
    (7, "Q5_1", 32, 24),
    (8, "Q8_0", 32, 34),
    (9, "Q8_1", 32, 40),
    (10, "Q2_K", 256, 84),
    (11, "Q3_K", 256, 110),
    (12, "Q4_K", 256, 144),
    (13, "Q5_K", 256, 176),
    (14, "Q6_K", 256, 210),
    (15, "Q8_K", 256, 292),
    (16, "IQ2_XXS", 256, 66),
    (17, "IQ2_XS", 256, 74),
    (18, "IQ3_XXS", 256, 98),
    (19, "IQ1_S", 256, 50),
    (20, "IQ4_NL", 32, 18),
    (21, "IQ3_S", 256, 110),
    (22, "IQ2_S", 256, 82),
    (23, "IQ4_XS", 256, 136),
    (24, "I8", 1, 1),
    (25, "I16", 1, 2),
    (26, "I32", 1, 4),
    (27, "I64", 1, 8),
    (28, "F64", 1, 8),
    (29, "IQ1_M", 256, 56),
    (30, "BF16", 1, 2),
    (34, "TQ1_0", 256, 54),
    (35, "TQ2_0", 256, 66),
    (39, "MXFP4", 32, 17),
    (40, "NVFP4", 64, 36),
];

/// A ggml tensor type: the ones shardes dequantizes, and any other id ggml defines.
// The variant names are ggml's, so they are not camel case.
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GgmlType {
    /// 32-bit float.
    F32,
    /// IEEE half.
    F16,
    /// bfloat16.
    BF16,
    /// Blocks of 32: f16 scale, 32 × i8 (34 bytes).
    Q8_0,
    /// Blocks of 32: f16 scale, 16 bytes of 4-bit values offset by 8 (18 bytes).
    Q4_0,
    /// Blocks of 32: f16 scale, f16 minimum, 16 bytes of 4-bit values (20 bytes).
    Q4_1,
    /// Blocks of 32: f16 scale, 32 high bits, 4-bit low parts, offset by 16 (22 bytes).
    Q5_0,
    /// Blocks of 32: f16 scale, f16 minimum, 32 high bits, 4-bit low parts (24 bytes).
    Q5_1,
    /// Super-blocks of 256: f16 scale and minimum, 8 six-bit sub-scales and minima, 4-bit
    /// values (144 bytes).
    Q4_K,
    /// Super-blocks of 256: as `Q4_K` plus a fifth bit per value (176 bytes).
    Q5_K,
    /// Super-blocks of 256: 6-bit values offset by 32, 16 i8 sub-scales, f16 scale (210
    /// bytes).
    Q6_K,
    /// Another ggml type, by id (`Q2_K`, `IQ4_NL`, `I32`, ...): its tensors can be read as
    /// bytes but not dequantized.
    Other(u32),
}

impl GgmlType {
    /// The type with ggml id `id`, or `None` when ggml defines no such id.
    pub fn from_id(id: u32) -> Option<GgmlType> {
        Some(match id {
            0 => GgmlType::F32,
            1 => GgmlType::F16,
            30 => GgmlType::BF16,
            8 => GgmlType::Q8_0,
            2 => GgmlType::Q4_0,
            3 => GgmlType::Q4_1,
            6 => GgmlType::Q5_0,
            7 => GgmlType::Q5_1,
            12 => GgmlType::Q4_K,
            13 => GgmlType::Q5_K,
            14 => GgmlType::Q6_K,
            _ if KNOWN.iter().any(|k| k.0 == id) => GgmlType::Other(id),
            _ => return None,
        })
    }

    /// ggml's id of the type (`GGML_TYPE_*`).
    pub fn id(&self) -> u32 {
        match self {
            GgmlType::F32 => 0,
            GgmlType::F16 => 1,
            GgmlType::BF16 => 30,
            GgmlType::Q8_0 => 8,
            GgmlType::Q4_0 => 2,
            GgmlType::Q4_1 => 3,
            GgmlType::Q5_0 => 6,
            GgmlType::Q5_1 => 7,
            GgmlType::Q4_K => 12,
            GgmlType::Q5_K => 13,
            GgmlType::Q6_K => 14,
            GgmlType::Other(id) => *id,
        }
    }

    fn known(&self) -> Option<&'static (u32, &'static str, usize, usize)> {
        let id = self.id();
        KNOWN.iter().find(|k| k.0 == id)
    }

    /// ggml's name of the type (`Q4_K`, `IQ2_XXS`, ...); `unknown` for an `Other` id ggml
    /// does not define.
    pub fn name(&self) -> &'static str {
        self.known().map_or("unknown", |k| k.1)
    }

    /// Values per block (1 for plain floats, 32 or 256 for quantized types); `None` for an
    /// `Other` id ggml does not define.
    pub fn block_size(&self) -> Option<usize> {
        self.known().map(|k| k.2)
    }

    /// Bytes per block; `None` for an `Other` id ggml does not define.
    pub fn type_size(&self) -> Option<usize> {
        self.known().map(|k| k.3)
    }

    /// Whether [`dequantize`] converts this type.
    pub fn is_supported(&self) -> bool {
        !matches!(self, GgmlType::Other(_))
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GgmlType::Other(id) if self.known().is_none() => write!(f, "ggml type {id}"),
            _ => f.write_str(self.name()),
        }
    }
}

/// Dequantizes `n` values of type `ty` stored in `bytes` (exactly `n / block × block
/// bytes` of them) into f32, in storage order: for a tensor, row-major in PyTorch order.
///
/// Errors when `ty` has no dequantizer ([`GgmlType::Other`]), when `n` is not a whole
/// number of blocks, or when `bytes` is not exactly their size.
pub fn dequantize(ty: GgmlType, bytes: &[u8], n: usize) -> Result<Vec<f32>, GgufError> {
    let (block, size) = match (ty.is_supported(), ty.block_size(), ty.type_size()) {
        (true, Some(block), Some(size)) => (block, size),
        _ => {
            return Err(GgufError::UnsupportedType {
                ty: ty.to_string(),
                supported: SUPPORTED,
            })
        }
    };
    let length = |why: String| GgufError::Length {
        ty: ty.name(),
        n,
        got: bytes.len(),
        why,
    };
    if !n.is_multiple_of(block) {
        return Err(length(format!(
            "{n} is not a multiple of the block size {block}"
        )));
    }
    let need = (n / block)
        .checked_mul(size)
        .ok_or_else(|| length("the byte count overflows".to_string()))?;
    if bytes.len() != need {
        return Err(length(format!(
            "{n} values take {need} bytes ({} blocks of {size})",
            n / block
        )));
    }
    // Zeroed then overwritten: one allocation, and the loops below write through
    // fixed-size chunks the compiler can check once per block.
    let mut out = vec![0f32; n];
    let blocks = bytes.chunks_exact(size);
    let outs = out.chunks_exact_mut(block);
    match ty {
        GgmlType::F32 => {
            for (o, b) in outs.zip(blocks) {
                o[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        GgmlType::F16 => outs.zip(blocks).for_each(|(o, b)| o[0] = half_at(b, 0)),
        GgmlType::BF16 => {
            for (o, b) in outs.zip(blocks) {
                o[0] = f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16);
            }
        }
        GgmlType::Q8_0 => outs.zip(blocks).for_each(|(o, b)| q8_0(o, b)),
        GgmlType::Q4_0 => outs.zip(blocks).for_each(|(o, b)| q4_0(o, b)),
        GgmlType::Q4_1 => outs.zip(blocks).for_each(|(o, b)| q4_1(o, b)),
        GgmlType::Q5_0 => outs.zip(blocks).for_each(|(o, b)| q5_0(o, b)),
        GgmlType::Q5_1 => outs.zip(blocks).for_each(|(o, b)| q5_1(o, b)),
        GgmlType::Q4_K => outs.zip(blocks).for_each(|(o, b)| q4_k(o, b)),
        GgmlType::Q5_K => outs.zip(blocks).for_each(|(o, b)| q5_k(o, b)),
        GgmlType::Q6_K => outs.zip(blocks).for_each(|(o, b)| q6_k(o, b)),
        GgmlType::Other(_) => {}
    }
    Ok(out)
}

/// The little-endian f16 at `b[at..at + 2]`, widened (exactly) to f32.
#[inline(always)]
fn half_at(b: &[u8], at: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[at], b[at + 1]])).to_f32()
}

/// Q8_0: `q·d` (numpy: `x * d`).
#[inline(always)]
fn q8_0(o: &mut [f32], b: &[u8]) {
    let d = half_at(b, 0);
    for (o, &q) in o.iter_mut().zip(&b[2..34]) {
        *o = f32::from(q as i8) * d;
    }
}

/// Q4_0: byte `j` holds value `j` (low nibble) and `j + 16` (high); `d·(q − 8)`.
#[inline(always)]
fn q4_0(o: &mut [f32], b: &[u8]) {
    let d = half_at(b, 0);
    let (lo, hi) = o.split_at_mut(16);
    for ((lo, hi), &q) in lo.iter_mut().zip(hi).zip(&b[2..18]) {
        *lo = d * f32::from((q & 0x0F) as i8 - 8);
        *hi = d * f32::from((q >> 4) as i8 - 8);
    }
}

/// Q4_1: as Q4_0 without the offset, plus the minimum: `d·q + m`.
#[inline(always)]
fn q4_1(o: &mut [f32], b: &[u8]) {
    let (d, m) = (half_at(b, 0), half_at(b, 2));
    let (lo, hi) = o.split_at_mut(16);
    for ((lo, hi), &q) in lo.iter_mut().zip(hi).zip(&b[4..20]) {
        *lo = d * f32::from(q & 0x0F) + m;
        *hi = d * f32::from(q >> 4) + m;
    }
}

/// The 5-bit values of a Q5_0/Q5_1 block: bit `j` of `qh` is the fifth bit of value `j`.
#[inline(always)]
fn q5_values(qh: u32, qs: &[u8], mut f: impl FnMut(usize, u8)) {
    for (j, &q) in qs.iter().enumerate().take(16) {
        f(j, (q & 0x0F) | ((((qh >> j) & 1) as u8) << 4));
        f(j + 16, (q >> 4) | ((((qh >> (j + 16)) & 1) as u8) << 4));
    }
}

/// Q5_0: f16 `d`, u32 high bits, 16 bytes of low nibbles; `d·(q − 16)`.
#[inline(always)]
fn q5_0(o: &mut [f32], b: &[u8]) {
    let d = half_at(b, 0);
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    q5_values(qh, &b[6..22], |j, q| o[j] = d * f32::from(q as i8 - 16));
}

/// Q5_1: f16 `d`, f16 `m`, u32 high bits, 16 bytes of low nibbles; `d·q + m`.
#[inline(always)]
fn q5_1(o: &mut [f32], b: &[u8]) {
    let (d, m) = (half_at(b, 0), half_at(b, 2));
    let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    q5_values(qh, &b[8..24], |j, q| o[j] = d * f32::from(q) + m);
}

/// The 6-bit scale and minimum of sub-block `j` (0..8) of a Q4_K/Q5_K super-block, packed
/// in 12 bytes (ggml's `get_scale_min_k4`).
#[inline(always)]
fn scale_min(s: &[u8], j: usize) -> (u8, u8) {
    if j < 4 {
        (s[j] & 0x3F, s[j + 4] & 0x3F)
    } else {
        (
            (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    }
}

/// Q4_K: f16 `d`, f16 `dmin`, 12 bytes of scales, 128 bytes of nibbles; sub-block `j`
/// (32 values) takes the low (even `j`) or high (odd `j`) nibbles of bytes `32·(j/2)..`;
/// `(d·sc)·q − dmin·m`.
#[inline(always)]
fn q4_k(o: &mut [f32], b: &[u8]) {
    let (d, dmin) = (half_at(b, 0), half_at(b, 2));
    let scales = &b[4..16];
    for (j, o) in o.chunks_exact_mut(32).enumerate() {
        let (sc, m) = scale_min(scales, j);
        let (dl, ml) = (d * f32::from(sc), dmin * f32::from(m));
        let qs = &b[16 + 32 * (j / 2)..16 + 32 * (j / 2) + 32];
        let shift = 4 * (j % 2);
        for (o, &q) in o.iter_mut().zip(qs) {
            *o = dl * f32::from((q >> shift) & 0x0F) - ml;
        }
    }
}

/// Q5_K: as Q4_K with 32 bytes of fifth bits before the nibbles: bit `j` of byte `l` is
/// the fifth bit of value `l` of sub-block `j`.
#[inline(always)]
fn q5_k(o: &mut [f32], b: &[u8]) {
    let (d, dmin) = (half_at(b, 0), half_at(b, 2));
    let scales = &b[4..16];
    let qh = &b[16..48];
    for (j, o) in o.chunks_exact_mut(32).enumerate() {
        let (sc, m) = scale_min(scales, j);
        let (dl, ml) = (d * f32::from(sc), dmin * f32::from(m));
        let qs = &b[48 + 32 * (j / 2)..48 + 32 * (j / 2) + 32];
        let shift = 4 * (j % 2);
        for ((o, &q), &h) in o.iter_mut().zip(qs).zip(qh) {
            let q = ((q >> shift) & 0x0F) | (((h >> j) & 1) << 4);
            *o = dl * f32::from(q) - ml;
        }
    }
}

/// Q6_K: 128 bytes of low nibbles, 64 bytes of high 2-bit pairs, 16 i8 scales, f16 `d`.
/// Each half of 128 values `h` uses `ql[64h..64h + 64]` (values `r < 64` the low nibbles,
/// the rest the high ones) and `qh[32h..32h + 32]` (bits `2·(r/32)..` of byte `r % 32`);
/// value `i` is `(d·scale[i/16])·(q − 32)`.
#[inline(always)]
fn q6_k(o: &mut [f32], b: &[u8]) {
    let d = half_at(b, 208);
    let scales = &b[192..208];
    for (h, o) in o.chunks_exact_mut(128).enumerate() {
        let ql = &b[64 * h..64 * h + 64];
        let qh = &b[128 + 32 * h..128 + 32 * h + 32];
        for (part, o) in o.chunks_exact_mut(32).enumerate() {
            // Parts 0 and 1 read ql's low nibbles, 2 and 3 its high ones.
            let ql = &ql[32 * (part % 2)..32 * (part % 2) + 32];
            let (lshift, hshift) = (4 * (part / 2), 2 * part);
            for (l, ((o, &lo), &hi)) in o.iter_mut().zip(ql).zip(qh).enumerate() {
                let q = ((lo >> lshift) & 0x0F) | (((hi >> hshift) & 3) << 4);
                let scale = scales[8 * h + 2 * part + l / 16];
                *o = (d * f32::from(scale as i8)) * f32::from(q as i8 - 32);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_unknown_ids_are_none() {
        for &(id, name, block, size) in &KNOWN {
            let ty = GgmlType::from_id(id).unwrap();
            assert_eq!(ty.id(), id);
            assert_eq!(ty.name(), name);
            assert_eq!(ty.block_size(), Some(block));
            assert_eq!(ty.type_size(), Some(size));
        }
        for id in [4, 5, 31, 32, 33, 36, 37, 38, 41, 1000] {
            assert_eq!(GgmlType::from_id(id), None, "{id}");
        }
        assert_eq!(GgmlType::Other(999).name(), "unknown");
        assert_eq!(GgmlType::Other(999).block_size(), None);
        assert_eq!(GgmlType::Other(999).to_string(), "ggml type 999");
        assert_eq!(GgmlType::Q4_K.to_string(), "Q4_K");
    }

    #[test]
    fn q8_0_and_q4_1_by_hand() {
        // d = 0.5 (f16 0x3800), m = -1 (0xBC00).
        let mut b = vec![0x00, 0x38];
        b.extend((0..32).map(|i| (i as i8 - 16) as u8));
        let v = dequantize(GgmlType::Q8_0, &b, 32).unwrap();
        assert_eq!(v[0], -8.0);
        assert_eq!(v[31], 7.5);
        let mut b = vec![0x00, 0x38, 0x00, 0xBC];
        b.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        let v = dequantize(GgmlType::Q4_1, &b, 32).unwrap();
        assert_eq!(v[0], -1.0); // nibble 0
        assert_eq!(v[15], 6.5); // nibble 15
        assert_eq!(v[16], 6.5); // high nibble of byte 0 = 15
        assert_eq!(v[31], -1.0);
    }

    #[test]
    fn bad_lengths_and_types_are_errors() {
        let e = dequantize(GgmlType::Q8_0, &[0; 34], 31).unwrap_err();
        assert!(
            e.to_string()
                .contains("not a multiple of the block size 32"),
            "{e}"
        );
        let e = dequantize(GgmlType::Q8_0, &[0; 33], 32).unwrap_err();
        assert!(e.to_string().contains("take 34 bytes"), "{e}");
        let e = dequantize(GgmlType::Other(10), &[0; 84], 256).unwrap_err();
        assert!(
            e.to_string().contains("Q2_K") && e.to_string().contains("Q6_K"),
            "{e}"
        );
        assert_eq!(
            dequantize(GgmlType::F32, &[], 0).unwrap(),
            Vec::<f32>::new()
        );
    }
}
