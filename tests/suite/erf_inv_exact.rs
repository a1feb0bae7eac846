//! `prng::erf_inv::erf_inv_exact` (bit, `select` and f64 ops, no library call) gives exactly
//! the f32 bits of `chlo.erf_inv` on the CPU plugin: both programs compiled separately and
//! run on the same inputs, every output compared as raw bits (no mismatch allowed).
//!
//! The default tier covers about 3.76 million inputs: a stride through all bit patterns of
//! `(-1, 1)` of both signs, and dense runs at every edge class (±0, subnormals, the
//! smallest normals, `log1p`'s branch point `x² = √2 − 1`, the polynomial's `w = 5`, each
//! of glibc `logf`'s 16 table boundaries in `1 − x²`, the last 2¹⁸ floats below 1, ±1;
//! beyond 1, ±∞ and NaN both give NaN, which is all that is compared there), and the
//! normals of `emit::normal_of_bits_exact` fused with an unrolled threefry draw against
//! `Keys::normal`. The slow tier (`slow_`) sweeps every bit pattern with `|x| < 1`.

use shardes::hlo::builder::{DType, Module, TensorType};
use shardes::hlo::prng::emit::{normal_of_bits_exact, threefry2x32_unrolled};
use shardes::hlo::prng::erf_inv::erf_inv_exact;
use shardes::hlo::prng::{Key, Keys};
use shardes::runtime::{Client, CompileOptions, Executable};

/// Elements per run.
const CHUNK: usize = 1 << 22;

/// `main(bits: u32[CHUNK]) -> f32[CHUNK]`: `chlo.erf_inv` (`exact = false`) or
/// `erf_inv_exact` of the bits read as f32.
fn program(client: &Client, exact: bool) -> Executable {
    let mut m = Module::new(if exact { "exact" } else { "chlo" });
    let f = m.func("main");
    let bits = f.arg("bits", TensorType::u32(&[CHUNK as i64])).unwrap();
    let x = bits.bitcast_convert(DType::F32).unwrap();
    let y = if exact {
        erf_inv_exact(&x).unwrap()
    } else {
        x.erf_inv().unwrap()
    };
    f.output(&y.bitcast_convert(DType::U32).unwrap()).unwrap();
    m.add(f.finish().unwrap()).unwrap();
    client
        .compile(&m.to_mlir(), &CompileOptions::new(1))
        .unwrap()
}

/// Runs both programs over `inputs` (any length) and returns the mismatches as
/// `(input bits, chlo bits, exact bits)`, at most the first 16 of them, and their count.
fn mismatches(inputs: &[u32]) -> (usize, Vec<(u32, u32, u32)>) {
    let client = Client::cpu(1).expect("CPU plugin");
    let (chlo, exact) = (program(&client, false), program(&client, true));
    let run = |exe: &Executable, chunk: &[u32]| -> Vec<u32> {
        let b = client.buffer_from_host(chunk, &[CHUNK], 0).unwrap();
        let out = exe.execute(&[vec![&b]]).unwrap();
        out[0][0].to_host::<u32>().unwrap()
    };
    let (mut count, mut first) = (0, Vec::new());
    for part in inputs.chunks(CHUNK) {
        let mut chunk = part.to_vec();
        // Pad with zeros (erf_inv(0) = 0 on both sides; padding is not counted).
        chunk.resize(CHUNK, 0);
        let (a, b) = (run(&chlo, &chunk), run(&exact, &chunk));
        for ((&x, &p), &q) in part.iter().zip(&a).zip(&b) {
            // Outside [-1, 1] only NaN-ness is compared (NaN signs and payloads depend on
            // which operation made them).
            let ax = f32::from_bits(x).abs();
            let outside = ax.is_nan() || ax > 1.0;
            let nans = f32::from_bits(p).is_nan() && f32::from_bits(q).is_nan();
            if p != q && !(outside && nans) {
                count += 1;
                if first.len() < 16 {
                    first.push((x, p, q));
                }
            }
        }
    }
    (count, first)
}

/// Every bit pattern in `[lo, hi)`, clamped to the non-negative floats below 1, both signs.
fn both_signs(lo: u32, hi: u32, out: &mut Vec<u32>) {
    let hi = hi.min(ONE);
    for b in lo.min(hi)..hi {
        out.push(b);
        out.push(b | SIGN);
    }
}

const ONE: u32 = 0x3f80_0000;
const SIGN: u32 = 0x8000_0000;

/// Dense runs of `half` bit patterns on each side of the f32 nearest `x` (`x ≥ 0`).
fn around(x: f64, half: u32, out: &mut Vec<u32>) {
    let c = (x as f32).to_bits();
    both_signs(c.saturating_sub(half), c + half, out);
}

#[test]
fn erf_inv_exact_equals_chlo_on_every_edge_class() {
    let mut v = Vec::new();
    // A stride through everything (prime, so every exponent and many mantissa patterns
    // are hit; the slow tier sweeps every input).
    let mut b = 0u32;
    while b < ONE {
        v.push(b);
        v.push(b | SIGN);
        b += 8191;
    }
    // ±0, the subnormals' ends and the smallest normals.
    both_signs(0, 1 << 16, &mut v);
    both_signs(0x007f_0000, 0x0081_0000, &mut v);
    // Around x² = 1e-7 (log1p's y tiny, glibc's 1 + y = 1).
    around(1e-3f64.sqrt(), 1 << 14, &mut v);
    // log1p's branch: |x²| = √2 − 1 in f32.
    around(
        f64::from(f32::from_bits(0x3ed4_13cd)).sqrt(),
        1 << 16,
        &mut v,
    );
    // The polynomial's w = 5: x² = 1 − e⁻⁵.
    around((1.0 - (-5.0f64).exp()).sqrt(), 1 << 16, &mut v);
    // glibc logf's table boundaries in t = 1 − x²: t = 2^e (1 + j/16) · 0x3f330000's
    // mantissa grid, i.e. the bit patterns OFF + j 2^19 and their powers of two.
    for e in -3..=0 {
        for j in 0..16u32 {
            let t = f64::from(f32::from_bits(0x3f33_0000 + (j << 19))) * 2f64.powi(e);
            if t < 0.5858 {
                around((1.0 - t).sqrt(), 1 << 10, &mut v);
            }
        }
    }
    // The last 2^18 floats below 1 (t down to 2⁻²³), and ±1, ±∞, NaN.
    both_signs(ONE - (1 << 18), ONE, &mut v);
    v.extend([
        ONE,
        ONE | SIGN,
        0x7f80_0000,
        0xff80_0000,
        0x7fc0_0000,
        0xffc0_0000,
    ]);
    // Beyond 1 (NaN on both sides): just above 1, 2, 1e30, the largest float.
    for b in [ONE + 1, ONE + 2, 0x4000_0000, 0x7149_f2ca, 0x7f7f_ffff] {
        v.extend([b, b | SIGN]);
    }
    assert!(v.len() > 1_800_000, "{} inputs", v.len());
    let (count, first) = mismatches(&v);
    assert_eq!(
        count,
        0,
        "{count} of {} inputs differ; first (x, chlo, exact): {:?}",
        v.len(),
        first
            .iter()
            .map(|&(x, p, q)| (f32::from_bits(x), f32::from_bits(p), f32::from_bits(q)))
            .collect::<Vec<_>>()
    );
}

#[test]
#[ignore = "slow tier"]
fn slow_erf_inv_exact_equals_chlo_on_every_input_below_one() {
    // 2 · 0x3f800000 ≈ 2.13e9 inputs, in slices so the input list stays small.
    let step = 1u32 << 26;
    let mut lo = 0u32;
    let mut total = 0usize;
    while lo < ONE {
        let mut v = Vec::with_capacity(2 * step as usize);
        both_signs(lo, lo.saturating_add(step), &mut v);
        total += v.len();
        let (count, first) = mismatches(&v);
        assert_eq!(
            count, 0,
            "bits [{lo:#x}, +{step:#x}): {count} differ: {first:x?}"
        );
        lo = lo.saturating_add(step);
    }
    assert_eq!(total, 2 * ONE as usize);
}

#[test]
fn exact_normals_fused_with_unrolled_threefry_equal_keys_normal() {
    // In one fused kernel with the draw (as a consumer would read them), 16 keys × 65536.
    let client = Client::cpu(1).expect("CPU plugin");
    let mut m = Module::new("fused");
    let f = m.func("main");
    let k = f.arg("key", TensorType::u32(&[2])).unwrap();
    let keys = Keys::from_data(&k).unwrap();
    let per = keys
        .fold_in(&f.iota(TensorType::u32(&[16]), 0).unwrap())
        .unwrap();
    let full = [16, 65536];
    let wide = per.broadcast_in_dim(&full, &[0]).unwrap();
    let (k0, k1) = wide.words();
    let ctr = f.iota(TensorType::u32(&full), 1).unwrap();
    let zero = f.scalar(0u32).unwrap().broadcast_to(&full).unwrap();
    let (y0, y1) = threefry2x32_unrolled(k0, k1, &zero, &ctr).unwrap();
    let exact = normal_of_bits_exact(&y0.xor(&y1).unwrap()).unwrap();
    let reference = per.normal(&[65536]).unwrap();
    for v in [&reference, &exact] {
        f.output(&v.bitcast_convert(DType::U32).unwrap()).unwrap();
    }
    m.add(f.finish().unwrap()).unwrap();
    let exe = client
        .compile(&m.to_mlir(), &CompileOptions::new(1))
        .unwrap();
    let kb = client
        .buffer_from_host(&Key::from_data([7, 3]).data(), &[2], 0)
        .unwrap();
    let out = exe.execute(&[vec![&kb]]).unwrap();
    let (a, b) = (
        out[0][0].to_host::<u32>().unwrap(),
        out[0][1].to_host::<u32>().unwrap(),
    );
    assert_eq!(a.len(), 16 * 65536);
    let differ = a.iter().zip(&b).filter(|(p, q)| p != q).count();
    assert_eq!(differ, 0, "{differ} of {} normals differ", a.len());
}

#[test]
fn erf_inv_exact_refuses_other_float_types() {
    let m = Module::new("bad");
    let f = m.func("bad");
    let x = f.arg("x", TensorType::new(DType::F64, &[4])).unwrap();
    let err = erf_inv_exact(&x).unwrap_err().to_string();
    assert!(err.contains("only f32"), "{err}");
    assert!(err.contains("erf_inv_exact"), "{err}");
}
