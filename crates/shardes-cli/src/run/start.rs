//! The out directory's errors as the CLI's: a [`RunDirError`] the user can fix is a
//! [`ConfigError`] (exit 2), any other a [`Failure`] (exit 1), both with the library's
//! what and hint.

use std::path::Path;

use shardes::rundir::RunDirError;
use shardes::session::SessionError;

use crate::config::{Config, ConfigError};
use crate::out::Failure;

/// `e` as the CLI's error.
pub fn rundir_error(e: RunDirError) -> anyhow::Error {
    if e.is_user_error() {
        ConfigError::new(e.what(), e.hint()).into()
    } else {
        Failure::new(e.what(), e.hint()).into()
    }
}

/// A session's error as the CLI's: what the user can fix (inputs that are not finite, a
/// resume of other files, a prompt longer than `task.prompt_len`) a [`ConfigError`] (exit
/// 2), a divergence a [`Failure`] (exit 1), a failed step with the generation as context.
pub fn session_error(e: SessionError) -> anyhow::Error {
    match e {
        SessionError::Generation { generation, source } => {
            super::reward::too_long(source).context(format!("running generation {generation}"))
        }
        SessionError::Refused { message, fix } => ConfigError::new(message, fix).into(),
        SessionError::Diverged { message, fix } => Failure::new(message, fix).into(),
        SessionError::RunDir(e) => rundir_error(e),
        other => other.into(),
    }
}

/// A refusal of `RunDir::prepare` for a run whose config hashes to `hash`, as the CLI's
/// error. A directory that holds nothing but a `config.toml` (a start of a shardes before
/// run markers, stopped before its first generation) is told apart by that config: another
/// config's run, a start of this one, or not a shardes config at all.
pub fn refusal(e: RunDirError, hash: &str) -> anyhow::Error {
    let RunDirError::NotARunDir { dir, entries } = &e else {
        return rundir_error(e);
    };
    if entries.len() != 1 || entries[0] != "config.toml" {
        return rundir_error(e);
    }
    let found = std::fs::read_to_string(dir.join("config.toml"))
        .ok()
        .and_then(|text| Config::parse(&text).ok())
        .map(|c| c.trajectory_hash());
    match found {
        Some(found) if found != hash => rundir_error(RunDirError::OtherConfig {
            dir: dir.clone(),
            found,
            expected: hash.to_string(),
            resume: false,
        }),
        Some(_) => ConfigError::new(
            format!(
                "{} holds the config.toml of an earlier start of this config, which stopped \
                 before its first generation",
                dir.display()
            ),
            format!(
                "pass --force to start over there (the file is moved to {}), or choose another \
                 run.out",
                previous(dir)
            ),
        )
        .into(),
        None => ConfigError::new(
            format!(
                "{} is not a shardes run directory: its config.toml is not a shardes config",
                dir.display()
            ),
            e.hint(),
        )
        .into(),
    }
}

fn previous(dir: &Path) -> String {
    dir.join("previous").display().to_string()
}
