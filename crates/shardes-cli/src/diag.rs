//! `shardes diag CONFIG`: what the generation program costs to build and compile.
//!
//! For the config's program, for the same program at ranks 1, 4 and 16 (low-rank
//! strategies) and, for qwen2 configs, for the same model with 1, 2, 4 and 8 layers:
//! emitted op counts by kind, emission time, XLA compile time, the optimized program's
//! instruction count, its collectives and the plugin's memory statistics.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use serde::Serialize;
use shardes::hlo::es::spec::StrategySpec;
use shardes::hlo::es::{leaf_infos, Model, ShardedES};
use shardes::hlo::params::ParamTree;
use shardes::problem::qwen2::{qwen2_at_depth, qwen2_model};
use shardes::runtime::{Client, CompileOptions};

use crate::config::{Config, ProblemConfig};
use crate::setup;

/// Arguments of `shardes diag`.
#[derive(Debug, Clone, clap::Args)]
pub struct DiagArgs {
    /// The run configuration (TOML).
    pub config: PathBuf,
    /// Also write the report as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Ranks to sweep for low-rank strategies (comma separated).
    #[arg(long, default_value = "1,4,16", value_delimiter = ',')]
    pub ranks: Vec<usize>,
    /// Layer counts to sweep for qwen2 configs (comma separated; random weights of the
    /// config's shapes). transformer_block is a single block and has no depth.
    #[arg(long, default_value = "1,2,4,8", value_delimiter = ',')]
    pub depths: Vec<usize>,
}

/// One program's build and compile cost.
#[derive(Debug, Clone, Serialize)]
pub struct DiagEntry {
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
    params: &ParamTree,
    client: &Client,
    layers: Option<usize>,
) -> Result<DiagEntry> {
    let t0 = Instant::now();
    let program = es.generation_program(model, &leaf_infos(params))?;
    let mlir = program.module.to_mlir();
    let emit_ms = t0.elapsed().as_secs_f64() * 1e3;
    let t1 = Instant::now();
    let exe = client.compile(&mlir, &CompileOptions::new(es.devices()))?;
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
    let emitted = program.module.op_counts();
    Ok(DiagEntry {
        strategy: es.strategy().name(),
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
    })
}

/// Runs `shardes diag`.
pub fn run(args: &DiagArgs) -> Result<()> {
    let config = Config::load(&args.config)?;
    let client = match &config.plugin {
        None => Client::cpu(config.devices)?,
        Some(p) => bail!(
            "plugin = {p:?}: shardes diag runs on the provisioned CPU plugin only; remove \
             the `plugin` key"
        ),
    };
    let spec = config.es.strategy.clone();
    let (es, p) = setup::problem(&config)?;
    let mut entries = vec![measure(&es, &*p.model, &p.params, &client, None)?];
    for &r in &args.ranks {
        match with_rank(&spec, r) {
            Some(s) if s != spec => {
                let es = es_with(&config, &s, &*p.model)?;
                entries.push(measure(&es, &*p.model, &p.params, &client, None)?)
            }
            _ => {}
        }
    }
    if let ProblemConfig::Qwen2 { .. } = &config.problem {
        let seed = config.run.seed;
        let source = setup::qwen2_source(&config.problem)?;
        let base = qwen2_model(&source, seed).map_err(setup::config_error)?;
        for &layers in &args.depths {
            let (model, params) =
                qwen2_at_depth(&base, layers, seed).map_err(setup::config_error)?;
            entries.push(measure(&es, &model, &params, &client, Some(layers))?);
        }
    }
    let first = &entries[0];
    println!(
        "{}, n={} devices={}: {}",
        first.strategy, config.es.n, config.devices, p.summary
    );
    println!(
        "{:<28}{:>7}{:>8}{:>10}{:>10}{:>12}{:>12}{:>12}",
        "strategy", "layers", "ops", "emit ms", "comp ms", "opt instr", "temp MiB", "collectives"
    );
    for e in &entries {
        let coll: usize = e.collectives.values().sum();
        let layers = e.layers.map_or_else(|| "-".to_string(), |l| l.to_string());
        println!(
            "{:<28}{:>7}{:>8}{:>10.1}{:>10.0}{:>12}{:>12.2}{:>12}",
            e.strategy,
            layers,
            e.emitted_ops,
            e.emit_ms,
            e.compile_ms,
            e.optimized_instructions,
            e.temp_bytes as f64 / 1048576.0,
            coll
        );
    }
    println!("emitted ops by kind ({}):", first.strategy);
    for (k, v) in &first.emitted_by_kind {
        println!("  {k:<36}{v:>6}");
    }
    println!("collectives: {:?}", first.collectives);
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&entries)?)
            .with_context(|| format!("writing the JSON report to {}", path.display()))?;
    }
    Ok(())
}
