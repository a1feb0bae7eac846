//! The quadratic problem (`shardes_hlo::problems::quadratic`): a known gradient, for
//! measuring gradient estimators (`shardes estimate`, [`crate::estimate`]).

use shardes_hlo::es::leaf_infos;
use shardes_hlo::prng::fold_in;
use shardes_hlo::problems::quadratic::{Quadratic, QuadraticInstance};

use super::{run_key, HostBytes, Problem, ProblemError, ProblemShapes};

/// The instance of `quad` that [`Problem::quadratic`] trains with `seed`: drawn from
/// `fold_in(key(seed), 1)`. Its [`QuadraticInstance::gradient`] is the true gradient.
pub fn quadratic_instance(quad: Quadratic, seed: u64) -> Result<QuadraticInstance, ProblemError> {
    let k = run_key(seed)?;
    quad.instance(fold_in(k, 1))
        .map_err(ProblemError::host("drawing the quadratic"))
}

impl Problem {
    /// The quadratic by shape (its arrays are built: they are at most a few `4096²`
    /// matrices, checked against the host's memory by [`ProblemShapes::check_host_memory`]).
    pub fn quadratic_shapes(quad: Quadratic, seed: u64) -> Result<ProblemShapes, ProblemError> {
        let k = run_key(seed)?;
        let (m, c) = (quad.rows as u64, quad.cols as u64);
        let bytes = 4 * (c + m * c);
        let host_bytes = HostBytes {
            params: bytes,
            largest_leaf: 4 * m * c,
            batch: 4 * (c * c + m * m + c * m + c),
        };
        let leaves = shardes_hlo::problems::leaf_infos_of_shapes(&quad.param_shapes())
            .map_err(ProblemError::host("describing the quadratic's parameters"))?;
        Ok(ProblemShapes {
            model: Box::new(quad),
            leaves,
            key: k,
            summary: summary(&quad),
            host_bytes,
            memory_what: format!(
                "the quadratic with rows = {}, cols = {} (its matrices)",
                quad.rows, quad.cols
            ),
            memory_lower: "rows and cols",
        })
    }

    /// The quadratic: parameters zero, the batch of [`quadratic_instance`]`(quad, seed)`.
    pub fn quadratic(quad: Quadratic, seed: u64) -> Result<Problem, ProblemError> {
        Self::quadratic_shapes(quad, seed)?.check_host_memory()?;
        let k = run_key(seed)?;
        let inst = quadratic_instance(quad, seed)?;
        let params = quad
            .init()
            .map_err(ProblemError::host("initialising the quadratic"))?;
        debug_assert_eq!(leaf_infos(&params).len(), 2);
        let batch = inst
            .batch()
            .map_err(ProblemError::host("building the quadratic's batch"))?;
        Ok(Problem {
            model: Box::new(quad),
            params,
            batch,
            key: k,
            summary: summary(&quad),
        })
    }
}

fn summary(q: &Quadratic) -> String {
    format!(
        "quadratic (w {}×{}, b {}, condition {})",
        q.rows, q.cols, q.cols, q.condition
    )
}
