//! `shardes hlo`, `shardes devices` and `shardes check`: look at a run without running it.
//!
//! Their output is the product: a reader that closes the pipe early (`| head`) ends the
//! command quietly with its normal exit code; any other write error (`> /dev/full`) is a
//! failure, exit 1 (see [`crate::out`]).

use std::path::PathBuf;

use anyhow::{Context, Result};
use shardes::hlo::es::{check_model, leaf_infos};
use shardes::runtime::CompileOptions;

use crate::config::Config;
use crate::out::{outln, Stdout};
use crate::setup;

/// Arguments of `shardes hlo`.
#[derive(Debug, Clone, clap::Args)]
pub struct HloArgs {
    /// The run configuration (TOML).
    pub config: PathBuf,
    /// Print XLA's optimized, partitioned program instead: every instruction with its opcode
    /// and per-device shape.
    #[arg(long)]
    pub optimized: bool,
    /// PJRT plugin for `--optimized`: `cpu`, `cuda`, `tpu` or a path (overrides the config's).
    #[arg(long)]
    pub plugin: Option<String>,
}

/// Arguments of `shardes devices`.
#[derive(Debug, Clone, clap::Args)]
pub struct DevicesArgs {
    /// PJRT plugin: `cpu` (default: the provisioned CPU plugin), `cuda`, `tpu` or a path.
    #[arg(long)]
    pub plugin: Option<String>,
    /// CPU devices to simulate (ignored by plugins with real devices).
    #[arg(long, default_value_t = 8)]
    pub devices: usize,
}

/// Arguments of `shardes check`.
#[derive(Debug, Clone, clap::Args)]
pub struct CheckArgs {
    /// The run configuration (TOML).
    pub config: PathBuf,
}

/// The generation program of `config` as StableHLO text.
pub fn generation_mlir(config: &Config) -> Result<String> {
    let (es, p) = setup::problem(config)?;
    let program = es
        .generation_program(&*p.model, &leaf_infos(&p.params))
        .context("building the generation program")?;
    Ok(program.module.to_mlir())
}

/// Runs `shardes hlo`.
pub fn hlo(args: &HloArgs) -> Result<()> {
    let mut config = Config::load(&args.config)?;
    if let Some(p) = &args.plugin {
        config.plugin = Some(p.clone());
    }
    let mlir = generation_mlir(&config)?;
    let mut out = Stdout::new();
    if !args.optimized {
        out.text(&mlir);
        return out.finish();
    }
    let client = setup::client(&config)?;
    let exe = client
        .compile(&mlir, &CompileOptions::new(config.devices))
        .context("compiling the generation program")?;
    let module = exe
        .optimized_hlo()
        .context("reading XLA's optimized program")?;
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
    out.finish()
}

/// Runs `shardes devices`.
pub fn devices(args: &DevicesArgs) -> Result<()> {
    let client = setup::client_for(args.plugin.as_deref(), args.devices)?;
    let plugin = client.plugin();
    let (major, minor) = plugin.api_version();
    let mut out = Stdout::new();
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
    out.finish()
}

/// Runs `shardes check`; returns the number of findings.
pub fn check(args: &CheckArgs) -> Result<usize> {
    let config = Config::load(&args.config)?;
    let (_, p) = setup::problem(&config)?;
    let leaves = leaf_infos(&p.params);
    let findings = check_model(&*p.model, &leaves).context("tracing the model")?;
    let mut out = Stdout::new();
    if findings.is_empty() {
        outln!(
            out,
            "ok: {} reads all {} leaves, every 2-D leaf through a seam",
            config.problem.name(),
            leaves.len()
        );
    } else {
        for f in &findings {
            outln!(out, "{}: {}", f.path, f.message);
        }
        outln!(out, "{} finding(s)", findings.len());
    }
    out.finish()?;
    Ok(findings.len())
}
