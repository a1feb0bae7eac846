//! Estimator quality: one generation's gradient estimate without applying it, a reference
//! gradient by central differences, and the metrics ([`metrics`]) that compare them.
//!
//! [`Estimator::estimate`] returns `ĝ = u / (n σ)` of one generation (`u = Σ_i w_i s_i ε_i`,
//! the spec's "Update"), exactly as the generation program computes it: it runs a split
//! population ([`Population<Losses>`]) of the ES with `lr = 1`, `ask + apply` at `θ` for the
//! fitness, then its tell with that fitness on parameters that are all zero, whose result
//! is `0 − 1/(nσ) · u` to the bit, and negates it. The ES descends, so `ĝ` estimates the
//! gradient of the loss (of its Gaussian smoothing, to be exact; they agree on a
//! quadratic). Its scale is that of the gradient only without shaping (`shaping = "none"`);
//! ranks change the scale, not the meaning of a cosine.
//!
//! [`central_differences`] evaluates `f(θ ± h e_c)` for every parameter `c` in one `ask +
//! apply` of `2d` members (the [`Coordinates`] strategy, mirrored, in a population that is
//! never told) and returns `(f(θ + h e_c) − f(θ − h e_c)) / (2h)` (with the step the f32
//! parameters actually take): the reference for models without an analytic gradient.

use std::sync::{Mutex, PoisonError};

use shardes_hlo::es::shaping::NoShaping;
use shardes_hlo::es::strategy::Mirrored;
use shardes_hlo::es::{leaf_infos, EsSpec, Model, ShardedES};
use shardes_hlo::params::{Array, ParamTree};
use shardes_hlo::prng::{key, Key};
use shardes_runtime::Client;

use crate::population::{CompileWhen, HostFitness, Losses, Place, Population, Start};
use crate::Error;

pub mod coordinates;
pub mod metrics;

pub use coordinates::Coordinates;
pub use metrics::{cosine, sampling_dimension, Quality};

/// The parameters of a tree as one vector in leaf order (row-major within a leaf), f64.
pub fn flatten(tree: &ParamTree) -> Vec<f64> {
    tree.leaves()
        .iter()
        .flat_map(|(_, a)| a.data().iter().map(|&x| f64::from(x)))
        .collect()
}

/// One generation's estimate.
#[derive(Clone, Debug)]
pub struct Estimate {
    /// `ĝ = u / (n σ)` flattened in leaf order.
    pub gradient: Vec<f64>,
    /// The population's fitness (the model's losses, before shaping).
    pub fitness: Vec<f32>,
}

/// Gradient estimates of one ES at fixed parameters, generation by generation.
///
/// One population holds the state: each estimate restarts it at `θ` for the fitness and at
/// zero for the tell ([`Population::restart`]), so no estimate sees another's state and
/// the programs are compiled once.
pub struct Estimator {
    /// Behind a lock because [`Estimator::estimate`] takes `&self` (the estimator is fixed;
    /// only the scratch state on the devices changes), which also serialises estimates
    /// from several threads over the one state.
    population: Mutex<Population<Losses>>,
    params: ParamTree,
    zeros: ParamTree,
}

impl Estimator {
    /// The estimator of `spec`'s ES (its strategy, n, σ, shaping, placement, chunk; the lr
    /// is set to 1) on `devices` devices, at `params` with `key` and `batch`.
    pub fn from_spec(
        client: &Client,
        spec: &EsSpec,
        devices: usize,
        model: &dyn Model,
        params: &ParamTree,
        key: Key,
        batch: &[Array],
    ) -> Result<Estimator, Error> {
        let mut spec = spec.clone();
        spec.lr = 1.0;
        let es = spec.build(devices)?.with_member_bytes(model.member_bytes());
        Estimator::new(client, &es, model, params, key, batch)
    }

    /// The estimator of `es`, whose lr must be exactly 1 (so that `tell`'s step is the
    /// estimate itself).
    pub fn new(
        client: &Client,
        es: &ShardedES,
        model: &dyn Model,
        params: &ParamTree,
        key: Key,
        batch: &[Array],
    ) -> Result<Estimator, Error> {
        if es.lr() != 1.0 {
            return Err(Error::Invalid(format!(
                "the estimator needs an ES with lr = 1 (its tell step is then the estimate \
                 u/(nσ)); this one has lr = {}: build it with lr = 1 or use \
                 Estimator::from_spec",
                es.lr()
            )));
        }
        let population = Population::<Losses>::new(client, es, model, params, key, batch, 0)?;
        let mut zeros = params.clone();
        for a in zeros.leaves_mut() {
            *a = Array::zeros(a.shape().to_vec())?;
        }
        Ok(Estimator {
            population: Mutex::new(population),
            params: params.clone(),
            zeros,
        })
    }

    /// Generation `generation`'s estimate: its base key is `fold_in(key, generation)`, so
    /// different generations give independent estimates.
    pub fn estimate(&self, generation: u32) -> Result<Estimate, Error> {
        // A lock poisoned by a panic in an earlier estimate is safe to take: every estimate
        // restarts the whole state (parameters, generation, optimizer state) before using it.
        let mut population = self
            .population
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        population.restart(&self.params, generation)?;
        let fitness = population.evaluate()?;
        // The same generation's tell from zero parameters (and a zero optimizer state).
        population.restart(&self.zeros, generation)?;
        population.tell(&HostFitness::F32(fitness.clone()))?;
        // tell returned 0 − u/(nσ): negating is exact.
        let gradient = flatten(&population.params()?)
            .into_iter()
            .map(|x| -x)
            .collect();
        Ok(Estimate { gradient, fitness })
    }
}

/// The most parameters [`central_differences`] differentiates (two members each).
pub const MAX_DIFFERENCED: u64 = 1 << 22;

/// Central differences `(f(θ + h e_c) − f(θ − h e_c)) / (Δ_c)` for every parameter `c`,
/// flattened in leaf order, in one `ask + apply` on `devices` devices. `Δ_c` is the step the
/// evaluation actually takes: `2h` through a seam (a 2-D leaf's `±h e_row e_colᵀ` enters as
/// a rank-1 term), `fl(θ_c + h) − fl(θ_c − h)` for other leaves (perturbed in f32).
pub fn central_differences(
    client: &Client,
    devices: usize,
    model: &dyn Model,
    params: &ParamTree,
    batch: &[Array],
    step: f32,
) -> Result<Vec<f64>, Error> {
    if !(step.is_finite() && step > 0.0) {
        return Err(Error::Invalid(format!(
            "central differences need a finite step h > 0, got {step}"
        )));
    }
    let leaves = leaf_infos(params);
    let coords = Coordinates::new(&leaves);
    let d = coords.len();
    if d == 0 || d > MAX_DIFFERENCED {
        return Err(Error::Invalid(format!(
            "central differences of {d} parameters; they take 2 members per parameter, for 1 \
             to {MAX_DIFFERENCED} parameters: use a smaller model"
        )));
    }
    let per = (d as usize).div_ceil(devices) * devices;
    let es = ShardedES::new(
        Box::new(Mirrored(Box::new(coords))),
        2 * per,
        step,
        1.0,
        devices,
    )?
    .with_shaping(Box::new(NoShaping))
    .with_member_bytes(model.member_bytes());
    // Nothing random is drawn (the directions are coordinates): any key serves.
    let k = key(0).map_err(|e| Error::Invalid(e.to_string()))?;
    // Evaluated only, never told: the tell is never compiled.
    let start = Start {
        key: k,
        batch,
        generation: 0,
    };
    let (place, when) = (Place::Alone, CompileWhen::FirstUse);
    let f =
        Population::<Losses>::placed(client, &es, model, params, start, place, when)?.evaluate()?;
    let mut out = Vec::with_capacity(d as usize);
    let mut c = 0;
    for (_, a) in params.leaves() {
        let seam = a.shape().len() == 2;
        for &theta in a.data() {
            let span = if seam {
                2.0 * f64::from(step)
            } else {
                f64::from(theta + step) - f64::from(theta - step)
            };
            out.push((f64::from(f[2 * c]) - f64::from(f[2 * c + 1])) / span);
            c += 1;
        }
    }
    Ok(out)
}
