//! How much of the plugin's own logging reaches stderr.
//!
//! XLA inside a PJRT plugin logs through TSL on top of absl, straight to file descriptor 2,
//! and by default shows every INFO line: `cpu_device_count set via create_options: 8` on each
//! client, `Using Shardy for XLA SPMD propagation.` on each compile, and before the first of
//! them absl's `WARNING: All log messages before absl::InitializeLog() is called are written
//! to STDERR`. TSL reads its level from the environment (`TF_CPP_MIN_LOG_LEVEL`: 0 = info,
//! 1 = warning, 2 = error, 3 = fatal; `TF_CPP_MAX_VLOG_LEVEL` for verbose logs), so shardes
//! sets those variables before it opens the first plugin, unless the user has set them.
//!
//! Checked on the pinned CPU plugin: with `TF_CPP_MIN_LOG_LEVEL=1` none of the three lines
//! appears in a normal run, and warnings and errors still do. absl's pre-init line is then
//! printed only directly before the first real warning (absl prints it once, ahead of the
//! first message that reaches stderr; `absl::InitializeLog`, which would silence it, is not
//! exported by the plugin). Hiding it there too would mean redirecting file descriptor 2
//! around a log call at a moment we do not control, or piping all of stderr through a
//! filter thread, which loses XLA's last words when it aborts; neither is worth one line
//! that now only ever accompanies a real warning.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use crate::error::{Result, RuntimeError};

/// The environment variable that overrides the program's [`LogLevel`]
/// (`error`, `warning`, `info` or `debug`).
pub const LOG_ENV: &str = "SHARDES_LOG";

/// How much of the plugin's (XLA's) own logging is shown on stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogLevel {
    /// Errors only.
    Error,
    /// Warnings and errors (the default): a normal run prints nothing from the plugin.
    #[default]
    Warning,
    /// Everything the plugin prints by default, informational lines included.
    Info,
    /// As `Info`, plus XLA's first level of verbose logs (about 1,400 lines per small
    /// program: flags, LLVM options, every pass).
    Debug,
}

impl LogLevel {
    /// The TSL environment variables that select this level.
    fn env(self) -> &'static [(&'static str, &'static str)] {
        match self {
            LogLevel::Error => &[("TF_CPP_MIN_LOG_LEVEL", "2")],
            LogLevel::Warning => &[("TF_CPP_MIN_LOG_LEVEL", "1")],
            LogLevel::Info => &[("TF_CPP_MIN_LOG_LEVEL", "0")],
            LogLevel::Debug => &[
                ("TF_CPP_MIN_LOG_LEVEL", "0"),
                ("TF_CPP_MAX_VLOG_LEVEL", "1"),
            ],
        }
    }

    /// The spelling [`LOG_ENV`] accepts.
    pub fn name(self) -> &'static str {
        match self {
            LogLevel::Error => "error",
            LogLevel::Warning => "warning",
            LogLevel::Info => "info",
            LogLevel::Debug => "debug",
        }
    }
}

impl std::fmt::Display for LogLevel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for LogLevel {
    type Err = RuntimeError;

    fn from_str(s: &str) -> Result<LogLevel> {
        match s.trim().to_ascii_lowercase().as_str() {
            "error" => Ok(LogLevel::Error),
            "warning" | "warn" => Ok(LogLevel::Warning),
            "info" => Ok(LogLevel::Info),
            "debug" => Ok(LogLevel::Debug),
            _ => Err(RuntimeError::UnknownLogLevel {
                value: s.to_string(),
            }),
        }
    }
}

/// The level the program asked for ([`set_log_level`]); `None` = the default.
static REQUESTED: Mutex<Option<LogLevel>> = Mutex::new(None);
/// Whether the environment has been set up (done once, before the first plugin is opened).
static APPLIED: AtomicBool = AtomicBool::new(false);

/// Chooses how much of the plugin's logging is shown. Takes effect when the first plugin of
/// the process is loaded (XLA reads its level then); returns `false` if that has already
/// happened, in which case nothing changes.
///
/// Precedence: `TF_CPP_MIN_LOG_LEVEL` / `TF_CPP_MAX_VLOG_LEVEL` set by the user are never
/// touched; otherwise [`LOG_ENV`] (`SHARDES_LOG=info`), if set, wins over this setting;
/// otherwise this setting; otherwise [`LogLevel::Warning`].
pub fn set_log_level(level: LogLevel) -> bool {
    *REQUESTED.lock().unwrap_or_else(|p| p.into_inner()) = Some(level);
    !APPLIED.load(Ordering::SeqCst)
}

/// [`set_log_level`] for a command line's `-v/--verbose`: [`LogLevel::Info`] if `verbose`,
/// else [`LogLevel::Warning`].
pub fn set_verbose(verbose: bool) -> bool {
    set_log_level(if verbose {
        LogLevel::Info
    } else {
        LogLevel::Warning
    })
}

/// The level that applies now: [`LOG_ENV`] if set, else the requested one, else the default.
pub fn log_level() -> Result<LogLevel> {
    match std::env::var(LOG_ENV) {
        Ok(v) if !v.trim().is_empty() => v.parse(),
        _ => Ok(REQUESTED
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .unwrap_or_default()),
    }
}

/// Sets XLA's logging variables for the chosen level, once, before the first `dlopen`.
///
/// Called by [`super::Plugin::load`] while it holds the plugin registry lock, so two loads
/// cannot race here. `std::env::set_var` is safe in edition 2021 but not thread-safe against
/// C code reading the environment at the same time (edition 2024 marks it `unsafe` for that
/// reason): this runs before the first plugin is opened, so none of XLA's threads exists yet.
/// A program that reads the environment from threads of its own C code while loading its
/// first plugin should set `TF_CPP_MIN_LOG_LEVEL` itself (then nothing is written here).
pub(crate) fn apply() -> Result<()> {
    if APPLIED.load(Ordering::SeqCst) {
        return Ok(());
    }
    let level = log_level()?;
    for (key, value) in level.env() {
        if std::env::var_os(key).is_none() {
            std::env::set_var(key, value);
        }
    }
    APPLIED.store(true, Ordering::SeqCst);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_parse_and_print() {
        for l in [
            LogLevel::Error,
            LogLevel::Warning,
            LogLevel::Info,
            LogLevel::Debug,
        ] {
            assert_eq!(l.name().parse::<LogLevel>().unwrap(), l);
        }
        assert_eq!(" WARN ".parse::<LogLevel>().unwrap(), LogLevel::Warning);
        let err = "loud".parse::<LogLevel>().unwrap_err();
        assert!(err.to_string().contains("SHARDES_LOG"), "{err}");
        assert!(err.to_string().contains("loud"), "{err}");
        assert_eq!(LogLevel::default(), LogLevel::Warning);
    }
}
