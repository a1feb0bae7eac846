//! Execution tests of every builder op: each program is built with `shardes::hlo::builder`,
//! compiled and run on the CPU PJRT plugin through `shardes::runtime`, and compared with
//! values computed here in Rust. Tolerances are stated per op.

use shardes::hlo::builder::{
    Cmp, DType, DotDims, Func, Mesh, Module, Result, Sharding, TensorType, Value,
};
use shardes::runtime::{gather_rows, Buffer, Client, CompileOptions};

fn client(devices: usize) -> Client {
    Client::cpu(devices).expect("CPU PJRT client (see shardes_runtime::plugin::locate)")
}

/// A one-function module whose outputs are what `build` returns.
fn module(build: impl FnOnce(&Func) -> Result<Vec<Value>>) -> Module {
    let mut m = Module::new("ops");
    let f = m.func("main");
    let outs = build(&f).expect("build");
    for o in &outs {
        f.output(o).expect("output");
    }
    m.add(f.finish().expect("finish")).expect("add");
    m
}

/// Compiles `m` for one device and runs it once.
fn run(c: &Client, m: &Module, args: &[&Buffer]) -> Vec<Buffer> {
    let text = m.to_mlir();
    let exe = c
        .compile(&text, &CompileOptions::new(1))
        .unwrap_or_else(|e| panic!("compile failed: {e}\n{text}"));
    let mut outs = exe.execute(&[args.to_vec()]).expect("execute");
    outs.remove(0)
}

fn f32s(b: &Buffer) -> Vec<f32> {
    b.to_host::<f32>().expect("to_host f32")
}

/// Asserts `|got - want| <= abs + rel * |want|` elementwise (NaN must match NaN).
fn assert_close(what: &str, got: &[f32], want: &[f32], abs: f32, rel: f32) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        if w.is_nan() {
            assert!(g.is_nan(), "{what}[{i}]: got {g}, want NaN");
            continue;
        }
        if w.is_infinite() {
            assert_eq!(g, w, "{what}[{i}]");
            continue;
        }
        assert!(
            (g - w).abs() <= abs + rel * w.abs(),
            "{what}[{i}]: got {g}, want {w} (abs {abs}, rel {rel})"
        );
    }
}

/// 24 deterministic values in (-3, 3), none integral, with sign changes.
/// The seven arithmetic binary ops both element kinds have, in the order the tests read
/// their results: add, sub, mul, div, rem, max, min.
fn arithmetic(a: &Value, b: &Value) -> Result<Vec<Value>> {
    Ok(vec![
        a.add(b)?,
        a.sub(b)?,
        a.mul(b)?,
        a.div(b)?,
        a.rem(b)?,
        a.max(b)?,
        a.min(b)?,
    ])
}

fn sample() -> Vec<f32> {
    (0..24)
        .map(|i| ((i * 37 % 24) as f32 - 11.5) * 0.25 + 0.013 * i as f32)
        .collect()
}

#[test]
fn unary_float_ops() {
    let c = client(1);
    let x = sample();
    let pos: Vec<f32> = x.iter().map(|v| v.abs() + 0.1).collect();
    let unit: Vec<f32> = x.iter().map(|v| v / 3.5).collect();
    let [bx, bp, bu] = [&x, &pos, &unit].map(|v| c.buffer_from_host(v, &[24], 0).unwrap());
    let m = module(|f| {
        let x = f.arg("x", TensorType::f32(&[24]))?;
        let p = f.arg("p", TensorType::f32(&[24]))?;
        let u = f.arg("u", TensorType::f32(&[24]))?;
        Ok(vec![
            x.neg()?,
            x.abs()?,
            x.exp()?,
            p.log()?,
            p.log1p()?,
            p.sqrt()?,
            p.rsqrt()?,
            x.tanh()?,
            x.logistic()?,
            x.floor()?,
            x.ceil()?,
            x.sign()?,
            x.cos()?,
            x.sin()?,
            u.erf_inv()?,
        ])
    });
    let out = run(&c, &m, &[&bx, &bp, &bu]);
    type F = fn(f32) -> f32;
    // (name, input, host function, relative tolerance). Transcendentals: XLA's CPU
    // implementations are within a few ulp of libm; 1e-5 relative (plus 1e-6 absolute) covers it.
    let cases: [(&str, &Vec<f32>, F, f32); 15] = [
        ("neg", &x, |v| -v, 0.0),
        ("abs", &x, f32::abs, 0.0),
        ("exp", &x, f32::exp, 1e-5),
        ("log", &pos, f32::ln, 1e-5),
        ("log1p", &pos, f32::ln_1p, 1e-5),
        ("sqrt", &pos, f32::sqrt, 1e-6),
        ("rsqrt", &pos, |v| 1.0 / v.sqrt(), 1e-5),
        ("tanh", &x, f32::tanh, 1e-5),
        ("logistic", &x, |v| 1.0 / (1.0 + (-v).exp()), 1e-5),
        ("floor", &x, f32::floor, 0.0),
        ("ceil", &x, f32::ceil, 0.0),
        ("sign", &x, f32::signum, 0.0),
        ("cos", &x, f32::cos, 1e-5),
        ("sin", &x, f32::sin, 1e-5),
        (
            "erf_inv",
            &unit,
            shardes::hlo::prng::host::erf_inv_f32,
            1e-5,
        ),
    ];
    for ((name, input, h, rel), b) in cases.iter().zip(&out) {
        let want: Vec<f32> = input.iter().map(|&v| h(v)).collect();
        assert_close(name, &f32s(b), &want, 1e-6, *rel);
    }
}

#[test]
fn is_finite_compare_select_clamp() {
    let c = client(1);
    let x = vec![
        1.0f32,
        f32::NAN,
        f32::INFINITY,
        -2.0,
        0.5,
        f32::NEG_INFINITY,
    ];
    let y = vec![1.0f32, 0.0, 3.0, -3.0, 0.75, 0.0];
    let bx = c.buffer_from_host(&x, &[6], 0).unwrap();
    let by = c.buffer_from_host(&y, &[6], 0).unwrap();
    let m = module(|f| {
        let a = f.arg("a", TensorType::f32(&[6]))?;
        let b = f.arg("b", TensorType::f32(&[6]))?;
        let mut outs = vec![a.is_finite()?];
        for d in [Cmp::Eq, Cmp::Ne, Cmp::Lt, Cmp::Le, Cmp::Gt, Cmp::Ge] {
            outs.push(a.compare(&b, d)?);
        }
        outs.push(a.lt(&b)?.select(&a, &b)?);
        outs.push(b.clamp(&f.scalar(-1.0f32)?, &f.scalar(0.6f32)?)?);
        Ok(outs)
    });
    let out = run(&c, &m, &[&bx, &by]);
    let bools = |b: &Buffer| b.to_host::<bool>().unwrap();
    assert_eq!(
        bools(&out[0]),
        x.iter().map(|v| v.is_finite()).collect::<Vec<_>>()
    );
    let dirs: [fn(&f32, &f32) -> bool; 6] = [
        |a, b| a == b,
        |a, b| a != b,
        |a, b| a < b,
        |a, b| a <= b,
        |a, b| a > b,
        |a, b| a >= b,
    ];
    for (k, d) in dirs.iter().enumerate() {
        let want: Vec<bool> = x.iter().zip(&y).map(|(a, b)| d(a, b)).collect();
        assert_eq!(bools(&out[1 + k]), want, "compare #{k}");
    }
    let sel: Vec<f32> = x
        .iter()
        .zip(&y)
        .map(|(a, b)| if a < b { *a } else { *b })
        .collect();
    assert_close("select", &f32s(&out[7]), &sel, 0.0, 0.0);
    let cl: Vec<f32> = y.iter().map(|v| v.clamp(-1.0, 0.6)).collect();
    assert_close("clamp", &f32s(&out[8]), &cl, 0.0, 0.0);
}

#[test]
fn binary_float_ops_with_broadcasting() {
    let c = client(1);
    let x: Vec<f32> = sample();
    let y: Vec<f32> = (0..4).map(|i| 0.5 + i as f32 * 0.75).collect();
    let bx = c.buffer_from_host(&x, &[6, 4], 0).unwrap();
    let by = c.buffer_from_host(&y, &[4], 0).unwrap();
    let m = module(|f| {
        let a = f.arg("a", TensorType::f32(&[6, 4]))?;
        let b = f.arg("b", TensorType::f32(&[4]))?; // broadcast along rows
        let mut out = arithmetic(&a, &b)?;
        out.push(a.abs()?.pow(&b)?);
        Ok(out)
    });
    let out = run(&c, &m, &[&bx, &by]);
    type F = fn(f32, f32) -> f32;
    // Exact IEEE ops compare bitwise (tolerance 0); pow goes through exp/log: 1e-5 relative.
    let cases: [(&str, F, f32); 8] = [
        ("add", |a, b| a + b, 0.0),
        ("sub", |a, b| a - b, 0.0),
        ("mul", |a, b| a * b, 0.0),
        ("div", |a, b| a / b, 0.0),
        ("rem", |a, b| a % b, 0.0),
        ("max", f32::max, 0.0),
        ("min", f32::min, 0.0),
        ("pow", |a, b| a.abs().powf(b), 1e-5),
    ];
    for ((name, h, rel), b) in cases.iter().zip(&out) {
        let want: Vec<f32> = x.iter().enumerate().map(|(i, &a)| h(a, y[i % 4])).collect();
        assert_close(name, &f32s(b), &want, 0.0, *rel);
    }
}

#[test]
fn integer_and_bit_ops() {
    let c = client(1);
    let a: Vec<i32> = vec![7, -7, 100, -1, 0, 123456];
    let b: Vec<i32> = vec![2, 3, -7, 5, 9, 1000];
    let u: Vec<u32> = vec![0xDEADBEEF, 1, 0x80000000, 0x12345678, 0xFFFFFFFF, 42];
    let s: Vec<u32> = vec![0, 1, 31, 13, 4, 9];
    let ba = c.buffer_from_host(&a, &[6], 0).unwrap();
    let bb = c.buffer_from_host(&b, &[6], 0).unwrap();
    let bu = c.buffer_from_host(&u, &[6], 0).unwrap();
    let bs = c.buffer_from_host(&s, &[6], 0).unwrap();
    let m = module(|f| {
        let a = f.arg("a", TensorType::i32(&[6]))?;
        let b = f.arg("b", TensorType::i32(&[6]))?;
        let u = f.arg("u", TensorType::u32(&[6]))?;
        let s = f.arg("s", TensorType::u32(&[6]))?;
        let arith = arithmetic(&a, &b)?;
        Ok(arith
            .into_iter()
            .chain([
                a.neg()?,
                a.abs()?,
                a.shift_right_arithmetic(&f.scalar(1i32)?)?,
                u.add(&s)?,
                u.mul(&u)?,
                u.and(&s)?,
                u.or(&s)?,
                u.xor(&s)?,
                u.not()?,
                u.shift_left(&s)?,
                u.shift_right_logical(&s)?,
                u.lt(&s)?.convert(DType::U32)?,
            ])
            .collect())
    });
    let out = run(&c, &m, &[&ba, &bb, &bu, &bs]);
    let i = |k: usize| out[k].to_host::<i32>().unwrap();
    let w = |k: usize| out[k].to_host::<u32>().unwrap();
    let zi = |h: fn(i32, i32) -> i32| a.iter().zip(&b).map(|(&x, &y)| h(x, y)).collect::<Vec<_>>();
    let zu = |h: fn(u32, u32) -> u32| u.iter().zip(&s).map(|(&x, &y)| h(x, y)).collect::<Vec<_>>();
    // Integer results are exact.
    assert_eq!(i(0), zi(i32::wrapping_add));
    assert_eq!(i(1), zi(i32::wrapping_sub));
    assert_eq!(i(2), zi(i32::wrapping_mul));
    assert_eq!(i(3), zi(|x, y| x / y), "division truncates toward zero");
    assert_eq!(i(4), zi(|x, y| x % y), "remainder has the dividend's sign");
    assert_eq!(i(5), zi(i32::max));
    assert_eq!(i(6), zi(i32::min));
    assert_eq!(i(7), a.iter().map(|x| -x).collect::<Vec<_>>());
    assert_eq!(i(8), a.iter().map(|x| x.abs()).collect::<Vec<_>>());
    assert_eq!(i(9), a.iter().map(|x| x >> 1).collect::<Vec<_>>());
    assert_eq!(w(10), zu(u32::wrapping_add));
    assert_eq!(
        w(11),
        u.iter().map(|&x| x.wrapping_mul(x)).collect::<Vec<_>>()
    );
    assert_eq!(w(12), zu(|x, y| x & y));
    assert_eq!(w(13), zu(|x, y| x | y));
    assert_eq!(w(14), zu(|x, y| x ^ y));
    assert_eq!(w(15), u.iter().map(|x| !x).collect::<Vec<_>>());
    assert_eq!(w(16), zu(|x, y| x << y));
    assert_eq!(w(17), zu(|x, y| x >> y));
    assert_eq!(w(18), zu(|x, y| u32::from(x < y)), "unsigned comparison");
}

#[test]
fn constants_are_exact() {
    let c = client(1);
    let mut s: u32 = 99;
    let mut data: Vec<f32> = (0..64)
        .map(|_| {
            s = s.wrapping_mul(1664525).wrapping_add(1013904223);
            f32::from_bits(s & 0xBFFF_FFFF) // avoid NaN payloads: the plugin may canonicalize them
        })
        .collect();
    data[0] = 0.1;
    data[1] = -0.0;
    data[2] = 1e-45;
    let simple: Vec<f32> = (0..6).map(|i| i as f32 * 0.5 - 1.0).collect();
    let bf: Vec<half::bf16> = [1.5f32, -2.25, 3.0e-3, 65504.0]
        .iter()
        .map(|&v| half::bf16::from_f32(v))
        .collect();
    let m = module(|f| {
        Ok(vec![
            f.constant(&[8, 8], &data)?,
            f.constant(&[2, 3], &simple)?,
            f.constant(&[4], &bf)?,
            f.constant(&[3], &[0u32, 0xFFFF_FFFF, 0x1BD1_1BDA])?,
            f.constant(&[2], &[-5i64, 1 << 40])?,
            f.constant(&[3], &[true, false, true])?,
            f.full(0.1f32, &[3])?,
            f.scalar(f32::NAN)?,
            f.scalar_of(DType::F64, 0.1)?,
        ])
    });
    let out = run(&c, &m, &[]);
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(
        bits(&f32s(&out[0])),
        bits(&data),
        "dense f32 constant must be bit-exact"
    );
    assert_eq!(f32s(&out[1]), simple);
    assert_eq!(out[2].to_host::<half::bf16>().unwrap(), bf);
    assert_eq!(
        out[3].to_host::<u32>().unwrap(),
        vec![0, 0xFFFF_FFFF, 0x1BD1_1BDA]
    );
    assert_eq!(out[4].to_host::<i64>().unwrap(), vec![-5, 1 << 40]);
    assert_eq!(out[5].to_host::<bool>().unwrap(), vec![true, false, true]);
    assert_eq!(bits(&f32s(&out[6])), vec![0.1f32.to_bits(); 3]);
    assert!(f32s(&out[7])[0].is_nan());
    assert_eq!(out[8].to_host::<f64>().unwrap(), vec![0.1]);
}

#[test]
fn conversions() {
    let c = client(1);
    let x = vec![1.7f32, -1.7, 0.5, 1e9, -3.0, 2.5];
    let bx = c.buffer_from_host(&x, &[6], 0).unwrap();
    let m = module(|f| {
        let a = f.arg("a", TensorType::f32(&[6]))?;
        Ok(vec![
            a.convert(DType::I32)?,
            a.convert(DType::I32)?.convert(DType::F32)?,
            a.convert(DType::BF16)?,
            a.bitcast_convert(DType::U32)?,
            a.bitcast_convert(DType::U32)?
                .shift_right_logical(&f.scalar(9u32)?)?
                .or(&f.scalar(0x3F80_0000u32)?)?
                .bitcast_convert(DType::F32)?,
        ])
    });
    let out = run(&c, &m, &[&bx]);
    assert_eq!(
        out[0].to_host::<i32>().unwrap(),
        x.iter().map(|&v| v as i32).collect::<Vec<_>>(),
        "f32 -> i32 truncates"
    );
    assert_eq!(
        f32s(&out[1]),
        x.iter().map(|&v| v as i32 as f32).collect::<Vec<_>>()
    );
    assert_eq!(
        out[2].to_host::<half::bf16>().unwrap(),
        x.iter()
            .map(|&v| half::bf16::from_f32(v))
            .collect::<Vec<_>>(),
        "round to nearest even"
    );
    assert_eq!(
        out[3].to_host::<u32>().unwrap(),
        x.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    );
    let mant: Vec<f32> = x
        .iter()
        .map(|v| f32::from_bits((v.to_bits() >> 9) | 0x3F80_0000))
        .collect();
    assert_eq!(f32s(&out[4]), mant);
}

#[test]
fn shape_ops() {
    let c = client(1);
    let x: Vec<f32> = (0..24).map(|i| i as f32).collect();
    let bx = c.buffer_from_host(&x, &[4, 6], 0).unwrap();
    let bi = c.buffer_from_host(&[2i32], &[], 0).unwrap();
    let m = module(|f| {
        let a = f.arg("a", TensorType::f32(&[4, 6]))?;
        let i = f.arg("i", TensorType::i32(&[]))?;
        let zero = f.scalar(0i32)?;
        let row = a.slice_in_dim(1, 2, 0)?.reshape(&[6])?;
        Ok(vec![
            row.broadcast_in_dim(&[3, 6], &[1])?,
            a.slice_in_dim(0, 1, 1)?.broadcast_to(&[2, 4, 5])?,
            a.reshape(&[6, 4])?,
            a.transpose(&[1, 0])?,
            a.slice(&[1, 0], &[4, 6], &[2, 3])?,
            a.dynamic_slice(&[&i, &zero], &[2, 3])?,
            a.dynamic_update_slice(&f.full(-1.0f32, &[1, 2])?, &[&i, &i])?,
            f.concatenate(&[&a, &a.slice_in_dim(0, 1, 0)?], 0)?,
            a.pad(&f.scalar(9.0f32)?, &[1, 0], &[0, 2], &[0, 1])?,
            f.iota(TensorType::u32(&[2, 3]), 1)?.convert(DType::F32)?,
        ])
    });
    let out = run(&c, &m, &[&bx, &bi]);
    let at = |r: usize, k: usize| x[r * 6 + k];
    let v = |k: usize| f32s(&out[k]);
    assert_eq!(
        v(0),
        (0..18).map(|j| at(1, j % 6)).collect::<Vec<_>>(),
        "broadcast_in_dim"
    );
    assert_eq!(
        v(1),
        (0..40).map(|j| at(j % 20 / 5, 0)).collect::<Vec<_>>(),
        "broadcast_to"
    );
    assert_eq!(v(2), x, "reshape keeps row-major order");
    assert_eq!(
        v(3),
        (0..24).map(|j| at(j % 4, j / 4)).collect::<Vec<_>>(),
        "transpose"
    );
    assert_eq!(
        v(4),
        vec![at(1, 0), at(1, 3), at(3, 0), at(3, 3)],
        "strided slice"
    );
    assert_eq!(
        v(5),
        vec![at(2, 0), at(2, 1), at(2, 2), at(3, 0), at(3, 1), at(3, 2)],
        "dynamic_slice"
    );
    let mut dus = x.clone();
    dus[2 * 6 + 2] = -1.0;
    dus[2 * 6 + 3] = -1.0;
    assert_eq!(v(6), dus, "dynamic_update_slice");
    let mut cat = x.clone();
    cat.extend_from_slice(&x[..6]);
    assert_eq!(v(7), cat, "concatenate");
    // pad: one row of 9s on top; each row: values interleaved with 9 (interior 1), then 2 high.
    let p = v(8);
    assert_eq!(p.len(), 5 * 13);
    assert!(p[..13].iter().all(|&e| e == 9.0));
    let r1: Vec<f32> = (0..13)
        .map(|j| {
            if j < 11 && j % 2 == 0 {
                at(0, j / 2)
            } else {
                9.0
            }
        })
        .collect();
    assert_eq!(&p[13..26], r1.as_slice(), "pad");
    assert_eq!(v(9), vec![0.0, 1.0, 2.0, 0.0, 1.0, 2.0], "iota");
}

#[test]
fn contractions() {
    let c = client(1);
    let a: Vec<f32> = (0..2 * 3 * 4).map(|i| (i as f32 * 0.37).sin()).collect();
    let b: Vec<f32> = (0..2 * 4 * 5).map(|i| (i as f32 * 0.11).cos()).collect();
    let w: Vec<f32> = (0..5 * 4).map(|i| i as f32 * 0.1 - 1.0).collect();
    let ba = c.buffer_from_host(&a, &[2, 3, 4], 0).unwrap();
    let bb = c.buffer_from_host(&b, &[2, 4, 5], 0).unwrap();
    let bw = c.buffer_from_host(&w, &[5, 4], 0).unwrap();
    let m = module(|f| {
        let a = f.arg("a", TensorType::f32(&[2, 3, 4]))?;
        let b = f.arg("b", TensorType::f32(&[2, 4, 5]))?;
        let w = f.arg("w", TensorType::f32(&[5, 4]))?;
        let dims = DotDims {
            lhs_batch: vec![0],
            rhs_batch: vec![0],
            lhs_contract: vec![2],
            rhs_contract: vec![1],
        };
        Ok(vec![
            a.dot_general(&b, &dims)?,
            a.matmul(&b)?,
            a.matmul_nt(&w)?,
            a.matmul(&w.transpose(&[1, 0])?)?,
        ])
    });
    let out = run(&c, &m, &[&ba, &bb, &bw]);
    let mut bmm = vec![0f32; 2 * 3 * 5];
    let mut nt = vec![0f32; 2 * 3 * 5];
    for n in 0..2 {
        for i in 0..3 {
            for j in 0..5 {
                let (mut s, mut t) = (0f64, 0f64);
                for k in 0..4 {
                    s += a[n * 12 + i * 4 + k] as f64 * b[n * 20 + k * 5 + j] as f64;
                    t += a[n * 12 + i * 4 + k] as f64 * w[j * 4 + k] as f64;
                }
                bmm[n * 15 + i * 5 + j] = s as f32;
                nt[n * 15 + i * 5 + j] = t as f32;
            }
        }
    }
    // 4-term f32 dot products against an f64 reference: 1e-5 absolute.
    assert_close("dot_general batched", &f32s(&out[0]), &bmm, 1e-5, 0.0);
    assert_close("matmul batched", &f32s(&out[1]), &bmm, 1e-5, 0.0);
    assert_close("matmul_nt", &f32s(&out[2]), &nt, 1e-5, 0.0);
    assert_close("matmul rank-2 rhs", &f32s(&out[3]), &nt, 1e-5, 0.0);
}

#[test]
fn reductions_and_argmax() {
    let c = client(1);
    let x = vec![
        1.0f32,
        5.0,
        5.0,
        -2.0,
        /* */ f32::NAN,
        0.0,
        3.0,
        1.0,
        /* */ -1.0,
        -3.0,
        -0.5,
        -0.5,
    ];
    let bx = c.buffer_from_host(&x, &[3, 4], 0).unwrap();
    let bi = c
        .buffer_from_host(&[3i32, -9, 7, 2, 7, 7], &[2, 3], 0)
        .unwrap();
    let m = module(|f| {
        let a = f.arg("a", TensorType::f32(&[3, 4]))?;
        let i = f.arg("i", TensorType::i32(&[2, 3]))?;
        let finite = a.slice_in_dim(0, 1, 0)?;
        Ok(vec![
            a.argmax(1)?,
            i.argmax(1)?,
            finite.reduce_sum(&[0, 1])?,
            a.reduce_max(&[1])?,
            a.slice_in_dim(2, 3, 0)?.reduce_min(&[1])?,
            i.reduce_min(&[0])?,
            i.reduce_max(&[1])?,
            finite.reduce_mean(&[1])?,
        ])
    });
    let out = run(&c, &m, &[&bx, &bi]);
    // jnp.argmax semantics: NaN wins, ties pick the first index.
    assert_eq!(out[0].to_host::<i32>().unwrap(), vec![1, 0, 2]);
    assert_eq!(out[1].to_host::<i32>().unwrap(), vec![2, 1]);
    assert_eq!(f32s(&out[2]), vec![9.0]);
    let mx = f32s(&out[3]);
    assert_eq!(mx[0], 5.0);
    assert!(mx[1].is_nan(), "max propagates NaN");
    assert_eq!(mx[2], -0.5);
    assert_eq!(f32s(&out[4]), vec![-3.0]);
    assert_eq!(out[5].to_host::<i32>().unwrap(), vec![2, -9, 7]);
    assert_eq!(out[6].to_host::<i32>().unwrap(), vec![7, 7]);
    assert_eq!(f32s(&out[7]), vec![2.25]);
}

#[test]
fn sort_gather_scatter() {
    let c = client(1);
    let keys = vec![3.0f32, -1.0, 2.0, -1.0, f32::NAN, 0.0, -0.0, 7.0];
    let bk = c.buffer_from_host(&keys, &[8], 0).unwrap();
    let table: Vec<f32> = (0..15).map(|i| i as f32).collect();
    let bt = c.buffer_from_host(&table, &[5, 3], 0).unwrap();
    let ids = vec![4i32, 0, 4, 2];
    let bids = c.buffer_from_host(&ids, &[2, 2], 0).unwrap();
    let m = module(|f| {
        let k = f.arg("k", TensorType::f32(&[8]))?;
        let t = f.arg("t", TensorType::f32(&[5, 3]))?;
        let ids = f.arg("ids", TensorType::i32(&[2, 2]))?;
        let pos = f.iota(TensorType::i32(&[8]), 0)?;
        let sorted = f.sort_ascending(&[&k, &pos], 0)?;
        // Descending by a custom comparator on the payload.
        let desc = f.sort(&[&pos], 0, true, |a| a[0].gt(&a[1]))?;
        // Ranks: scatter positions back through the sort permutation.
        let ranks = f
            .full(0i32, &[8])?
            .reshape(&[8, 1])?
            .scatter_rows(&sorted[1], &pos.reshape(&[8, 1])?)?
            .reshape(&[8])?;
        let rows = t.take_rows(&ids)?;
        let flat = t.take_rows(&ids.reshape(&[4])?)?;
        let added =
            t.scatter_add_rows(&f.constant(&[2], &[1i32, 1])?, &f.full(10.0f32, &[2, 3])?)?;
        Ok(vec![
            sorted[0].clone(),
            sorted[1].clone(),
            desc[0].clone(),
            ranks,
            rows,
            flat,
            added,
            t.transpose(&[1, 0])?.take_cols(&ids)?,
        ])
    });
    let out = run(&c, &m, &[&bk, &bt, &bids]);
    let sk = f32s(&out[0]);
    // Stable, -0.0 == 0.0, NaN last: [-1(1), -1(3), 0.0(5), -0.0(6), 2, 3, 7, NaN].
    assert_eq!(
        out[1].to_host::<i32>().unwrap(),
        vec![1, 3, 5, 6, 2, 0, 7, 4]
    );
    assert_eq!(&sk[..7], &[-1.0, -1.0, 0.0, -0.0, 2.0, 3.0, 7.0]);
    assert!(sk[7].is_nan());
    assert_eq!(
        out[2].to_host::<i32>().unwrap(),
        vec![7, 6, 5, 4, 3, 2, 1, 0]
    );
    assert_eq!(
        out[3].to_host::<i32>().unwrap(),
        vec![5, 0, 4, 1, 7, 2, 3, 6],
        "rank of each element"
    );
    let want_rows: Vec<f32> = ids
        .iter()
        .flat_map(|&i| table[i as usize * 3..i as usize * 3 + 3].to_vec())
        .collect();
    assert_eq!(f32s(&out[4]), want_rows, "take_rows with [2,2] ids");
    assert_eq!(f32s(&out[5]), want_rows, "take_rows with [4] ids");
    assert_eq!(
        f32s(&out[7]),
        want_rows,
        "take_cols of the transposed table"
    );
    let mut added = table.clone();
    for e in &mut added[3..6] {
        *e += 20.0;
    }
    assert_eq!(
        f32s(&out[6]),
        added,
        "scatter_add_rows accumulates duplicates"
    );
}

#[test]
fn while_call_and_barrier() {
    let c = client(1);
    let x = vec![1.0f32, -2.0, 0.5];
    let bx = c.buffer_from_host(&x, &[3], 0).unwrap();
    let mut m = Module::new("ctl");
    let h = m.func("affine");
    let a = h.arg("a", TensorType::f32(&[3])).unwrap();
    let s = h.arg("s", TensorType::f32(&[])).unwrap();
    h.output(&a.mul(&s).unwrap().add(&a.const_like(1.0).unwrap()).unwrap())
        .unwrap();
    let affine = m.add(h.finish().unwrap()).unwrap();
    let f = m.func("main");
    let build = || -> Result<Vec<Value>> {
        let x = f.arg("x", TensorType::f32(&[3]))?;
        let half = f.scalar(0.5f32)?;
        // carry_{i+1} = affine(carry_i, 0.5) + i, for i in 0..5 (captures `half` and calls).
        let looped = f.fori_loop(0, 5, &[&x], |i, carry| {
            let y = f.call(&affine, &[&carry[0], &half])?.remove(0);
            Ok(vec![y.add(&i.convert(DType::F32)?)?])
        })?;
        // Plain while: double until the sum exceeds 100.
        let grown = f.while_loop(
            &[&x.abs()?],
            |c| c[0].reduce_sum(&[0])?.lt(&c[0].const_like(100.0)?),
            |c| Ok(vec![c[0].mul(&c[0].const_like(2.0)?)?]),
        )?;
        let barrier = f.optimization_barrier(&[&x])?;
        Ok(vec![
            looped[0].clone(),
            grown[0].clone(),
            barrier[0].clone(),
        ])
    };
    for o in build().unwrap() {
        f.output(&o).unwrap();
    }
    m.add(f.finish().unwrap()).unwrap();
    let out = run(&c, &m, &[&bx]);
    let want: Vec<f32> = x
        .iter()
        .map(|&v| {
            let mut y = v;
            for i in 0..5 {
                y = y * 0.5 + 1.0 + i as f32;
            }
            y
        })
        .collect();
    assert_eq!(f32s(&out[0]), want, "all steps are exact in f32");
    let mut g: Vec<f32> = x.iter().map(|v| v.abs()).collect();
    while g.iter().sum::<f32>() < 100.0 {
        g.iter_mut().for_each(|v| *v *= 2.0);
    }
    assert_eq!(f32s(&out[1]), g);
    assert_eq!(f32s(&out[2]), x);
}

/// The sharded test program over a mesh of `d` devices: a sharded matmul with a sharding
/// constraint, a manual computation with all_reduce / all_gather / partition_id, and sorted
/// ranks of the row sums.
fn sharded_module(d: i64) -> Module {
    let mut m = Module::with_mesh("sharded", Mesh::pop(d).unwrap());
    let f = m.func("main");
    let rows = Sharding::split(2, 0).unwrap();
    let build = || -> Result<Vec<(Value, Sharding)>> {
        let x = f.arg_sharded("x", TensorType::f32(&[64, 16]), &rows)?;
        let w = f.arg_sharded("w", TensorType::f32(&[8, 16]), &Sharding::replicated(2))?;
        let h = x.matmul_nt(&w)?.tanh()?.shard(&rows)?.named("h");
        let outs = f.manual_computation(
            &[&h],
            std::slice::from_ref(&rows),
            &[
                Sharding::replicated(1),
                rows.clone(),
                Sharding::split(1, 0)?,
            ],
            |l| {
                let colsum = l[0].reduce_sum(&[0])?.all_reduce_sum()?;
                let all = l[0].all_gather(0)?; // [64, 8] on every device
                let n = l[0].shape()[0];
                let g = l[0].func();
                let pid = g.partition_id()?.convert(DType::I32)?;
                let start = pid.mul(&g.scalar(n as i32)?)?;
                let mine = all.dynamic_slice(&[&start, &g.scalar(0i32)?], &[n, 8])?;
                let again = mine.sub(&l[0])?.abs()?.reduce_max(&[0, 1])?.reshape(&[1])?;
                Ok(vec![colsum, mine, again])
            },
        )?;
        let rowsum = outs[1].reduce_sum(&[1])?;
        let pos = f.iota(TensorType::i32(&[64]), 0)?;
        let order = f.sort_ascending(&[&rowsum, &pos], 0)?;
        Ok(vec![
            (outs[0].clone(), Sharding::replicated(1)),
            (outs[1].clone(), rows.clone()),
            (outs[2].clone(), Sharding::split(1, 0)?),
            (order[1].clone(), Sharding::replicated(1)),
        ])
    };
    for (v, s) in build().unwrap() {
        f.output_sharded(&v, &s).unwrap();
    }
    m.add(f.finish().unwrap()).unwrap();
    m
}

fn run_sharded(d: usize) -> (Vec<f32>, Vec<f32>, Vec<f32>, Vec<i32>) {
    let c = client(d);
    let x: Vec<f32> = (0..64 * 16)
        .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
        .collect();
    let w: Vec<f32> = (0..8 * 16)
        .map(|i| ((i * 31) % 17) as f32 / 17.0 - 0.5)
        .collect();
    let m = sharded_module(d as i64);
    let exe = c
        .compile(&m.to_mlir(), &CompileOptions::new(d))
        .expect("compile sharded");
    let xs = c.scatter_rows(&x, &[64, 16]).unwrap();
    let ws = c.replicate(&w, &[8, 16]).unwrap();
    let args: Vec<Vec<&Buffer>> = xs.iter().zip(&ws).map(|(a, b)| vec![a, b]).collect();
    let mut outs = exe.execute(&args).expect("execute sharded");
    assert_eq!(outs.len(), d);
    let col = f32s(&outs[0][0]);
    for o in &outs {
        assert_eq!(f32s(&o[0]), col, "replicated output equal on every device");
    }
    let order = outs[0][3].to_host::<i32>().unwrap();
    let mut h = Vec::new();
    let mut again = Vec::new();
    for o in &mut outs {
        again.extend(f32s(&o[2]));
        h.push(o.remove(1));
    }
    let h = gather_rows::<f32>(&h).unwrap();
    // Host reference for h = tanh(x wᵀ) and its column sums (f64 accumulation).
    let mut href = vec![0f32; 64 * 8];
    for r in 0..64 {
        for j in 0..8 {
            let s: f64 = (0..16)
                .map(|k| x[r * 16 + k] as f64 * w[j * 16 + k] as f64)
                .sum();
            href[r * 8 + j] = (s as f32).tanh();
        }
    }
    // 16-term dot + tanh in f32: 1e-5 absolute; column sums of 64 such values: 1e-4.
    assert_close("h", &h, &href, 1e-5, 0.0);
    let cref: Vec<f32> = (0..8)
        .map(|j| (0..64).map(|r| href[r * 8 + j] as f64).sum::<f64>() as f32)
        .collect();
    assert_close("colsum", &col, &cref, 1e-4, 0.0);
    (col, h, again, order)
}

#[test]
fn sharded_program_is_device_count_invariant() {
    let (c1, h1, a1, o1) = run_sharded(1);
    let (c8, h8, a8, o8) = run_sharded(8);
    // Same program on 1 and 8 devices: per-element results agree to 1e-6 (reassociated sums).
    assert_close("h 1 vs 8", &h8, &h1, 1e-6, 0.0);
    assert_close("colsum 1 vs 8", &c8, &c1, 1e-5, 0.0);
    // all_gather + dynamic_slice at partition_id gives back each device's own block exactly.
    assert_eq!(a1, vec![0.0]);
    assert_eq!(a8, vec![0.0; 8]);
    assert_eq!(o1, o8, "sort order of row sums");
    let mut sorted = o1.clone();
    sorted.sort();
    assert_eq!(
        sorted,
        (0..64).collect::<Vec<_>>(),
        "order is a permutation"
    );
}
