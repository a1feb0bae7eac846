//! Control problems on MJCF models (`crate::host_control`): the policy's parameters, the
//! reset states and the key, as [`Problem::control`] derives them for the in-program
//! environments.

use shardes_hlo::prng::fold_in;
use shardes_hlo::problems::control::host::PolicyStep;

use crate::host_control::HostControl;

use super::{run_key, Problem, ProblemError, ProblemShapes, Setting};

impl Problem {
    /// [`Problem::mjcf`] by shape, for `hlo`, `check` and `diag` (a policy is small, so it
    /// is built and described).
    pub fn mjcf_shapes(
        control: &HostControl,
        n: usize,
        seed: u64,
    ) -> Result<ProblemShapes, ProblemError> {
        Ok(super::control::policy_shapes(Problem::mjcf(
            control, n, seed,
        )?))
    }

    /// The control problem `control` on its loaded MJCF model for `n` members, with `key =
    /// key(seed)`: the policy's parameters are `control.init(key)`; the reset states,
    /// `control.reset_states(fold_in(key, 1))` (the same for every generation), are drawn
    /// by the trainer ([`crate::host_control`]), so the batch is empty here (the policy
    /// step's input is the observations of each step). The model is the policy step
    /// ([`PolicyStep`]); it has no loss, the episodes run on the host.
    pub fn mjcf(control: &HostControl, n: usize, seed: u64) -> Result<Problem, ProblemError> {
        let k = run_key(seed)?;
        let params = control
            .init(k)
            .map_err(ProblemError::host("initialising the control policy"))?;
        // Drawn here once so that a seed the PRNG refuses is refused before anything runs.
        control.reset_states(fold_in(k, 1)).map_err(|e| {
            ProblemError::input(
                Setting::Seed,
                format!("seed = {seed}: drawing the reset states: {e}"),
                "use another seed",
            )
        })?;
        let spec = control.spec();
        let env = control.env();
        let step = PolicyStep::new(&control.widths(), n, spec.episodes()).map_err(|e| {
            ProblemError::input(
                Setting::Batch,
                format!("episodes: {e}"),
                "check n and episodes",
            )
        })?;
        let summary = format!(
            "control {} (MuJoCo, {} episodes × ≤ {} steps on host threads, {})",
            env.path().display(),
            spec.episodes(),
            spec.episode_length(),
            super::control::policy_words(&control.widths(), spec.episodes(), spec.fitness()),
        );
        Ok(Problem {
            model: Box::new(step),
            params,
            batch: Vec::new(),
            key: k,
            summary,
        })
    }
}
