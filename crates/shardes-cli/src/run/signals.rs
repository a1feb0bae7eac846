//! SIGINT, SIGTERM and SIGHUP stop a run the same way: the first finishes the current
//! generation, writes a checkpoint and exits 128 + the signal (130, 143, 129); a second exits
//! at once with 128 + its number, leaving the last checkpoint intact (its writes are atomic
//! as a pair, see `shardes::rundir`).
//!
//! SIGTERM is how `timeout`, systemd, Docker and Slurm stop a job, and SIGHUP what a closed
//! terminal or ssh session sends, so all three mean "stop, but keep the work".

use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;

use anyhow::{Context, Result};
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

use crate::out::errln;

pub use shardes::session::Signal;

/// The first stop signal received, if any; shared with the signal thread.
#[derive(Debug, Clone)]
pub struct Stop(Arc<AtomicI32>);

impl Stop {
    /// The first signal received so far.
    pub fn received(&self) -> Option<Signal> {
        match self.0.load(Ordering::SeqCst) {
            0 => None,
            s => Some(Signal(s)),
        }
    }
}

/// Starts handling SIGINT, SIGTERM and SIGHUP (see the module docs) for the rest of the
/// process.
pub fn install() -> Result<Stop> {
    let mut signals =
        Signals::new([SIGINT, SIGTERM, SIGHUP]).context("installing the signal handlers")?;
    let first = Arc::new(AtomicI32::new(0));
    let seen = Arc::clone(&first);
    // The handlers only queue the signal; this thread acts on it outside signal context.
    std::thread::Builder::new()
        .name("shardes-signals".into())
        .spawn(move || {
            for sig in signals.forever() {
                if seen
                    .compare_exchange(0, sig, Ordering::SeqCst, Ordering::SeqCst)
                    .is_err()
                {
                    errln!(
                        "\n{}: quitting now (the last checkpoint is intact)",
                        Signal(sig).name()
                    );
                    // `_exit`: no atexit handlers or destructors racing the plugin's threads.
                    signal_hook::low_level::exit(128 + sig);
                }
                errln!(
                    "\n{}: finishing this generation and writing a checkpoint (signal again to \
                     quit now)",
                    Signal(sig).name()
                );
            }
        })
        .context("starting the signal thread")?;
    Ok(Stop(first))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_library_names_the_signals_this_platform_numbers() {
        assert_eq!(Signal(SIGINT).name(), "SIGINT (Ctrl-C)");
        assert_eq!(Signal(SIGTERM).name(), "SIGTERM");
        assert_eq!(Signal(SIGHUP).name(), "SIGHUP");
        assert_eq!(Signal(SIGTERM).exit_code(), 143);
    }
}
