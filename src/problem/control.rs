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
        let p = Problem::control(control, seed)?;
        let bytes = |n: usize| (n * std::mem::size_of::<f32>()) as u64;
        let leaves = leaf_infos(&p.params);
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
        Ok(ProblemShapes {
            model: p.model,
            leaves,
            key: p.key,
            summary: p.summary,
            host_bytes,
            memory_what: "the control policy".into(),
            memory_lower: "hidden (or episodes)",
        })
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
