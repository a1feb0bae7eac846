//! `shardes bench CONFIG`: generation time against the inference limit, the FLOP rate
//! against the GEMM peak, host overhead and peak memory, as a table and JSON.
//!
//! A control config is measured in environment steps per second instead
//! ([`control`]). The measuring is [`shardes::bench`]; this file turns a
//! config into its inputs and
//! prints the report as a table. Overrides (`--n`, `--devices`, `--member-chunk`) exist for scaling sweeps from
//! one config file.
//!
//! Under `mpirun` (feature `mpi`), or with `--phases`, it times a generation of a run across
//! processes in its phases instead ([`processes`]).

mod control;
mod decode;
mod processes;
mod qwen2;

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use shardes::bench::{self, BenchInput, BenchOptions, BenchReport, Flops};
use shardes::hlo::es::{How, Model, ShardedES};
use shardes::runtime::Client;
use shardes::Problem;

use crate::config::{transformer_block, Config, ConfigError, ProblemConfig};
use crate::inspect::{at_least_one, check_writable};
use crate::run::processes::Group;
use crate::setup;
use crate::setup::problem_error;

/// Arguments of `shardes bench`.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// The run configuration (TOML), e.g. benches/eggroll_n16384.toml.
    pub config: PathBuf,
    /// Also write the report as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Placements to compare: `A`, `B` or `AB` (both, interleaved). Default: the config's.
    #[arg(long, value_parser = parse_how_flag)]
    pub how: Option<String>,
    /// Timed rounds (each: one generation dispatch per placement and one inference).
    #[arg(long, default_value_t = 10, value_parser = at_least_one())]
    pub generations: usize,
    /// Untimed warm-up rounds.
    #[arg(long, default_value_t = 2)]
    pub warmup: usize,
    /// Generations per dispatch (a `while` over generations inside one executable).
    #[arg(long, default_value_t = 1, value_parser = at_least_one())]
    pub per_dispatch: usize,
    /// Override the population size.
    #[arg(long, value_parser = at_least_one())]
    pub n: Option<usize>,
    /// Override the device count.
    #[arg(long, value_parser = at_least_one())]
    pub devices: Option<usize>,
    /// Override the members per evaluation chunk.
    #[arg(long, value_parser = at_least_one())]
    pub member_chunk: Option<usize>,
    /// Per-device size of the square GEMM that measures the peak (0: skip).
    #[arg(long, default_value_t = 512)]
    pub gemm_size: usize,
    /// Time a generation in the phases of a run across processes (local evaluation,
    /// fitness gather, update exchange, the rest) on this one process; under `mpirun` this
    /// is what `shardes bench` measures.
    #[arg(long)]
    pub phases: bool,
    /// Placements across processes for the phases: `A`, `B` or `AB`. Default: the
    /// config's `es.how_hosts`.
    #[arg(long, value_parser = parse_how_flag)]
    pub how_hosts: Option<String>,
    /// qwen2 configs: benchmark the model at this many decoder layers (its width,
    /// vocabulary and data; random weights), e.g. to measure a per-layer cost quickly.
    #[arg(long, value_parser = crate::inspect::count_in(1, shardes::hlo::problems::qwen2::MAX_LAYERS))]
    pub layers: Option<usize>,
}

pub(crate) fn parse_how(s: &str) -> Result<Vec<How>> {
    // Each letter through `How`'s own parser: "A", "B", or both side by side ("AB", "BA").
    let mut hows: Vec<How> = Vec::new();
    for c in s.chars() {
        match c.to_string().parse::<How>() {
            Ok(h) if !hows.contains(&h) => hows.push(h),
            _ => hows.clear(),
        }
        if hows.is_empty() {
            break;
        }
    }
    if hows.is_empty() || hows.len() != s.chars().count() {
        bail!(
            "--how {}: use A, B or AB (both side by side)",
            shardes::hlo::es::spec::excerpt(s)
        );
    }
    hows.sort_by_key(|h| h.to_string());
    Ok(hows)
}

/// The `--how` flag checked by clap (exit 2), the same parser as [`parse_how`].
fn parse_how_flag(s: &str) -> std::result::Result<String, String> {
    parse_how(s).map(|_| s.to_string()).map_err(|_| {
        format!(
            "use A, B or AB (both side by side), not \"{}\"",
            shardes::hlo::es::spec::excerpt(s)
        )
    })
}

/// The config with the command line's overrides, validated again as a whole (an override
/// can break what the file's values satisfied, e.g. `--n` not divisible by the devices),
/// and the host memory the benchmark needs checked; every refusal is a config error (exit
/// 2) before anything is allocated or compiled.
fn validated(args: &BenchArgs) -> Result<Config> {
    let mut config = Config::load(&args.config)?;
    if let Some(path) = &args.json {
        check_writable("--json", path)?;
    }
    if !matches!(
        config.problem,
        ProblemConfig::TransformerBlock { .. }
            | ProblemConfig::Control { .. }
            | ProblemConfig::Qwen2 { .. }
    ) {
        return Err(ConfigError::new(
            format!(
                "problem \"{}\": shardes bench knows the FLOPs of transformer_block and the \
                 environment steps of control only",
                config.problem.name()
            ),
            "benchmark a transformer_block config (e.g. benches/eggroll_n16384.toml) or a \
             control config (e.g. examples/cartpole.toml); time other problems with shardes run",
        )
        .into());
    }
    if args.layers.is_some() && !matches!(config.problem, ProblemConfig::Qwen2 { .. }) {
        return Err(ConfigError::new(
            format!(
                "--layers is for qwen2 configs; this one's problem is \"{}\"",
                config.problem.name()
            ),
            "drop --layers, or benchmark a qwen2 config (e.g. benches/qwen2_d256.toml)",
        )
        .into());
    }
    if let Some(p) = &config.plugin {
        return Err(ConfigError::new(
            format!(
                "plugin = \"{}\": shardes bench runs on the provisioned CPU plugin only",
                shardes::hlo::es::spec::excerpt(p)
            ),
            "remove the `plugin` key from the config to benchmark",
        )
        .into());
    }
    if args.n.is_none() && args.devices.is_none() && args.member_chunk.is_none() {
        return check_memory(args, config);
    }
    if let Some(n) = args.n {
        config.es.n = n;
    }
    if let Some(d) = args.devices {
        config.devices = d;
    }
    if let Some(c) = args.member_chunk {
        config.es.member_chunk = Some(c);
    }
    let text = toml::to_string(&config).context("writing the overridden config")?;
    let config = Config::parse(&text).map_err(|e| {
        ConfigError::new(
            format!("with the command-line overrides: {}", e.message),
            format!(
                "{} (--n, --devices and --member-chunk replace those keys)",
                e.hint
            ),
        )
    })?;
    check_memory(args, config)
}

/// Refuses a benchmark whose problem or GEMM would not fit the host's memory.
fn check_memory(args: &BenchArgs, config: Config) -> Result<Config> {
    if let ProblemConfig::TransformerBlock {
        d_model,
        batch,
        seq,
    } = config.problem
    {
        Problem::transformer_block_shapes(transformer_block(d_model, batch, seq), config.run.seed)
            .and_then(|s| s.check_host_memory())
            .map_err(problem_error)?;
    }
    // The GEMM's operands: (devices·m, m) and (m, m) on the host and again on the devices.
    let m = args.gemm_size as u64;
    let gemm = (config.devices as u64)
        .saturating_mul(2)
        .saturating_add(1)
        .saturating_mul(m.saturating_mul(m))
        .saturating_mul(8);
    shardes::problem::memory::require(
        gemm,
        || format!("the peak GEMM of --gemm-size {}", args.gemm_size),
        "--gemm-size",
    )
    .map_err(|e| {
        ConfigError::new(
            e.to_string(),
            "lower --gemm-size (512 is the default; 0 skips the GEMM)",
        )
    })?;
    Ok(config)
}

/// Runs `shardes bench` (a config with a `[decode]` section runs the decode benchmark).
pub fn run(args: &BenchArgs) -> Result<()> {
    if decode::is_decode_config(&args.config) {
        return decode::run(args);
    }
    let group = Group::from_env()?;
    let config = validated(args)?;
    if processes::wanted(args, &group) {
        return processes::run(args, &config, group);
    }
    if let ProblemConfig::Control { .. } = config.problem {
        return control::run(args, &config);
    }
    if let ProblemConfig::Qwen2 { .. } = config.problem {
        return qwen2::run(args, &config);
    }
    let ProblemConfig::TransformerBlock {
        d_model,
        batch,
        seq,
    } = config.problem
    else {
        bail!(
            "shardes bench knows the FLOPs of transformer_block only, got problem `{}`",
            config.problem.name()
        );
    };
    let tb = transformer_block(d_model, batch, seq);
    let hows = match &args.how {
        Some(h) => parse_how(h)?,
        None => vec![config.es.how],
    };
    let make_es = |how: How| -> Result<ShardedES> {
        let mut c = config.clone();
        c.es.how = how;
        setup::es(&c)
    };
    let variants: Vec<ShardedES> = hows
        .iter()
        .map(|&h| Ok(make_es(h)?.with_member_bytes(tb.member_bytes())))
        .collect::<Result<_>>()?;
    let problem = Problem::transformer_block(tb, config.run.seed).map_err(setup::config_error)?;
    let client = match &config.plugin {
        // No compile cache: the report's compile times are measured.
        None => Client::cpu(config.devices)?.with_compile_cache(None),
        Some(p) => bail!(
            "plugin = {p:?}: shardes bench runs on the provisioned CPU plugin only; remove \
             the `plugin` key to benchmark"
        ),
    };
    let rank = bench::noise_rank(&variants[0])?;
    let flops = Flops::transformer_block(&tb, &variants[0], rank)?;
    let input = BenchInput {
        client: &client,
        variants: variants.iter().collect(),
        model: &tb,
        params: &problem.params,
        key: problem.key,
        batch: &problem.batch,
        flops: Some(flops),
    };
    let report = measure(args, &input)?;
    print_report(args, &table(&report), &report)
}

/// Runs the benchmark engine on `input` for `args`' rounds, its stages on a progress bar.
fn measure(args: &BenchArgs, input: &BenchInput) -> Result<BenchReport> {
    let options = BenchOptions {
        warmup: args.warmup,
        rounds: args.generations,
        generations_per_dispatch: args.per_dispatch,
        gemm_size: args.gemm_size,
        ..BenchOptions::default()
    };
    let bar = ProgressBar::new(1);
    bar.set_style(
        ProgressStyle::with_template("{spinner} {msg} [{bar:30}] {pos}/{len}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let report = bench::run(input, &options, &mut |stage, done, total| {
        bar.set_message(stage.to_string());
        bar.set_length(total.max(1) as u64);
        bar.set_position(done as u64);
    })?;
    bar.finish_and_clear();
    Ok(report)
}

/// Prints a report's `table` and, with `--json`, writes the `report` there as JSON.
fn print_report(args: &BenchArgs, table: &str, report: &impl Serialize) -> Result<()> {
    print!("{table}");
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(report)?;
        std::fs::write(path, text)
            .with_context(|| format!("writing the JSON report to {}", path.display()))?;
    }
    Ok(())
}

/// The report as the human table.
pub fn table(r: &BenchReport) -> String {
    let mut s = String::new();
    s.push_str(&format!(
        "{} n={} devices={} member_chunk={} rounds={}\n",
        r.strategy, r.n, r.devices, r.member_chunk, r.rounds
    ));
    s.push_str(&format!(
        "{:<26}{:>14}{:>14}\n",
        "", "generation", "inference"
    ));
    for v in &r.variants {
        s.push_str(&format!(
            "how {} (×{}/dispatch)\n",
            v.how, v.generations_per_dispatch
        ));
        s.push_str(&format!(
            "  {:<24}{:>14.1}{:>14.1}\n",
            "emission ms", v.emit_ms, r.inference_emit_ms
        ));
        s.push_str(&format!(
            "  {:<24}{:>14.0}{:>14.0}\n",
            "compile ms", v.compile_ms, r.inference_compile_ms
        ));
        s.push_str(&format!(
            "  {:<24}{:>14.2}{:>14.2}\n",
            "ms (median)", v.generation_ms.median, r.inference_ms.median
        ));
        s.push_str(&format!(
            "  {:<24}{:>14}{:>14}\n",
            "ms (min..max)",
            format!("{:.2}..{:.2}", v.generation_ms.min, v.generation_ms.max),
            format!("{:.2}..{:.2}", r.inference_ms.min, r.inference_ms.max)
        ));
        s.push_str(&format!(
            "  {:<24}{:>14.3}\n",
            "generation / inference", v.ratio_to_inference
        ));
        s.push_str(&format!(
            "  {:<24}{:>14.1}{:>14.1}\n",
            "GFLOP/s", v.gflops, r.inference_gflops
        ));
        s.push_str(&format!(
            "  {:<24}{:>13.1}%\n",
            "of GEMM peak",
            100.0 * v.peak_fraction
        ));
        s.push_str(&format!(
            "  {:<24}{:>14.1}\n",
            "temp MiB/device",
            v.temp_bytes as f64 / 1048576.0
        ));
    }
    s.push_str(&format!(
        "ask + apply alone (no tell) {:.2} ms ({:.2}..{:.2})\n",
        r.apply_ms.median, r.apply_ms.min, r.apply_ms.max
    ));
    s.push_str(&format!(
        "GEMM peak {:.1} GFLOP/s; host overhead {:.3} ms/dispatch ({:.3}..{:.3}); \
         peak RSS {:.0} MiB\n",
        r.gemm_peak_gflops,
        r.host_overhead_ms.median,
        r.host_overhead_ms.min,
        r.host_overhead_ms.max,
        r.peak_rss_bytes as f64 / 1048576.0
    ));
    s
}
