//! `erf_inv` with the same f32 bits as the CPU plugin's `chlo.erf_inv`, but without the
//! scalar library call inside it.
//!
//! XLA lowers `chlo.erf_inv` (f32) to Giles' polynomial around `w = -log1p(-x²)`, and its
//! CPU backend lowers `log1p(y)` to Cephes' rational approximation for `|y| < √2 − 1` and to
//! `log(1 + y)` otherwise, where `log` becomes `llvm.log.v8f32`: eight calls of glibc's
//! scalar `logf` per vector (the largest single cost of drawing full-rank noise, see
//! `docs/performance.md`, "how = A with full-rank noise"). [`erf_inv_exact`] emits the same
//! arithmetic as plain StableHLO ops, with glibc's `logf` algorithm (ARM's optimized
//! routines: a 16-entry table of `1/c` and `log c` in f64 and a cubic in f64, since glibc
//! 2.28) written out as bit, `select` and f64 ops, which XLA vectorizes (8 lanes) and fuses
//! into the consumer; on its own it is faster than `chlo.erf_inv` on this CPU.
//!
//! It is not on the hot path: fused into `how = A`'s draw-and-contract kernel it made that
//! kernel scalar (the longer body keeps LLVM from unrolling the dot's two-direction loop,
//! which is what lets it vectorize the outer one); `docs/performance.md`, "how = A with
//! full-rank noise", has the numbers.
//!
//! The results are the same bits as `chlo.erf_inv` for every f32 input in `[-1, 1]`,
//! checked through the plugin (`tests/suite/erf_inv_exact.rs`: a few million inputs with every
//! edge class by default, all 2.1·10⁹ bit patterns of `(-1, 1)` in the slow tier). The log
//! part was also checked on the host against this machine's glibc `logf` for every positive
//! normal f32 below 1, with and without fused multiply-adds in the f64 steps (the f32 result
//! is the same either way, so XLA's contraction choices cannot change it).
//!
//! The inputs where the log matters are `1 − x²` for `|x| ≥ 0.6436` (normal floats in
//! `[2⁻²³, 0.5858]`); elsewhere its lanes are computed and discarded by the `select`s, as in
//! XLA's lowering. [`log_glibc`] is only claimed to match `logf` on positive normal floats
//! other than 1 (glibc special-cases zero, subnormals, 1, infinities and NaN).

use crate::builder::{DType, HloError, Result, Value};
use crate::prng::host::{ERF_INV_COEFFS_GE5, ERF_INV_COEFFS_LT5};

/// glibc's `__logf_data.tab` (`{invc, logc}` for `c` near the centre of each of the 16
/// subintervals of `[0x3f330000, 2·0x3f330000)`), as f64 bit patterns.
const LOGF_TABLE: [(u64, u64); 16] = [
    (0x3ff6_61ec_79f8_f3be, 0xbfd5_7bf7_808c_aade),
    (0x3ff5_71ed_4aaf_883d, 0xbfd2_bef0_a7c0_6ddb),
    (0x3ff4_9539_f0f0_10b0, 0xbfd0_1eae_7f51_3a67),
    (0x3ff3_c995_b0b8_0385, 0xbfcb_31d8_a682_24e9),
    (0x3ff3_0d19_0c88_64a5, 0xbfc6_574f_0ac0_7758),
    (0x3ff2_5e22_7b0b_8ea0, 0xbfc1_aa2b_c79c_8100),
    (0x3ff1_bb4a_4a1a_343f, 0xbfba_4e76_ce8c_0e5e),
    (0x3ff1_2358_f08a_e5ba, 0xbfb1_973c_5a61_1ccc),
    (0x3ff0_953f_4199_00a7, 0xbfa2_52f4_38e1_0c1e),
    (0x3ff0_0000_0000_0000, 0x0000_0000_0000_0000),
    (0x3fee_608c_fd9a_47ac, 0x3faa_a5aa_5df2_5984),
    (0x3fec_a4b3_1f02_6aa0, 0x3fbc_5e53_aa36_2eb4),
    (0x3feb_2036_576a_fce6, 0x3fc5_26e5_7720_db08),
    (0x3fe9_c2d1_63a1_aa2d, 0x3fcb_c286_0d22_4770),
    (0x3fe8_86e6_0378_41ed, 0x3fd1_058b_c8a0_7ee1),
    (0x3fe7_67dc_f553_4862, 0x3fd4_0430_57b6_ee09),
];

/// glibc's `__logf_data.ln2` (`0x1.62e42fefa39efp-1`).
const LOGF_LN2: u64 = 0x3fe6_2e42_fefa_39ef;

/// glibc's `__logf_data.poly` (`A[0] r⁴ + A[1] r³ + A[2] r² + r` approximates `log1p(r)`).
const LOGF_POLY: [u64; 3] = [
    0xbfd0_0ea3_48b8_8334,
    0x3fd5_575b_0be0_0b6a,
    0xbfdf_fffe_f20a_4123,
];

/// `OFF` of glibc's `logf`: the table's subintervals start at this bit pattern (≈ 0.6992).
const LOGF_OFF: u32 = 0x3f33_0000;

/// Cephes' `log1p` denominator (highest power first) as XLA:CPU rounds it to f32:
/// 1, 15.0629091, 83.0475660, 221.762398, 309.098722, 216.427886, 60.1186605.
const LOG1P_DEN: [u32; 7] = [
    0x3f80_0000,
    0x4171_01ad,
    0x42a6_185b,
    0x435d_c32d,
    0x439a_8ca3,
    0x4358_6d8a,
    0x4270_7982,
];

/// Cephes' `log1p` numerator (highest power first) in f32: 4.52700009e-5, 0.498541028,
/// 6.57873259, 29.9119193, 60.9496680, 57.1129636, 20.0395535.
const LOG1P_NUM: [u32; 7] = [
    0x383d_e04b,
    0x3eff_40c5,
    0x40d2_84fa,
    0x41ef_4b9c,
    0x4273_cc76,
    0x4264_73ad,
    0x41a0_5101,
];

/// `√2 − 1` in f32: below it (in magnitude) XLA's `log1p` uses the rational form.
const LOG1P_SMALL: u32 = 0x3ed4_13cd;

fn need_f32(op: &str, x: &Value) -> Result<()> {
    if x.dtype() == DType::F32 {
        return Ok(());
    }
    Err(HloError::DTypeMismatch {
        op: op.into(),
        types: x.ty.to_string(),
        reason: "only f32 is supported (the bit-exact form mirrors XLA's f32 lowering); \
                 use `Value::erf_inv` for other float types"
            .into(),
    })
}

/// glibc's `logf(t)` for f32 `t`, as StableHLO bit and f64 ops (no library call).
///
/// Equal to glibc 2.28+'s `logf` for every positive normal `t` except `t = 1` (where glibc
/// returns exactly 0 and this returns a value within an ulp of 0); other inputs give
/// unspecified finite or NaN values.
pub fn log_glibc(t: &Value) -> Result<Value> {
    need_f32("log_glibc", t)?;
    let f = t.func();
    let d = |b: u64| f.scalar(f64::from_bits(b));
    let ix = t.bitcast_convert(DType::U32)?;
    let tmp = ix.sub(&f.scalar(LOGF_OFF)?)?;
    // The table index is bits 19..23 of `tmp`.
    let bit =
        |k: u32| -> Result<Value> { tmp.and(&f.scalar(1u32 << (19 + k))?)?.ne(&f.scalar(0u32)?) };
    let index_bits = [bit(0)?, bit(1)?, bit(2)?, bit(3)?];
    let k = tmp
        .bitcast_convert(DType::I32)?
        .shift_right_arithmetic(&f.scalar(23i32)?)?
        .convert(DType::F64)?;
    // `t = 2^k z` with `z` in `[OFF, 2 OFF)`: clearing the exponent bits `tmp` carried over.
    let iz = ix.sub(&tmp.and(&f.scalar(0xff80_0000u32)?)?)?;
    let z = iz.bitcast_convert(DType::F32)?.convert(DType::F64)?;
    let invc = lookup(&index_bits, |j| LOGF_TABLE[j].0)?;
    let logc = lookup(&index_bits, |j| LOGF_TABLE[j].1)?;
    // log(t) = log1p(z/c − 1) + log(c) + k ln 2, the polynomial pipelined as glibc writes it.
    let r = z.mul(&invc)?.sub(&f.scalar(1.0f64)?)?;
    let y0 = logc.add(&k.mul(&d(LOGF_LN2)?)?)?;
    let r2 = r.mul(&r)?;
    let y = d(LOGF_POLY[1])?.mul(&r)?.add(&d(LOGF_POLY[2])?)?;
    let y = d(LOGF_POLY[0])?.mul(&r2)?.add(&y)?;
    let y = y.mul(&r2)?.add(&y0.add(&r)?)?;
    y.convert(DType::F32)
}

/// `table(i)` (f64 bit patterns, 16 entries) for the index whose bits are `bits` (lowest
/// first), as a tree of `select`s: elementwise, so XLA fuses it with the index's producer
/// (a `gather` makes it materialize the indices, splitting the noise kernel in two).
fn lookup(bits: &[Value; 4], table: impl Fn(usize) -> u64) -> Result<Value> {
    let f = bits[0].func();
    let mut level: Vec<Value> = (0..16)
        .map(|j| f.scalar(f64::from_bits(table(j))))
        .collect::<Result<_>>()?;
    for b in bits {
        level = level
            .chunks_exact(2)
            .map(|pair| b.select(&pair[1], &pair[0]))
            .collect::<Result<_>>()?;
    }
    Ok(level.remove(0))
}

/// `log1p(y)` for f32 `y` as XLA:CPU lowers it, with [`log_glibc`] for its `log(1 + y)`.
///
/// The same bits as `stablehlo.log_plus_one` on the CPU plugin wherever `1 + y` is a
/// positive normal float other than 1 or `|y| < √2 − 1` (so for every `y` in `[-1, 0]`
/// that `erf_inv` passes it, `y = -1` aside).
pub fn log1p_exact(y: &Value) -> Result<Value> {
    need_f32("log1p_exact", y)?;
    let f = y.func();
    let c = |b: u32| f.scalar(f32::from_bits(b));
    let large = log_glibc(&y.add(&f.scalar(1.0f32)?)?)?;
    // XLA evaluates both polynomials from `0 · y + c₀` (not folded: `y` may be non-finite);
    // the same ops keep its rounding, fused or not.
    let y2 = y.mul(y)?;
    let zero = y.mul(&f.scalar(0.0f32)?)?;
    let horner = |coeffs: &[u32]| -> Result<Value> {
        let mut p = zero.add(&c(coeffs[0])?)?;
        for &k in &coeffs[1..] {
            p = p.mul(y)?.add(&c(k)?)?;
        }
        Ok(p)
    };
    let ratio = horner(&LOG1P_NUM)?.div(&horner(&LOG1P_DEN)?)?;
    // XLA computes `y + (y² · -0.5 + y³ · ratio)` with the first product fused:
    // `fma(y², -0.5, round(y³ · ratio))`. Written that way here, LLVM would flip the
    // constant's sign (`m - y² · 0.5`) and fuse the other product instead. The form
    // `y - (y² · 0.5 - m)` keeps `m` rounded on its own and `y² · 0.5` (exact) fused,
    // which is the same value: round-to-nearest is symmetric.
    let m = y.mul(&y2)?.mul(&ratio)?;
    let small = y.sub(&y2.mul(&f.scalar(0.5f32)?)?.sub(&m)?)?;
    y.abs()?.lt(&c(LOG1P_SMALL)?)?.select(&small, &large)
}

/// The inverse error function of f32 `x`, the same bits as [`Value::erf_inv`] on the CPU
/// plugin, with no scalar library call (see the module docs).
///
/// `w = -log1p(-x²)`; Giles' degree-8 polynomial in `w − 2.5` (`w < 5`) or `√w − 3`, times
/// `x`; `|x| = 1` gives `x · ∞`, as XLA's lowering does. Bit-exact on `[-1, 1]`; outside it,
/// and for NaN, both give NaN (not necessarily with the same sign and payload bits).
pub fn erf_inv_exact(x: &Value) -> Result<Value> {
    need_f32("erf_inv_exact", x)?;
    let f = x.func();
    let s = |v: f32| f.scalar(v);
    let w = log1p_exact(&x.mul(&x.neg()?)?)?.neg()?;
    let lt = w.lt(&s(5.0)?)?;
    let t = lt.select(&w.sub(&s(2.5)?)?, &w.sqrt()?.sub(&s(3.0)?)?)?;
    let coeff = |i: usize| -> Result<Value> {
        lt.select(&s(ERF_INV_COEFFS_LT5[i])?, &s(ERF_INV_COEFFS_GE5[i])?)
    };
    let mut p = coeff(0)?;
    for i in 1..ERF_INV_COEFFS_LT5.len() {
        p = coeff(i)?.add(&p.mul(&t)?)?;
    }
    let abs = x.abs()?;
    let at_one = abs
        .eq(&s(1.0)?)?
        .select(&x.mul(&s(f32::INFINITY)?)?, &p.mul(x)?)?;
    // Outside [-1, 1] (and for NaN) XLA's result is NaN from `logf` of a negative number;
    // the table lookup would give a finite value there, so the NaN is made explicit.
    abs.le(&s(1.0)?)?.select(&at_one, &s(f32::NAN)?)
}
