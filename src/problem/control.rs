//! Control problems: a tanh MLP policy on an environment rolled out inside the generation
//! program (`shardes_hlo::problems::control`).

use shardes_hlo::prng::fold_in;
use shardes_hlo::problems::control::{Control, Fitness};

use super::{run_key, Problem, ProblemError};

impl Problem {
    /// The control problem `control` with `key = key(seed)`: the policy's parameters are
    /// `control.init(key)`, the batch is the episodes' reset states
    /// `control.reset_states(fold_in(key, 1))` (the same for every generation). The
    /// fitness is a negated return; [`Control::mean_return`] turns it back.
    pub fn control(control: Control, seed: u64) -> Result<Problem, ProblemError> {
        let k = run_key(seed)?;
        let params = control
            .init(k)
            .map_err(ProblemError::host("initialising the control policy"))?;
        let reset = control
            .reset_states(fold_in(k, 1))
            .map_err(ProblemError::host("drawing the control reset states"))?;
        let widths: Vec<String> = control.widths().iter().map(|w| w.to_string()).collect();
        let summary = format!(
            "control {} ({} episodes × {} steps, tanh policy {}; fitness = −return{})",
            control.env(),
            control.episodes(),
            control.episode_length(),
            widths.join("→"),
            if control.episodes() > 1 && control.fitness() == Fitness::PerEpisode {
                " per episode"
            } else {
                ", mean over episodes"
            },
        );
        Ok(Problem {
            model: Box::new(control),
            params,
            batch: vec![reset],
            key: k,
            summary,
        })
    }
}
