use super::*;
use crate::builder::{Mesh, Module};
use crate::es::model::LayerLeaves;

fn layout(kind: ProgramKind, tasks: usize) -> Layout {
    let leaf = |index: usize, path: &str, shape: &[i64]| LeafInfo {
        index,
        path: path.into(),
        shape: shape.to_vec(),
    };
    Layout::new(
        kind,
        vec![leaf(0, "b", &[7]), leaf(1, "w", &[7, 13])],
        vec![
            ("x".into(), TensorType::f32(&[3, 13])),
            ("y".into(), TensorType::i32(&[3])),
        ],
        16,
        tasks,
    )
}

#[test]
fn positions_follow_the_kind() {
    use ProgramKind::*;
    // (kind, batch_arg, fitness_arg, args, generation_result, fitness_result, results)
    for (kind, batch, fit_arg, args, gen, fit, results) in [
        (Generation, Some(4), None, 6, Some(2), Some(3), 4),
        (AskApply, Some(4), None, 6, None, Some(0), 1),
        (Tell, None, Some(4), 5, Some(2), None, 3),
    ] {
        let l = layout(kind, 1);
        assert_eq!((l.key_arg(), l.generation_arg()), (2, 3), "{kind:?}");
        assert_eq!(
            (l.batch_arg(), l.fitness_arg()),
            (batch, fit_arg),
            "{kind:?}"
        );
        assert_eq!(l.arg_count(), args, "{kind:?}");
        assert_eq!(
            (l.generation_result(), l.fitness_result()),
            (gen, fit),
            "{kind:?}"
        );
        assert_eq!(l.result_count(), results, "{kind:?}");
        assert_eq!(l.donates(), kind != AskApply, "{kind:?}");
    }
    assert!(layout(Tell, 1).batch.is_empty(), "tell takes no batch");
    assert_eq!(layout(Generation, 1).fitness_dims(), [16]);
    assert_eq!(layout(Generation, 3).fitness_dims(), [16, 3]);
    assert_eq!(layout(Tell, 3).fitness_type(), TensorType::f32(&[16, 3]));
    assert_eq!(ProgramKind::AskApply.name(), "ask_apply");
}

#[test]
fn host_argument_lists_are_in_layout_order() {
    let l = layout(ProgramKind::Generation, 1);
    let args = l.args(["b", "w"], "key", "gen", ["x", "y"]).unwrap();
    assert_eq!(args, ["b", "w", "key", "gen", "x", "y"]);
    assert_eq!(args[l.key_arg()], "key");
    assert_eq!(args[l.generation_arg()], "gen");
    assert_eq!(l.batch_arg().map(|i| args[i]), Some("x"));
    let t = layout(ProgramKind::Tell, 1);
    let args = t.args(&[10, 11], &12, &13, [&14]).unwrap();
    assert_eq!(args, [&10, &11, &12, &13, &14]);
    assert_eq!(t.fitness_arg().map(|i| *args[i]), Some(14));
}

#[test]
fn a_wrong_argument_count_names_the_list_and_what_it_holds() {
    let l = layout(ProgramKind::AskApply, 1);
    let e = l.args(["b"], "key", "gen", ["x", "y"]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "the ask_apply program's parameter arguments: got 1, its layout has 2 (one per leaf or layer stack)"
    );
    let e = l.args(["b", "w"], "key", "gen", ["x"]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "the ask_apply program's batch arguments: got 1, its layout has 2 (x: \
         tensor<3x13xf32>, y: tensor<3xi32>)"
    );
    let e = layout(ProgramKind::Tell, 2)
        .args(["b", "w"], "key", "gen", [])
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "the tell program's fitness arguments: got 0, its layout has 1 (tensor<16x2xf32>)"
    );
}

#[test]
fn results_split_by_role() {
    let g = layout(ProgramKind::Generation, 1)
        .split_results(vec!["b'", "w'", "gen'", "fit"])
        .unwrap();
    assert_eq!(
        g,
        ProgramResults {
            params: vec!["b'", "w'"],
            generation: Some("gen'"),
            fitness: Some("fit"),
            opt_state: Vec::new(),
        }
    );
    let a = layout(ProgramKind::AskApply, 1)
        .split_results(vec!["fit"])
        .unwrap();
    assert_eq!(
        (a.params.len(), a.generation, a.fitness),
        (0, None, Some("fit"))
    );
    let t = layout(ProgramKind::Tell, 1)
        .split_results(vec!["b'", "w'", "gen'"])
        .unwrap();
    assert_eq!(
        (t.params, t.generation, t.fitness),
        (vec!["b'", "w'"], Some("gen'"), None)
    );
}

#[test]
fn a_wrong_result_count_is_refused() {
    let e = layout(ProgramKind::Generation, 1)
        .split_results(vec![1, 2, 3])
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "the generation program's results: got 3, its layout has 4 (2 parameters + generation \
         + fitness)"
    );
    let e = layout(ProgramKind::Tell, 1)
        .split_results(vec![1, 2, 3, 4])
        .unwrap_err();
    assert!(e
        .to_string()
        .contains("got 4, its layout has 3 (2 parameters + generation)"));
    assert!(layout(ProgramKind::AskApply, 1)
        .split_results(Vec::<u8>::new())
        .is_err());
}

/// The printed signature of a function that declares `l`'s arguments and emits `out`.
fn signature(l: &Layout, out: impl FnOnce(&ProgramArgs<Value>) -> ProgramResults<Value>) -> String {
    let mut m = Module::with_mesh("t", Mesh::pop(2).unwrap());
    let f = m.func("main");
    let args = l.declare(&f).unwrap();
    l.emit(&f, out(&args)).unwrap();
    m.add(f.finish().unwrap()).unwrap();
    let text = m.to_mlir();
    let start = text.find("@main(").unwrap();
    text[start..start + text[start..].find(" {\n").unwrap()].to_string()
}

/// The error `l.emit` gives for the results `out` makes of the declared arguments (on one
/// device), as text.
fn emit_error(
    l: &Layout,
    out: impl FnOnce(&ProgramArgs<Value>) -> ProgramResults<Value>,
) -> String {
    let m = Module::with_mesh("t", Mesh::pop(1).unwrap());
    let f = m.func("main");
    let args = l.declare(&f).unwrap();
    l.emit(&f, out(&args)).unwrap_err().to_string()
}

#[test]
fn declared_arguments_and_emitted_results_follow_the_layout() {
    let g = layout(ProgramKind::Generation, 1);
    let sig = signature(&g, |a| ProgramResults {
        params: a.params.clone(),
        generation: Some(a.generation.clone()),
        fitness: Some(a.batch[0].func().full(0.0f32, &[16]).unwrap()),
        opt_state: Vec::new(),
    });
    let names: Vec<&str> = sig
        .split('%')
        .skip(1)
        .map(|s| &s[..s.find(':').unwrap()])
        .collect();
    assert_eq!(names, ["b", "w", "key", "generation", "x", "y"]);
    // Params into results 0 and 1, the generation into result 2; nothing else donated.
    assert_eq!(sig.matches("tf.aliasing_output").count(), 3, "{sig}");
    assert!(sig.contains("%generation: tensor<ui32> {sdy.sharding = #sdy.sharding<@mesh, []>, tf.aliasing_output = 2 : i32}"), "{sig}");
    assert!(
        sig.ends_with("tensor<16xf32> {sdy.sharding = #sdy.sharding<@mesh, [{\"pop\"}]>})"),
        "{sig}"
    );
    let a = layout(ProgramKind::AskApply, 3);
    let sig = signature(&a, |a| ProgramResults {
        params: Vec::new(),
        generation: None,
        fitness: Some(a.key.func().full(0.0f32, &[16, 3]).unwrap()),
        opt_state: Vec::new(),
    });
    assert!(!sig.contains("tf.aliasing_output"), "{sig}");
    assert!(sig.contains("-> (tensor<16x3xf32>"), "{sig}");
    let t = layout(ProgramKind::Tell, 1);
    let sig = signature(&t, |a| ProgramResults {
        params: a.params.clone(),
        generation: Some(a.generation.clone()),
        fitness: None,
        opt_state: Vec::new(),
    });
    assert!(sig.contains("%generation: tensor<ui32> {sdy.sharding = #sdy.sharding<@mesh, []>, tf.aliasing_output = 2 : i32}, %fitness: tensor<16xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}]>})"), "{sig}");
}

#[test]
fn emitting_a_part_the_kind_lacks_is_refused() {
    let l = layout(ProgramKind::AskApply, 1);
    let e = emit_error(&l, |args| ProgramResults {
        params: Vec::new(),
        generation: Some(args.generation.clone()),
        fitness: None,
        opt_state: Vec::new(),
    });
    assert_eq!(
        e,
        "the ask_apply program's generation results: got 1, its layout has 0 (the next \
         generation)"
    );
}

fn with_state(kind: ProgramKind) -> Layout {
    layout(kind, 1).with_opt_state(vec![
        ("velocity.b".into(), TensorType::f32(&[7])),
        ("velocity.w".into(), TensorType::f32(&[7, 13])),
    ])
}

#[test]
fn optimizer_state_comes_last_where_the_program_donates() {
    use ProgramKind::*;
    // (kind, opt_arg, args, opt_result, results): every other position as without state.
    for (kind, opt_arg, args, opt_result, results) in [
        (Generation, Some(6), 8, Some(4), 6),
        (AskApply, None, 6, None, 1),
        (Tell, Some(5), 7, Some(3), 5),
    ] {
        let l = with_state(kind);
        let plain = layout(kind, 1);
        assert_eq!((l.opt_arg(), l.arg_count()), (opt_arg, args), "{kind:?}");
        assert_eq!(
            (l.opt_result(), l.result_count()),
            (opt_result, results),
            "{kind:?}"
        );
        assert_eq!(
            (
                l.key_arg(),
                l.generation_arg(),
                l.batch_arg(),
                l.fitness_arg()
            ),
            (
                plain.key_arg(),
                plain.generation_arg(),
                plain.batch_arg(),
                plain.fitness_arg()
            )
        );
        assert_eq!(
            (l.generation_result(), l.fitness_result()),
            (plain.generation_result(), plain.fitness_result())
        );
    }
    let g = with_state(Generation);
    let args = g
        .args_with_state(["b", "w"], "key", "gen", ["x", "y"], ["vb", "vw"])
        .unwrap();
    assert_eq!(args, ["b", "w", "key", "gen", "x", "y", "vb", "vw"]);
    let e = g.args(["b", "w"], "key", "gen", ["x", "y"]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "the generation program's optimizer state arguments: got 0, its layout has 2 \
         (velocity.b: tensor<7xf32>, velocity.w: tensor<7x13xf32>)"
    );
    let r = g
        .split_results(vec!["b'", "w'", "gen'", "fit", "vb'", "vw'"])
        .unwrap();
    assert_eq!(
        (r.params, r.generation, r.fitness, r.opt_state),
        (
            vec!["b'", "w'"],
            Some("gen'"),
            Some("fit"),
            vec!["vb'", "vw'"]
        )
    );
    let e = g.split_results(vec![1, 2, 3, 4]).unwrap_err();
    assert!(
        e.to_string()
            .contains("(2 parameters + generation + fitness + 2 optimizer state)"),
        "{e}"
    );
    // ask_apply neither takes nor returns it.
    let a = with_state(AskApply);
    assert_eq!(
        a.args(["b", "w"], "key", "gen", ["x", "y"]).unwrap().len(),
        6
    );
    assert!(a.split_results(vec!["fit"]).unwrap().opt_state.is_empty());
}

#[test]
fn optimizer_state_is_declared_donated_and_emitted_replicated() {
    let t = with_state(ProgramKind::Tell);
    let sig = signature(&t, |a| ProgramResults {
        params: a.params.clone(),
        generation: Some(a.generation.clone()),
        fitness: None,
        opt_state: a.opt_state.clone(),
    });
    assert!(
        sig.contains("%velocity.b: tensor<7xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}]>, tf.aliasing_output = 3 : i32}"),
        "{sig}"
    );
    assert!(sig.contains("tf.aliasing_output = 4 : i32}) -> ("), "{sig}");
    assert_eq!(sig.matches("tf.aliasing_output").count(), 5, "{sig}");
    let e = emit_error(&t, |args| ProgramResults {
        params: args.params.clone(),
        generation: Some(args.generation.clone()),
        fitness: None,
        opt_state: Vec::new(),
    });
    assert!(
        e.contains("optimizer state results: got 0, its layout has 2"),
        "{e}"
    );
}

#[test]
fn an_outputs_layout_takes_inputs_and_returns_its_outputs() {
    let l = layout(ProgramKind::Outputs, 1).with_outputs(vec![
        ("tokens".into(), TensorType::i32(&[3, 4])),
        ("lengths".into(), TensorType::i32(&[3])),
    ]);
    assert_eq!(
        (l.batch_arg(), l.fitness_arg(), l.arg_count()),
        (Some(4), None, 6)
    );
    assert_eq!((l.generation_result(), l.fitness_result()), (None, None));
    assert_eq!((l.result_count(), l.donates()), (2, false));
    assert_eq!(l.output_types()[0], TensorType::i32(&[16, 3, 4]));
    assert_eq!(l.split_outputs(vec!["t", "n"]).unwrap(), ["t", "n"]);
    let e = l.split_outputs(vec!["t"]).unwrap_err().to_string();
    assert!(
        e.contains("got 1, its layout has 2 (tokens + lengths)"),
        "{e}"
    );
    assert!(l.split_results(vec!["t", "n"]).is_err());
    let sig = signature(&l, |_| ProgramResults {
        params: Vec::new(),
        generation: None,
        fitness: None,
        opt_state: Vec::new(),
    });
    assert!(!sig.contains("tf.aliasing_output"), "{sig}");
}

#[test]
fn leaves_out_of_order_are_refused() {
    let mut leaves = layout(ProgramKind::Generation, 1).leaves;
    assert!(check_leaves(&leaves).is_ok());
    leaves.swap(0, 1);
    let e = check_leaves(&leaves).unwrap_err().to_string();
    assert!(
        e.contains("parameter `w`: leaf index 1 at position 0"),
        "{e}"
    );
}

/// Two layers of leaves `a` ([2, 3]) and `b` ([3]) between `emb` and `norm`, with layer
/// 1's `b` of shape `b1`.
fn layered(b1: &[i64]) -> Layout {
    let paths: [(&str, &[i64]); 6] = [
        ("emb", &[4]),
        ("m.layers.0.a", &[2, 3]),
        ("m.layers.0.b", &[3]),
        ("m.layers.1.a", &[2, 3]),
        ("m.layers.1.b", b1),
        ("norm", &[3]),
    ];
    let leaves = paths
        .iter()
        .enumerate()
        .map(|(index, (path, shape))| LeafInfo {
            index,
            path: (*path).into(),
            shape: shape.to_vec(),
        })
        .collect();
    Layout::new(ProgramKind::Generation, leaves, Vec::new(), 16, 1)
}

fn two_layers() -> LayerLeaves {
    LayerLeaves {
        prefix: "m.layers.".into(),
        count: 2,
        names: vec!["a".into(), "b".into()],
    }
}

#[test]
fn a_looped_model_s_layers_are_stacks_in_the_place_of_layer_0() {
    let l = layered(&[3]).with_layers(Some(&two_layers()));
    assert_eq!(
        l.slots(),
        [Slot::Leaf(0), Slot::Stack(0), Slot::Stack(1), Slot::Leaf(5)]
    );
    assert_eq!(l.stacks[0].name, "m.layers.stack.a");
    assert_eq!(l.stacks[0].positions, [1, 3]);
    assert_eq!(l.stacks[1].ty(), TensorType::f32(&[2, 3]));
    assert_eq!((l.key_arg(), l.generation_arg(), l.arg_count()), (4, 5, 6));
    assert_eq!(
        (l.generation_result(), l.fitness_result()),
        (Some(4), Some(5))
    );
    // The leaves stay what the tree has: the stacks change the arguments only.
    assert_eq!(l.leaves.len(), 6);
    let e = l.args([1, 2, 3], 0, 0, []).unwrap_err().to_string();
    assert!(
        e.contains("got 3, its layout has 4 (one per leaf or layer stack)"),
        "{e}"
    );
}

#[test]
fn stacks_are_declared_whole_and_views_and_restack_are_inverse() {
    let l = layered(&[3]).with_layers(Some(&two_layers()));
    let sig = signature(&l, |a| {
        let views = l.views(&a.params).unwrap();
        assert_eq!(views.len(), 6);
        assert_eq!(
            views[3].shape(),
            [2, 3],
            "layer 1's `a`, a row of its stack"
        );
        assert_eq!(l.leaf_value(&a.params, 4).unwrap().shape(), [3]);
        assert_eq!(l.stack_value(&a.params, 1).unwrap().shape(), [2, 3]);
        let params = l.restack(views).unwrap();
        assert_eq!(params[1].shape(), [2, 2, 3]);
        ProgramResults {
            params,
            generation: Some(a.generation.clone()),
            fitness: Some(a.key.func().full(0.0f32, &[16]).unwrap()),
            opt_state: Vec::new(),
        }
    });
    let stacks = [
        "%m.layers.stack.a: tensor<2x2x3xf32>",
        "%m.layers.stack.b: tensor<2x3xf32>",
    ];
    for arg in [
        "%emb: tensor<4xf32>",
        stacks[0],
        stacks[1],
        "%norm: tensor<3xf32>",
    ] {
        assert!(sig.contains(arg), "{arg} in {sig}");
    }
    assert!(!sig.contains("m.layers.0"), "{sig}");
    assert!(sig.contains("-> (tensor<4xf32>"), "{sig}");
    assert!(sig.contains("tensor<2x2x3xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {}, {}]>}, tensor<2x3xf32>"), "{sig}");
}

#[test]
fn layers_that_do_not_stack_stay_leaves() {
    let leaves = |l: &Layout| l.slots().iter().all(|s| matches!(s, Slot::Leaf(_)));
    // Layer 1's `b` has another shape than layer 0's.
    let l = layered(&[4]).with_layers(Some(&two_layers()));
    assert!(l.stacks.is_empty() && leaves(&l) && l.slots().len() == 6);
    // A layer the tree lacks.
    let mut three = two_layers();
    three.count = 3;
    let l = layered(&[3]).with_layers(Some(&three));
    assert!(l.stacks.is_empty() && leaves(&l));
    // Layers unrolled.
    assert!(leaves(&layered(&[3]).with_layers(None)));
    // Another layout's stacks that do not fit these leaves.
    let stacks = layered(&[3]).with_layers(Some(&two_layers())).stacks;
    let mut bad = stacks.clone();
    bad[0].positions = vec![1, 9];
    assert!(leaves(&layered(&[3]).with_stacks(bad)));
    let mut twice = stacks.clone();
    twice[1] = Stack {
        name: "m.layers.stack.again".into(),
        ..stacks[0].clone()
    };
    assert!(leaves(&layered(&[3]).with_stacks(twice)));
    let kept = layered(&[3]).with_stacks(stacks.clone());
    assert_eq!(kept.stacks, stacks);
}
