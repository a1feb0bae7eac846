//! The `shardes` command: run, inspect and benchmark sharded evolution strategies.
//!
//! Exit codes: 0 success; 1 a failure (with its causes; a run that diverged); 2 a usage or
//! configuration error the user can fix (one line saying what is wrong, one hint saying how);
//! 128 + the signal for a run stopped by a signal after writing its checkpoint: 130 after
//! Ctrl-C (SIGINT), 143 after SIGTERM, 129 after SIGHUP. `shardes check` exits 1 when it has
//! findings. Output errors never panic (see [`out`]).

use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};
use shardes::runtime::RuntimeError;

mod bench;
mod completions;
mod config;
mod diag;
mod estimate;
mod eval;
mod export;
mod generate;
mod init;
mod inspect;
mod models;
mod out;
mod plot;
mod rollout;
mod run;
mod setup;
mod taskset;

use config::ConfigError;
use out::{errln, Failure};

/// Sharded evolution strategies on XLA.
#[derive(Debug, Parser)]
#[command(name = "shardes", version, about, long_about = None)]
struct Cli {
    /// Show the PJRT plugin's (XLA's) informational log lines, hidden by default
    /// (`SHARDES_LOG=error|warning|info|debug` overrides this either way).
    #[arg(short, long, global = true)]
    verbose: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Train: progress, metrics.jsonl, checkpoints; `--resume` continues a run.
    Run(run::RunArgs),
    /// Print the generation program (StableHLO; a [task] config's decode, tell or eval with
    /// `--program`), or XLA's optimized program with `--optimized`.
    Hlo(inspect::HloArgs),
    /// List the plugin's devices, platform and versions.
    Devices(inspect::DevicesArgs),
    /// Check a config without compiling: the model reads every leaf, every 2-D leaf through
    /// a seam; for a [task] or MJCF config also what a run would do.
    Check(inspect::CheckArgs),
    /// Measure generation time, FLOP rate, host overhead and memory.
    Bench(bench::BenchArgs),
    /// What the generation program costs to build and compile.
    Diag(diag::DiagArgs),
    /// Gradient-estimate quality per strategy and coupling: cosine to the true gradient, bias, variance.
    Estimate(estimate::EstimateArgs),
    /// Greedy completions of a qwen2 config's model (with rewards when it has a [task]).
    Generate(generate::GenerateArgs),
    /// Held-out score of a run's parameters, the base model, or both (`--compare`).
    Eval(eval::EvalArgs),
    /// A language-model run's parameters as a Hugging Face directory (--hf) and/or a GGUF
    /// file (--gguf), with its model's tokenizer and chat template.
    Export(export::ExportArgs),
    /// The pretrained models a config may name (`problem.model`), cached or not.
    Models(models::ModelsArgs),
    /// Draw a run's curves (fitness, ms/gen, held-out eval) as SVG or PNG; runs overlay.
    Plot(plot::PlotArgs),
    /// Replay a trained control policy: the return of each episode (MuJoCo: qpos as CSV).
    Rollout(rollout::RolloutArgs),
    /// Print a starter config with every key and its default, e.g. `shardes init > my.toml`.
    Init(init::InitArgs),
    /// Print a shell completion script to stdout, e.g. `shardes completions bash`.
    Completions(completions::CompletionsArgs),
}

/// The user error a runtime error stands for, if it is one: the fix is in the config.
fn runtime_user_error(e: &RuntimeError) -> Option<ConfigError> {
    match e {
        RuntimeError::TooManyDevices { requested, max } => Some(ConfigError::new(
            format!(
                "devices = {requested}: the CPU plugin simulates at most {max} devices (its \
                 collectives would wait forever with more)"
            ),
            format!("lower `devices` in the config (or `--devices`) to at most {max}"),
        )),
        RuntimeError::CacheBound { value } => Some(ConfigError::new(
            format!("SHARDES_COMPILE_CACHE_MAX_BYTES = {value:?} is not a size"),
            "set it to a number of bytes or a number with a K, M, G or T suffix (such as \
             500M or 4G), or unset it for the default 4G",
        )),
        _ => None,
    }
}

/// Prints `e` and returns the exit code: 2 for a user error, 1 otherwise.
fn report(e: &anyhow::Error) -> u8 {
    for cause in e.chain() {
        if let Some(user) = cause.downcast_ref::<ConfigError>() {
            errln!("error: {user}");
            return 2;
        }
        // `shardes::Error` is transparent: its `source` skips the runtime error it holds.
        let runtime = cause.downcast_ref::<RuntimeError>().or_else(|| {
            match cause.downcast_ref::<shardes::Error>() {
                Some(shardes::Error::Runtime(r)) => Some(r),
                _ => None,
            }
        });
        if let Some(user) = runtime.and_then(runtime_user_error) {
            errln!("error: {user}");
            return 2;
        }
        if let Some(failure) = cause.downcast_ref::<Failure>() {
            errln!("error: {failure}");
            return 1;
        }
    }
    errln!("error: {e:#}");
    1
}

/// Runs this program again, in the same process, with glibc's huge-page tunable
/// ([`shardes::runtime::host_alloc`]: a large model's generation then takes 512 times fewer
/// page faults), where that changes anything; returns only where it does not or the
/// restart failed, and the command then goes on as it is.
fn restart_with_huge_pages() {
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt;
        let Some(tunables) = shardes::runtime::host_alloc::huge_pages_env() else {
            return;
        };
        let mut args = std::env::args_os();
        let Some(arg0) = args.next() else {
            return;
        };
        // `exec` returns only on failure; the command then runs without huge pages.
        let _failed = std::process::Command::new("/proc/self/exe")
            .arg0(arg0)
            .args(args)
            .env("GLIBC_TUNABLES", tunables)
            .exec();
    }
}

fn main() -> ExitCode {
    restart_with_huge_pages();
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            // clap prints help/version to stdout with success, and usage errors with code 2.
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 2 } else { 0 });
        }
    };
    // Before any client exists: XLA reads its log level when the plugin is first opened.
    shardes::runtime::plugin::set_verbose(cli.verbose);
    let result = match &cli.command {
        Command::Run(a) => run::run(a).map(|o| o.exit_code()),
        Command::Hlo(a) => inspect::hlo(a).map(|()| 0),
        Command::Devices(a) => inspect::devices(a).map(|()| 0),
        Command::Check(a) => inspect::check(a).map(|n| u8::from(n > 0)),
        Command::Bench(a) => bench::run(a).map(|()| 0),
        Command::Diag(a) => diag::run(a).map(|()| 0),
        Command::Estimate(a) => estimate::run(a).map(|()| 0),
        Command::Generate(a) => generate::run(a).map(|()| 0),
        Command::Eval(a) => eval::run(a).map(|()| 0),
        Command::Export(a) => export::run(a).map(|()| 0),
        Command::Models(a) => models::run(a).map(|()| 0),
        Command::Plot(a) => plot::run(a).map(|()| 0),
        Command::Rollout(a) => rollout::run(a).map(|()| 0),
        Command::Init(a) => init::run(a).map(|()| 0),
        Command::Completions(a) => {
            completions::run(a, Cli::command());
            Ok(0)
        }
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => ExitCode::from(report(&e)),
    }
}
