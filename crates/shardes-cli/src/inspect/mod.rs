//! `shardes hlo`, `shardes devices` and `shardes check`: look at a run without running it
//! (`check` on a `[task]` or an MJCF config: [`task`], [`mjcf`];
//! `hlo` on a `[task]` config prints the programs [`task::programs`] builds).
//!
//! Their output is the product: a reader that closes the pipe early (`| head`) ends the
//! command quietly with its normal exit code; any other write error (`> /dev/full`) is a
//! failure, exit 1 (see [`crate::out`]).

use std::path::PathBuf;

use anyhow::{Context, Result};
use shardes::hlo::es::{check_model, ShardedES};
use shardes::hlo::problems::control::host::PolicyStep;
use shardes::problem::ProblemShapes;
use shardes::runtime::CompileOptions;

use crate::config::{Config, ConfigError};
use crate::out::{outln, Stdout};
use crate::setup;

mod findings;
pub mod mjcf;
pub mod task;

/// Arguments of `shardes hlo`.
#[derive(Debug, Clone, clap::Args)]
pub struct HloArgs {
    /// The run configuration (TOML).
    pub config: PathBuf,
    /// Print XLA's optimized, partitioned program instead: every instruction with its opcode
    /// and per-device shape.
    #[arg(long)]
    pub optimized: bool,
    /// PJRT plugin for `--optimized`: `cpu`, `cpu-jax`, `cuda`, `tpu` or a path (overrides
    /// the config's).
    #[arg(long)]
    pub plugin: Option<String>,
    /// Which program of a `[task]` (reward) config to print: the decode of every member
    /// (default), the tell, the held-out decode of `[eval]`, or all of them, each after a
    /// `// program: NAME` line. Loss and control configs have one program and refuse it.
    #[arg(long, value_enum)]
    pub program: Option<TaskProgram>,
}

/// A program of a reward run, for `shardes hlo --program`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TaskProgram {
    /// The decode of every member under its perturbation.
    Decode,
    /// The tell (the update from the rewards).
    Tell,
    /// The held-out decode of the unperturbed parameters (`[eval]`).
    Eval,
    /// Every program the run compiles.
    All,
}

impl TaskProgram {
    fn name(self) -> &'static str {
        match self {
            TaskProgram::Decode => "decode",
            TaskProgram::Tell => "tell",
            TaskProgram::Eval => "eval",
            TaskProgram::All => "all",
        }
    }
}

/// Arguments of `shardes devices`.
#[derive(Debug, Clone, clap::Args)]
pub struct DevicesArgs {
    /// PJRT plugin: `cpu` (default: the provisioned CPU plugin), `cuda`, `tpu` or a path.
    #[arg(long)]
    pub plugin: Option<String>,
    /// CPU devices to simulate (ignored by plugins with real devices).
    #[arg(long, default_value_t = 8, value_parser = at_least_one())]
    pub devices: usize,
    /// Print one JSON object instead of the table (for scripts).
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `shardes check`.
#[derive(Debug, Clone, clap::Args)]
pub struct CheckArgs {
    /// The run configuration (TOML).
    pub config: PathBuf,
    /// Print one JSON object (`problem`, `leaves`, `findings` with `path` and `message`)
    /// instead of the lines; the exit code is the same.
    #[arg(long)]
    pub json: bool,
}

/// The ES and the problem of `config` by shape alone: what `hlo`, `check` and `diag` need,
/// with no parameter allocated (a config far too large to run still prints its program).
pub fn problem_shapes(config: &Config) -> Result<(ShardedES, ProblemShapes)> {
    let shapes = setup::Described::of(config)?.shapes(config.run.seed)?;
    let es = setup::es_for(config, &*shapes.model)?;
    crate::config::sigma::check_leaves(&es, &shapes.leaves)?;
    Ok((es, shapes))
}

/// A clap value parser for a count that must be at least 1, so `--flag 0` is a usage error
/// (exit 2) before anything is read or compiled.
pub fn at_least_one() -> impl clap::builder::TypedValueParser<Value = usize> {
    count_in(1, usize::MAX)
}

/// A clap value parser for a count in `lo..=hi`, its error saying so in words.
pub fn count_in(lo: usize, hi: usize) -> impl clap::builder::TypedValueParser<Value = usize> {
    move |s: &str| -> std::result::Result<usize, String> {
        let range = if hi == usize::MAX {
            format!("at least {lo}")
        } else {
            format!("between {lo} and {hi}")
        };
        match s.trim().parse::<usize>() {
            Ok(v) if (lo..=hi).contains(&v) => Ok(v),
            Ok(_) => Err(format!("must be {range}")),
            Err(_) => Err(format!("must be a whole number, {range}")),
        }
    }
}

/// Refuses an output file the command could not write, before the work that fills it: an
/// existing file must open for writing (it is left as it is), a new one must be creatable
/// (it is created and removed again).
pub fn check_writable(flag: &str, path: &std::path::Path) -> Result<()> {
    let existed = path.exists();
    let opened = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path);
    match opened {
        Ok(_) => {
            if !existed {
                let _ = std::fs::remove_file(path);
            }
            Ok(())
        }
        Err(e) => Err(ConfigError::new(
            format!(
                "{flag} {}: cannot write the report there: {e}",
                path.display()
            ),
            format!(
                "pass {flag} a file in a directory that exists and is writable (it is written \
                 after the measurements)"
            ),
        )
        .into()),
    }
}

/// The generation program of `config` as StableHLO text; for a control problem on a
/// MuJoCo model, whose episodes run on the host, its policy step (the outputs program).
pub fn generation_mlir(config: &Config) -> Result<String> {
    let (es, p) = problem_shapes(config)?;
    if let Some(h) = setup::host_control(config)? {
        let spec = h.spec();
        let step = PolicyStep::new(&h.widths(), config.es.n, spec.episodes())?
            .with_fitness(spec.fitness());
        let program = es
            .outputs_program(&step, &p.leaves)
            .context("building the policy step program")?;
        return Ok(program.module.to_mlir());
    }
    let program = es
        .generation_program(&*p.model, &p.leaves)
        .context("building the generation program")?;
    Ok(program.module.to_mlir())
}

/// The programs `shardes hlo` prints for `config`, named: a `[task]` config's selection
/// (`--program`, the decode by default) of the programs a reward run compiles, else the one
/// generation program ([`generation_mlir`]).
fn hlo_programs(config: &Config, program: Option<TaskProgram>) -> Result<Vec<(String, String)>> {
    if config.task.is_none() {
        if let Some(p) = program {
            return Err(ConfigError::new(
                format!(
                    "--program {}: only a [task] config has several programs",
                    p.name()
                ),
                "remove --program (this config has one generation program), or pass a \
                 config with a [task]",
            )
            .into());
        }
        return Ok(vec![("generation".into(), generation_mlir(config)?)]);
    }
    let want = program.unwrap_or(TaskProgram::Decode);
    if want == TaskProgram::Eval && config.eval.is_none() {
        return Err(ConfigError::new(
            "--program eval: the config has no [eval], so a run compiles no held-out decode",
            "add an [eval] section (every, prompts), or print --program decode or tell",
        )
        .into());
    }
    let plan = task::plan(config)?;
    let built = task::programs(config, &plan)?;
    Ok(built
        .into_iter()
        .filter(|b| want == TaskProgram::All || b.name == want.name())
        .map(|b| (b.name.to_string(), b.program.module.to_mlir()))
        .collect())
}

/// Runs `shardes hlo`.
pub fn hlo(args: &HloArgs) -> Result<()> {
    let mut config = Config::load(&args.config)?;
    if let Some(p) = &args.plugin {
        config.plugin = Some(p.clone());
    }
    let programs = hlo_programs(&config, args.program)?;
    // A name line only where there is more than one program to tell apart.
    let named = programs.len() > 1;
    let mut out = Stdout::new();
    if !args.optimized {
        for (name, mlir) in &programs {
            if named {
                outln!(out, "// program: {name}");
            }
            out.text(mlir);
            if named && !mlir.ends_with('\n') {
                out.text("\n");
            }
        }
        return out.finish();
    }
    let client = setup::client(&config)?;
    for (name, mlir) in &programs {
        let exe = client
            .compile(mlir, &CompileOptions::new(config.devices))
            .with_context(|| format!("compiling the {name} program"))?;
        let module = exe
            .optimized_hlo()
            .context("reading XLA's optimized program")?;
        if named {
            outln!(out, "// program: {name}");
        }
        outln!(
            out,
            "// {}: optimized for {} partitions; shapes are per device",
            module.name,
            config.devices
        );
        for comp in &module.computations {
            let entry = if comp.name == module.entry {
                " (entry)"
            } else {
                ""
            };
            if !out.ok() {
                break;
            }
            outln!(out, "computation {}{entry} {{", comp.name);
            for inst in &comp.instructions {
                outln!(out, "  {} = {inst}", inst.name);
            }
            outln!(out, "}}");
        }
        if !out.ok() {
            break;
        }
    }
    out.finish()
}

/// Runs `shardes devices`.
pub fn devices(args: &DevicesArgs) -> Result<()> {
    let client = setup::client_for(args.plugin.as_deref(), args.devices)?;
    let plugin = client.plugin();
    let (major, minor) = plugin.api_version();
    let mut out = Stdout::new();
    if args.json {
        let devices: Vec<serde_json::Value> = client
            .devices()
            .iter()
            .map(|d| serde_json::json!({"id": d.id, "kind": d.kind, "description": d.description}))
            .collect();
        let doc = serde_json::json!({
            "plugin": plugin.path().display().to_string(),
            "platform": client.platform_name(),
            "pjrt_api": format!("{major}.{minor}"),
            "xla_version": plugin.xla_version(),
            "stablehlo_version": plugin.stablehlo_current_version(),
            "stablehlo_minimum_version": plugin.stablehlo_minimum_version(),
            "device_count": client.device_count(),
            "devices": devices,
            "huge_pages": shardes::runtime::host_alloc::huge_pages_state(),
        });
        outln!(out, "{doc}");
        return out.finish();
    }
    outln!(out, "plugin     {}", plugin.path().display());
    outln!(out, "platform   {}", client.platform_name());
    outln!(out, "pjrt api   {major}.{minor}");
    let or_unknown = |v: Option<String>| v.unwrap_or_else(|| "(not reported)".into());
    outln!(out, "xla        {}", or_unknown(plugin.xla_version()));
    outln!(
        out,
        "stablehlo  {} (minimum {})",
        or_unknown(plugin.stablehlo_current_version()),
        or_unknown(plugin.stablehlo_minimum_version())
    );
    outln!(out, "devices    {}", client.device_count());
    for d in client.devices() {
        outln!(out, "  {:>3}  {:<6} {}", d.id, d.kind, d.description);
    }
    outln!(
        out,
        "huge pages {}",
        shardes::runtime::host_alloc::huge_pages_state()
    );
    out.finish()
}

/// Runs `shardes check`; returns the number of findings.
pub fn check(args: &CheckArgs) -> Result<usize> {
    let config = Config::load(&args.config)?;
    if config.task.is_some() {
        return task::check(&config, args.json);
    }
    if mjcf::is_mjcf(&config)? {
        return mjcf::check(&config, args.json);
    }
    let (_, p) = problem_shapes(&config)?;
    let leaves = p.leaves;
    let findings = check_model(&*p.model, &leaves).context("tracing the model")?;
    let mut out = Stdout::new();
    if args.json {
        let list = findings::to_json(&findings);
        let doc = serde_json::json!({
            "problem": config.problem.name(),
            "leaves": leaves.len(),
            "findings": list,
        });
        outln!(out, "{doc}");
    } else {
        let ok = format!(
            "ok: {} reads all {} leaves, every 2-D leaf through a seam",
            config.problem.name(),
            leaves.len()
        );
        findings::print(&mut out, &findings, &ok, "");
    }
    out.finish()?;
    Ok(findings.len())
}
