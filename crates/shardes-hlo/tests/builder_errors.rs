//! Build-time checks: every misuse returns a typed `HloError` naming the op and the operand
//! types (never a panic). One test per error kind.

use shardes_hlo::builder::{
    Cmp, DType, DotDims, Func, HloError, Mesh, Module, Sharding, TensorType,
};

fn f32s(shape: &[i64]) -> TensorType {
    TensorType::f32(shape)
}

/// Checks that the message of `e` (an error or its text) says each of `parts`.
fn says(e: &impl std::fmt::Display, parts: &[&str]) {
    let msg = e.to_string();
    for part in parts {
        assert!(msg.contains(part), "{msg}");
    }
}

#[test]
fn dtype_mismatch_names_op_and_types() {
    let f = Func::new("main");
    let a = f.arg("a", f32s(&[4])).unwrap();
    let b = f.arg("b", TensorType::i32(&[4])).unwrap();
    let e = a.add(&b).unwrap_err();
    assert!(matches!(e, HloError::DTypeMismatch { .. }), "{e:?}");
    let msg = e.to_string();
    assert!(msg.contains("`add`"), "{msg}");
    says(&msg, &["tensor<4xf32>", "tensor<4xi32>"]);
    assert!(
        msg.contains("convert"),
        "message should suggest the fix: {msg}"
    );
    // Wrong kind: exp of an integer.
    let e = b.exp().unwrap_err();
    assert!(matches!(e, HloError::DTypeMismatch { .. }), "{e:?}");
    assert!(e.to_string().contains("`exp`") && e.to_string().contains("tensor<4xi32>"));
    // Bitcast across widths.
    let e = a.bitcast_convert(DType::F16).unwrap_err();
    says(&e, &["bitcast_convert", "32 bits"]);
}

#[test]
fn shape_mismatch_names_op_and_shapes() {
    let f = Func::new("main");
    let a = f.arg("a", f32s(&[4, 3])).unwrap();
    let b = f.arg("b", f32s(&[5])).unwrap();
    let e = a.mul(&b).unwrap_err();
    assert!(matches!(e, HloError::ShapeMismatch { .. }), "{e:?}");
    let msg = e.to_string();
    says(&msg, &["`mul`", "tensor<4x3xf32>", "tensor<5xf32>"]);
    // Contracting sizes differ.
    let w = f.arg("w", f32s(&[5, 4])).unwrap();
    let e = a.matmul(&w).unwrap_err();
    assert!(matches!(e, HloError::ShapeMismatch { .. }), "{e:?}");
    says(&e, &["dot_general", "size 3", "size 5"]);
    // Reshape element count.
    let e = a.reshape(&[5, 2]).unwrap_err();
    says(&e, &["reshape", "12 elements"]);
}

#[test]
fn invalid_attribute_names_op() {
    let f = Func::new("main");
    let a = f.arg("a", f32s(&[4, 3])).unwrap();
    let e = a.transpose(&[0, 0]).unwrap_err();
    assert!(matches!(e, HloError::InvalidAttribute { .. }), "{e:?}");
    says(&e, &["transpose", "tensor<4x3xf32>"]);
    let e = a.reduce_sum(&[2]).unwrap_err();
    assert!(matches!(e, HloError::InvalidAttribute { .. }), "{e:?}");
    says(&e, &["reduce_sum", "out of range"]);
    let e = a.slice(&[0, 0], &[5, 3], &[1, 1]).unwrap_err();
    says(&e, &["slice", "limit (5)"]);
    let dims = DotDims {
        lhs_contract: vec![1],
        rhs_contract: vec![],
        ..Default::default()
    };
    let e = a.dot_general(&a, &dims).unwrap_err();
    assert!(matches!(e, HloError::InvalidAttribute { .. }), "{e:?}");
}

#[test]
fn foreign_value_is_an_error() {
    let f = Func::new("main");
    let g = Func::new("other");
    let a = f.arg("a", f32s(&[4])).unwrap();
    let b = g.arg("b", f32s(&[4])).unwrap();
    let e = a.add(&b).unwrap_err();
    assert!(matches!(e, HloError::ForeignValue { .. }), "{e:?}");
    let msg = e.to_string();
    says(&msg, &["`other`", "`main`", "%b"]);
}

#[test]
fn values_of_closed_or_isolated_regions_are_out_of_scope() {
    let f = Func::new("main");
    let x = f.arg("x", f32s(&[4])).unwrap();
    let outer = f.scalar(1.0f32).unwrap();
    // Isolated: a reduce body may not capture `outer`.
    let e = f
        .reduce(&[&x], &[&outer], &[0], |a| {
            Ok(vec![a[0].add(&a[1])?.add(&outer)?])
        })
        .unwrap_err();
    assert!(matches!(e, HloError::OutOfScope { .. }), "{e:?}");
    assert!(e.to_string().contains("isolated"), "{e}");
    // Leaking a value out of a closed while body.
    let mut leaked = None;
    f.while_loop(
        &[&x],
        |c| c[0].reduce_sum(&[0])?.lt(&c[0].const_like(0.0)?),
        |c| {
            let y = c[0].add(&outer)?; // while bodies may capture
            leaked = Some(y.clone());
            Ok(vec![y])
        },
    )
    .unwrap();
    let e = x.add(&leaked.unwrap()).unwrap_err();
    assert!(matches!(e, HloError::OutOfScope { .. }), "{e:?}");
    assert!(e.to_string().contains("closed"), "{e}");
}

#[test]
fn region_results_are_checked() {
    let f = Func::new("main");
    let x = f.arg("x", f32s(&[4])).unwrap();
    let e = f
        .while_loop(&[&x], |c| c[0].reduce_sum(&[0]), |c| Ok(vec![c[0].clone()]))
        .unwrap_err();
    assert!(matches!(e, HloError::RegionResult { .. }), "{e:?}");
    says(&e, &["while (cond)", "tensor<i1>"]);
    let e = f
        .while_loop(
            &[&x],
            |c| c[0].reduce_sum(&[0])?.lt(&c[0].const_like(1.0)?),
            |c| Ok(vec![c[0].reduce_sum(&[0])?]),
        )
        .unwrap_err();
    says(&e, &["while (body)", "tensor<4xf32>"]);
}

#[test]
fn sharding_errors_say_what_to_change() {
    let m = Module::with_mesh("m", Mesh::pop(8).unwrap());
    let f = m.func("main");
    let e = f
        .arg_sharded("x", f32s(&[12, 4]), &Sharding::split(2, 0).unwrap())
        .unwrap_err();
    assert!(matches!(e, HloError::Sharding { .. }), "{e:?}");
    says(&e, &["12", "8 devices"]);
    assert!(Sharding::split(2, 2).is_err());
    let x = f.arg("x", f32s(&[16])).unwrap();
    let e = x.all_reduce_sum().unwrap_err();
    assert!(e.to_string().contains("manual_computation"), "{e}");
    let nomesh = Func::new("main");
    let y = nomesh.arg("y", f32s(&[16])).unwrap();
    let e = y.shard(&Sharding::replicated(1)).unwrap_err();
    assert!(e.to_string().contains("no mesh"), "{e}");
}

#[test]
fn function_errors() {
    let mut m = Module::new("m");
    let h = m.func("helper");
    let a = h.arg("a", f32s(&[2])).unwrap();
    h.output(&a).unwrap();
    let hf = h.finish().unwrap();
    let callee = hf.callee();
    // Finished functions refuse new ops.
    let e = a.neg().unwrap_err();
    assert!(matches!(e, HloError::Function { .. }), "{e:?}");
    // Calling a function that is not in the module yet.
    let f = m.func("main");
    let x = f.arg("x", f32s(&[2])).unwrap();
    let r = f.call(&callee, &[&x]).unwrap();
    f.output(&r[0]).unwrap();
    let e = m.add(f.finish().unwrap()).unwrap_err();
    assert!(e.to_string().contains("not in the module"), "{e}");
    m.add(hf.clone()).unwrap();
    let e = m.add(hf).unwrap_err();
    assert!(e.to_string().contains("already in the module"), "{e}");
    // Wrong argument types for a call.
    let g = m.func("g");
    let z = g.arg("z", f32s(&[3])).unwrap();
    let e = g.call(&callee, &[&z]).unwrap_err();
    says(&e, &["@helper", "tensor<3xf32>"]);
}

#[test]
fn constant_errors() {
    let f = Func::new("main");
    let e = f.constant(&[2, 2], &[1.0f32, 2.0, 3.0]).unwrap_err();
    assert!(matches!(e, HloError::Constant { .. }), "{e:?}");
    says(&e, &["tensor<2x2xf32>", "3 elements"]);
    let e = f.scalar_of(DType::I32, 0.5).unwrap_err();
    assert!(e.to_string().contains("not exactly representable"), "{e}");
}

#[test]
fn compare_type_follows_dtype() {
    let mut m = Module::new("m");
    let f = m.func("main");
    let arg = |name: &str, t: TensorType| f.arg(name, t).unwrap();
    let (a, b, c) = (
        arg("a", TensorType::u32(&[2])),
        arg("b", TensorType::i32(&[2])),
        arg("c", f32s(&[2])),
    );
    let r = [
        a.compare(&a, Cmp::Lt).unwrap(),
        b.ge(&b).unwrap(),
        c.ne(&c).unwrap(),
    ];
    for v in &r {
        f.output(v).unwrap();
    }
    m.add(f.finish().unwrap()).unwrap();
    let text = m.to_mlir();
    assert!(text.contains("LT, %a, %a, UNSIGNED"), "{text}");
    assert!(text.contains("GE, %b, %b, SIGNED"), "{text}");
    assert!(text.contains("NE, %c, %c, FLOAT"), "{text}");
    assert!(a.compare_typed(&a, Cmp::Lt, "FLOAT").is_err());
}

#[test]
fn broadcasting_is_numpy_style() {
    let f = Func::new("main");
    let a = f.arg("a", f32s(&[4, 3])).unwrap();
    let b = f.arg("b", f32s(&[3])).unwrap();
    let c = f.arg("c", f32s(&[4, 1])).unwrap();
    assert_eq!(a.add(&b).unwrap().shape(), &[4, 3]);
    assert_eq!(b.add(&c).unwrap().shape(), &[4, 3]);
    assert_eq!(a.mul(&a.const_like(2.0).unwrap()).unwrap().shape(), &[4, 3]);
}

/// A caller's own error type, as the ES layer has one.
#[derive(Debug, PartialEq)]
enum CallerError {
    Hlo(HloError),
    Own(&'static str),
}

impl From<HloError> for CallerError {
    fn from(e: HloError) -> Self {
        CallerError::Hlo(e)
    }
}

#[test]
fn region_closures_return_the_callers_own_error() {
    let mut m = Module::with_mesh("m", Mesh::pop(4).unwrap());
    let f = m.func("main");
    let rows = Sharding::split(1, 0).unwrap();
    let x = f.arg_sharded("x", f32s(&[8]), &rows).unwrap();
    let mut leaked = Vec::new();
    // The body's own error comes out of fori_loop unchanged, after ops were built with `?`.
    let e = f
        .fori_loop(0, 3, &[&x], |i, c| {
            leaked.push(c[0].add(&i.convert(DType::F32)?)?);
            Err(CallerError::Own("loop body"))
        })
        .unwrap_err();
    assert_eq!(e, CallerError::Own("loop body"));
    // A builder error inside the region converts into the caller's type.
    let e = f
        .fori_loop(0, 3, &[&x], |_, c| Ok(vec![c[0].reduce_sum(&[1])?]))
        .unwrap_err();
    assert!(
        matches!(e, CallerError::Hlo(HloError::InvalidAttribute { .. })),
        "{e:?}"
    );
    // The same for manual_computation.
    let e = f
        .manual_computation(
            &[&x],
            std::slice::from_ref(&rows),
            &[Sharding::replicated(1)],
            |l| {
                leaked.push(l[0].all_reduce_sum()?);
                Err(CallerError::Own("manual body"))
            },
        )
        .unwrap_err();
    assert_eq!(e, CallerError::Own("manual body"));
    // The function stays usable: values of the failed regions are out of scope, a manual
    // computation is not taken as nested in the failed one, and the function finishes
    // (no region left open) and prints without the failed ops.
    for v in &leaked {
        let e = v.neg().unwrap_err();
        assert!(matches!(e, HloError::OutOfScope { .. }), "{e:?}");
        assert!(e.to_string().contains("closed"), "{e}");
    }
    let y = f
        .manual_computation(
            &[&x.neg().unwrap()],
            std::slice::from_ref(&rows),
            &[Sharding::replicated(1)],
            |l| -> Result<_, CallerError> { Ok(vec![l[0].all_reduce_sum()?]) },
        )
        .unwrap();
    f.output(&y[0]).unwrap();
    m.add(f.finish().unwrap()).unwrap();
    let text = m.to_mlir();
    assert!(!text.contains("stablehlo.while"), "{text}");
    assert_eq!(text.matches("sdy.manual_computation").count(), 1, "{text}");
    assert_eq!(text.matches("stablehlo.all_reduce").count(), 1, "{text}");
    // A one-device manual computation (printed inline) passes the error through as well.
    let mut one = Module::with_mesh("one", Mesh::pop(1).unwrap());
    let g = one.func("main");
    let z = g.arg("z", f32s(&[4])).unwrap();
    let e = g
        .manual_computation(
            &[&z],
            &[Sharding::replicated(1)],
            &[Sharding::replicated(1)],
            |l| {
                l[0].neg()?;
                Err(CallerError::Own("inline body"))
            },
        )
        .unwrap_err();
    assert_eq!(e, CallerError::Own("inline body"));
    g.output(&z.abs().unwrap()).unwrap();
    one.add(g.finish().unwrap()).unwrap();
    assert!(!one.to_mlir().contains("negate"), "{}", one.to_mlir());
    // while_loop, reduce and sort take the caller's error type too.
    let h = Func::new("h");
    let v = h.arg("v", f32s(&[4])).unwrap();
    let e = h
        .while_loop(
            &[&v],
            |_| Err(CallerError::Own("cond")),
            |c| Ok(vec![c[0].clone()]),
        )
        .unwrap_err();
    assert_eq!(e, CallerError::Own("cond"));
    let zero = h.scalar(0.0f32).unwrap();
    let e = h
        .reduce(&[&v], &[&zero], &[0], |_| Err(CallerError::Own("reduce")))
        .unwrap_err();
    assert_eq!(e, CallerError::Own("reduce"));
    let e = h
        .sort(&[&v], 0, true, |_| Err(CallerError::Own("sort")))
        .unwrap_err();
    assert_eq!(e, CallerError::Own("sort"));
    h.output(&v.reduce_sum(&[0]).unwrap()).unwrap();
    h.finish().unwrap();
}
