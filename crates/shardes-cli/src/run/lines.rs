//! Where `shardes run` prints its lines: straight to stdout on one process, through a
//! thread of their own on the lead of a run across processes, so that the run never waits
//! for its reader.
//!
//! `mpirun` (Open MPI 4.1) reads its processes' output in the thread that also runs its
//! kill sequence after a Ctrl-C: SIGCONT, a sleep of `odls_base_sigkill_timeout` seconds,
//! SIGTERM, the same sleep, SIGKILL. During those sleeps nothing reads the terminal the
//! lead prints to; a lead writing a progress line per generation fills it and blocks in
//! `write`, so the SIGTERM that follows finds it unable to reach the generation boundary
//! where the processes agree to stop and it checkpoints, and the SIGKILL ends it without
//! the checkpoint (seen with the sleep raised to 40 s: the lead blocked writing to its pty
//! from the first seconds, the other process waiting for it in the next collective).
//! Queued here, a line waits in memory instead (up to [`QUEUE`] lines, then new ones are
//! dropped, and a note says how many).

use std::fmt;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::out::{errln, Stdout};

/// Lines a [`Lines::queued`] holds for a reader that does not read, before it drops new
/// ones.
const QUEUE: usize = 4096;

/// How long a [`Queue`] waits at the end for a reader that takes no line at all: after a
/// finished run or an error, when the reader is reading as usual.
const PATIENCE: Duration = Duration::from_secs(5);

/// The same after a stop signal, when under `mpirun` the reader is asleep until the
/// SIGKILL (see the module docs): the process exits, with its exit code, well before it.
const PATIENCE_STOPPED: Duration = Duration::from_millis(200);

/// The writer thread's side: lines written so far, and its first error.
#[derive(Default)]
struct Shared {
    written: AtomicU64,
    error: Mutex<Option<(io::ErrorKind, String)>>,
}

/// The lines of a run (see the module docs).
pub(crate) enum Lines {
    /// Written as they come.
    Direct(Stdout),
    /// Written by a thread of their own.
    Queued(Queue),
}

/// Lines written by a thread of their own.
pub(crate) struct Queue {
    tx: Option<SyncSender<String>>,
    shared: Arc<Shared>,
    sent: u64,
    dropped: u64,
    thread: Option<JoinHandle<()>>,
    patience: Duration,
}

impl Lines {
    /// Lines queued for a writer thread (where the thread cannot start: written directly).
    pub(crate) fn queued() -> Lines {
        let (tx, rx) = sync_channel::<String>(QUEUE);
        let shared = Arc::new(Shared::default());
        let mine = Arc::clone(&shared);
        let spawned = std::thread::Builder::new()
            .name("shardes-stdout".into())
            .spawn(move || {
                let mut out = Stdout::new();
                for line in rx {
                    out.text(&line);
                    if let Some(e) = out.error() {
                        if let Ok(mut g) = mine.error.lock() {
                            g.get_or_insert_with(|| (e.kind(), e.to_string()));
                        }
                    }
                    mine.written.fetch_add(1, Ordering::SeqCst);
                }
                out.flush();
            });
        match spawned {
            Ok(thread) => Lines::Queued(Queue {
                tx: Some(tx),
                shared,
                sent: 0,
                dropped: 0,
                thread: Some(thread),
                patience: PATIENCE,
            }),
            Err(_) => Lines::Direct(Stdout::new()),
        }
    }

    /// Writes `args` and a newline (for [`crate::out::outln`]).
    pub(crate) fn line(&mut self, args: fmt::Arguments<'_>) {
        match self {
            Lines::Direct(out) => out.line(args),
            Lines::Queued(q) => {
                let Some(tx) = &q.tx else { return };
                match tx.try_send(format!("{args}\n")) {
                    Ok(()) => q.sent += 1,
                    Err(TrySendError::Full(_)) => q.dropped += 1,
                    Err(TrySendError::Disconnected(_)) => {}
                }
            }
        }
    }

    /// After a stop signal: the lines still queued at the end get [`PATIENCE_STOPPED`]
    /// without progress before the process exits without them.
    pub(crate) fn stopping(&mut self) {
        if let Lines::Queued(q) = self {
            q.patience = PATIENCE_STOPPED;
        }
    }

    /// Whether every write so far succeeded.
    pub(crate) fn ok(&self) -> bool {
        self.error().is_none()
    }

    /// The first write error, if any.
    pub(crate) fn error(&self) -> Option<io::Error> {
        match self {
            Lines::Direct(out) => out.error().map(|e| io::Error::new(e.kind(), e.to_string())),
            Lines::Queued(q) => q
                .shared
                .error
                .lock()
                .ok()
                .and_then(|g| g.clone())
                .map(|(kind, text)| io::Error::new(kind, text)),
        }
    }
}

impl Drop for Queue {
    /// Lets the writer finish the queued lines while its reader takes them: it waits as
    /// long as lines keep being written, and gives up after [`PATIENCE`] without one (a
    /// reader that stopped reading) or, after [`Lines::stopping`], [`PATIENCE_STOPPED`],
    /// leaving the rest.
    fn drop(&mut self) {
        self.tx = None;
        let Some(thread) = self.thread.take() else {
            return;
        };
        let mut seen = self.shared.written.load(Ordering::SeqCst);
        let mut since = Instant::now();
        while !thread.is_finished() {
            let now = self.shared.written.load(Ordering::SeqCst);
            if now != seen {
                (seen, since) = (now, Instant::now());
            } else if since.elapsed() > self.patience {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        if thread.is_finished() {
            let _ = thread.join();
        }
        let written = self.shared.written.load(Ordering::SeqCst);
        let lost = self.dropped + self.sent.saturating_sub(written);
        if lost > 0 {
            errln!(
                "note: {lost} line(s) of progress were not printed: stdout was not read \
                 (metrics.jsonl has every generation)"
            );
        }
    }
}
