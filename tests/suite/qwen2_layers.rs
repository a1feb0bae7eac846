//! Qwen2's layers emitted as one `while` over the layer index (`Layers::Loop`) against the
//! same layers emitted one after the other (`Layers::Unrolled`, the default).
//!
//! Tolerances: the looped program holds each layer leaf name as one `[L, …]` argument and
//! reads layer `i` by a `dynamic_slice`; under low rank the ES program draws each layer's
//! noise inside the loop from the leaves' own streams and contracts it in a loop over the
//! layers (seed regenerated draws every leaf's noise before the model, as unrolled).
//! Decoded tokens must be equal. Fitness and updated parameters must be equal bit for bit
//! on the tiny Hugging Face fixture and a 3-layer random model, for low rank
//! (`lowrank(r=1)`, mirrored on 8 devices) and seed regenerated, on 1 and 8 devices. The
//! exception is mirrored low rank on one device, where LLVM fuses multiplies into adds
//! (FMA) differently in the unrolled kernels than in the loop body (docs/performance.md,
//! "Qwen2 layers as a loop"):
//! there a loss may differ by at most `MAX_ULP` units in the last place, an updated leaf
//! by at most `PARAM_MAX_ULP` (the looped `tell` regenerates noise the unrolled one
//! keeps), and the update must equal the unrolled program's with regenerated noise bit
//! for bit whenever the fitness ranks do; without FMA (`XLA_FLAGS=--xla_cpu_max_isa=AVX`,
//! the slow tier's child process, which checks mirrored low rank on 1 and 8 devices) it
//! is bit for bit. The emitted op count of the looped
//! generation grows by a few ops per layer leaf only (its row of the stacked update; the
//! model, the noise and `tell`'s contraction are loops) and its dots not at all, and low
//! rank never forms a member × m × k value in the looped program (emitted or optimized).

use std::path::Path;

use crate::support::sharded::{emits_member_matrix, matrices, member_matrix, optimized_shapes};
use shardes::hf::load_checkpoint;
use shardes::hlo::builder::DType;
use shardes::hlo::decode::{DecodeShape, DecodeSpec};
use shardes::hlo::es::{leaf_infos, ShardedES};
use shardes::hlo::params::{Array, ParamTree};
use shardes::hlo::prng::key;
use shardes::hlo::problems::qwen2::{Layers, Qwen2, Qwen2Config};
use shardes::runtime::{Client, CompileOptions};
use shardes::{HostArray, OutputsRunner, Trainer};

const N: usize = 16;
const STRATEGIES: [&str; 2] = ["mirrored(lowrank(r=1))", "seed_regenerated"];
/// The strategies of the generation test: the decode test's and low rank unpaired.
const GENERATION_STRATEGIES: [&str; 3] =
    ["mirrored(lowrank(r=1))", "lowrank(r=1)", "seed_regenerated"];
/// The most units in the last place a looped loss may differ from the unrolled one by,
/// where the two are not bit-identical (mirrored low rank on one device; measured: 3).
const MAX_ULP: u32 = 4;
/// The most units in the last place an updated leaf may differ from the unrolled
/// program's there (the noise `tell` contracts kept against regenerated; measured: 7).
const PARAM_MAX_ULP: u32 = 16;

/// The tiny checkpoint `transformers` wrote (2 layers) and a 3-layer random model.
fn models() -> Vec<(&'static str, Qwen2Config, ParamTree)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/qwen2_tiny");
    let (fixture, tree) = load_checkpoint(dir).expect("load the fixture");
    let mut three = Qwen2Config::tiny();
    three.num_hidden_layers = 3;
    let random = three.init(key(11).unwrap(), 0.3).unwrap();
    vec![("fixture", fixture, tree), ("3-layer", three, random)]
}

fn es(strategy: &str, devices: usize) -> ShardedES {
    crate::support::sharded::es(strategy, N, 0.05, 0.01, devices).with_member_chunk(Some(2))
}

/// Pseudo-random token ids below `vocab`, as the f32 arrays a batch is passed as.
fn tokens(n: usize, vocab: usize, seed: u64) -> Vec<f32> {
    crate::support::lcg_ids(n, vocab, seed)
        .into_iter()
        .map(|x| x as f32)
        .collect()
}

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

/// One generation: the fitness and every updated leaf, as bits. Without `keep`, `tell`
/// regenerates the noise even where `apply` could keep it.
fn generation(
    client: &Client,
    model: &Qwen2,
    tree: &ParamTree,
    strategy: &str,
    devices: usize,
    keep: bool,
) -> (Vec<u32>, Vec<(String, Vec<u32>)>) {
    let (b, s) = (model.batch, model.seq);
    let v = model.config.vocab_size;
    let batch = [
        Array::new(vec![b, s], tokens(b * s, v, 1)).unwrap(),
        Array::new(vec![b, s], tokens(b * s, v, 2)).unwrap(),
        Array::new(vec![b, s], vec![1.0; b * s]).unwrap(),
    ];
    let es = if keep {
        es(strategy, devices)
    } else {
        es(strategy, devices).with_keep_noise_bytes(0)
    };
    let mut t = Trainer::with_state(client, &es, model, tree, key(3).unwrap(), &batch, 2).unwrap();
    let fitness = t.step().unwrap();
    let params = t
        .params()
        .unwrap()
        .leaves()
        .into_iter()
        .map(|(p, a)| (p, bits(a.data())))
        .collect();
    (bits(&fitness), params)
}

/// Member ranks by fitness (ties broken by index).
fn ranks(f: &[u32]) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..f.len()).collect();
    idx.sort_by(|&a, &b| f32::from_bits(f[a]).total_cmp(&f32::from_bits(f[b])));
    idx
}

/// The largest distance in units in the last place between two fitness vectors.
fn max_ulp(a: &[u32], b: &[u32]) -> u32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| x.abs_diff(*y))
        .max()
        .unwrap_or(0)
}

/// Whether XLA:CPU compiles this case's two programs to the same arithmetic. Only mirrored
/// low rank on one device does not: LLVM fuses multiplies into adds (FMA) differently in the
/// unrolled kernels and the loop body's, which moves the last bits of some losses; under
/// `XLA_FLAGS=--xla_cpu_max_isa=AVX`, which has no FMA, they agree (docs/performance.md,
/// "Qwen2 layers as a loop").
fn bit_identical(strategy: &str, devices: usize) -> bool {
    !(strategy == "mirrored(lowrank(r=1))" && devices == 1)
}

// About three minutes on 2 cores (two models × three strategies × 1 and 8 devices, each
// compiled twice): the slow tier, which `.ci/run` runs after the default command.
#[test]
#[ignore = "slow tier"]
fn slow_looped_generation_equals_unrolled_to_the_last_bits() {
    let client = Client::cpu(8).unwrap();
    for (name, cfg, tree) in models() {
        let unrolled = Qwen2::new(cfg.clone(), 2, 7);
        assert_eq!(unrolled.layers, Layers::Unrolled, "unrolled is the default");
        let looped = Qwen2::new(cfg.clone(), 2, 7).with_layers(Layers::Loop);
        for strategy in GENERATION_STRATEGIES {
            for devices in [1, 8] {
                let what = format!("{name}, {strategy}, {devices} devices");
                let (fu, pu) = generation(&client, &unrolled, &tree, strategy, devices, true);
                let (fl, pl) = generation(&client, &looped, &tree, strategy, devices, true);
                let ulp = max_ulp(&fl, &fu);
                println!("{what}: fitness differs by at most {ulp} ulp");
                let moved = pu
                    .iter()
                    .zip(tree.leaves())
                    .filter(|((_, u), (_, a))| *u != bits(a.data()))
                    .count();
                assert!(moved > 0, "{what}: the update moved nothing");
                if bit_identical(strategy, devices) {
                    assert_eq!(fl, fu, "{what}: fitness");
                    assert_eq!(pl, pu, "{what}: updated parameters");
                    continue;
                }
                assert!(ulp <= MAX_ULP, "{what}: fitness {fl:?} vs {fu:?}");
                // The looped low-rank program's `tell` regenerates the noise (`apply` draws
                // the layers' inside the model's loop), where the unrolled one contracts the
                // noise `apply` kept, which here rounds some 1-D leaves' sums differently.
                // Against the unrolled program that regenerates too, the update reads the
                // fitness only through its ranks: with the same ranks it is the same bits.
                let (fr, pr) = generation(&client, &unrolled, &tree, strategy, devices, false);
                assert_eq!(fr, fu, "{what}: keeping the noise moved the fitness");
                if ranks(&fl) == ranks(&fr) {
                    assert_eq!(pl, pr, "{what}: updated parameters (noise regenerated)");
                }
                for ((path, l), (_, u)) in pl.iter().zip(&pu) {
                    let d = max_ulp(l, u);
                    assert!(d <= PARAM_MAX_ULP, "{what}: {path} moved by {d} ulp");
                }
            }
        }
    }
}

/// `XLA_FLAGS` under which XLA:CPU's kernels use no FMA instructions (AVX has none).
const NO_FMA: &str = "--xla_cpu_max_isa=AVX";

// XLA reads `XLA_FLAGS` once per process, so the check runs in a child process of this test
// binary: the one case that is not bit-identical under the plugin's defaults (mirrored low
// rank on one device; 8 devices checked too) is bit-identical once LLVM cannot fuse multiplies into adds, which
// pins the cause of its difference. About a minute on 2 cores: the slow tier.
#[test]
#[ignore = "slow tier"]
fn slow_without_fma_the_one_exception_is_bit_identical_too() {
    let exe = std::env::current_exe().expect("the test binary's path");
    let out = std::process::Command::new(exe)
        .args(["--ignored", "--exact", "--nocapture", "--test-threads=1"])
        .arg("qwen2_layers::mirrored_low_rank_under_xla_flags")
        .env("XLA_FLAGS", NO_FMA)
        .output()
        .expect("run the test binary");
    let text = String::from_utf8_lossy(&out.stdout);
    println!("{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the child failed");
    assert!(text.contains("1 passed"), "the child ran no test: {text}");
}

/// The child of `slow_without_fma_the_one_exception_is_bit_identical_too`; without its
/// `XLA_FLAGS` (run on its own, or through `--include-ignored`) it checks nothing.
#[test]
#[ignore = "run by slow_without_fma_the_one_exception_is_bit_identical_too"]
fn mirrored_low_rank_under_xla_flags() {
    if std::env::var("XLA_FLAGS").as_deref() != Ok(NO_FMA) {
        println!("not under XLA_FLAGS={NO_FMA}: run by its parent test, nothing checked");
        return;
    }
    let client = Client::cpu(8).unwrap();
    let strategy = "mirrored(lowrank(r=1))";
    for (name, cfg, tree) in models() {
        let unrolled = Qwen2::new(cfg.clone(), 2, 7);
        let looped = Qwen2::new(cfg.clone(), 2, 7).with_layers(Layers::Loop);
        for devices in [1, 8] {
            let (fu, _) = generation(&client, &unrolled, &tree, strategy, devices, true);
            let (fr, pr) = generation(&client, &unrolled, &tree, strategy, devices, false);
            let (fl, pl) = generation(&client, &looped, &tree, strategy, devices, true);
            assert_eq!(fr, fu, "{name}: keeping the noise moved the fitness");
            assert_eq!(fl, fu, "{name}: fitness without FMA");
            // The looped `tell` regenerates the noise; the unrolled one that regenerates too is
            // the program it must equal (the one that keeps rounds its 1-D sums differently
            // with or without FMA).
            assert_eq!(pl, pr, "{name}: updated parameters without FMA");
            println!("{name}, {devices} devices: looped equals unrolled bit for bit without FMA");
        }
    }
}

fn decode(
    client: &Client,
    model: Qwen2,
    tree: &ParamTree,
    strategy: &str,
    devices: usize,
) -> Vec<i32> {
    let (b, p, t) = (2usize, 5usize, 6usize);
    let v = model.config.vocab_size;
    let spec = DecodeSpec::new(
        model,
        DecodeShape {
            batch: b,
            prompt_len: p,
            max_new: t,
        },
        Vec::new(),
        0,
    )
    .unwrap();
    let es = es(strategy, devices);
    let runner = OutputsRunner::with_state(client, &es, &spec, tree, key(4).unwrap(), 1).unwrap();
    let ids: Vec<i32> = tokens(b * p, v, 9).iter().map(|&x| x as i32).collect();
    let out = runner
        .outputs(&[
            HostArray::i32(&[b, p], ids),
            HostArray::i32(&[b], vec![p as i32, 3]),
        ])
        .unwrap();
    assert_eq!(out[0].dims, [N, b, t]);
    out[0].as_i32().unwrap().to_vec()
}

// About 90 s on 2 cores (two models, two strategies, 1 and 8 devices, each decode program
// compiled twice): the slow tier, to keep the default command under 15 minutes.
#[test]
#[ignore = "slow tier"]
fn slow_looped_decoding_equals_unrolled_token_for_token() {
    let client = Client::cpu(8).unwrap();
    for (name, cfg, tree) in models() {
        for strategy in STRATEGIES {
            let mut first = None;
            for devices in [1, 8] {
                let what = format!("{name}, {strategy}, {devices} devices");
                let unrolled = Qwen2::new(cfg.clone(), 2, 5).with_layers(Layers::Unrolled);
                let want = decode(&client, unrolled, &tree, strategy, devices);
                let got = decode(
                    &client,
                    Qwen2::new(cfg.clone(), 2, 5).with_layers(Layers::Loop),
                    &tree,
                    strategy,
                    devices,
                );
                assert_eq!(got, want, "{what}: tokens");
                let first = first.get_or_insert_with(|| got.clone());
                assert_eq!(&got, first, "{what}: 1 vs 8 devices");
            }
            // Members decode differently (the noise reached the loop).
            let t = first.unwrap();
            assert!(
                t.chunks(12).any(|m| m != &t[..12]),
                "{name}, {strategy}: every member decoded the same tokens"
            );
        }
    }
}

/// The emitted ops of the tiny model's generation and decode programs at `layers` layers.
fn op_counts(layers: usize, how: Layers) -> (usize, usize, usize) {
    let mut cfg = Qwen2Config::tiny();
    cfg.num_hidden_layers = layers;
    let tree = cfg.init(key(0).unwrap(), 0.02).unwrap();
    let leaves = leaf_infos(&tree);
    let es = es("mirrored(lowrank(r=1))", 2);
    let model = Qwen2::new(cfg, 2, 4).with_layers(how);
    let generation = es
        .generation_program(&model, &leaves)
        .unwrap()
        .module
        .op_counts();
    let dots = generation
        .get("stablehlo.dot_general")
        .copied()
        .unwrap_or(0);
    let spec = DecodeSpec::new(
        model,
        DecodeShape {
            batch: 2,
            prompt_len: 3,
            max_new: 2,
        },
        Vec::new(),
        0,
    )
    .unwrap();
    let decode = es
        .outputs_program(&spec, &leaves)
        .unwrap()
        .module
        .op_counts();
    let decode_dots = decode.get("stablehlo.dot_general").copied().unwrap_or(0);
    (generation.values().sum(), dots, decode_dots)
}

#[test]
fn emitted_op_count_of_the_looped_model_is_flat_in_depth() {
    let looped: Vec<_> = [1, 2, 4, 8]
        .iter()
        .map(|&l| op_counts(l, Layers::Loop))
        .collect();
    let unrolled: Vec<_> = [1, 2, 4]
        .iter()
        .map(|&l| op_counts(l, Layers::Unrolled))
        .collect();
    println!("looped 1/2/4/8 layers (ops, dots, decode dots): {looped:?}");
    println!("unrolled 1/2/4 layers: {unrolled:?}");
    // The decode program's dots are all the model's: one layer's, whatever the depth.
    for c in &looped {
        assert_eq!(c.2, looped[0].2, "decode dots grow with depth: {looped:?}");
    }
    assert!(
        unrolled[2].2 > unrolled[0].2,
        "the unrolled count can fail: {unrolled:?}"
    );
    // The ES work draws, scales and contracts a layer's noise inside loops over the layer
    // index too, and the layers' leaves are `[L, …]` stacks: the generation program's dots
    // do not move with depth, and a layer adds only its 12 leaves' rows of the stacked
    // update (each leaf's sum cut out of the stacked contraction and put back as a row of
    // the stack's step: 3 ops a leaf) and its branch of the `case` that hands the body its
    // 1-D leaves, far fewer than an unrolled layer (which adds the model's ops too). The
    // update of a stack itself is one op whatever the depth.
    for c in &looped {
        assert_eq!(
            c.1, looped[0].1,
            "generation dots grow with depth: {looped:?}"
        );
    }
    let per_layer = looped[1].0 - looped[0].0;
    assert_eq!(looped[2].0 - looped[1].0, 2 * per_layer, "{looped:?}");
    assert_eq!(looped[3].0 - looped[2].0, 4 * per_layer, "{looped:?}");
    assert!(
        per_layer <= 5 * 12,
        "a looped layer adds {per_layer} ops: {looped:?}"
    );
    let unrolled_per_layer = unrolled[1].0 - unrolled[0].0;
    assert!(
        10 * per_layer < unrolled_per_layer,
        "a looped layer adds {per_layer} ops, an unrolled one {unrolled_per_layer}"
    );
}

#[test]
fn low_rank_never_forms_a_member_matrix_in_the_looped_program() {
    let mut cfg = Qwen2Config::tiny();
    cfg.num_hidden_layers = 3;
    let tree = cfg.init(key(1).unwrap(), 0.02).unwrap();
    let mats = matrices(&tree);
    // b·s = 14 matches no matrix dimension of the tiny model (128, 64, 32, 16).
    let q = Qwen2::new(cfg, 2, 7).with_layers(Layers::Loop);
    let es = crate::support::sharded::es("mirrored(lowrank(r=1))", 16, 0.01, 0.01, 2)
        .with_member_chunk(Some(4));
    let program = es.generation_program(&q, &leaf_infos(&tree)).unwrap();
    let text = program.module.to_mlir();
    assert!(
        text.contains("%model.layers.stack.mlp.up_proj.weight: tensor<3x"),
        "not looped over stacked layers: {}",
        &text[..text.len().min(4000)]
    );
    let types = program.module.value_types();
    assert!(types.len() > 100, "only {} values", types.len());
    for t in &types {
        if let Some(m) = member_matrix(&t.shape, 4, &mats) {
            panic!("emitted: {:?} holds a per-member {m:?} matrix", t.shape);
        }
    }
    let client = Client::cpu(2).unwrap();
    let exe = client
        .compile(&program.module.to_mlir(), &CompileOptions::new(2))
        .unwrap();
    let shapes = optimized_shapes(&exe.optimized_hlo().unwrap());
    for dims in &shapes {
        if let Some(m) = member_matrix(dims, 4, &mats) {
            panic!("optimized: {dims:?} holds a per-member {m:?} matrix");
        }
    }
    let seen = shapes.len();
    assert!(seen > 50, "only {seen} optimized shapes");
    // The detector can fail: dense noise puts whole matrices in the members.
    let dense =
        crate::support::sharded::es("iid_gaussian", 16, 0.01, 0.01, 2).with_member_chunk(Some(4));
    let dense = dense.generation_program(&q, &leaf_infos(&tree)).unwrap();
    let found = emits_member_matrix(&dense.module, 4, &mats);
    assert!(found, "the detector missed the dense per-member matrices");
}

#[test]
fn layers_setting_parses_and_names_the_key() {
    assert_eq!(Layers::parse("loop").unwrap(), Layers::Loop);
    assert_eq!(Layers::parse("unrolled").unwrap(), Layers::Unrolled);
    let e = Layers::parse("scan").unwrap_err().to_string();
    assert!(e.contains("layers") && e.contains("\"scan\""), "{e}");
    for l in [Layers::Loop, Layers::Unrolled] {
        assert_eq!(Layers::parse(l.name()).unwrap(), l);
    }
}

/// The `[L, …]` stacks the ES decode program converts from f32 to `dtype`, as the rank of
/// each converted stack (a `stablehlo.convert` of a `tensor<3x…xf32>`, the 3-layer model).
fn converted_stacks(strategy: &str, dtype: DType) -> Vec<usize> {
    let mut cfg = Qwen2Config::tiny();
    cfg.num_hidden_layers = 3;
    let tree = cfg.init(key(1).unwrap(), 0.02).unwrap();
    let model = Qwen2::new(cfg, 2, 5)
        .with_layers(Layers::Loop)
        .with_compute_dtype(dtype);
    let spec = DecodeSpec::new(
        model,
        DecodeShape {
            batch: 2,
            // Not 3: a 3-token prompt's rotary tables and masks would lead with the layers' 3.
            prompt_len: 5,
            max_new: 2,
        },
        Vec::new(),
        0,
    )
    .unwrap();
    let text = es(strategy, 2)
        .with_compute_dtype(dtype)
        .unwrap()
        .outputs_program(&spec, &leaf_infos(&tree))
        .unwrap()
        .module
        .to_mlir();
    text.lines()
        .filter(|l| l.contains("stablehlo.convert"))
        .filter_map(|l| {
            let from = l.split(": (tensor<").nth(1)?.split('>').next()?;
            (from.starts_with("3x") && from.ends_with("xf32") && l.contains("bf16>"))
                .then(|| from.split('x').count() - 1)
        })
        .collect()
}

/// In bf16 the ES program converts the stacks of the matrices it hands the model as stored
/// (low-rank bases) once, before the loops, so a decode's layer loop never converts them
/// per token; the 1-D leaves' stacks, which get dense noise on their f32 values, stay f32.
#[test]
fn bf16_low_rank_bases_are_converted_once_before_the_loops() {
    let ranks = converted_stacks("mirrored(lowrank(r=1))", DType::BF16);
    assert_eq!(
        ranks,
        vec![3; 7],
        "the 7 matrix stacks of a layer, and no 1-D stack"
    );
    assert!(converted_stacks("mirrored(lowrank(r=1))", DType::F32).is_empty());
}
