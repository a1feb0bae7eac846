//! `shardes bench CONFIG` on a qwen2 run config (teacher-forced loss): the generation
//! against the inference limit (the same program path with zero noise), tokens per second,
//! compile time and peak RSS, through the benchmark engine ([`shardes::bench`]) with no
//! analytic FLOP count (the engine knows `transformer_block`'s only).
//!
//! `--layers N` benchmarks the config's width, vocabulary and data at `N` decoder layers
//! with random weights, so a per-layer cost can be measured on a shallow model. Decoding
//! is benchmarked on a `[decode]` config ([`super::decode`], e.g.
//! `benches/decode_0_5b.toml`).

use anyhow::Result;
use serde::Serialize;
use shardes::bench::{BenchInput, BenchReport};
use shardes::hlo::es::{How, ShardedES};
use shardes::runtime::Client;
use shardes::Problem;

use super::{measure, parse_how, print_report, table, BenchArgs};
use crate::config::Config;
use crate::setup;
use crate::setup::problem_error;

/// A qwen2 benchmark: the engine's report and the tokens it processed.
#[derive(Debug, Serialize)]
pub struct Qwen2BenchReport {
    /// The problem as `shardes run` describes it.
    pub problem: String,
    /// Parameters of the model benchmarked.
    pub params: usize,
    /// f32 parameter bytes.
    pub param_bytes: usize,
    /// Teacher-forced tokens one member reads per generation (batch × seq).
    pub tokens_per_member: usize,
    /// Tokens per second of each variant's generation (all members), in the engine's
    /// variant order.
    pub generation_tokens_per_s: Vec<f64>,
    /// Tokens per second of the inference pass (all members, zero noise).
    pub inference_tokens_per_s: f64,
    /// The engine's report.
    pub report: BenchReport,
}

fn tokens_per_s(tokens: usize, ms: f64) -> f64 {
    if ms > 0.0 {
        tokens as f64 / (ms / 1e3)
    } else {
        0.0
    }
}

/// Runs the benchmark of a validated qwen2 `config`.
pub fn run(args: &BenchArgs, config: &Config) -> Result<()> {
    let source = setup::qwen2_source(&config.problem)?;
    let seed = config.run.seed;
    let problem = match args.layers {
        None => Problem::qwen2(&source, seed),
        Some(layers) => Problem::qwen2_with_layers(&source, seed, layers),
    }
    .map_err(problem_error)?;
    let hows = match &args.how {
        Some(h) => parse_how(h)?,
        None => vec![config.es.how],
    };
    let variants: Vec<ShardedES> = hows
        .iter()
        .map(|&how: &How| {
            let mut c = config.clone();
            c.es.how = how;
            setup::es_for(&c, &*problem.model)
        })
        .collect::<Result<_>>()?;
    // No compile cache: the report's compile times are measured.
    let client = Client::cpu(config.devices)?.with_compile_cache(None);
    let input = BenchInput {
        client: &client,
        variants: variants.iter().collect(),
        model: &*problem.model,
        params: &problem.params,
        key: problem.key,
        batch: &problem.batch,
        flops: None,
    };
    let report = measure(args, &input)?;
    // The batch's ids are `[batch, seq]`: every member reads all of them.
    let tokens_per_member = problem
        .batch
        .first()
        .map_or(0, |ids| ids.shape().iter().product());
    let all = tokens_per_member * report.n * args.per_dispatch;
    let params = problem.params.num_params();
    let out = Qwen2BenchReport {
        problem: problem.summary.clone(),
        params,
        param_bytes: params * std::mem::size_of::<f32>(),
        tokens_per_member,
        generation_tokens_per_s: report
            .variants
            .iter()
            .map(|v| tokens_per_s(all, v.generation_ms.median))
            .collect(),
        inference_tokens_per_s: tokens_per_s(
            tokens_per_member * report.n,
            report.inference_ms.median,
        ),
        report,
    };
    print_report(args, &qwen2_table(&out), &out)
}

/// The engine's table, its FLOP lines left out (no count is known), and the tokens.
fn qwen2_table(r: &Qwen2BenchReport) -> String {
    let mut s = format!(
        "{}\n{} parameters ({:.1} MiB of f32), {} teacher-forced tokens per member\n",
        r.problem,
        r.params,
        r.param_bytes as f64 / 1048576.0,
        r.tokens_per_member
    );
    for line in table(&r.report).lines() {
        let row = line.trim_start();
        if !(row.starts_with("GFLOP/s") || row.starts_with("of GEMM peak")) {
            s.push_str(line);
            s.push('\n');
        }
    }
    for (v, tps) in r.report.variants.iter().zip(&r.generation_tokens_per_s) {
        s.push_str(&format!(
            "tokens/s: generation (how {}) {:.1}, inference {:.1}\n",
            v.how, tps, r.inference_tokens_per_s
        ));
    }
    s
}
