//! What `shardes run` leaves to look at while it goes: `OUT/curves.svg`, redrawn at every
//! checkpoint, and with `run.tensorboard = true` TensorBoard event files under `OUT/tb/`.
//!
//! Both are written when a checkpoint is, never between checkpoints: the scalars of the
//! generations since the last checkpoint wait in memory. So neither shows a generation that
//! a resume would run again, and neither exists in a directory without a checkpoint (whose
//! fresh restart would otherwise find files the out directory does not know as a run's).
//! Like every output of a run, a failure here is a warning on stderr, never a run failure.

use std::path::{Path, PathBuf};

use shardes::rundir::Metric;
use shardes::tensorboard::{EventWriter, TensorboardError};

use crate::out::errln;
use crate::plot;

/// The directory under the out directory that holds the event files.
pub const TB_DIR: &str = "tb";

/// The curve tags of one generation, with their values from its metrics record.
pub fn scalars(m: &Metric) -> [(&'static str, f32); 4] {
    // TensorBoard's scalars are f32; the record keeps the f64.
    [
        ("fitness/mean", m.fitness_mean as f32),
        ("fitness/min", m.fitness_min as f32),
        ("fitness/max", m.fitness_max as f32),
        ("time/ms_per_generation", m.ms as f32),
    ]
}

/// The curves of one run directory.
#[derive(Debug)]
pub struct Curves {
    dir: PathBuf,
    tb: Option<Tensorboard>,
    /// Whether `curves.svg` shows the latest checkpoint.
    plotted: bool,
    /// Whether a plotting failure has been reported (once is enough).
    plot_warned: bool,
}

/// The event file (opened at the first checkpoint) and the generations not yet in it.
#[derive(Debug, Default)]
struct Tensorboard {
    writer: Option<EventWriter>,
    pending: Vec<Metric>,
}

impl Curves {
    /// The curves of out directory `dir`; `tensorboard`: also write event files.
    pub fn new(dir: &Path, tensorboard: bool) -> Curves {
        Curves {
            dir: dir.to_path_buf(),
            tb: tensorboard.then(Tensorboard::default),
            plotted: false,
            plot_warned: false,
        }
    }

    /// A generation just appended to metrics.jsonl.
    pub fn record(&mut self, m: &Metric) {
        if let Some(tb) = &mut self.tb {
            tb.pending.push(m.clone());
        }
    }

    /// A checkpoint was written: the event file gets the waiting generations and is
    /// flushed, and `curves.svg` is redrawn from metrics.jsonl.
    pub fn checkpoint(&mut self) {
        if let Some(tb) = &mut self.tb {
            if let Err(e) = tb.write(&self.dir) {
                errln!(
                    "warning: TensorBoard: {e}; the run goes on without event files \
                     (metrics.jsonl has every generation)"
                );
                self.tb = None;
            }
        }
        match plot::write_curves(&self.dir) {
            Ok(_) => self.plotted = true,
            Err(e) => {
                self.plotted = false;
                if !self.plot_warned {
                    self.plot_warned = true;
                    errln!(
                        "warning: cannot draw {}: {e:#}; the run goes on (`shardes plot {}` \
                         draws it later)",
                        self.dir.join(plot::CURVES_FILE).display(),
                        self.dir.display()
                    );
                }
            }
        }
    }

    /// The summary's line saying where the curves are, if any were written.
    pub fn summary_line(&self) -> Option<String> {
        let tb = self.tb.as_ref().and_then(|t| t.writer.as_ref()).map(|_| {
            format!(
                "TensorBoard: `tensorboard --logdir {}`",
                self.dir.join(TB_DIR).display()
            )
        });
        let svg = self
            .plotted
            .then(|| self.dir.join(plot::CURVES_FILE).display().to_string());
        let both: Vec<String> = svg.into_iter().chain(tb).collect();
        (!both.is_empty()).then(|| format!("  curves   {}", both.join("; ")))
    }
}

impl Tensorboard {
    fn write(&mut self, dir: &Path) -> Result<(), TensorboardError> {
        let writer = match &mut self.writer {
            Some(w) => w,
            None => self.writer.insert(EventWriter::create(dir.join(TB_DIR))?),
        };
        for m in self.pending.drain(..) {
            writer.add_scalars(i64::from(m.generation), &scalars(&m))?;
        }
        writer.flush()
    }
}
