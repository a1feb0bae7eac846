//! The sharded test program on 1 and 8 devices: results against a host reference, and the
//! partitioned HLO XLA built.

mod common;

use std::time::Instant;

use shardes_runtime::{gather_rows, CompileOptions};

/// Tolerance for the column sums: 256 terms of magnitude <= 10 summed in f32 in an order
/// that differs from the f64 host reference; the rounding error bound is ~256 * 10 * 2^-24 * 16
/// ≈ 2.5e-3 in the worst case, typically far less.
const SUM_TOL: f32 = 2e-3;

fn run(devices: usize) -> (Vec<f32>, Vec<Vec<f32>>) {
    let client = common::client(devices);
    assert_eq!(client.device_count(), devices);
    let t = Instant::now();
    let exe = client
        .compile(
            &common::sharded_program(devices),
            &CompileOptions::new(devices),
        )
        .expect("compile");
    let compile = t.elapsed();
    assert_eq!(exe.num_partitions(), devices);
    assert_eq!(exe.num_outputs(), 2);
    let x = common::input();
    let shards = client.scatter_rows(&x, &[256, 16]).expect("scatter");
    assert!(shards.iter().all(|b| b.dims() == [256 / devices, 16]));
    let args: Vec<Vec<_>> = shards.iter().map(|b| vec![b]).collect();
    // Warm up once, then time a few executions.
    drop(exe.execute(&args).expect("execute"));
    let reps = 20;
    let t = Instant::now();
    let mut outs = Vec::new();
    for _ in 0..reps {
        outs = exe.execute(&args).expect("execute");
    }
    let exec = t.elapsed() / reps;
    println!(
        "[measure] sharded [256,16] program on {devices} device(s): compile {:.1} ms, execute {:.3} ms (mean of {reps})",
        compile.as_secs_f64() * 1e3,
        exec.as_secs_f64() * 1e3
    );
    assert_eq!(outs.len(), devices);
    let mut rows_bufs = Vec::new();
    let mut sums = Vec::new();
    for (d, mut o) in outs.into_iter().enumerate() {
        assert_eq!(o.len(), 2);
        let s = o.pop().unwrap();
        let r = o.pop().unwrap();
        assert_eq!(r.dims(), [256 / devices, 16]);
        assert_eq!(s.dims(), [16]);
        assert_eq!(r.device(), d);
        sums.push(s.to_host::<f32>().unwrap());
        rows_bufs.push(r);
    }
    (gather_rows::<f32>(&rows_bufs).unwrap(), sums)
}

#[test]
fn sharded_program_matches_host_reference_on_1_and_8_devices() {
    let x = common::input();
    let (want_rows, want_sums) = common::reference(&x);
    let mut per_count = Vec::new();
    for devices in [1usize, 8] {
        let (rows, sums) = run(devices);
        // x * 2 + 1 is exact in f32 for these inputs (multiples of 2^-3 plus small offsets
        // that need at most 24 bits), so the rows must match bit for bit.
        assert_eq!(rows, want_rows, "row output on {devices} device(s)");
        for (d, s) in sums.iter().enumerate() {
            for (c, (g, w)) in s.iter().zip(&want_sums).enumerate() {
                assert!(
                    (g - w).abs() <= SUM_TOL,
                    "sum col {c} on device {d} of {devices}: got {g}, want {w}"
                );
            }
        }
        per_count.push(sums[0].clone());
    }
    // The same program on 1 and 8 devices (tolerance as above: reduction order may differ).
    for (a, b) in per_count[0].iter().zip(&per_count[1]) {
        assert!((a - b).abs() <= SUM_TOL, "1 vs 8 devices: {a} vs {b}");
    }
}

#[test]
fn optimized_hlo_is_partitioned_per_device() {
    let (_client, exe) = common::compiled(8);
    let hlo = exe.optimized_hlo().expect("optimized HLO");
    assert!(!hlo.entry.is_empty());
    let all: Vec<String> = hlo.instructions().map(|i| i.to_string()).collect();
    let params = hlo.entry_parameters();
    assert_eq!(params.len(), 1, "{all:#?}");
    assert_eq!(params[0].to_string(), "f32[32,16]");
    assert!(
        all.iter().any(|s| s == "all-reduce f32[16]"),
        "expected an all-reduce f32[16] in {all:#?}"
    );
    assert!(
        !all.iter().any(|s| s.contains("[256,16]")),
        "no value should have the global shape [256,16]: {all:#?}"
    );
    let spec = exe.parameter_specs().expect("parameter specs");
    assert_eq!(spec[0].dims, [32, 16]);
    if let Some(outs) = exe.output_specs() {
        assert_eq!(outs.len(), 2);
        assert_eq!(outs[0].dims, [32, 16]);
        assert_eq!(outs[1].dims, [16]);
    }
    // The column sums need exactly one cross-device reduction; the counts cover every
    // computation (the reducer's `add` lives outside the entry computation).
    let counts = hlo.opcode_counts();
    assert_eq!(counts.get("all-reduce"), Some(&1), "{counts:?}");
    assert_eq!(counts.values().sum::<usize>(), all.len(), "{counts:?}");
    let entry_params = hlo.entry_computation().map_or(0, |c| {
        c.instructions
            .iter()
            .filter(|i| i.opcode == "parameter")
            .count()
    });
    assert!(counts["parameter"] > entry_params, "{counts:?}");
    // The 1-device build has the global shape and no collective.
    let client1 = common::client(1);
    let exe1 = client1
        .compile(&common::sharded_program(1), &CompileOptions::new(1))
        .unwrap();
    let hlo1 = exe1.optimized_hlo().unwrap();
    assert_eq!(hlo1.entry_parameters()[0].to_string(), "f32[256,16]");
    assert!(!hlo1.instructions().any(|i| i.opcode == "all-reduce"));
    assert_eq!(hlo1.opcode_counts().get("all-reduce"), None);
}

#[test]
fn plugin_reports_versions_and_devices() {
    let client = shardes_runtime::Client::cpu(8).expect("default CPU client");
    let plugin = client.plugin();
    assert_eq!(plugin.api_version().0, 0);
    println!(
        "[measure] plugin {} API {:?}, xla {:?}, stablehlo {:?}..{:?}",
        plugin.path().display(),
        plugin.api_version(),
        plugin.xla_version(),
        plugin.stablehlo_minimum_version(),
        plugin.stablehlo_current_version()
    );
    assert!(plugin.stablehlo_current_version().is_some());
    let devs = client.devices();
    assert_eq!(devs.len(), 8);
    let ids: Vec<usize> = devs.iter().map(|d| d.id).collect();
    assert_eq!(ids, (0..8).collect::<Vec<_>>());
    assert!(
        devs.iter().all(|d| d.kind.to_lowercase().contains("cpu")),
        "{devs:?}"
    );
    assert_eq!(client.platform_name(), "cpu");
}
