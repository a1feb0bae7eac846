//! The benchmark engine and the "several generations per dispatch" lever.
//!
//! - `k` generations inside one executable must leave the same parameters as `k` single
//!   dispatches (≤ 1e-6 relative in norm per leaf; the programs are the same per-generation
//!   computation, so any difference is XLA fusing differently around the loop);
//! - the bench runs on a tiny configuration and its JSON report has every field.

use crate::support::rel_norm_diff;
use shardes::bench::{self, BenchInput, BenchOptions, Flops};
use shardes::hlo::es::strategy::{LowRank, Mirrored, SeedRegenerated};
use shardes::hlo::es::{How, ShardedES, Strategy};
use shardes::hlo::prng::{fold_in, key};
use shardes::hlo::problems::transformer_block::TransformerBlock;
use shardes::population::Start;
use shardes::runtime::Client;
use shardes::Trainer;

const TINY: TransformerBlock = TransformerBlock {
    d_model: 16,
    batch: 2,
    seq: 4,
};

fn es(strategy: Box<dyn Strategy>, devices: usize) -> ShardedES {
    ShardedES::new(strategy, 32, 0.05, 0.05, devices)
        .unwrap()
        .with_member_chunk(Some(4))
}

fn multi_matches_single(strategy: fn() -> Box<dyn Strategy>, devices: usize) {
    let client = Client::cpu(devices).unwrap();
    let k0 = key(3).unwrap();
    let params = TINY.init(k0).unwrap();
    let b = TINY.make_batch(fold_in(k0, 1)).unwrap();
    let batch = [b.x, b.target];
    let steps = 3;
    let es1 = es(strategy(), devices);
    let mut single = Trainer::with_state(&client, &es1, &TINY, &params, k0, &batch, 5).unwrap();
    let mut last_single = Vec::new();
    for _ in 0..steps {
        last_single = single.step().unwrap();
    }
    let start = Start {
        key: k0,
        batch: &batch,
        generation: 5,
    };
    let mut multi =
        Trainer::with_generations_per_dispatch(&client, &es1, &TINY, &params, start, steps)
            .unwrap();
    let last_multi = multi.step().unwrap();
    assert_eq!(single.generation(), 5 + steps as u32);
    assert_eq!(multi.generation(), single.generation());
    let e = rel_norm_diff(&last_single, &last_multi);
    assert!(e <= 1e-6, "last fitness differs by {e:e}");
    let (ps, pm) = (single.params().unwrap(), multi.params().unwrap());
    let p0 = params.leaves();
    for (((path, a), (_, b)), (_, a0)) in ps.leaves().into_iter().zip(pm.leaves()).zip(&p0) {
        // The state must actually have moved, or equality says nothing.
        assert!(
            rel_norm_diff(a.data(), a0.data()) > 1e-4,
            "{path} did not change"
        );
        let e = rel_norm_diff(a.data(), b.data());
        println!("{path}: multi vs single rel norm diff {e:e}");
        assert!(
            e <= 1e-6,
            "{path}: {steps} generations per dispatch differ by {e:e}"
        );
    }
    // The multi trainer keeps going from where it is: a second dispatch = 3 more steps.
    for _ in 0..steps {
        single.step().unwrap();
    }
    multi.step_many(steps).unwrap();
    for ((path, a), (_, b)) in single
        .params()
        .unwrap()
        .leaves()
        .into_iter()
        .zip(multi.params().unwrap().leaves())
    {
        let e = rel_norm_diff(a.data(), b.data());
        assert!(e <= 1e-6, "{path} after 6 generations differs by {e:e}");
    }
    assert!(multi.step_many(2).is_err(), "2 is not a multiple of 3");
}

#[test]
fn several_generations_per_dispatch_match_single_steps_low_rank() {
    multi_matches_single(|| Box::new(Mirrored(Box::new(LowRank { r: 2 }))), 4);
}

#[test]
fn several_generations_per_dispatch_match_single_steps_dense_one_device() {
    multi_matches_single(|| Box::new(SeedRegenerated { chunk: None }), 1);
}

#[test]
fn bench_runs_on_a_tiny_config_and_reports_every_field() {
    let client = Client::cpu(2).unwrap();
    let k0 = key(0).unwrap();
    let params = TINY.init(k0).unwrap();
    let b = TINY.make_batch(fold_in(k0, 1)).unwrap();
    let batch = [b.x, b.target];
    let mk = |how| es(Box::new(Mirrored(Box::new(LowRank { r: 1 }))), 2).with_how(how);
    let (ea, eb) = (mk(How::A), mk(How::B));
    let rank = bench::noise_rank(&eb).unwrap();
    assert_eq!(rank, Some(1));
    let flops = Flops::transformer_block(&TINY, &eb, rank).unwrap();
    assert!(flops.generation > 0.0 && flops.inference > 0.0);
    let input = BenchInput {
        client: &client,
        variants: vec![&ea, &eb],
        model: &TINY,
        params: &params,
        key: k0,
        batch: &batch,
        flops: Some(flops),
    };
    let opts = BenchOptions {
        warmup: 1,
        rounds: 3,
        generations_per_dispatch: 2,
        overhead_dispatches: 20,
        gemm_size: 64,
    };
    let mut calls = 0;
    let report = bench::run(&input, &opts, &mut |_, _, _| calls += 1).unwrap();
    assert!(calls > 0, "no progress reported");
    let json = serde_json::to_value(&report).unwrap();
    for field in [
        "n",
        "devices",
        "member_chunk",
        "strategy",
        "rounds",
        "variants",
        "inference_emit_ms",
        "inference_compile_ms",
        "inference_ms",
        "inference_gflops",
        "apply_ms",
        "flops",
        "gemm_peak_gflops",
        "host_overhead_ms",
        "peak_rss_bytes",
    ] {
        assert!(json.get(field).is_some(), "report lacks `{field}`: {json}");
    }
    let variants = json["variants"].as_array().unwrap();
    assert_eq!(variants.len(), 2);
    assert_eq!(variants[0]["how"], "A");
    assert_eq!(variants[1]["how"], "B");
    for v in variants {
        for field in [
            "emit_ms",
            "compile_ms",
            "generations_per_dispatch",
            "ratio_to_inference",
            "gflops",
            "peak_fraction",
            "temp_bytes",
        ] {
            assert!(v.get(field).is_some(), "variant lacks `{field}`: {v}");
        }
        let g = &v["generation_ms"];
        assert_eq!(g["samples"], 3);
        let (min, med, max) = (
            g["min"].as_f64().unwrap(),
            g["median"].as_f64().unwrap(),
            g["max"].as_f64().unwrap(),
        );
        assert!(0.0 < min && min <= med && med <= max, "{g}");
        assert!(v["ratio_to_inference"].as_f64().unwrap() > 0.0);
    }
    assert!(report.gemm_peak_gflops > 0.0);
    assert!(report.host_overhead_ms.median > 0.0);
    assert!(report.peak_rss_bytes > 0, "VmHWM unreadable");
    assert_eq!(report.inference_ms.samples, 3);
    assert_eq!(report.apply_ms.samples, 3);
    assert!(report.apply_ms.median > 0.0);
    // The table printed from this report is the CLI's: crates/shardes-cli/tests/cli/cli_inspect.rs
    // (`bench_prints_the_table`).
}
