//! `Module::op_counts` (counted from the builder's op records) gives the same map as a
//! line-by-line reading of `Module::to_mlir` (the oracle below, a copy of
//! `shardes::bench::op_counts`), on hand-built programs covering every kind of line and on
//! the ES and model programs.

use std::collections::BTreeMap;

use shardes_hlo::builder::{DType, Func, Mesh, Module, Result, Sharding, TensorType};
use shardes_hlo::es::strategy::from_spec;
use shardes_hlo::es::{leaf_infos, How, ShardedES, StrategySpec};
use shardes_hlo::prng::{key, Keys};
use shardes_hlo::problems::qwen2::{Qwen2, Qwen2Config};
use shardes_hlo::problems::transformer_block::TransformerBlock;

/// The oracle: `shardes::bench::op_counts` as of this test's writing.
fn text_op_counts(mlir: &str) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for line in mlir.lines() {
        let body = match line.find(" = ") {
            Some(i) => &line[i + 3..],
            None => line.trim_start(),
        };
        let body = body.trim_start().trim_start_matches('"');
        let name: String = body
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '.')
            .collect();
        if let Some((dialect, _)) = name.split_once('.') {
            if matches!(dialect, "stablehlo" | "sdy" | "func" | "chlo" | "mhlo") {
                *counts.entry(name).or_insert(0) += 1;
            }
        }
    }
    counts
}

fn check(what: &str, m: &Module) {
    let text = m.to_mlir();
    assert_eq!(m.op_counts(), text_op_counts(&text), "{what}:\n{text}");
}

/// Sharded and donated signatures, a plain helper with `func.call`, a sharding
/// constraint, `while` (regions with headers), reduce, sort, gather, scatter, the PRNG
/// (`chlo.erf_inv`), and a manual computation with collectives (`sdy.return`).
fn mixed(devices: i64) -> Result<Module> {
    let mut m = Module::with_mesh("mixed", Mesh::pop(devices)?);
    let h = m.func("helper");
    let a = h.arg("a", TensorType::f32(&[4]))?;
    h.output(&a.mul(&a)?)?;
    let helper = m.add(h.finish()?)?;
    let f = m.func("main");
    let rows = Sharding::split(2, 0)?;
    let x = f.arg_sharded("x", TensorType::f32(&[8, 4]), &rows)?;
    let k = f.arg_donated("k", TensorType::u32(&[2]), &Sharding::replicated(1), 1)?;
    let ids = f.arg("ids", TensorType::i32(&[3]))?;
    let y = x.tanh()?.shard(&rows)?;
    let looped = f.fori_loop(0, 2, &[&y], |i, c| {
        let fi = i.convert(DType::F32)?;
        Ok(vec![c[0].add(&fi)?])
    })?;
    let s = looped[0].reduce_sum(&[0])?;
    let sq = f.call(&helper, &[&s])?.remove(0);
    let sorted = f.sort_ascending(&[&sq], 0)?;
    let best = x.argmax(1)?;
    let taken = x.take_rows(&ids)?;
    let upd = x.scatter_add_rows(&ids, &taken)?;
    let z = Keys::from_data(&k)?.normal(&[4])?;
    let outs = f.manual_computation(
        &[&upd],
        std::slice::from_ref(&rows),
        &[Sharding::replicated(1), rows.clone()],
        |l| {
            let tot = l[0].reduce_max(&[0])?.all_reduce_max()?;
            let pid = l[0].func().partition_id()?;
            let g = l[0].all_gather(0)?.slice_in_dim(0, 8 / devices, 0)?;
            let g = g.add(&pid.convert(DType::F32)?)?;
            Ok(vec![tot, g])
        },
    )?;
    let barrier = f.optimization_barrier(&[&outs[0], &z])?;
    f.output(&sorted[0])?;
    f.output(&k)?;
    f.output(&best)?;
    f.output(&barrier[0])?;
    f.output_sharded(&outs[1], &rows)?;
    f.output(&barrier[1])?;
    m.add(f.finish()?)?;
    Ok(m)
}

/// No mesh, no attributes: `func.func` lines count, and a function without results.
fn plain() -> Result<Module> {
    let mut m = Module::new("plain");
    let e = m.func("empty");
    m.add(e.finish()?)?;
    let f: Func = m.func("main");
    let x = f.arg("x", TensorType::f32(&[3]))?;
    let c = f.constant(&[3], &[1.5f32, -0.0, f32::NAN])?;
    let w = f.while_loop(
        &[&x],
        |c| c[0].reduce_sum(&[0])?.lt(&c[0].const_like(10.0)?),
        |c| Ok(vec![c[0].add(&c[0].const_like(1.0)?)?]),
    )?;
    f.output(&w[0].mul(&c)?.erf_inv()?)?;
    m.add(f.finish()?)?;
    Ok(m)
}

#[test]
fn op_counts_match_the_text_on_hand_built_programs() {
    check("plain", &plain().unwrap());
    // 4 devices: a real sdy.manual_computation; 1 device: its body printed inline.
    check("mixed over 4", &mixed(4).unwrap());
    check("mixed over 1", &mixed(1).unwrap());
    let counts = mixed(4).unwrap().op_counts();
    assert_eq!(counts.get("sdy.manual_computation"), Some(&1), "{counts:?}");
    assert_eq!(counts.get("sdy.return"), Some(&1), "{counts:?}");
    assert_eq!(counts.get("func.call"), Some(&1), "{counts:?}");
    assert_eq!(counts.get("chlo.erf_inv"), Some(&1), "{counts:?}");
    assert!(!mixed(1)
        .unwrap()
        .op_counts()
        .contains_key("sdy.manual_computation"));
}

#[test]
fn op_counts_match_the_text_on_es_and_model_programs() {
    let tb = TransformerBlock::QUICKSTART;
    let leaves = leaf_infos(&tb.init(key(0).unwrap()).unwrap());
    let mut cfg = Qwen2Config::tiny();
    cfg.num_hidden_layers = 1;
    let qp = cfg.init(key(0).unwrap(), 0.02).unwrap();
    let qwen = Qwen2::new(cfg, 2, 4);
    for strat in [
        "mirrored(lowrank(r=1))",
        "seed_regenerated(chunk=4)",
        "iid_gaussian",
    ] {
        for how in [How::A, How::B] {
            for d in [1, 8] {
                let spec: StrategySpec = strat.parse().unwrap();
                let es = ShardedES::new(from_spec(&spec), 64, 0.01, 0.01, d)
                    .unwrap()
                    .with_how(how);
                let what = format!("{strat} {how:?} on {d}");
                let p = es.generation_program(&tb, &leaves).unwrap();
                check(&format!("generation {what}"), &p.module);
                let p = es.ask_apply_program(&tb, &leaves).unwrap();
                check(&format!("ask_apply {what}"), &p.module);
                let p = es.tell_program(&tb, &leaves).unwrap();
                check(&format!("tell {what}"), &p.module);
            }
        }
    }
    check("qwen2 logits", &qwen.logits_program(&qp).unwrap());
    check("qwen2 greedy", &qwen.greedy_program(&qp, 3, 2).unwrap());
}
