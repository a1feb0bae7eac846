//! What one generation of any engine hands back to the run loop.

use std::collections::BTreeMap;

/// One generation's outcome.
pub(crate) struct StepOut {
    /// The fitness `tell` used (lower is better).
    pub fitness: Vec<f32>,
    /// Scalars logged beside the fitness (`extra` in `metrics.jsonl`).
    pub extra: BTreeMap<String, f64>,
}
