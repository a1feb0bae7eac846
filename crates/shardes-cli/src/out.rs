//! Terminal output that never stops the program: stdout through [`Stdout`], which stops
//! printing at the first write error and remembers it, and stderr through [`warn`], which
//! ignores errors.
//!
//! `println!` panics when stdout is gone (`shardes run cfg | head -1`, `> /dev/full`, a
//! closed terminal), which killed a training run before its checkpoint. Rust ignores
//! `SIGPIPE`, so a closed pipe shows up here as an `EPIPE` write error instead.
//!
//! What a command does with a failed stdout is its own choice (see [`Stdout::finish`] and
//! `run`): for `shardes run` the output is only progress and the run carries on; for `hlo`,
//! `devices` and `check` the output is the product, so a closed pipe (the reader has all it
//! wanted) ends quietly with the normal exit code, and any other error (`ENOSPC`, `EIO`) is a
//! failure, exit 1.

use std::fmt;
use std::io::{self, Write};

/// Writes a line to [`Stdout`] with `format!` syntax: `outln!(out, "gen {g}")`.
macro_rules! outln {
    ($out:expr) => {
        $out.line(format_args!(""))
    };
    ($out:expr, $($arg:tt)*) => {
        $out.line(format_args!($($arg)*))
    };
}
pub(crate) use outln;

/// Writes a line to stderr with `format!` syntax, ignoring errors (see [`warn`]).
macro_rules! errln {
    ($($arg:tt)*) => {
        $crate::out::warn(format_args!($($arg)*))
    };
}
pub(crate) use errln;

/// Writes one line to stderr. Errors are ignored: stderr is where failures are reported,
/// so there is nowhere left to report its own.
pub fn warn(args: fmt::Arguments<'_>) {
    // One write per line: stderr is unbuffered, and under mpirun the lines of several
    // processes would interleave piece by piece.
    let line = format!("{args}\n");
    let _ = io::stderr().lock().write_all(line.as_bytes());
}

/// Standard output that stops printing at its first error instead of panicking.
#[derive(Debug, Default)]
pub struct Stdout {
    failed: Option<io::Error>,
}

impl Stdout {
    /// Stdout, not yet failed.
    pub fn new() -> Stdout {
        Stdout::default()
    }

    /// Writes `args` and a newline (nothing once a write has failed).
    pub fn line(&mut self, args: fmt::Arguments<'_>) {
        self.write_with(|w| w.write_fmt(args).and_then(|()| w.write_all(b"\n")));
    }

    /// Writes `text` as it is (nothing once a write has failed).
    pub fn text(&mut self, text: &str) {
        self.write_with(|w| w.write_all(text.as_bytes()));
    }

    /// Flushes what is buffered (a line without its newline stays in Rust's buffer).
    pub fn flush(&mut self) {
        self.write_with(|w| w.flush());
    }

    fn write_with(&mut self, f: impl FnOnce(&mut io::StdoutLock<'static>) -> io::Result<()>) {
        if self.failed.is_some() {
            return;
        }
        if let Err(e) = f(&mut io::stdout().lock()) {
            self.failed = Some(e);
        }
    }

    /// Whether every write so far succeeded.
    pub fn ok(&self) -> bool {
        self.failed.is_none()
    }

    /// The first write error, if any.
    pub fn error(&self) -> Option<&io::Error> {
        self.failed.as_ref()
    }

    /// For commands whose output is the product: flushes, then `Ok` when everything was
    /// written or the reader closed the pipe (`EPIPE`: it has all it wanted, as with
    /// `| head`), the first other error otherwise.
    pub fn finish(mut self) -> anyhow::Result<()> {
        self.flush();
        match self.failed {
            None => Ok(()),
            Some(e) if is_closed(&e) => Ok(()),
            Some(e) => Err(anyhow::Error::new(e).context("writing to stdout")),
        }
    }
}

/// Whether `e` says the reader went away (a closed pipe), rather than that writing failed.
pub fn is_closed(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::BrokenPipe
}

/// A failure (exit 1) that, like a [`crate::config::ConfigError`], prints one line saying
/// what happened and a hint saying what to do about it.
#[derive(Debug, thiserror::Error)]
#[error("{message}\n  hint: {hint}")]
pub struct Failure {
    /// What happened.
    pub message: String,
    /// What to do.
    pub hint: String,
}

impl Failure {
    /// The failure `message` with the advice `hint`.
    pub fn new(message: impl Into<String>, hint: impl Into<String>) -> Failure {
        Failure {
            message: message.into(),
            hint: hint.into(),
        }
    }
}
