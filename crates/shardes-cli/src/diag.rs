//! `shardes diag CONFIG`: what the generation program costs to build and compile.
//!
//! For the config's program, for the same program at ranks 1, 4 and 16 (low-rank
//! strategies) and, for qwen2 configs, for the same model with 1, 2, 4 and 8 layers:
//! emitted op counts by kind, emission time, XLA compile time, the optimized program's
//! instruction count, its collectives and the plugin's memory statistics.
//!
//! For a `[task]` config, the programs a reward run compiles (the decode of every member,
//! the tell and, with `[eval]`, the held-out decode); for a control config on an MJCF
//! model, the policy step and the tell. The rank and depth sweeps are for loss programs.
//!
//! Every program is built from the problem's shapes alone (no parameters are allocated),
//! and every flag and sweep entry is checked before the client starts.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use serde::Serialize;
use shardes::hlo::es::spec::StrategySpec;
use shardes::hlo::es::{LeafInfo, Model, ShardedES};
use shardes::hlo::problems::qwen2::MAX_LAYERS;
use shardes::problem::qwen2::{qwen2_model, qwen2_shapes_at_depth};
use shardes::runtime::{Client, CompileOptions};

use crate::config::{Config, ConfigError, ProblemConfig};
use crate::inspect::task::{timed, BuiltProgram};
use crate::inspect::{at_least_one, check_writable, count_in, mjcf, problem_shapes, task};
use crate::out::{outln, Stdout};
use crate::setup;
use crate::setup::problem_error;

/// Arguments of `shardes diag`.
#[derive(Debug, Clone, clap::Args)]
pub struct DiagArgs {
    /// The run configuration (TOML).
    pub config: PathBuf,
    /// Also write the report as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Ranks to sweep for low-rank strategies (comma separated).
    #[arg(long, default_value = "1,4,16", value_delimiter = ',', value_parser = at_least_one())]
    pub ranks: Vec<usize>,
    /// Layer counts to sweep for qwen2 configs (comma separated; the config's shapes at
    /// each depth). transformer_block is a single block and has no depth.
    #[arg(
        long,
        default_value = "1,2,4,8",
        value_delimiter = ',',
        value_parser = count_in(1, MAX_LAYERS)
    )]
    pub depths: Vec<usize>,
}

/// One program's build and compile cost.
#[derive(Debug, Clone, Serialize)]
pub struct DiagEntry {
    /// Which program of a `[task]` or MJCF run (`decode`, `tell`, `eval`, `policy step`);
    /// absent for a loss config's generation program.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub program: Option<String>,
    /// The strategy.
    pub strategy: String,
    /// Decoder layers (qwen2 depth sweep), else absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub layers: Option<usize>,
    /// Emitted ops in total.
    pub emitted_ops: usize,
    /// Emitted ops by kind.
    pub emitted_by_kind: std::collections::BTreeMap<String, usize>,
    /// MLIR text size, bytes.
    pub mlir_bytes: usize,
    /// Building and printing, ms.
    pub emit_ms: f64,
    /// XLA compile, ms.
    pub compile_ms: f64,
    /// Instructions in the optimized HLO (all computations).
    pub optimized_instructions: usize,
    /// Collectives in the optimized HLO by opcode.
    pub collectives: std::collections::BTreeMap<String, usize>,
    /// Per-device temp (scratch) bytes from the plugin.
    pub temp_bytes: i64,
    /// Per-device argument bytes.
    pub argument_bytes: i64,
    /// Per-device output bytes.
    pub output_bytes: i64,
    /// Peak bytes, if the plugin reports it (0 otherwise).
    pub peak_bytes: i64,
    /// Whether the plugin offers device allocator statistics (`PJRT_Device_MemoryStats`).
    pub device_stats_offered: bool,
    /// Bytes allocated on device 0 after this compile, where offered.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_bytes_in_use: Option<i64>,
    /// The most bytes allocated on device 0 at once so far, where offered.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_peak_bytes_in_use: Option<i64>,
    /// Peak resident memory of this process (`VmHWM`) after this compile, bytes; 0 where
    /// unavailable.
    pub peak_rss_bytes: u64,
}

fn mib(bytes: i64) -> f64 {
    bytes as f64 / 1048576.0
}

fn with_rank(spec: &StrategySpec, r: usize) -> Option<StrategySpec> {
    match spec {
        StrategySpec::LowRank { .. } => Some(StrategySpec::LowRank { r }),
        StrategySpec::Mirrored(inner) => {
            with_rank(inner, r).map(|s| StrategySpec::Mirrored(Box::new(s)))
        }
        _ => None,
    }
}

/// The config's ES for `model` with `spec` as its strategy.
fn es_with(config: &Config, spec: &StrategySpec, model: &dyn Model) -> Result<ShardedES> {
    let mut c = config.clone();
    c.es.strategy = spec.clone();
    setup::es_for(&c, model)
}

fn measure(
    es: &ShardedES,
    model: &dyn Model,
    leaves: &[LeafInfo],
    client: &Client,
    layers: Option<usize>,
) -> Result<DiagEntry> {
    let built = timed("generation", || es.generation_program(model, leaves))?;
    measure_program(
        &built,
        None,
        &es.strategy().name(),
        es.devices(),
        client,
        layers,
    )
}

/// The cost of `built` (named `program` in the report, if given) compiled for `devices`.
fn measure_program(
    built: &BuiltProgram,
    program: Option<&str>,
    strategy: &str,
    devices: usize,
    client: &Client,
    layers: Option<usize>,
) -> Result<DiagEntry> {
    let t0 = Instant::now();
    let mlir = built.program.module.to_mlir();
    let emit_ms = built.build_ms + t0.elapsed().as_secs_f64() * 1e3;
    let t1 = Instant::now();
    let exe = client
        .compile(&mlir, &CompileOptions::new(devices))
        .with_context(|| format!("compiling the {} program", built.name))?;
    let compile_ms = t1.elapsed().as_secs_f64() * 1e3;
    let hlo = exe.optimized_hlo()?;
    let by_op = hlo.opcode_counts();
    let collectives = by_op
        .iter()
        .filter(|(k, _)| {
            k.starts_with("all-") || k.starts_with("reduce-scatter") || k.starts_with("collective-")
        })
        .map(|(k, v)| (k.clone(), *v))
        .collect();
    let mem = exe.compiled_memory_stats().unwrap_or_default();
    let device = client.device_memory_stats(0)?;
    let emitted = built.program.module.op_counts();
    Ok(DiagEntry {
        program: program.map(str::to_string),
        strategy: strategy.to_string(),
        layers,
        emitted_ops: emitted.values().sum(),
        emitted_by_kind: emitted,
        mlir_bytes: mlir.len(),
        emit_ms,
        compile_ms,
        optimized_instructions: by_op.values().sum(),
        collectives,
        temp_bytes: mem.temp_size_in_bytes,
        argument_bytes: mem.argument_size_in_bytes,
        output_bytes: mem.output_size_in_bytes,
        peak_bytes: mem.peak_memory_in_bytes,
        device_stats_offered: device.is_some(),
        device_bytes_in_use: device.map(|s| s.bytes_in_use),
        device_peak_bytes_in_use: device.and_then(|s| s.peak_bytes_in_use),
        peak_rss_bytes: shardes::bench::peak_rss_bytes(),
    })
}

/// The programs of a `[task]` or MJCF config (what its run compiles), measured; `None`
/// for a loss config. Everything is checked before the client starts.
fn run_programs(config: &Config) -> Result<Option<(String, Vec<DiagEntry>)>> {
    let (es, summary, built) = if config.task.is_some() {
        let plan = task::plan(config)?;
        let built = task::programs(config, &plan)?;
        (plan.es, plan.summary, built)
    } else if mjcf::is_mjcf(config)? {
        let plan = mjcf::plan(config)?;
        let built = mjcf::programs(&plan)?;
        (plan.es, plan.summary, built)
    } else {
        return Ok(None);
    };
    // No compile cache: diag measures compiling.
    let client = Client::cpu(config.devices)?.with_compile_cache(None);
    let strategy = es.strategy().name();
    let mut entries = Vec::new();
    for b in &built {
        // The held-out decode runs the unperturbed parameters.
        let s = if b.name == "eval" { "plain" } else { &strategy };
        entries.push(measure_program(
            b,
            Some(b.name),
            s,
            es.devices(),
            &client,
            None,
        )?);
    }
    Ok(Some((summary, entries)))
}

/// Runs `shardes diag`.
pub fn run(args: &DiagArgs) -> Result<()> {
    let config = Config::load(&args.config)?;
    if let Some(path) = &args.json {
        check_writable("--json", path)?;
    }
    if let Some(p) = &config.plugin {
        return Err(ConfigError::new(
            format!(
                "plugin = \"{}\": shardes diag runs on the provisioned CPU plugin only",
                shardes::hlo::es::spec::excerpt(p)
            ),
            "remove the `plugin` key from the config to diagnose on the CPU plugin",
        )
        .into());
    }
    if let Some((summary, entries)) = run_programs(&config)? {
        return report(args, &config, &summary, &entries);
    }
    let spec = config.es.strategy.clone();
    // Everything the sweep builds is checked before the client starts or anything compiles.
    let (es, p) = problem_shapes(&config)?;
    let mut variants = Vec::new();
    for &r in &args.ranks {
        match with_rank(&spec, r) {
            Some(s) if s != spec => variants.push(es_with(&config, &s, &*p.model)?),
            _ => {}
        }
    }
    let mut depths = Vec::new();
    if let ProblemConfig::Qwen2 { .. } = &config.problem {
        let seed = config.run.seed;
        let source = setup::qwen2_source(&config.problem)?;
        let base = qwen2_model(&source, seed).map_err(problem_error)?;
        for &layers in &args.depths {
            depths.push(qwen2_shapes_at_depth(&base, layers).map_err(problem_error)?);
        }
    }
    // No compile cache: diag measures compiling.
    let client = Client::cpu(config.devices)?.with_compile_cache(None);
    let mut entries = vec![measure(&es, &*p.model, &p.leaves, &client, None)?];
    for es in &variants {
        entries.push(measure(es, &*p.model, &p.leaves, &client, None)?);
    }
    for (model, leaves) in &depths {
        let layers = model.config.num_hidden_layers;
        entries.push(measure(&es, model, leaves, &client, Some(layers))?);
    }
    report(args, &config, &p.summary, &entries)
}

/// Writes the JSON report (with `--json`) and prints the table.
fn report(args: &DiagArgs, config: &Config, summary: &str, entries: &[DiagEntry]) -> Result<()> {
    // The JSON first: a reader that closes stdout early (`| head`) must not lose it.
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&entries)?)
            .with_context(|| format!("writing the JSON report to {}", path.display()))?;
    }
    let Some(first) = entries.first() else {
        anyhow::bail!("no program to report");
    };
    let programs = first.program.is_some();
    let mut out = Stdout::new();
    outln!(
        out,
        "{}, n={} devices={}: {}",
        first.strategy,
        config.es.n,
        config.devices,
        summary
    );
    outln!(
        out,
        "{:<28}{:>7}{:>8}{:>10}{:>10}{:>12}{:>12}{:>12}",
        if programs { "program" } else { "strategy" },
        "layers",
        "ops",
        "emit ms",
        "comp ms",
        "opt instr",
        "temp MiB",
        "collectives"
    );
    for e in entries {
        let coll: usize = e.collectives.values().sum();
        let layers = e.layers.map_or_else(|| "-".to_string(), |l| l.to_string());
        // The header names the run's strategy; a program without it says so.
        let name = match &e.program {
            Some(p) if e.strategy != first.strategy => format!("{p} ({})", e.strategy),
            Some(p) => p.clone(),
            None => e.strategy.clone(),
        };
        outln!(
            out,
            "{:<28}{:>7}{:>8}{:>10.1}{:>10.0}{:>12}{:>12.2}{:>12}",
            name,
            layers,
            e.emitted_ops,
            e.emit_ms,
            e.compile_ms,
            e.optimized_instructions,
            e.temp_bytes as f64 / 1048576.0,
            coll
        );
    }
    let label = first.program.as_deref().unwrap_or(&first.strategy);
    outln!(out, "emitted ops by kind ({label}):");
    for (k, v) in &first.emitted_by_kind {
        outln!(out, "  {k:<36}{v:>6}");
    }
    outln!(out, "collectives: {:?}", first.collectives);
    // A loss config's sweep varies one program; a run's programs each have their own.
    let shown = if programs { entries } else { &entries[..1] };
    for e in shown {
        outln!(
            out,
            "memory ({}): arguments {:.1} MiB, outputs {:.1} MiB, temporaries {:.1} MiB per device",
            e.program.as_deref().unwrap_or(&e.strategy),
            mib(e.argument_bytes),
            mib(e.output_bytes),
            mib(e.temp_bytes)
        );
    }
    let last = entries.last().unwrap_or(first);
    match (last.device_bytes_in_use, last.device_peak_bytes_in_use) {
        (Some(now), peak) => outln!(
            out,
            "device 0 allocator: {:.1} MiB in use, peak {}",
            mib(now),
            peak.map_or_else(|| "not reported".into(), |p| format!("{:.1} MiB", mib(p)))
        ),
        (None, _) => outln!(
            out,
            "device 0 allocator: not offered by this plugin (PJRT_Device_MemoryStats)"
        ),
    }
    outln!(
        out,
        "host peak RSS after compiling every program: {:.1} MiB",
        last.peak_rss_bytes as f64 / 1048576.0
    );
    out.finish()
}
