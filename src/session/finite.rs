//! Divergence is an error: a run stops at the first generation whose fitness is not finite,
//! and never writes a checkpoint of parameters that are not finite, so the last checkpoint on
//! disk is always a finite one.
//!
//! Where the NaN comes from, in f32 (see `shared/spec/semantics.md`, *Update*):
//! - the perturbations `θ ± σ·ε` overflow when `es.sigma` is huge: NaN from generation 0,
//!   whose parameters are the (checked, finite) initial ones;
//! - the update `θ − lr/(n·σ) · u` overflows when `es.lr` is huge, or when `es.sigma` is so
//!   small that `lr/(n·σ)` itself is infinite: the fitness of generation 0 is fine, the
//!   parameters after it are not (caught at the next checkpoint) and the next fitness is NaN;
//! - non-finite initial parameters or inputs: refused before the run starts.

use std::fmt::Write as _;

use shardes_hlo::params::{Array, ParamTree};

use super::SessionError;

/// The ES settings a divergence is explained by.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// `es.n`.
    pub n: usize,
    /// `es.sigma`.
    pub sigma: f32,
    /// `es.lr`.
    pub lr: f32,
}

/// Non-finite values found in some data.
#[derive(Debug, Clone, PartialEq)]
pub struct NonFinite {
    /// Where (a leaf path, an input index), empty for a flat list.
    pub place: String,
    /// How many values are NaN.
    pub nan: usize,
    /// How many are ±inf.
    pub inf: usize,
    /// How many values there are in all.
    pub of: usize,
}

impl NonFinite {
    fn of(place: String, data: &[f32]) -> Option<NonFinite> {
        let nan = data.iter().filter(|v| v.is_nan()).count();
        let inf = data.iter().filter(|v| v.is_infinite()).count();
        (nan + inf > 0).then_some(NonFinite {
            place,
            nan,
            inf,
            of: data.len(),
        })
    }

    fn counts(&self) -> String {
        let mut s = String::new();
        if self.nan > 0 {
            let _ = write!(s, "{} NaN", self.nan);
        }
        if self.inf > 0 {
            let sep = if s.is_empty() { "" } else { " and " };
            let _ = write!(s, "{sep}{} infinite", self.inf);
        }
        format!("{s} of {}", self.of)
    }
}

/// The fitness values that are not finite, if any.
pub fn fitness(fitness: &[f32]) -> Option<NonFinite> {
    NonFinite::of(String::new(), fitness)
}

/// The first leaf of `params` that holds a non-finite value, if any.
pub fn params(params: &ParamTree) -> Option<NonFinite> {
    params
        .leaves()
        .into_iter()
        .find_map(|(path, a)| NonFinite::of(path, a.data()))
}

/// Refuses to start from non-finite parameters or inputs ([`SessionError::Refused`], a
/// user's error): they make every fitness NaN, and used to run to the end as if nothing
/// were wrong.
pub fn check_start(params: &ParamTree, batch: &[Array], resumed: bool) -> Result<(), SessionError> {
    if let Some(bad) = self::params(params) {
        let (whose, hint) = if resumed {
            (
                "the checkpoint's parameters",
                "the checkpoint was written by a shardes that did not check for divergence: \
                 start over with --force (with a smaller es.lr or es.sigma)",
            )
        } else {
            (
                "the initial parameters",
                "the problem's weights (problem.checkpoint) hold NaN or infinite values: use \
                 an undamaged checkpoint",
            )
        };
        return Err(SessionError::Refused {
            message: format!(
                "{whose} are not finite: leaf `{}` has {}",
                bad.place,
                bad.counts()
            ),
            fix: hint.to_string(),
        });
    }
    for (i, a) in batch.iter().enumerate() {
        if let Some(bad) = NonFinite::of(format!("{i}"), a.data()) {
            return Err(SessionError::Refused {
                message: format!(
                    "the problem's input {} is not finite: it has {}",
                    bad.place,
                    bad.counts()
                ),
                fix: "check the problem's data (problem.data) for NaN or infinite values".into(),
            });
        }
    }
    Ok(())
}

/// `x` as people write it: plain near 1, in exponent form when very large or small
/// (`1e30`, not 31 digits).
fn num(x: f32) -> String {
    if x != 0.0 && !(1e-4..1e6).contains(&x.abs()) {
        format!("{x:e}")
    } else {
        format!("{x}")
    }
}

/// `lr / (n·σ)` in f32, as the update computes it.
fn step_scale(es: Settings) -> f32 {
    es.lr / (es.n as f32 * es.sigma)
}

/// Whether `es.sigma` is too small for the update in f32: subnormal (it does not perturb a
/// weight of ordinary size at all), or `lr/(n·σ)` overflows.
fn sigma_too_small(es: Settings) -> bool {
    es.sigma < f32::MIN_POSITIVE || !step_scale(es).is_finite()
}

/// The likely cause of a divergence first seen at `generation`, and its fix.
fn cause(es: Settings, generation: u32, params_only: bool) -> (String, &'static str) {
    if sigma_too_small(es) {
        return (
            format!(
                "es.sigma = {} is too small for f32: the update's scale lr/(n·sigma) = {}",
                num(es.sigma),
                num(step_scale(es))
            ),
            "raise es.sigma (e.g. 0.01) and start over with --force",
        );
    }
    if generation == 0 && !params_only {
        return (
            format!(
                "es.sigma = {} is too large: the perturbed parameters θ ± σ·ε overflow in f32",
                num(es.sigma)
            ),
            "lower es.sigma (e.g. 0.01) and start over with --force",
        );
    }
    (
        format!(
            "es.lr = {} (update scale lr/(n·sigma) = {}) or es.sigma = {} is too large: the \
             update overflowed in f32",
            num(es.lr),
            num(step_scale(es)),
            num(es.sigma)
        ),
        "lower es.lr (and es.sigma), e.g. to 0.01, and start over with --force",
    )
}

/// What a diverged run leaves behind: its last checkpoint's generation (none before the
/// first) and its out directory.
pub struct Kept<'a> {
    /// The generation of the last checkpoint written.
    pub checkpoint: Option<u32>,
    /// The out directory.
    pub dir: &'a std::path::Path,
}

/// Where the last finite checkpoint is, for the hint.
fn kept(Kept { checkpoint, dir }: Kept<'_>) -> String {
    match checkpoint {
        Some(g) => format!(
            "the last finite checkpoint (generation {g}) is kept in {}",
            dir.display()
        ),
        None => format!(
            "no checkpoint was written in {} (the run diverged before its first)",
            dir.display()
        ),
    }
}

/// The failure of a generation whose fitness is not finite.
pub fn diverged_fitness(es: Settings, generation: u32, bad: &NonFinite, at: Kept) -> SessionError {
    let (cause, fix) = cause(es, generation, false);
    SessionError::Diverged {
        message: format!(
            "the run diverged at generation {generation}: {} fitness values are not finite; \
             likely cause: {cause}",
            bad.counts()
        ),
        fix: format!(
            "{fix}; {} (metrics.jsonl records generation {generation} as NaN)",
            kept(at)
        ),
    }
}

/// The failure of a checkpoint refused because the parameters are not finite, although
/// the fitness of the generation that produced them was.
pub fn diverged_params(es: Settings, generation: u32, bad: &NonFinite, at: Kept) -> SessionError {
    // `generation` runs next: the update of the one before produced these parameters.
    let last = generation.saturating_sub(1);
    let (cause, fix) = cause(es, last, true);
    SessionError::Diverged {
        message: format!(
            "the run diverged at generation {last}: its update made the parameters non-finite \
             (leaf `{}` has {}), so no checkpoint of them was written; likely cause: {cause}",
            bad.place,
            bad.counts()
        ),
        fix: format!("{fix}; {}", kept(at)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn es(sigma: f32, lr: f32) -> Settings {
        Settings { n: 32, sigma, lr }
    }

    #[test]
    fn counts_name_nan_and_inf() {
        let bad = fitness(&[1.0, f32::NAN, f32::INFINITY, f32::NAN]).unwrap();
        assert_eq!(bad.counts(), "2 NaN and 1 infinite of 4");
        assert!(fitness(&[1.0, -2.0]).is_none());
    }

    #[test]
    fn causes_name_the_setting() {
        let (c, _) = cause(es(1e-45, 0.01), 0, false);
        assert!(c.contains("es.sigma = 1e-45 is too small"), "{c}");
        let (c, _) = cause(es(1e30, 0.01), 0, false);
        assert!(c.contains("es.sigma = 1e30 is too large"), "{c}");
        let (c, _) = cause(es(0.01, 1e30), 1, false);
        assert!(
            c.starts_with("es.lr = 1e30 (update scale lr/(n·sigma) = 3.125e30)"),
            "{c}"
        );
        let (c, _) = cause(es(0.01, 1e38), 0, true);
        assert!(c.starts_with("es.lr"), "{c}");
    }
}
