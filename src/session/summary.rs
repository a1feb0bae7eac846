//! Fitness statistics per generation and the end-of-run summary.
//!
//! The fitness is a loss (the ES descends it), so the best mean is the lowest. Generations
//! are shown 1-based, as the progress lines count them (`gen 30/30` is metrics.jsonl's
//! `"generation": 29`).

use std::path::Path;

use crate::rundir::Metric;

/// Mean, min and max of `fitness`, in f64. The mean is NaN when any value is; min and max
/// are those of the values that are not NaN (NaN when none is), so a line of a diverging
/// generation still shows what range the rest reached.
pub fn stats(fitness: &[f32]) -> (f64, f64, f64) {
    let mut sum = 0.0f64;
    let mut lo = f64::INFINITY;
    let mut hi = f64::NEG_INFINITY;
    let mut numbers = 0usize;
    for &f in fitness {
        let f = f64::from(f);
        sum += f;
        if !f.is_nan() {
            lo = lo.min(f);
            hi = hi.max(f);
            numbers += 1;
        }
    }
    if numbers == 0 && !fitness.is_empty() {
        (lo, hi) = (f64::NAN, f64::NAN);
    }
    (sum / fitness.len().max(1) as f64, lo, hi)
}

/// `secs` as `4.7s`, `3m05s` or `2h10m`.
pub fn fmt_duration(secs: f64) -> String {
    if !secs.is_finite() {
        return "?".into();
    }
    let s = secs.round() as u64;
    if s >= 3600 {
        format!("{}h{:02}m", s / 3600, (s % 3600) / 60)
    } else if s >= 60 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        format!("{secs:.1}s")
    }
}

/// What the summary reports, gathered as the run goes.
#[derive(Debug, Default)]
pub struct Summary {
    /// The lowest finite mean fitness and its generation (0-based).
    best: Option<(u32, f64)>,
    /// The last mean fitness and its generation.
    last: Option<(u32, f64)>,
    /// The first generation of the run in metrics.jsonl (earlier runs of a resume included).
    first: Option<u32>,
    /// Generations this process ran.
    ran: u32,
}

impl Summary {
    /// A record of the run: one read back from metrics.jsonl on resume, or one this
    /// process just wrote.
    pub fn record(&mut self, m: &Metric, this_process: bool) {
        let mean = m.fitness_mean;
        if mean.is_finite() && self.best.is_none_or(|(_, b)| mean < b) {
            self.best = Some((m.generation, mean));
        }
        self.last = Some((m.generation, mean));
        self.first = Some(self.first.map_or(m.generation, |f| f.min(m.generation)));
        self.ran += u32::from(this_process);
    }

    /// The lines after the `done:`/`interrupted:` line: fitness, time, files.
    /// `loop_secs` is the generation loop's wall time, `total_secs` the whole command's;
    /// `checkpoint` the generation of the checkpoint in `dir`.
    pub fn lines(
        &self,
        loop_secs: f64,
        total_secs: f64,
        checkpoint: Option<u32>,
        dir: &Path,
    ) -> Vec<String> {
        let mut lines = Vec::new();
        if let (Some((lg, lm)), Some((bg, bm)), Some(first)) = (self.last, self.best, self.first) {
            lines.push(format!(
                "  fitness  final mean {lm:.5} (gen {}), best mean {bm:.5} (gen {}) of gens \
                 {}-{} (lower is better)",
                lg + 1,
                bg + 1,
                first + 1,
                lg + 1
            ));
        }
        let per_gen = if self.ran > 0 {
            format!(", {:.1} ms/gen", loop_secs * 1e3 / f64::from(self.ran))
        } else {
            String::new()
        };
        lines.push(format!(
            "  time     {} generations in {}{per_gen}; {} in all with setup and compile",
            self.ran,
            fmt_duration(loop_secs),
            fmt_duration(total_secs)
        ));
        let params = dir.join("params.safetensors");
        lines.push(match checkpoint {
            Some(g) => format!(
                "  files    {} (generation {g}), metrics.jsonl, state.json, config.toml",
                params.display()
            ),
            None => format!("  files    {}: metrics.jsonl, config.toml", dir.display()),
        });
        lines
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(generation: u32, mean: f64) -> Metric {
        Metric {
            generation,
            fitness_mean: mean,
            fitness_min: mean,
            fitness_max: mean,
            ms: 1.0,
            extra: Default::default(),
        }
    }

    #[test]
    fn stats_of_a_diverging_generation() {
        let (mean, lo, hi) = stats(&[1.0, f32::NAN, 3.0]);
        assert!(mean.is_nan());
        assert_eq!((lo, hi), (1.0, 3.0));
        let (_, lo, hi) = stats(&[f32::NAN, f32::NAN]);
        assert!(lo.is_nan() && hi.is_nan());
        assert_eq!(stats(&[1.0, 2.0]), (1.5, 1.0, 2.0));
    }

    #[test]
    fn best_is_the_lowest_finite_mean() {
        let mut s = Summary::default();
        s.record(&m(0, 3.0), false);
        s.record(&m(1, 2.0), true);
        s.record(&m(2, f64::NAN), true);
        s.record(&m(3, 2.5), true);
        let lines = s.lines(0.03, 1.0, Some(4), Path::new("out"));
        assert_eq!(
            lines[0],
            "  fitness  final mean 2.50000 (gen 4), best mean 2.00000 (gen 2) of gens 1-4 \
             (lower is better)"
        );
        assert_eq!(
            lines[1],
            "  time     3 generations in 0.0s, 10.0 ms/gen; 1.0s in all with setup and compile"
        );
        assert!(lines[2].contains("params.safetensors (generation 4)"));
    }
}
