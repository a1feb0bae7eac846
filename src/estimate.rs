//! Estimator quality: one generation's gradient estimate without applying it, a reference
//! gradient by central differences, and the metrics ([`metrics`]) that compare them.
//!
//! [`Estimator::estimate`] returns `ĝ = u / (n σ)` of one generation (`u = Σ_i w_i s_i ε_i`,
//! the spec's "Update"), exactly as the generation program computes it: it runs the split
//! mode's two programs of an ES with `lr = 1`, `ask + apply` at `θ` for the fitness, then
//! `tell` with that fitness on parameters that are all zero, whose result is `0 − 1/(nσ) · u`
//! to the bit, and negates it. The ES descends, so `ĝ` estimates the gradient of the loss
//! (of its Gaussian smoothing, to be exact; they agree on a quadratic). Its scale is that of
//! the gradient only without shaping (`shaping = "none"`); ranks change the scale, not the
//! meaning of a cosine.
//!
//! [`central_differences`] evaluates `f(θ ± h e_c)` for every parameter `c` in one `ask +
//! apply` of `2d` members (the [`Coordinates`] strategy, mirrored) and returns
//! `(f(θ + h e_c) − f(θ − h e_c)) / (2h)` (with the step the f32 parameters actually take):
//! the reference for models without an analytic gradient.

use shardes_hlo::es::shaping::NoShaping;
use shardes_hlo::es::strategy::Mirrored;
use shardes_hlo::es::{leaf_infos, EsSpec, Layout, Model, ShardedES};
use shardes_hlo::params::{Array, ParamTree};
use shardes_hlo::prng::{key, Key};
use shardes_runtime::{gather_rows, Buffer, Client, CompileOptions, Executable};

use crate::state::{check_devices, replicate, DeviceState};
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
pub struct Estimator {
    client: Client,
    devices: usize,
    ask_apply: Executable,
    tell: Executable,
    ask_layout: Layout,
    tell_layout: Layout,
    params: ParamTree,
    zeros: ParamTree,
    key: Key,
    batch: Vec<Array>,
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
        let devices = es.devices();
        check_devices(client, devices)?;
        let leaves = leaf_infos(params);
        let first = es.ask_apply_program(model, &leaves)?;
        let second = es.tell_program(model, &leaves)?;
        let opts = CompileOptions::new(devices);
        let mut zeros = params.clone();
        for a in zeros.leaves_mut() {
            *a = Array::zeros(a.shape().to_vec())?;
        }
        Ok(Estimator {
            client: client.clone(),
            devices,
            ask_apply: client.compile(&first.module.to_mlir(), &opts)?,
            tell: client.compile(&second.module.to_mlir(), &opts)?,
            ask_layout: first.layout,
            tell_layout: second.layout,
            params: params.clone(),
            zeros,
            key,
            batch: batch.to_vec(),
        })
    }

    /// The population's fitness at `generation` (ask + apply).
    fn fitness(&self, generation: u32) -> Result<Vec<f32>, Error> {
        let state = DeviceState::upload(
            &self.client,
            self.devices,
            self.ask_layout.clone(),
            &self.params,
            self.key,
            &self.batch,
            generation,
        )?;
        let args: Vec<Vec<&Buffer>> = (0..self.devices)
            .map(|d| state.args_for(&self.ask_layout, d, None))
            .collect::<Result<_, _>>()?;
        let mut shards = Vec::with_capacity(self.devices);
        for out in self.ask_apply.execute(&args)? {
            shards.push(
                self.ask_layout
                    .split_results(out)?
                    .fitness
                    .ok_or_else(|| Error::Invalid("ask_apply returned no fitness".into()))?,
            );
        }
        Ok(gather_rows(&shards)?)
    }

    /// Generation `generation`'s estimate: its base key is `fold_in(key, generation)`, so
    /// different generations give independent estimates.
    pub fn estimate(&self, generation: u32) -> Result<Estimate, Error> {
        let fitness = self.fitness(generation)?;
        let mut zero = DeviceState::upload(
            &self.client,
            self.devices,
            self.ask_layout.clone(),
            &self.zeros,
            self.key,
            &self.batch,
            generation,
        )?;
        let fit_dev = replicate(
            &self.client,
            &fitness,
            &self.tell_layout.fitness_dims(),
            self.devices,
        )?;
        let args: Vec<Vec<&Buffer>> = (0..self.devices)
            .map(|d| zero.args_for(&self.tell_layout, d, Some(&fit_dev[d])))
            .collect::<Result<_, _>>()?;
        let outs = self.tell.execute(&args)?;
        zero.absorb_for(&self.tell_layout, outs, 1)?;
        // tell returned 0 − u/(nσ): negating is exact.
        let gradient = flatten(&zero.params()?).into_iter().map(|x| -x).collect();
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
    let program = es.ask_apply_program(model, &leaves)?;
    let exe = client.compile(&program.module.to_mlir(), &CompileOptions::new(devices))?;
    let state = DeviceState::upload(
        client,
        devices,
        program.layout.clone(),
        params,
        key(0).map_err(|e| Error::Invalid(e.to_string()))?,
        batch,
        0,
    )?;
    let args: Vec<Vec<&Buffer>> = (0..devices)
        .map(|dv| state.args_for(&program.layout, dv, None))
        .collect::<Result<_, _>>()?;
    let mut shards = Vec::with_capacity(devices);
    for out in exe.execute(&args)? {
        shards.push(
            program
                .layout
                .split_results(out)?
                .fitness
                .ok_or_else(|| Error::Invalid("ask_apply returned no fitness".into()))?,
        );
    }
    let f: Vec<f32> = gather_rows(&shards)?;
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
