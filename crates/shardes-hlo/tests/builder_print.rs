//! Printer tests: determinism, snapshots of representative modules, constant exactness,
//! naming and `value_types` inspection.

use shardes_hlo::builder::{DType, Func, Mesh, Module, Result, Sharding, TensorType};

/// A sharded program: row-sharded input, replicated weights, a sharding constraint, a
/// reduction and an argmax (multi-operand reduce).
fn sharded_module() -> Result<Module> {
    let mut m = Module::with_mesh("sharded", Mesh::pop(8)?);
    let f = m.func("main");
    let x = f.arg_sharded("x", TensorType::f32(&[16, 4]), &Sharding::split(2, 0)?)?;
    let w = f.arg_sharded("w", TensorType::f32(&[8, 4]), &Sharding::replicated(2))?;
    let logits = x
        .matmul_nt(&w)?
        .shard(&Sharding::split(2, 0)?)?
        .named("logits");
    let s = logits.tanh()?.reduce_sum(&[1])?.named("total");
    let a = logits.argmax(1)?.named("best");
    f.output_sharded(&s, &Sharding::split(1, 0)?)?;
    f.output_sharded(&a, &Sharding::split(1, 0)?)?;
    m.add(f.finish()?)?;
    Ok(m)
}

/// A `while` loop with a carried tuple and a captured outer constant.
fn while_module() -> Result<Module> {
    let mut m = Module::new("loop");
    let f = m.func("main");
    let x = f.arg("x", TensorType::f32(&[4, 2]))?;
    let c = f.scalar(0.5f32)?.named("half");
    let out = f.fori_loop(0, 3, &[&x], |i, carry| {
        let fi = i.convert(DType::F32)?;
        Ok(vec![carry[0].mul(&c)?.add(&fi)?.named("next")])
    })?;
    f.output(&out[0])?;
    m.add(f.finish()?)?;
    Ok(m)
}

/// A manual computation (shard_map) with an all-reduce, an all-gather and a helper call.
fn manual_module() -> Result<Module> {
    let mut m = Module::with_mesh("manual", Mesh::pop(4)?);
    let h = m.func("square");
    let a = h.arg("a", TensorType::f32(&[3]))?;
    h.output(&a.mul(&a)?)?;
    let square = m.add(h.finish()?)?;
    let f = m.func("main");
    let x = f.arg_sharded("x", TensorType::f32(&[8, 3]), &Sharding::split(2, 0)?)?;
    let outs = f.manual_computation(
        &[&x],
        &[Sharding::split(2, 0)?],
        &[Sharding::replicated(1), Sharding::split(2, 0)?],
        |local| {
            let part = local[0].reduce_sum(&[0])?.named("partial");
            let total = part.all_reduce_sum()?.named("total");
            let sq = local[0].func().call(&square, &[&total])?.remove(0);
            let g = local[0].all_gather(0)?;
            Ok(vec![sq, g.slice_in_dim(0, 2, 0)?])
        },
    )?;
    f.output_sharded(&outs[0], &Sharding::replicated(1))?;
    f.output_sharded(&outs[1], &Sharding::split(2, 0)?)?;
    m.add(f.finish()?)?;
    Ok(m)
}

#[test]
fn snapshot_sharded() {
    insta::assert_snapshot!(sharded_module().unwrap().to_mlir());
}

#[test]
fn snapshot_while() {
    insta::assert_snapshot!(while_module().unwrap().to_mlir());
}

#[test]
fn snapshot_manual_computation() {
    insta::assert_snapshot!(manual_module().unwrap().to_mlir());
}

#[test]
fn printing_is_deterministic() {
    for build in [sharded_module, while_module, manual_module] {
        let a = build().unwrap().to_mlir();
        let b = build().unwrap().to_mlir();
        assert_eq!(a, b);
        // Printing the same module twice is also stable.
        let m = build().unwrap();
        assert_eq!(m.to_mlir(), m.to_string());
    }
}

#[test]
fn names_are_unique_and_readable() {
    let f = Func::new("main");
    let x = f.arg("x", TensorType::f32(&[2])).unwrap();
    let x2 = f.arg("x", TensorType::f32(&[2])).unwrap();
    let weird = f.arg("my weight#1", TensorType::f32(&[2])).unwrap();
    let y = x.add(&x2).unwrap().named("x");
    assert_eq!(x.name(), "%x");
    assert_eq!(x2.name(), "%x_1");
    assert_eq!(weird.name(), "%my_weight_1");
    assert_eq!(y.name(), "%x_2");
    let digits = f.arg("0abc", TensorType::f32(&[2])).unwrap();
    assert_eq!(digits.name(), "%v_0abc");
}

/// Parses one printed scalar literal (`1.5e0` or `0x3FC00000`) back to f32 bits.
fn parse_f32_literal(lit: &str) -> u32 {
    if let Some(hex) = lit.strip_prefix("0x") {
        u32::from_str_radix(hex, 16).unwrap()
    } else {
        let direct = lit.parse::<f32>().unwrap().to_bits();
        let via64 = (lit.parse::<f64>().unwrap() as f32).to_bits();
        assert_eq!(direct, via64, "literal {lit} is ambiguous between parsers");
        direct
    }
}

#[test]
fn f32_constants_round_trip_exactly() {
    // A deterministic spread of bit patterns: normals, subnormals, extremes, NaN, -0.
    let mut vals: Vec<f32> = vec![
        0.1,
        1.0 / 3.0,
        -0.0,
        f32::MIN_POSITIVE,
        1e-45,
        f32::MAX,
        f32::INFINITY,
        f32::NAN,
        16777217.0,
    ];
    let mut s: u32 = 12345;
    for _ in 0..2000 {
        s = s.wrapping_mul(1664525).wrapping_add(1013904223);
        vals.push(f32::from_bits(s));
    }
    let f = Func::new("main");
    for &v in &vals {
        let c = f.scalar(v).unwrap();
        f.output(&c).unwrap();
    }
    let mut m = Module::new("c");
    m.add(f.finish().unwrap()).unwrap();
    let text = m.to_mlir();
    let lits: Vec<&str> = text
        .lines()
        .filter_map(|l| l.split("dense<").nth(1))
        .map(|r| r.split('>').next().unwrap())
        .collect();
    assert_eq!(lits.len(), vals.len());
    for (lit, v) in lits.iter().zip(&vals) {
        assert_eq!(
            parse_f32_literal(lit),
            v.to_bits(),
            "value {v:e} printed as {lit}"
        );
    }
}

#[test]
fn dense_constants_fall_back_to_exact_hex() {
    let f = Func::new("main");
    let c = f.constant(&[2, 2], &[f32::NAN, 1.0, 2.0, 3.0]).unwrap();
    let d = f.constant(&[2, 2], &[0.5f32, 1.0, 2.0, 3.0]).unwrap();
    f.output(&c).unwrap();
    f.output(&d).unwrap();
    let mut m = Module::new("c");
    m.add(f.finish().unwrap()).unwrap();
    let text = m.to_mlir();
    // NaN forces little-endian hex bytes of the whole array.
    assert!(
        text.contains("dense<\"0x0000C07F0000803F0000004000004040\"> : tensor<2x2xf32>"),
        "{text}"
    );
    assert!(
        text.contains("dense<[[5.0e-1, 1.0e0], [2.0e0, 3.0e0]]> : tensor<2x2xf32>"),
        "{text}"
    );
}

#[test]
fn value_types_include_region_arguments() {
    let mut m = Module::new("m");
    let f = m.func("main");
    let x = f.arg("x", TensorType::f32(&[3, 5])).unwrap();
    let r = f
        .reduce(
            &[&x],
            &[&f.scalar(0.0f32).unwrap()],
            &[0, 1],
            |a| -> Result<_> { Ok(vec![a[0].add(&a[1])?]) },
        )
        .unwrap();
    let w = f
        .while_loop(
            &[&f.full(1u32, &[7, 11]).unwrap()],
            |c| c[0].reduce_max(&[0, 1])?.lt(&c[0].const_like(9.0)?),
            |c| Ok(vec![c[0].add(&c[0].const_like(1.0)?)?]),
        )
        .unwrap();
    f.output(&r[0]).unwrap();
    f.output(&w[0]).unwrap();
    m.add(f.finish().unwrap()).unwrap();
    let tys = m.value_types();
    assert!(tys.contains(&TensorType::f32(&[3, 5])));
    assert!(tys.contains(&TensorType::u32(&[7, 11])));
    // Reduce body block arguments are rank-0 f32; while cond block args are [7, 11] u32.
    assert!(
        tys.iter()
            .filter(|t| **t == TensorType::scalar(DType::F32))
            .count()
            >= 3
    );
    assert!(
        tys.iter()
            .filter(|t| **t == TensorType::u32(&[7, 11]))
            .count()
            >= 4,
        "{tys:?}"
    );
    assert!(!tys.contains(&TensorType::f32(&[5, 3])));
}

#[test]
fn one_device_manual_computation_is_inlined() {
    let mut m = Module::with_mesh("one", Mesh::pop(1).unwrap());
    let f = m.func("main");
    let x = f.arg("x", TensorType::f32(&[4])).unwrap();
    let out = f
        .manual_computation(
            &[&x],
            &[Sharding::split(1, 0).unwrap()],
            &[Sharding::replicated(1)],
            |l| -> Result<_> { Ok(vec![l[0].all_reduce_sum()?.named("summed")]) },
        )
        .unwrap();
    // The returned value is usable outside, like a manual_computation result.
    let y = out[0].neg().unwrap();
    f.output(&y).unwrap();
    m.add(f.finish().unwrap()).unwrap();
    let text = m.to_mlir();
    assert!(!text.contains("sdy.manual_computation"), "{text}");
    assert!(
        text.contains("\"stablehlo.all_reduce\"(%x)"),
        "block argument prints as the input: {text}"
    );
    assert!(text.contains("stablehlo.negate %summed"), "{text}");
}
