//! Compile cost must not grow with the rank r: the noise of r columns is one batched draw,
//! not r copies of the graph. The emitted op count (what XLA has to compile) of the
//! quickstart's generation program is the same at r = 1, 4 and 16, and the count is a real
//! one (it sees the program's dots and its PRNG).

use shardes::hlo::es::strategy::{LowRank, Mirrored};
use shardes::hlo::es::{leaf_infos, ShardedES};
use shardes::hlo::prng::key;
use shardes::hlo::problems::transformer_block::TransformerBlock;

fn ops_at_rank(r: usize) -> std::collections::BTreeMap<String, usize> {
    let tb = TransformerBlock::QUICKSTART;
    let params = tb.init(key(0).unwrap()).unwrap();
    let es = ShardedES::new(
        Box::new(Mirrored(Box::new(LowRank { r }))),
        256,
        0.01,
        0.01,
        8,
    )
    .unwrap();
    let program = es.generation_program(&tb, &leaf_infos(&params)).unwrap();
    program.module.op_counts()
}

#[test]
fn emitted_op_count_is_flat_in_rank() {
    let base = ops_at_rank(1);
    let total: usize = base.values().sum();
    // Six leaves, each read through a seam: at least a base and two factor products each.
    assert!(
        base.get("stablehlo.dot_general").copied().unwrap_or(0) >= 18,
        "op count misses the dots: {base:?}"
    );
    assert!(base.contains_key("sdy.manual_computation"), "{base:?}");
    for r in [4, 16] {
        let other = ops_at_rank(r);
        let t: usize = other.values().sum();
        println!("r={r}: {t} ops (r=1: {total})");
        assert_eq!(other, base, "op counts at r={r} differ from r=1");
    }
}

fn qwen2_ops(layers: usize) -> usize {
    use shardes::hlo::problems::qwen2::{Qwen2, Qwen2Config};
    let mut cfg = Qwen2Config::tiny();
    cfg.num_hidden_layers = layers;
    let params = cfg.init(key(0).unwrap(), 0.02).unwrap();
    let es = ShardedES::new(
        Box::new(Mirrored(Box::new(LowRank { r: 1 }))),
        16,
        0.01,
        0.01,
        2,
    )
    .unwrap();
    let program = es
        .generation_program(&Qwen2::new(cfg, 2, 4), &leaf_infos(&params))
        .unwrap();
    program.module.op_counts().values().sum()
}

#[test]
fn emitted_op_count_grows_linearly_with_depth() {
    // Every layer adds the same ops (its forward, its leaves' noise and update): the cost
    // of depth is linear, with no per-layer term that grows with the layer count.
    let ops: Vec<usize> = [1, 2, 4].iter().map(|&l| qwen2_ops(l)).collect();
    println!("qwen2 tiny, 1/2/4 layers: {ops:?} emitted ops");
    let per_layer = ops[1] - ops[0];
    assert!(per_layer > 0);
    assert_eq!(ops[2] - ops[1], 2 * per_layer, "{ops:?}");
}
