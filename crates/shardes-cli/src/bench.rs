//! `shardes bench CONFIG`: generation time against the inference limit, the FLOP rate
//! against the GEMM peak, host overhead and peak memory, as a table and JSON.
//!
//! The measuring is [`shardes::bench`]; this file turns a config into its inputs and
//! prints. Overrides (`--n`, `--devices`, `--member-chunk`) exist for scaling sweeps from
//! one config file.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use shardes::bench::{self, BenchInput, BenchOptions, Flops};
use shardes::hlo::es::strategy::from_spec;
use shardes::hlo::es::{shaping, How, Model, ShardedES};
use shardes::hlo::prng::{fold_in, key};
use shardes::hlo::problems::transformer_block::TransformerBlock;
use shardes::runtime::Client;

use crate::config::Config;

/// Arguments of `shardes bench`.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// The run configuration (TOML), e.g. benches/eggroll_n16384.toml.
    pub config: PathBuf,
    /// Also write the report as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Placements to compare: `A`, `B` or `AB` (both, interleaved). Default: the config's.
    #[arg(long)]
    pub how: Option<String>,
    /// Timed rounds (each: one generation dispatch per placement and one inference).
    #[arg(long, default_value_t = 10)]
    pub generations: usize,
    /// Untimed warm-up rounds.
    #[arg(long, default_value_t = 2)]
    pub warmup: usize,
    /// Generations per dispatch (a `while` over generations inside one executable).
    #[arg(long, default_value_t = 1)]
    pub per_dispatch: usize,
    /// Override the population size.
    #[arg(long)]
    pub n: Option<usize>,
    /// Override the device count.
    #[arg(long)]
    pub devices: Option<usize>,
    /// Override the members per evaluation chunk.
    #[arg(long)]
    pub member_chunk: Option<usize>,
    /// Per-device size of the square GEMM that measures the peak (0: skip).
    #[arg(long, default_value_t = 512)]
    pub gemm_size: usize,
}

fn parse_how(s: &str) -> Result<Vec<How>> {
    Ok(match s.to_ascii_uppercase().as_str() {
        "A" => vec![How::A],
        "B" => vec![How::B],
        "AB" | "BA" => vec![How::A, How::B],
        other => bail!("--how {other}: use A, B or AB (both side by side)"),
    })
}

/// Runs `shardes bench`.
pub fn run(args: &BenchArgs) -> Result<()> {
    let mut config = Config::load(&args.config)?;
    if let Some(n) = args.n {
        config.es.n = n;
    }
    if let Some(d) = args.devices {
        config.devices = d;
    }
    if let Some(c) = args.member_chunk {
        config.es.member_chunk = Some(c);
    }
    if config.problem.name != "transformer_block" {
        bail!(
            "shardes bench knows the FLOPs of transformer_block only, got problem `{}`",
            config.problem.name
        );
    }
    let hows = match &args.how {
        Some(h) => parse_how(h)?,
        None => parse_how(&config.es.how)?,
    };
    if args.generations == 0 {
        bail!("--generations 0: time at least 1 round (10 or more for a meaningful median)");
    }
    let spec = config.strategy()?;
    let shaping_name = config.es.shaping.clone();
    let make_es = |how: How| -> Result<ShardedES> {
        let shaping = shaping::by_name(&shaping_name)
            .with_context(|| format!("es.shaping = {shaping_name:?} is not a known shaping"))?;
        Ok(ShardedES::new(
            from_spec(&spec),
            config.es.n,
            config.es.sigma,
            config.es.lr,
            config.devices,
        )?
        .with_shaping(shaping)
        .with_how(how)
        .with_member_chunk(config.es.member_chunk)
        .with_keep_noise_bytes(config.es.keep_noise_bytes()))
    };
    let tb = TransformerBlock {
        d_model: config.problem.d_model(),
        batch: config.problem.batch(),
        seq: config.problem.seq(),
    };
    let variants: Vec<ShardedES> = hows
        .iter()
        .map(|&h| Ok(make_es(h)?.with_member_bytes(tb.member_bytes())))
        .collect::<Result<_>>()?;
    let k = key(config.run.seed)?;
    let params = tb.init(k)?;
    let b = tb.make_batch(fold_in(k, 1))?;
    let batch = [b.x, b.target];
    let client = match &config.plugin {
        None => Client::cpu(config.devices)?,
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
        params: &params,
        key: k,
        batch: &batch,
        flops: Some(flops),
    };
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
    let report = bench::run(&input, &options, &mut |stage, done, total| {
        bar.set_message(stage.to_string());
        bar.set_length(total.max(1) as u64);
        bar.set_position(done as u64);
    })?;
    bar.finish_and_clear();
    print!("{}", report.table());
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&report)?;
        std::fs::write(path, text)
            .with_context(|| format!("writing the JSON report to {}", path.display()))?;
    }
    Ok(())
}
