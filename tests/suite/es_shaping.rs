//! The emitted shapings (`shaping_function` compiled and run on the CPU plugin) against the
//! host reference in `tests/support/shaping.rs`, and the mirrored zero-update property.
//!
//! Tolerances: centered_ranks and none are bit-exact; centered and group_relative agree to
//! 1e-6 × max|w| (a reduction's summation order is XLA's); "contributes exactly 0" and
//! "exactly zero update" are bitwise.

use crate::support::shaping as host;
use crate::support::tiny::{mlp_on_8_devices, one_generation, Constant};
use shardes::hlo::builder::{DType, Module, TensorType};
use shardes::hlo::es::shaping::{
    shaping_function, Centered, CenteredRanks, GroupRelative, NoShaping, Shaping, ShapingSpec,
};
use shardes::hlo::es::strategy::from_spec;
use shardes::hlo::es::ShardedES;
use shardes::hlo::prng::{key, normal};
use shardes::runtime::{Client, CompileOptions};

/// Runs `shaping` on `fitness` (shape `dims`) through XLA.
fn emitted(client: &Client, shaping: &dyn Shaping, fitness: &[f32], dims: &[usize]) -> Vec<f32> {
    let ty = TensorType::f32(&dims.iter().map(|&d| d as i64).collect::<Vec<_>>());
    let func = shaping_function(shaping, ty).expect("shaping emits");
    let mut m = Module::new("shaping");
    m.add(func).expect("add");
    let text = m.to_mlir();
    let exe = client
        .compile(&text, &CompileOptions::new(1))
        .unwrap_or_else(|e| panic!("compile {}: {e}\n{text}", shaping.name()));
    let arg = client.buffer_from_host(fitness, dims, 0).expect("upload");
    let mut outs = exe.execute(&[vec![&arg]]).expect("execute");
    outs.remove(0).remove(0).to_host::<f32>().expect("download")
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn close(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let scale = want
        .iter()
        .fold(0.0f32, |a, b| a.max(b.abs()))
        .max(f32::MIN_POSITIVE);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-6 * scale,
            "{what}[{i}]: got {g}, want {w} (tol 1e-6 × {scale})"
        );
    }
}

#[test]
fn centered_ranks_midranks_nan_and_small_n_are_bit_exact() {
    let client = Client::cpu(1).expect("CPU client");
    let cases: Vec<Vec<f32>> = vec![
        // ties of 2 and 3, shuffled
        vec![3.0, 1.0, 3.0, 2.0, 1.0, 3.0, 5.0],
        // NaN ranks as the worst (ties with +inf and with each other)
        vec![f32::NAN, 1.0, 2.0, f32::NAN, 0.0, f32::INFINITY],
        // -0.0 and +0.0 are tied by value
        vec![0.0, -0.0, 1.0, -1.0],
        // all tied: every weight is the same
        vec![4.0; 9],
        vec![2.5, -7.0],
        vec![42.0],
    ];
    for f in &cases {
        let got = emitted(&client, &CenteredRanks, f, &[f.len()]);
        let want = host::centered_ranks(f);
        assert_eq!(
            bits(&got),
            bits(&want),
            "centered_ranks({f:?}): {got:?} vs {want:?}"
        );
    }
    // The NaN case explicitly: both NaNs share the top midrank with +inf ((3+4+5)/3 = 4).
    let nan = &cases[1];
    let w = emitted(&client, &CenteredRanks, nan, &[nan.len()]);
    assert_eq!(w[0], w[3]);
    assert_eq!(w[0], w[5]);
    assert_eq!(w[0], 4.0 * (1.0 / 5.0f32) - 0.5);
    assert_eq!(emitted(&client, &CenteredRanks, &[42.0], &[1]), vec![0.0]);
    // A larger population with injected ties, bit-exact.
    let mut big = normal(key(5).expect("seed"), &[256]).expect("normal");
    for i in (0..256).step_by(7) {
        big[i] = big[(i * 3) % 256];
    }
    big[17] = f32::NAN;
    let got = emitted(&client, &CenteredRanks, &big, &[256]);
    assert_eq!(bits(&got), bits(&host::centered_ranks(&big)));
}

#[test]
fn centered_and_none_match_the_reference() {
    let client = Client::cpu(1).expect("CPU client");
    let f = normal(key(6).expect("seed"), &[33]).expect("normal");
    close(
        "centered",
        &emitted(&client, &Centered, &f, &[33]),
        &host::centered(&f),
    );
    assert_eq!(
        bits(&emitted(&client, &NoShaping, &f, &[33])),
        bits(&host::none(&f))
    );
    // n < 2: centered and none return f.
    assert_eq!(emitted(&client, &Centered, &[3.5], &[1]), vec![3.5]);
    assert_eq!(emitted(&client, &NoShaping, &[3.5], &[1]), vec![3.5]);
    // n = 2 is already centered: mean -2.25, w = (f - mean) · 2/1, every step exact in f32.
    let two = [2.5f32, -7.0];
    assert_eq!(host::centered(&two), vec![9.5, -9.5]);
    assert_eq!(emitted(&client, &Centered, &two, &[2]), vec![9.5, -9.5]);
}

#[test]
fn group_relative_of_a_vector_is_a_single_task() {
    // Fitness f32[n] is accepted as f32[n, 1].
    let client = Client::cpu(1).expect("CPU client");
    let n = 10;
    let f = normal(key(9).expect("seed"), &[n]).expect("normal");
    let got = emitted(&client, &GroupRelative, &f, &[n]);
    close(
        "group_relative f32[n]",
        &got,
        &host::group_relative(&f, n, 1),
    );
    assert_eq!(
        bits(&got),
        bits(&emitted(&client, &GroupRelative, &f, &[n, 1])),
        "f32[n] and f32[n, 1] must give the same weights"
    );
}

#[test]
fn shapings_are_found_by_their_config_names() {
    // The spec's four names; each shaping reports its own name, and only group_relative
    // takes several fitness columns (`tasks() = None`: any g).
    for name in ["centered_ranks", "centered", "group_relative", "none"] {
        let s = name
            .parse::<ShapingSpec>()
            .unwrap_or_else(|e| panic!("{name} is a spec shaping: {e}"))
            .build();
        assert_eq!(s.name(), name);
        let tasks = if name == "group_relative" {
            None
        } else {
            Some(1)
        };
        assert_eq!(s.tasks(), tasks, "{name}: tasks");
    }
    assert_eq!(CenteredRanks.name(), "centered_ranks");
    assert_eq!(Centered.name(), "centered");
    assert_eq!(GroupRelative.name(), "group_relative");
    assert_eq!(NoShaping.name(), "none");
    assert!("ranks".parse::<ShapingSpec>().is_err());
    assert!("".parse::<ShapingSpec>().is_err());
}

#[test]
fn fitness_other_than_f32_is_refused_before_anything_runs() {
    // Spec guarantee 3 (narrower than f32) and the shapings' contract (f32 only): emitting
    // the shaping fails, for the one-column shape and, for group_relative, [n, g] too.
    for name in ["centered_ranks", "centered", "group_relative", "none"] {
        let s = name.parse::<ShapingSpec>().expect("spec shaping").build();
        for dtype in [DType::BF16, DType::F16, DType::F64] {
            let ty = TensorType::new(dtype, &[4]);
            assert!(
                shaping_function(&*s, ty.clone()).is_err(),
                "{name} accepted {ty}"
            );
        }
        assert!(
            shaping_function(&*s, TensorType::f32(&[4])).is_ok(),
            "{name} refused f32[4]"
        );
    }
    for dtype in [DType::BF16, DType::F16, DType::F64] {
        for ty in [
            TensorType::new(dtype, &[4, 3]),
            TensorType::new(dtype, &[4]),
        ] {
            // Refused by the shaping itself, not by a later op's type mismatch.
            match shaping_function(&GroupRelative, ty.clone()) {
                Ok(_) => panic!("group_relative accepted {ty}"),
                Err(e) => assert!(
                    e.to_string().contains("shaping group_relative"),
                    "group_relative on {ty}: {e}"
                ),
            }
        }
    }
    // The one-column shapings refuse [n, g] fitness.
    for s in [&CenteredRanks as &dyn Shaping, &Centered, &NoShaping] {
        assert!(
            shaping_function(s, TensorType::f32(&[4, 3])).is_err(),
            "{} accepted f32[4, 3]",
            s.name()
        );
    }
}

#[test]
fn group_relative_zero_spread_task_contributes_exactly_zero() {
    let client = Client::cpu(1).expect("CPU client");
    let (n, g) = (12, 3);
    let base = normal(key(8).expect("seed"), &[n * g]).expect("normal");
    let with_const = |c: f32| -> Vec<f32> {
        let mut f = base.clone();
        for i in 0..n {
            f[i * g + 1] = c;
        }
        f
    };
    let a = with_const(2.0);
    let got = emitted(&client, &GroupRelative, &a, &[n, g]);
    close("group_relative", &got, &host::group_relative(&a, n, g));
    // Task 1 has zero spread: its value cannot matter, bit for bit.
    let b = with_const(-1.0e6);
    assert_eq!(
        bits(&got),
        bits(&emitted(&client, &GroupRelative, &b, &[n, g])),
        "a zero-spread task changed the weights"
    );
    // Every task constant: all weights exactly 0 (no NaN from 0/0).
    let flat = vec![3.0f32; n * g];
    let w = emitted(&client, &GroupRelative, &flat, &[n, g]);
    assert!(w.iter().all(|x| x.to_bits() == 0), "got {w:?}");
}

#[test]
fn mirrored_with_uniform_fitness_gives_an_exactly_zero_update() {
    let (client, params, batch) = mlp_on_8_devices();
    for (strat, shaping) in [
        ("mirrored(lowrank(r=1))", "centered_ranks"),
        ("mirrored(iid_gaussian)", "none"),
        ("mirrored(seed_regenerated(chunk=4))", "centered"),
    ] {
        let es = ShardedES::new(from_spec(&strat.parse().expect("spec")), 64, 0.1, 1.0, 8)
            .expect("valid")
            .with_shaping(shaping.parse::<ShapingSpec>().expect("shaping").build());
        let g = one_generation(&client, &es, &Constant, &params, &batch);
        assert!(
            g.fitness.iter().all(|&f| f == 1.5),
            "{strat}: constant loss"
        );
        for (j, u) in g.update.iter().enumerate() {
            assert!(
                u.iter().all(|x| *x == 0.0),
                "{strat}/{shaping}: leaf {j} moved under uniform fitness: {:?}",
                &u[..u.len().min(4)]
            );
        }
    }
    // Without mirroring the same uniform fitness does move the parameters under `none`
    // (Σ 1.5 ε ≠ 0), so the check above can fail.
    let es = ShardedES::new(
        from_spec(&"iid_gaussian".parse().expect("spec")),
        64,
        0.1,
        1.0,
        8,
    )
    .expect("valid")
    .with_shaping(Box::new(NoShaping));
    let g = one_generation(&client, &es, &Constant, &params, &batch);
    assert!(g.update.iter().any(|u| u.iter().any(|x| *x != 0.0)));
}

#[test]
fn emitted_centered_ranks_reproduce_jax_weights_of_the_quickstart() {
    let client = Client::cpu(1).expect("CPU client");
    let file = shardes::io::SafetensorsFile::open(crate::support::shared(
        "testdata/quickstart_gen0.safetensors",
    ))
    .expect("test data");
    let fit = file.f32("fitness").expect("fitness");
    let want = file.f32("weights").expect("weights");
    let got = emitted(&client, &CenteredRanks, fit.data(), &[fit.len()]);
    let differ = got
        .iter()
        .zip(want.data())
        .filter(|(a, b)| a.to_bits() != b.to_bits())
        .count();
    println!(
        "emitted centered_ranks: {differ} of {} weights differ from JAX's",
        got.len()
    );
    assert_eq!(differ, 0, "emitted weights differ from JAX's");
}
