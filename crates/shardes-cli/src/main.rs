//! The `shardes` command: run, inspect and benchmark sharded evolution strategies.
//!
//! Exit codes: 0 success; 1 a failure (with its causes); 2 a usage or configuration error the
//! user can fix (one line saying what is wrong, one hint saying how); 130 interrupted by
//! Ctrl-C after writing a checkpoint. `shardes check` exits 1 when it has findings.

use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

mod bench;
mod completions;
mod config;
mod diag;
mod inspect;
mod plot;
mod run;
mod setup;

use config::ConfigError;

/// Sharded evolution strategies on XLA.
#[derive(Debug, Parser)]
#[command(name = "shardes", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Train: progress, metrics.jsonl, checkpoints; `--resume` continues a run.
    Run(run::RunArgs),
    /// Print the generation program (StableHLO), or XLA's optimized program with `--optimized`.
    Hlo(inspect::HloArgs),
    /// List the plugin's devices, platform and versions.
    Devices(inspect::DevicesArgs),
    /// Check that the model reads every leaf, and every 2-D leaf through a seam.
    Check(inspect::CheckArgs),
    /// Measure generation time, FLOP rate, host overhead and memory.
    Bench(bench::BenchArgs),
    /// What the generation program costs to build and compile.
    Diag(diag::DiagArgs),
    /// Draw a run's curves (fitness, ms/gen, held-out eval) as SVG or PNG; runs overlay.
    Plot(plot::PlotArgs),
    /// Print a shell completion script to stdout, e.g. `shardes completions bash`.
    Completions(completions::CompletionsArgs),
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            // clap prints help/version to stdout with success, and usage errors with code 2.
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 2 } else { 0 });
        }
    };
    let result = match &cli.command {
        Command::Run(a) => run::run(a).map(|o| match o {
            run::Outcome::Finished => 0,
            run::Outcome::Interrupted => 130,
        }),
        Command::Hlo(a) => inspect::hlo(a).map(|()| 0),
        Command::Devices(a) => inspect::devices(a).map(|()| 0),
        Command::Check(a) => inspect::check(a).map(|n| u8::from(n > 0)),
        Command::Bench(a) => bench::run(a).map(|()| 0),
        Command::Diag(a) => diag::run(a).map(|()| 0),
        Command::Plot(a) => plot::run(a).map(|()| 0),
        Command::Completions(a) => {
            completions::run(a, Cli::command());
            Ok(0)
        }
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            if let Some(user) = e.chain().find_map(|c| c.downcast_ref::<ConfigError>()) {
                eprintln!("error: {user}");
                ExitCode::from(2)
            } else {
                eprintln!("error: {e:#}");
                ExitCode::from(1)
            }
        }
    }
}
