//! The ES layer's contract with its users: refusals with actionable messages (narrow
//! fitness, invalid settings, task mismatches), `check_model`'s findings, and user-defined
//! strategies and shapings (implemented here, outside the crate).

use std::time::Instant;

use crate::support::rel_norm_diff;
use crate::support::tiny::{mlp_batch, mlp_on_8_devices, mlp_params, one_generation, Mlp};
use shardes::hlo::builder::{self, DType, Value};
use shardes::hlo::es::shaping::{NoShaping, ShapingSpec};
use shardes::hlo::es::strategy::{
    from_spec, full_rank_noise, IidGaussian, LowRank, Mirrored, SeedRegenerated,
};
use shardes::hlo::es::{
    check_model, leaf_infos, EsError, How, LeafInfo, Model, Noise, Shaping, ShardedES, Strategy,
    CHUNK_BYTES, DEFAULT_MEMBER_CHUNK, KEEP_NOISE_BYTES, TELL_CHUNK_BYTES,
};
use shardes::hlo::prng::emit::Keys;
use shardes::hlo::prng::key;
use shardes::hlo::problems::transformer_block::TransformerBlock;
use shardes::runtime::Client;
use shardes::Trainer;

fn lowrank() -> Box<dyn Strategy> {
    Box::new(LowRank { r: 1 })
}

fn message(r: Result<ShardedES, EsError>) -> String {
    match r {
        Ok(es) => panic!("accepted invalid settings: {es:?}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn narrow_fitness_is_refused_before_anything_runs() {
    let params = mlp_params(1);
    let leaves = leaf_infos(&params);
    for (dtype, name) in [(DType::BF16, "bf16"), (DType::F16, "f16")] {
        let model = Mlp {
            loss_dtype: dtype,
            ..Mlp::PLAIN
        };
        let es = ShardedES::new(lowrank(), 16, 0.1, 0.1, 1).expect("valid");
        let err = match es.generation_program(&model, &leaves) {
            Ok(_) => panic!("{name} fitness accepted"),
            Err(e) => e,
        };
        assert!(matches!(err, EsError::NarrowFitness { .. }), "{err:?}");
        let msg = err.to_string();
        assert!(msg.contains(name), "names the type: {msg}");
        assert!(msg.contains("ties"), "says why: {msg}");
        assert!(msg.contains("float32"), "says the fix: {msg}");
        // Through the trainer: refused before compilation (so before any device work).
        let client = Client::cpu(1).expect("CPU client");
        let t0 = Instant::now();
        let r = Trainer::with_state(
            &client,
            &es,
            &model,
            &params,
            key(0).expect("seed"),
            &mlp_batch(2),
            0,
        );
        assert!(
            matches!(r, Err(shardes::Error::Es(EsError::NarrowFitness { .. }))),
            "trainer must refuse {name} fitness"
        );
        println!("{name}: refused in {:?}: {msg}", t0.elapsed());
    }
    // f64 is wider: accepted (converted to f32).
    let model = Mlp {
        loss_dtype: DType::F64,
        ..Mlp::PLAIN
    };
    let es = ShardedES::new(lowrank(), 16, 0.1, 0.1, 1).expect("valid");
    assert!(es.generation_program(&model, &leaves).is_ok());
}

#[test]
fn invalid_settings_are_rejected_naming_the_number() {
    let m = message(ShardedES::new(lowrank(), 30, 0.1, 0.1, 8));
    assert!(
        m.contains("n = 30") && m.contains('8') && m.contains("32"),
        "{m}"
    );
    let m = message(ShardedES::new(lowrank(), 0, 0.1, 0.1, 1));
    assert!(m.contains("n = 0"), "{m}");
    // Mirrored: the per-device count must be even.
    let m = message(ShardedES::new(
        Box::new(Mirrored(lowrank())),
        8,
        0.1,
        0.1,
        8,
    ));
    assert!(
        m.contains("n = 8") && m.contains("pairing (2)") && m.contains("16"),
        "{m}"
    );
    for sigma in [0.0, -0.5, f32::NAN, f32::INFINITY] {
        let m = message(ShardedES::new(lowrank(), 16, sigma, 0.1, 1));
        assert!(m.contains(&format!("sigma = {sigma}")), "{m}");
    }
    for lr in [f32::INFINITY, f32::NEG_INFINITY, f32::NAN] {
        let m = message(ShardedES::new(lowrank(), 16, 0.1, lr, 1));
        assert!(m.contains(&format!("lr = {lr}")), "{m}");
    }
    let m = message(ShardedES::new(lowrank(), 16, 0.1, 0.1, 0));
    assert!(m.contains("devices = 0"), "{m}");
    // Member chunks: must divide the local population (and the pairing).
    let es = ShardedES::new(lowrank(), 64, 0.1, 0.1, 8)
        .expect("valid")
        .with_member_chunk(Some(3));
    let m = es.member_chunk().expect_err("chunk 3 of 8").to_string();
    assert!(
        m.contains("member chunk 3") && m.contains("8 members"),
        "{m}"
    );
    let leaves = leaf_infos(&mlp_params(1));
    assert!(es.generation_program(&Mlp::PLAIN, &leaves).is_err());
    let es = ShardedES::new(Box::new(Mirrored(lowrank())), 64, 0.1, 0.1, 8)
        .expect("valid")
        .with_member_chunk(Some(1));
    let m = es
        .member_chunk()
        .expect_err("odd chunk when mirrored")
        .to_string();
    assert!(
        m.contains("member chunk 1") && m.contains("pairing 2"),
        "{m}"
    );
    let es = ShardedES::new(lowrank(), 64, 0.1, 0.1, 8)
        .expect("valid")
        .with_member_chunk(Some(0));
    assert!(es.member_chunk().is_err());
}

#[test]
fn task_count_must_match_the_shaping() {
    let leaves = leaf_infos(&mlp_params(1));
    let es = ShardedES::new(lowrank(), 16, 0.1, 0.1, 1).expect("valid");
    let err = match es.generation_program(&Mlp::MULTI, &leaves) {
        Ok(_) => panic!("3 task losses accepted by centered_ranks"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains("3 task losses") && err.contains("group_relative"),
        "{err}"
    );
    let es = es.with_shaping(ShapingSpec::GroupRelative.build());
    let p = es
        .generation_program(&Mlp::MULTI, &leaves)
        .expect("group_relative takes task losses");
    assert_eq!(p.layout.tasks, 3);
}

#[test]
fn check_model_reports_raw_reads_and_unread_leaves() {
    let leaves = leaf_infos(&mlp_params(1));
    let t0 = Instant::now();
    let raw = check_model(
        &Mlp {
            raw_w1: true,
            ..Mlp::PLAIN
        },
        &leaves,
    )
    .expect("check runs");
    let w1 = raw.iter().find(|f| f.path == "w1").expect("w1 reported");
    assert!(
        w1.message.contains("without a seam") && w1.message.contains("nn::dense"),
        "{}",
        w1.message
    );
    let skip = check_model(
        &Mlp {
            skip_b1: true,
            ..Mlp::PLAIN
        },
        &leaves,
    )
    .expect("check runs");
    assert_eq!(skip.len(), 1, "{skip:?}");
    assert_eq!(skip[0].path, "b1");
    assert!(
        skip[0].message.contains("never read"),
        "{}",
        skip[0].message
    );
    assert!(check_model(&Mlp::PLAIN, &leaves).expect("check").is_empty());
    let tb = TransformerBlock::QUICKSTART;
    let tb_leaves = leaf_infos(&tb.init(key(0).expect("seed")).expect("init"));
    let t1 = Instant::now();
    let findings = check_model(&tb, &tb_leaves).expect("check runs");
    let tb_time = t1.elapsed();
    assert!(findings.is_empty(), "{findings:?}");
    let total = t0.elapsed();
    println!("check_model: transformer block {tb_time:?}, all four checks {total:?}");
    assert!(tb_time.as_secs_f64() < 0.5, "check_model took {tb_time:?}");
}

/// A user strategy: full-rank noise at half scale.
struct Halved;

impl Strategy for Halved {
    fn name(&self) -> String {
        "halved".into()
    }

    fn materialized(&self) -> bool {
        true
    }

    fn noise(&self, stream: &Keys, leaf: &LeafInfo, dirs: &Value) -> builder::Result<Noise> {
        match full_rank_noise(stream, leaf, dirs)? {
            Noise::Dense(e) => Ok(Noise::Dense(e.mul(&dirs.func().scalar(0.5f32)?)?)),
            other => Ok(other),
        }
    }
}

/// A user shaping: twice the raw fitness.
struct Doubled;

impl Shaping for Doubled {
    fn name(&self) -> String {
        "doubled".into()
    }

    fn weights(&self, fitness: &Value) -> builder::Result<Value> {
        fitness.mul(&fitness.func().scalar(2.0f32)?)
    }
}

#[test]
fn users_can_implement_strategy_and_shaping() {
    // Halved noise at σ evaluates exactly the members of IID noise at σ/2 (scaling by 0.5
    // is exact), and lr/(nσ)·Σ 2f·ε/2 is half of lr/(n·σ/2)·Σ f·ε: the update is half of
    // the built-in one (to 1e-6 relative: only the scale factors round differently).
    let (client, params, batch) = mlp_on_8_devices();
    let (n, sigma, lr) = (64, 0.1f32, 1.0f32);
    let custom = ShardedES::new(Box::new(Halved), n, sigma, lr, 8)
        .expect("valid")
        .with_shaping(Box::new(Doubled));
    let builtin = ShardedES::new(Box::new(IidGaussian), n, sigma / 2.0, lr, 8)
        .expect("valid")
        .with_shaping(Box::new(NoShaping));
    let a = one_generation(&client, &custom, &Mlp::PLAIN, &params, &batch);
    let b = one_generation(&client, &builtin, &Mlp::PLAIN, &params, &batch);
    assert_eq!(a.fitness, b.fitness, "same members");
    for (j, (ua, ub)) in a.update.iter().zip(&b.update).enumerate() {
        let half: Vec<f32> = ub.iter().map(|x| x / 2.0).collect();
        let e = rel_norm_diff(ua, &half);
        println!("leaf {j}: custom vs built-in/2 rel {e:.3e}");
        assert!(e <= 1e-6, "leaf {j}: {e:e}");
    }
    // And a user strategy is accepted by name-based plumbing too (spec → built-in).
    assert_eq!(
        from_spec(&"lowrank(r=2)".parse().expect("spec")).name(),
        "lowrank(r=2)"
    );
}

#[test]
fn default_member_chunk_keeps_a_chunk_within_the_activation_budget() {
    let mirrored = || -> Box<dyn Strategy> { Box::new(Mirrored(lowrank())) };
    let chunk = |n: usize, devices: usize, bytes: Option<usize>| {
        ShardedES::new(mirrored(), n, 0.1, 0.1, devices)
            .expect("valid")
            .with_member_bytes(bytes)
            .member_chunk()
            .expect("a default chunk always divides")
    };
    // Unknown size: the fixed cap.
    assert_eq!(chunk(256, 8, None), DEFAULT_MEMBER_CHUNK);
    // The quickstart's 64 KiB per member: 8 members fill CHUNK_BYTES.
    let quickstart = TransformerBlock::QUICKSTART.member_bytes();
    assert_eq!(quickstart, Some(64 * 1024));
    assert_eq!(chunk(256, 8, quickstart), CHUNK_BYTES / (64 * 1024));
    assert_eq!(chunk(16384, 8, quickstart), 8);
    // The same chunk on 1..8 devices (the bit-identity guarantee depends on it).
    for devices in [1, 2, 4, 8] {
        assert_eq!(chunk(256, devices, quickstart), 8, "{devices} devices");
    }
    // Tiny members: the fixed cap still applies. Huge members: two directions (two
    // mirrored pairs) at a time.
    assert_eq!(chunk(256, 8, Some(16)), DEFAULT_MEMBER_CHUNK);
    assert_eq!(chunk(256, 8, Some(CHUNK_BYTES * 4)), 4);
    assert_eq!(
        chunk(16, 8, Some(CHUNK_BYTES * 4)),
        2,
        "only 2 members per device"
    );
    // Zero bytes means unknown, not an unbounded chunk.
    assert_eq!(chunk(256, 8, Some(0)), DEFAULT_MEMBER_CHUNK);
    // An explicit chunk wins over the budget.
    let es = ShardedES::new(mirrored(), 256, 0.1, 0.1, 8)
        .expect("valid")
        .with_member_bytes(quickstart)
        .with_member_chunk(Some(32));
    assert_eq!(es.member_chunk().expect("valid"), 32);
}

#[test]
fn tell_regenerates_as_many_directions_as_fit_its_noise_budget() {
    let leaves = leaf_infos(
        &TransformerBlock::QUICKSTART
            .init(key(0).expect("seed"))
            .expect("init"),
    );
    // One direction per evaluation chunk, so the noise budget decides.
    let es = |s: Box<dyn Strategy>| {
        ShardedES::new(s, 256, 0.1, 0.1, 8)
            .expect("valid")
            .with_member_chunk(Some(2))
    };
    // Low rank: r (m + k) elements per 2-D leaf, 6 leaves of 64 × 64 at r = 2.
    let low = es(Box::new(Mirrored(Box::new(LowRank { r: 2 }))));
    let per_dir = 4 * 6 * 2 * (64 + 64);
    assert_eq!(
        leaves
            .iter()
            .map(|l| low.strategy().noise_elements(l))
            .sum::<usize>()
            * 4,
        per_dir
    );
    // 64 KiB / 6 KiB = 10 directions at most: the largest divisor of 16 (or 2^20) is 8.
    assert_eq!(TELL_CHUNK_BYTES / per_dir, 10);
    assert_eq!(low.tell_chunk(&leaves, 16), 8);
    assert_eq!(low.tell_chunk(&leaves, 1 << 20), 8);
    assert_eq!(low.tell_chunk(&leaves, 5), 5);
    // An evaluation chunk of 32 mirrored members holds 16 directions: tell takes 16.
    let low_wide = es(Box::new(Mirrored(Box::new(LowRank { r: 2 })))).with_member_chunk(Some(32));
    assert_eq!(low_wide.tell_chunk(&leaves, 64), 16);
    // Dense noise: the leaf's size. Above the budget, one direction per step.
    let dense = es(Box::new(SeedRegenerated { chunk: None })).with_member_chunk(Some(1));
    let big = [LeafInfo {
        index: 0,
        path: "w".into(),
        shape: vec![1024, 1024],
    }];
    assert_eq!(dense.strategy().noise_elements(&big[0]), 1 << 20);
    assert_eq!(dense.tell_chunk(&big, 12), 1);
    assert_eq!(dense.tell_chunk(&leaves, 12), 1);
    let small = [LeafInfo {
        index: 0,
        path: "b".into(),
        shape: vec![1024],
    }];
    // 4 KiB per direction: 16 fit.
    assert_eq!(dense.tell_chunk(&small, 48), 16);
    // Never fewer directions than an evaluation chunk holds (16 members, unpaired).
    let wide = dense.with_member_chunk(Some(16));
    assert_eq!(wide.tell_chunk(&big, 48), 16);
    assert_eq!(wide.tell_chunk(&big, 12), 12);
}

#[test]
fn how_b_keeps_the_noise_of_apply_for_tell_within_its_budget() {
    let tb = TransformerBlock::QUICKSTART;
    let leaves = leaf_infos(&tb.init(key(0).expect("seed")).expect("init"));
    let es = |how: How, bytes: usize| {
        ShardedES::new(
            Box::new(Mirrored(Box::new(LowRank { r: 1 }))),
            256,
            0.1,
            0.1,
            8,
        )
        .expect("valid")
        .with_how(how)
        .with_keep_noise_bytes(bytes)
    };
    // 16 directions per device × 6 leaves × (64 + 64) × 4 bytes = 48 KiB.
    let per_device = 16 * 6 * (64 + 64) * 4;
    assert!(es(How::B, KEEP_NOISE_BYTES).keeps_noise(&leaves));
    assert!(es(How::B, per_device).keeps_noise(&leaves));
    assert!(!es(How::B, per_device - 1).keeps_noise(&leaves));
    assert!(!es(How::B, 0).keeps_noise(&leaves));
    // how = A contracts every member on every device: nothing local to keep.
    assert!(!es(How::A, KEEP_NOISE_BYTES).keeps_noise(&leaves));
    // Kept, `tell` draws nothing: the program has fewer threefry loops (one `while` each).
    let whiles = |e: ShardedES| {
        e.generation_program(&tb, &leaves)
            .expect("program")
            .module
            .to_mlir()
            .matches("stablehlo.while")
            .count()
    };
    let (kept, regenerated) = (whiles(es(How::B, per_device)), whiles(es(How::B, 0)));
    assert!(
        kept < regenerated,
        "{kept} loops kept, {regenerated} regenerated"
    );
}
