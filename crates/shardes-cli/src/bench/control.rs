//! `shardes bench` on a control config: environment steps per second of the in-program
//! rollout, or for a MuJoCo model the split between the host simulations and the device
//! policy evaluations, each next to a plain-Rust reference loop ([`shardes::bench_control`]).

use anyhow::{Context, Result};
use serde::Serialize;
use shardes::bench_control::{self, ControlRun, InProgramReport, MjcfReport, Reference};
use shardes::hlo::prng::fold_in;

use super::{print_report, BenchArgs};
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
    let (table, report) = match setup::host_control(config)? {
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
            (mjcf_table(&r), Report::Mjcf(r))
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
            (in_program_table(&r), Report::InProgram(r))
        }
    };
    print_report(args, &table, &report)
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

/// The lines both reports start with: `title` and the rounds, a generation's time and the
/// environment steps per second of `run`, with what those steps count.
fn head(title: &str, run: &ControlRun, counted: &str) -> String {
    let (generation_ms, steps_per_s) = (&run.generation_ms, run.env_steps_per_s);
    format!(
        "{title} rounds={}\n  {:<30}{:>14.2}   ({:.2}..{:.2})\n  {:<30}{:>14.0}   ({counted})\n",
        generation_ms.samples,
        "generation ms (median)",
        generation_ms.median,
        generation_ms.min,
        generation_ms.max,
        "env steps/s",
        steps_per_s
    )
}

/// The in-program report as a table.
pub fn in_program_table(r: &InProgramReport) -> String {
    let title = format!(
        "control {} (in the program) n={} episodes={} steps={} devices={}",
        r.env, r.run.n, r.run.episodes, r.run.steps, r.run.devices
    );
    let counted = "n · episodes · steps per generation";
    let mut s = head(&title, &r.run, counted);
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
    let title = format!(
        "control {} (MuJoCo on host threads) n={} episodes={} steps≤{} devices={}",
        r.model, r.run.n, r.run.episodes, r.run.steps, r.run.devices
    );
    let counted = "episode steps simulated";
    let mut s = head(&title, &r.run, counted);
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
