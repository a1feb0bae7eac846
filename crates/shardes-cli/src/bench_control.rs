//! `shardes bench` on a control config: environment steps per second of the in-program
//! rollout, or for a MuJoCo model the split between the host simulations and the device
//! policy evaluations, each next to a plain-Rust reference loop ([`shardes::bench_control`]).

use std::path::Path;

use anyhow::{Context, Result};
use serde::Serialize;
use shardes::bench_control::{self, InProgramReport, MjcfReport, Reference};
use shardes::hlo::prng::fold_in;

use crate::bench::BenchArgs;
use crate::config::{control, Config};
use crate::setup;

/// The report of either path, for `--json`.
#[derive(Serialize)]
#[serde(untagged)]
enum Report {
    InProgram(InProgramReport),
    Mjcf(MjcfReport),
}

/// Runs the control benchmark of `config` (already validated, overrides applied).
pub fn run(args: &BenchArgs, config: &Config) -> Result<()> {
    let es = setup::es(config)?;
    // No compile cache: the report's compile times are measured.
    let client = setup::client(config)?.with_compile_cache(None);
    let report = match setup::host_control(config)? {
        Some(h) => {
            let p = shardes::Problem::mjcf(&h, config.es.n, config.run.seed)
                .map_err(setup::problem_error)?;
            let es = es.with_member_bytes(p.model.member_bytes());
            let r = bench_control::mjcf(
                &client,
                &es,
                &h,
                &p.params,
                p.key,
                args.warmup,
                args.generations,
            )
            .context("benchmarking the MuJoCo control problem")?;
            print!("{}", mjcf_table(&r));
            Report::Mjcf(r)
        }
        None => {
            let c = control(&config.problem, config.es.shaping)?;
            let p = shardes::Problem::control(c.clone(), config.run.seed)
                .map_err(setup::problem_error)?;
            let es = es.with_member_bytes(p.model.member_bytes());
            let reset = c.reset_states(fold_in(p.key, 1))?;
            let r = bench_control::in_program(
                &client,
                &es,
                &c,
                &p.params,
                p.key,
                &reset,
                args.warmup,
                args.generations,
            )
            .context("benchmarking the control problem")?;
            print!("{}", in_program_table(&r));
            Report::InProgram(r)
        }
    };
    if let Some(path) = &args.json {
        write_json(path, &report)?;
    }
    Ok(())
}

fn write_json(path: &Path, report: &Report) -> Result<()> {
    let text = serde_json::to_string_pretty(report)?;
    std::fs::write(path, text)
        .with_context(|| format!("writing the JSON report to {}", path.display()))
}

fn reference_line(r: &Reference) -> String {
    format!(
        "  {:<30}{:>14.0}   ({:.0} % simulation; {})\n",
        "reference env steps/s",
        r.env_steps_per_s,
        100.0 * r.sim_secs / (r.sim_secs + r.policy_secs).max(1e-12),
        r.what
    )
}

/// The in-program report as a table.
pub fn in_program_table(r: &InProgramReport) -> String {
    let mut s = format!(
        "control {} (in the program) n={} episodes={} steps={} devices={} rounds={}\n",
        r.env, r.n, r.episodes, r.steps, r.devices, r.generation_ms.samples
    );
    s.push_str(&format!(
        "  {:<30}{:>14.2}   ({:.2}..{:.2})\n",
        "generation ms (median)", r.generation_ms.median, r.generation_ms.min, r.generation_ms.max
    ));
    s.push_str(&format!(
        "  {:<30}{:>14.0}   (n · episodes · steps per generation)\n",
        "env steps/s", r.env_steps_per_s
    ));
    match &r.reference {
        Some(x) => s.push_str(&reference_line(x)),
        None => s.push_str("  reference: only for cartpole_balance\n"),
    }
    s
}

/// The MuJoCo report as a table.
pub fn mjcf_table(r: &MjcfReport) -> String {
    let total = (r.sim_secs + r.policy_secs + r.tell_secs).max(1e-12);
    let pct = |x: f64| 100.0 * x / total;
    let mut s = format!(
        "control {} (MuJoCo on host threads) n={} episodes={} steps≤{} devices={} rounds={}\n",
        r.model, r.n, r.episodes, r.steps, r.devices, r.generation_ms.samples
    );
    s.push_str(&format!(
        "  {:<30}{:>14.2}   ({:.2}..{:.2})\n",
        "generation ms (median)", r.generation_ms.median, r.generation_ms.min, r.generation_ms.max
    ));
    s.push_str(&format!(
        "  {:<30}{:>14.0}   (episode steps simulated)\n",
        "env steps/s", r.env_steps_per_s
    ));
    s.push_str(&format!(
        "  {:<30}{:>13.1}%   ({:.3} s)\n",
        "host simulation",
        pct(r.sim_secs),
        r.sim_secs
    ));
    s.push_str(&format!(
        "  {:<30}{:>13.1}%   ({:.3} s, {} dispatches, {:.3} ms each)\n",
        "device policy evaluation",
        pct(r.policy_secs),
        r.policy_secs,
        r.dispatches,
        1e3 * r.policy_secs / (r.dispatches.max(1) as f64)
    ));
    s.push_str(&format!(
        "  {:<30}{:>13.1}%   ({:.3} s)\n",
        "tell",
        pct(r.tell_secs),
        r.tell_secs
    ));
    s.push_str(&reference_line(&r.reference));
    s
}
