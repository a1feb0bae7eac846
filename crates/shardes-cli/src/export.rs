//! `shardes export RUN_DIR --hf OUT_DIR | --gguf OUT.gguf`: a language-model run's trained
//! parameters as a Hugging Face directory and/or a GGUF file, with the settings,
//! tokenizer and chat template of the pretrained model the run started from
//! ([`shardes::export`]).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use shardes::export::{self, ExportError, GgufType, HfDtype, Source, Written};
use shardes::Qwen2Weights;

use crate::config::{Config, ConfigError, ProblemConfig, WeightsKey};
use crate::out::{outln, Stdout};
use crate::setup;

/// Arguments of `shardes export`.
#[derive(Debug, Clone, clap::Args)]
pub struct ExportArgs {
    /// A run directory written by `shardes run` (its config.toml and params.safetensors),
    /// or a config file together with --params.
    pub run: PathBuf,
    /// Write a Hugging Face directory (config.json, model.safetensors, tokenizer files).
    #[arg(long, value_name = "OUT_DIR")]
    pub hf: Option<PathBuf>,
    /// How model.safetensors stores the weights.
    #[arg(long, default_value = "f32", value_parser = ["f32", "bf16"], ignore_case = true)]
    pub dtype: String,
    /// Write a GGUF file (llama.cpp's format).
    #[arg(long, value_name = "OUT.gguf")]
    pub gguf: Option<PathBuf>,
    /// How the GGUF file stores its matrices (norms and biases stay F32).
    #[arg(long, default_value = "f32", value_parser = ["f32", "f16", "q8_0"], ignore_case = true)]
    pub gguf_type: String,
    /// The parameters to export (default: RUN_DIR/params.safetensors).
    #[arg(long, value_name = "FILE")]
    pub params: Option<PathBuf>,
    /// Replace an existing OUT_DIR or OUT.gguf.
    #[arg(long)]
    pub force: bool,
}

/// Runs `shardes export`.
pub fn run(args: &ExportArgs) -> Result<()> {
    if args.hf.is_none() && args.gguf.is_none() {
        return Err(ConfigError::new(
            "nothing to export: neither --hf nor --gguf was given",
            "add --hf OUT_DIR (a Hugging Face directory) and/or --gguf OUT.gguf",
        )
        .into());
    }
    if let (Some(h), Some(g)) = (&args.hf, &args.gguf) {
        if h == g {
            return Err(ConfigError::new(
                format!("--hf and --gguf both name {}", h.display()),
                "give the directory and the file different paths",
            )
            .into());
        }
    }
    // clap checked the spellings.
    let dtype: HfDtype = args
        .dtype
        .parse()
        .map_err(|e: String| ConfigError::new(e, "use f32 or bf16"))?;
    let gguf_type: GgufType = args
        .gguf_type
        .parse()
        .map_err(|e: String| ConfigError::new(e, "use f32, f16 or q8_0"))?;
    let (config_path, params_path) = inputs(&args.run, args.params.as_deref())?;
    // The targets first: a refused path costs nothing.
    if let Some(h) = &args.hf {
        export::check_target(h, args.force, true).map_err(export_error)?;
    }
    if let Some(g) = &args.gguf {
        export::check_target(g, args.force, false).map_err(export_error)?;
    }
    let config = Config::load(&config_path)?;
    if !matches!(config.problem, ProblemConfig::Qwen2 { .. }) {
        return Err(ConfigError::new(
            format!(
                "{}: shardes export writes language models, not problem \"{}\"",
                config_path.display(),
                config.problem.name()
            ),
            "export a run of a config with [problem] name = \"qwen2\"",
        )
        .into());
    }
    if let WeightsKey::Size(size) = config.problem.weights_key()? {
        return Err(ConfigError::new(
            format!(
                "{}: problem.size = \"{size}\" draws a random model, which has no tokenizer or \
                 pretrained files to export with",
                config_path.display()
            ),
            "export runs that start from a pretrained model (problem.model or problem.checkpoint)",
        )
        .into());
    }
    let Qwen2Weights::Checkpoint(model) = setup::weights(&config.problem)? else {
        anyhow::bail!("problem.model or problem.checkpoint resolved to no files");
    };
    let source = Source::open(&model)
        .map_err(export_error)
        .with_context(|| format!("reading the run's model {}", model.display()))?;
    let params = export::read_params(&params_path, &source).map_err(export_error)?;
    let mut o = Stdout::new();
    outln!(
        o,
        "exporting {} ({} model of {}, {} tensors)",
        params_path.display(),
        source.family.name,
        source.path.display(),
        params.num_leaves()
    );
    if let Some(h) = &args.hf {
        let w = export::to_hf(&source, &params, h, dtype, args.force).map_err(export_error)?;
        report(&mut o, "Hugging Face directory", &w);
    }
    if let Some(g) = &args.gguf {
        let w =
            export::to_gguf(&source, &params, g, gguf_type, args.force).map_err(export_error)?;
        report(&mut o, "GGUF file", &w);
    }
    o.finish()
}

/// The config and the parameter file of `run`: a run directory's own, or a config file
/// with `--params`.
fn inputs(run: &Path, params: Option<&Path>) -> Result<(PathBuf, PathBuf)> {
    if run.is_dir() {
        let config = run.join("config.toml");
        if !config.is_file() {
            return Err(ConfigError::new(
                format!(
                    "{} has no config.toml: it is not a run directory",
                    run.display()
                ),
                "pass the out directory of a `shardes run` (run.out), or a config file with \
                 --params FILE",
            )
            .into());
        }
        let params = params.map_or_else(|| run.join("params.safetensors"), Path::to_path_buf);
        if !params.is_file() {
            return Err(ConfigError::new(
                format!("{} does not exist", params.display()),
                "the run has written no checkpoint yet; let it finish a checkpoint \
                 (run.checkpoint_every), or pass --params FILE",
            )
            .into());
        }
        return Ok((config, params));
    }
    if !run.is_file() {
        return Err(ConfigError::new(
            format!("{} does not exist", run.display()),
            "pass a run directory written by `shardes run`, or a config file with --params FILE",
        )
        .into());
    }
    let Some(params) = params else {
        return Err(ConfigError::new(
            format!(
                "{} is a file: export needs the parameters too",
                run.display()
            ),
            "pass --params FILE (a params.safetensors written by `shardes run` for this config), \
             or the run directory instead",
        )
        .into());
    };
    if !params.is_file() {
        return Err(ConfigError::new(
            format!("--params {} does not exist", params.display()),
            "pass a params.safetensors written by `shardes run` for this config",
        )
        .into());
    }
    Ok((run.to_path_buf(), params.to_path_buf()))
}

/// An export error as the CLI reports it: the user's to fix (exit 2) or a failure.
fn export_error(e: ExportError) -> anyhow::Error {
    let hint = match &e {
        ExportError::Exists { .. } => "pass --force to replace it, or choose another path",
        ExportError::WrongKind { .. }
        | ExportError::ParentIsFile { .. }
        | ExportError::ParentMissing { .. }
        | ExportError::NotWritable { .. } => "choose a path in a directory you can write to",
        ExportError::Params { .. } | ExportError::ParamsRead(_) => {
            "pass --params with the params.safetensors of a run of this model"
        }
        ExportError::Unsupported { .. } => {
            "export the other format, or a model without that setting"
        }
        _ => return anyhow::Error::new(e),
    };
    ConfigError::new(e.to_string(), hint).into()
}

fn report(o: &mut Stdout, what: &str, w: &Written) {
    outln!(
        o,
        "wrote {} ({what}): {} tensors, {}, {} ({} bytes)",
        w.path.display(),
        w.tensors,
        w.dtype,
        export::human_bytes(w.bytes),
        w.bytes
    );
    if w.files.len() > 1 {
        for (f, n) in &w.files {
            outln!(o, "  {}  {}", f.display(), export::human_bytes(*n));
        }
    }
    for n in &w.notes {
        outln!(o, "  note: {n}");
    }
}
