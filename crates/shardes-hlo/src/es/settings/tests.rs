use super::*;

fn spec_json(body: &str) -> Result<EsSpec, String> {
    serde_json::from_str(body).map_err(|e| e.to_string())
}

/// `(message, fix)` of a build error.
fn build_err(spec: &EsSpec, devices: usize) -> (String, String) {
    let e = spec.build(devices).expect_err("invalid settings");
    (e.message(), e.fix().expect("a fix"))
}

#[test]
fn es_spec_refuses_what_the_program_cannot_run_before_building_it() {
    let mut s = EsSpec::new(32, 0.01, 0.01);
    // A chunk that does not divide the 4 members per device on 8 devices.
    s.member_chunk = Some(3);
    let (m, fix) = build_err(&s, 8);
    assert!(m.starts_with("es.member_chunk: member chunk 3"), "{m}");
    assert!(fix.contains("divisor of 4"), "{fix}");
    // The strategy's own chunk is checked the same way, naming es.strategy.
    let mut s = EsSpec::new(32, 0.01, 0.01);
    s.strategy = "seed_regenerated(chunk=1000000)".parse().unwrap();
    let (m, _) = build_err(&s, 2);
    assert!(m.starts_with("es.strategy: member chunk 1000000"), "{m}");
    // A subnormal sigma is flushed to zero by XLA: refused.
    let (m, fix) = build_err(&EsSpec::new(32, 1e-45, 0.01), 2);
    assert!(
        m.contains("es.sigma = 1e-45 is too small for float32"),
        "{m}"
    );
    assert!(fix.contains("es.sigma"), "{fix}");
    // lr/(n·sigma) overflowing f32.
    let (m, fix) = build_err(&EsSpec::new(32, 1e-37, 1e30), 2);
    assert!(m.contains("overflows float32"), "{m}");
    assert_eq!(fix, "raise es.sigma or lower es.lr");
    // The library names the numbers without the section.
    let e = ShardedES::new(from_spec(&default_strategy()), 32, 1e-45, 0.01, 2)
        .expect_err("subnormal sigma");
    assert!(e.message().starts_with("sigma = 1e-45 is too small"), "{e}");
    // Member ids are i32 in the program.
    let n = (i32::MAX as usize + 1) * 2;
    let (m, _) = build_err(&EsSpec::new(n, 0.01, 0.01), 1);
    assert!(m.contains("exceeds the program's 32-bit member ids"), "{m}");
}

#[test]
fn es_spec_reads_the_es_section_with_its_defaults() {
    let s = spec_json(r#"{"n": 256, "sigma": 0.01, "lr": 0.02}"#).unwrap();
    assert_eq!(s, EsSpec::new(256, 0.01, 0.02));
    assert_eq!(s.strategy.to_string(), "mirrored(lowrank(r=1))");
    assert_eq!(s.shaping, ShapingSpec::CenteredRanks);
    assert_eq!(s.how, How::B);
    assert_eq!((s.member_chunk, s.keep_noise_mib), (None, None));
    assert_eq!(s.keep_noise_bytes(), KEEP_NOISE_BYTES);
    let s = spec_json(
        r#"{"strategy": "seed_regenerated(chunk=4)", "n": 64, "sigma": 0.1, "lr": 1.0,
            "shaping": "group_relative", "how": "a", "member_chunk": 8,
            "keep_noise_mib": 4}"#,
    )
    .unwrap();
    assert_eq!(s.strategy, StrategySpec::SeedRegenerated { chunk: Some(4) });
    assert_eq!(s.shaping, ShapingSpec::GroupRelative);
    assert_eq!(s.how, How::A);
    assert_eq!(s.member_chunk, Some(8));
    assert_eq!(s.keep_noise_bytes(), 4 << 20);
    // Written back as a config writes it, and read again to the same settings.
    let text = serde_json::to_string(&s).unwrap();
    assert_eq!(
        text,
        r#"{"strategy":"seed_regenerated(chunk=4)","n":64,"sigma":0.1,"lr":1.0,"shaping":"group_relative","how":"A","member_chunk":8,"keep_noise_mib":4}"#
    );
    assert_eq!(spec_json(&text).unwrap(), s);
}

#[test]
fn es_spec_refuses_unknown_keys_and_names() {
    let e = spec_json(r#"{"n": 8, "sigma": 0.1, "lr": 0.1, "sigmaa": 1}"#).unwrap_err();
    assert!(e.contains("unknown field `sigmaa`"), "{e}");
    let e = spec_json(r#"{"n": 8, "sigma": 0.1, "lr": 0.1, "how": "C"}"#).unwrap_err();
    assert!(e.contains("unknown placement \"C\"; use \"B\""), "{e}");
    let e = spec_json(r#"{"n": 8, "sigma": 0.1, "lr": 0.1, "shaping": "rank"}"#).unwrap_err();
    assert!(
        e.contains("unknown shaping \"rank\" (valid: centered_ranks, centered"),
        "{e}"
    );
    let e = spec_json(r#"{"n": 8, "sigma": 0.1, "lr": 0.1, "strategy": "lowrnk"}"#).unwrap_err();
    assert!(e.contains("invalid strategy \"lowrnk\""), "{e}");
    let e = spec_json(r#"{"sigma": 0.1, "lr": 0.1}"#).unwrap_err();
    assert!(e.contains("missing field `n`"), "{e}");
}

#[test]
fn es_spec_builds_the_es_it_describes() {
    let mut s = EsSpec::new(64, 0.1, 0.5);
    s.shaping = ShapingSpec::Centered;
    s.how = How::A;
    s.member_chunk = Some(4);
    s.keep_noise_mib = Some(0);
    let es = s.build(8).unwrap();
    assert_eq!(
        (es.n(), es.devices(), es.sigma(), es.lr()),
        (64, 8, 0.1, 0.5)
    );
    assert_eq!(es.strategy().name(), "mirrored(lowrank(r=1))");
    assert_eq!(es.shaping().name(), "centered");
    assert_eq!(es.how(), How::A);
    assert_eq!(es.member_chunk().unwrap(), 4);
    assert_eq!(es.keep_noise_bytes, 0);
}

#[test]
fn es_spec_errors_name_the_config_key() {
    let spec = |n: usize, sigma: f32, lr: f32| EsSpec::new(n, sigma, lr);
    assert_eq!(
        build_err(&spec(30, 0.01, 0.01), 2),
        (
            "es.n = 30 is not divisible by devices (2) × pairing (2 for \
             mirrored(lowrank(r=1)))"
                .into(),
            "set es.n to a multiple of 4, e.g. 28 or 32".into()
        )
    );
    assert_eq!(
        build_err(&spec(0, 0.01, 0.01), 2),
        ("es.n = 0".into(), "set es.n to at least 1".into())
    );
    assert_eq!(
        build_err(&spec(8, -1.0, 0.01), 2),
        (
            "es.sigma = -1 is not a finite number > 0".into(),
            "set es.sigma to a small positive number, e.g. 0.01".into()
        )
    );
    assert_eq!(
        build_err(&spec(8, 0.01, f32::INFINITY), 2),
        (
            "es.lr = inf is not finite".into(),
            "set es.lr to a finite number, e.g. 0.01".into()
        )
    );
    let mut chunk = spec(8, 0.01, 0.01);
    chunk.member_chunk = Some(0);
    assert_eq!(
        build_err(&chunk, 2),
        (
            "es.member_chunk = 0".into(),
            "set es.member_chunk to at least 1".into()
        )
    );
    assert_eq!(
        build_err(&spec(8, 0.01, 0.01), 0),
        ("devices = 0".into(), "set devices to at least 1".into())
    );
}

#[test]
fn the_library_keeps_its_own_names_for_the_same_checks() {
    let lowrank = || from_spec(&StrategySpec::LowRank { r: 1 });
    let err = |r: Result<ShardedES, EsError>| {
        let e = r.expect_err("invalid");
        (e.message(), e.fix().expect("a fix"))
    };
    assert_eq!(
        err(ShardedES::new(lowrank(), 30, 0.1, 0.1, 8)),
        (
            "n = 30 is not a positive multiple of devices (8) × pairing (1)".into(),
            "set n to a multiple of 8, e.g. 24 or 32".into()
        )
    );
    assert_eq!(
        err(ShardedES::new(lowrank(), 16, 0.0, 0.1, 1)),
        (
            "sigma = 0 is not finite and > 0".into(),
            "set sigma to a small positive number such as 0.01".into()
        )
    );
    assert_eq!(
        err(ShardedES::new(lowrank(), 16, 0.1, f32::NAN, 1)),
        (
            "lr = NaN is not finite".into(),
            "set lr to a finite number such as 0.01".into()
        )
    );
    assert_eq!(
        err(ShardedES::new(lowrank(), 16, 0.1, 0.1, 0)),
        ("devices = 0".into(), "use at least 1 device".into())
    );
}

#[test]
fn with_several_numbers_wrong_each_front_end_reports_the_one_it_always_has() {
    let (m, _) = build_err(&EsSpec::new(30, -1.0, 0.01), 2);
    assert_eq!(m, "es.sigma = -1 is not a finite number > 0");
    let lowrank = from_spec(&StrategySpec::LowRank { r: 1 });
    let e = ShardedES::new(lowrank, 30, -1.0, 0.1, 8).expect_err("invalid");
    assert!(e.message().starts_with("n = 30"), "{e}");
}

#[test]
fn suggested_populations_are_two_distinct_multiples() {
    // Below one multiple (issue #15 saw "e.g. 4 or 4"), at zero, and between two.
    assert_eq!(nearby_multiples(1, 4), (4, 8));
    assert_eq!(nearby_multiples(3, 4), (4, 8));
    assert_eq!(nearby_multiples(0, 4), (4, 8));
    assert_eq!(nearby_multiples(30, 4), (28, 32));
    assert_eq!(nearby_multiples(31, 2), (30, 32));
    for per in 1..10 {
        for n in 0..50 {
            let (lo, hi) = nearby_multiples(n, per);
            assert!(lo < hi && lo % per == 0 && hi % per == 0, "{n} {per}");
        }
    }
    let (_, fix) = build_err(&EsSpec::new(1, 0.01, 0.01), 2);
    assert_eq!(fix, "set es.n to a multiple of 4, e.g. 4 or 8");
}

/// A model that only reports its member size (and how its chunk is sized).
struct Sized(Option<usize>, crate::es::ChunkPolicy);

impl Model for Sized {
    fn batch_types(&self) -> Vec<(String, crate::builder::TensorType)> {
        Vec::new()
    }

    fn loss(
        &self,
        _: &crate::es::ModelParams,
        _: &[crate::builder::Value],
    ) -> Result<crate::nn::Act, EsError> {
        Err(invalid("unused".into(), "unused".into()))
    }

    fn member_bytes(&self) -> Option<usize> {
        self.0
    }

    fn chunk_policy(&self) -> crate::es::ChunkPolicy {
        self.1
    }
}

/// A fused-program model of `bytes` of activation per member.
fn cached(bytes: Option<usize>) -> Sized {
    Sized(bytes, crate::es::ChunkPolicy::Cache)
}

/// A decode-like model: `bytes` of working set per member, chunks within `budget`.
fn batched(bytes: usize, budget: usize) -> Sized {
    Sized(Some(bytes), crate::es::ChunkPolicy::Batch { bytes: budget })
}

#[test]
fn programs_take_the_member_size_from_the_model_unless_one_is_set() {
    let es = || EsSpec::new(256, 0.1, 0.1).build(8).unwrap();
    let quickstart = cached(Some(64 * 1024));
    // No size set: the model's (8 members of 64 KiB fill CHUNK_BYTES).
    assert_eq!(es().member_chunk().unwrap(), DEFAULT_MEMBER_CHUNK);
    assert_eq!(es().member_chunk_for(&quickstart).unwrap(), 8);
    assert_eq!(es().member_chunk_for(&cached(None)).unwrap(), 32);
    assert_eq!(es().member_chunk_for(&cached(Some(0))).unwrap(), 32);
    // A size set on the ES wins over the model's.
    let set = es().with_member_bytes(Some(CHUNK_BYTES * 4));
    assert_eq!(set.member_chunk_for(&quickstart).unwrap(), 4);
    // tell sizes its chunk after the evaluation chunk it is given.
    let leaves = [LeafInfo {
        index: 0,
        path: "w".into(),
        shape: vec![1024, 1024],
    }];
    let mut dense = EsSpec::new(256, 0.1, 0.1);
    dense.strategy = StrategySpec::SeedRegenerated { chunk: None };
    dense.member_chunk = Some(32);
    let dense = dense.build(8).unwrap();
    // 4 MiB of noise per direction: over TELL_CHUNK_BYTES, so the evaluation chunk's
    // 32 directions decide, or one direction without it.
    assert_eq!(dense.tell_chunk_after(&leaves, 64, Some(32)), 32);
    assert_eq!(dense.tell_chunk_after(&leaves, 64, None), 1);
    assert_eq!(dense.tell_chunk(&leaves, 64), 32);
}

#[test]
fn a_batched_model_takes_every_local_member_that_fits_its_memory() {
    let es = |n: usize, devices: usize| EsSpec::new(n, 0.1, 0.1).build(devices).unwrap();
    // n = 16 on one device: all 16 members in one chunk (the cache policy gives 2, n / 8).
    assert_eq!(es(16, 1).member_chunk_for(&cached(Some(1024))).unwrap(), 2);
    assert_eq!(
        es(16, 1).member_chunk_for(&batched(1024, 1 << 30)).unwrap(),
        16
    );
    // On 8 devices each holds 2.
    assert_eq!(
        es(16, 8).member_chunk_for(&batched(1024, 1 << 30)).unwrap(),
        2
    );
    // Memory decides: 5 members of 100 fit 512, so the largest mirrored divisor of 16
    // within it, 4.
    assert_eq!(es(16, 1).member_chunk_for(&batched(100, 512)).unwrap(), 4);
    // Never below the pairing, even when one member alone is over the budget.
    assert_eq!(es(16, 1).member_chunk_for(&batched(1000, 512)).unwrap(), 2);
    // Device invariant: a divisor of n / 8 again, the same chunk on 1 and 8 devices.
    let inv = |devices: usize| es(16, devices).with_device_invariant(true);
    assert_eq!(inv(1).member_chunk_for(&batched(1024, 1 << 30)).unwrap(), 2);
    assert_eq!(inv(8).member_chunk_for(&batched(1024, 1 << 30)).unwrap(), 2);
    // A chunk that is set wins.
    let mut set = EsSpec::new(16, 0.1, 0.1);
    set.member_chunk = Some(8);
    let set = set.build(1).unwrap();
    assert_eq!(set.member_chunk_for(&batched(1024, 1 << 30)).unwrap(), 8);
    // The config key reaches the ES.
    let mut spec = EsSpec::new(16, 0.1, 0.1);
    spec.device_invariant = true;
    assert!(spec.build(1).unwrap().device_invariant());
}
