//! Control problems: a tanh MLP policy on an environment rolled out inside the generation
//! program (`shardes_hlo::problems::control`).

use shardes_hlo::prng::fold_in;
use shardes_hlo::problems::control::{Control, Fitness};

use shardes_hlo::es::leaf_infos;

use super::{run_key, HostBytes, Problem, ProblemError, ProblemShapes};

impl Problem {
    /// The control problem by shape, for `hlo`, `check` and `diag`: a policy's parameters
    /// and reset states are small, so they are built and described (nothing the problem
    /// would allocate is large enough to refuse).
    pub fn control_shapes(control: Control, seed: u64) -> Result<ProblemShapes, ProblemError> {
        Ok(policy_shapes(Problem::control(control, seed)?))
    }

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
        let summary = format!(
            "control {} ({} episodes × {} steps, {})",
            control.env(),
            control.episodes(),
            control.episode_length(),
            policy_words(&control.widths(), control.episodes(), control.fitness()),
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

/// A control summary's policy and fitness: `tanh policy 4→16→1; fitness = −return, mean
/// over episodes` (or `per episode`).
pub(super) fn policy_words(widths: &[usize], episodes: usize, fitness: Fitness) -> String {
    let widths: Vec<String> = widths.iter().map(|w| w.to_string()).collect();
    format!(
        "tanh policy {}; fitness = −return{}",
        widths.join("→"),
        if episodes > 1 && fitness == Fitness::PerEpisode {
            " per episode"
        } else {
            ", mean over episodes"
        }
    )
}

/// A control problem `p` by shape: its policy's leaves and the host bytes of its
/// parameters and batch (the reset states; none on the host-simulated problems).
pub(super) fn policy_shapes(p: Problem) -> ProblemShapes {
    let bytes = |n: usize| (n * std::mem::size_of::<f32>()) as u64;
    let host_bytes = HostBytes {
        params: bytes(p.params.num_params()),
        largest_leaf: p
            .params
            .leaves()
            .iter()
            .map(|(_, a)| bytes(a.data().len()))
            .max()
            .unwrap_or(0),
        batch: p.batch.iter().map(|a| bytes(a.data().len())).sum(),
    };
    ProblemShapes {
        model: p.model,
        leaves: leaf_infos(&p.params),
        key: p.key,
        summary: p.summary,
        host_bytes,
        memory_what: "the control policy".into(),
        memory_lower: "hidden (or episodes)",
    }
}
