//! Split mode: fitness from outside the program.
//!
//! The generation is cut in two executables, each compiled once: `ask + apply`
//! ([`SplitTrainer::evaluate`]) returns the population's losses as the model computes
//! them, and `tell` ([`SplitTrainer::tell`]) takes a fitness array from the host, so the
//! rewards can be computed in Rust (from decoded text, a simulator, a human...). The state
//! (parameters, key, generation) stays on the devices as in [`crate::Trainer`]; only the
//! `n` fitness values cross to the devices for `tell`.
//!
//! Feeding `evaluate`'s own output back to `tell` gives the same parameters as the fused
//! [`crate::Trainer`] (the same ask, the same shaping and contraction).

use shardes_hlo::es::{EsError, Layout, Model, ShardedES};
use shardes_hlo::params::{Array, ParamTree};
use shardes_hlo::prng::Key;
use shardes_runtime::half::{bf16, f16};
use shardes_runtime::{gather_rows, Buffer, Client, CompileOptions, Executable};

use crate::state::{check_devices, replicate, DeviceState};
use crate::Error;

/// A fitness array computed on the host, one value per member (or `n × g` row-major for
/// `g` tasks), lower is better (`tell` descends: negate a reward).
#[derive(Clone, Debug, PartialEq)]
pub enum HostFitness {
    /// Used as is.
    F32(Vec<f32>),
    /// Rounded to f32 (values beyond f32's range become ±inf, NaN stays NaN and ranks worst).
    F64(Vec<f64>),
    /// Refused: in bf16 a population's losses collapse into ties.
    Bf16(Vec<bf16>),
    /// Refused: in f16 a population's losses collapse into ties.
    F16(Vec<f16>),
}

impl HostFitness {
    /// The number of values.
    pub fn len(&self) -> usize {
        match self {
            HostFitness::F32(v) => v.len(),
            HostFitness::F64(v) => v.len(),
            HostFitness::Bf16(v) => v.len(),
            HostFitness::F16(v) => v.len(),
        }
    }

    /// Whether there are no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The values as f32, refusing types narrower than f32 (with the reason and the fix).
    pub fn to_f32(&self) -> Result<Vec<f32>, EsError> {
        match self {
            HostFitness::F32(v) => Ok(v.clone()),
            // Rounding to the program's fitness precision is the point.
            HostFitness::F64(v) => Ok(v.iter().map(|&x| x as f32).collect()),
            HostFitness::Bf16(_) => Err(EsError::NarrowFitness {
                dtype: "bf16".into(),
            }),
            HostFitness::F16(_) => Err(EsError::NarrowFitness {
                dtype: "f16".into(),
            }),
        }
    }
}

/// Runs `exe`, a tell program of `layout`, on `state` with every member's fitness `values`
/// (replicated on each of the state's devices), and takes its results as the new state:
/// the update applied, the generation advanced. The one tell of every runner that tells
/// with a host fitness on its own devices.
pub(crate) fn run_tell(
    client: &Client,
    exe: &Executable,
    layout: &Layout,
    state: &mut DeviceState,
    values: &[f32],
) -> Result<(), Error> {
    let devices = state.devices();
    let fit_dev = replicate(client, values, &layout.fitness_dims(), devices)?;
    let args: Vec<Vec<&Buffer>> = (0..devices)
        .map(|d| state.args_for(layout, d, Some(&fit_dev[d])))
        .collect::<Result<_, _>>()?;
    let outs = exe.execute(&args)?;
    state.absorb_for(layout, outs, 1)?;
    Ok(())
}

/// A split-mode run: `ask + apply` and `tell` compiled once each, state on the devices.
pub struct SplitTrainer {
    client: Client,
    ask_apply: Executable,
    tell: Executable,
    /// The tell program's layout (the state holds ask_apply's).
    tell_layout: Layout,
    state: DeviceState,
}

impl SplitTrainer {
    /// Builds and compiles both programs and uploads the state: `params` and `batch` (one
    /// array per [`Model::batch_types`] entry) are replicated; the state starts at
    /// `generation`.
    pub fn new(
        client: &Client,
        es: &ShardedES,
        model: &dyn Model,
        params: &ParamTree,
        key: Key,
        batch: &[Array],
        generation: u32,
    ) -> Result<SplitTrainer, Error> {
        let devices = es.devices();
        check_devices(client, devices)?;
        let leaves = shardes_hlo::es::leaf_infos(params);
        let first = es.ask_apply_program(model, &leaves)?;
        // The same model: tell takes its fitness columns and sizes its chunks as the fused
        // program for this model would.
        let second = es.tell_program(model, &leaves)?;
        let opts = CompileOptions::new(devices);
        let ask_apply = client.compile(&first.module.to_mlir(), &opts)?;
        let tell = client.compile(&second.module.to_mlir(), &opts)?;
        let state = DeviceState::upload(
            client,
            devices,
            first.layout,
            params,
            key,
            batch,
            generation,
        )?;
        Ok(SplitTrainer {
            client: client.clone(),
            ask_apply,
            tell,
            tell_layout: second.layout,
            state,
        })
    }

    /// Runs `ask + apply` on the current state: the fitness of every member in global
    /// member order (`n`, or `n × g` row-major). The state is unchanged.
    pub fn evaluate(&self) -> Result<Vec<f32>, Error> {
        let layout = &self.state.layout;
        let args: Vec<Vec<&Buffer>> = (0..self.state.devices())
            .map(|d| self.state.args_for(layout, d, None))
            .collect::<Result<_, _>>()?;
        let outs = self.ask_apply.execute(&args)?;
        let mut shards = Vec::with_capacity(outs.len());
        for out in outs {
            shards.push(
                layout
                    .split_results(out)?
                    .fitness
                    .ok_or_else(|| Error::Invalid("ask_apply returned no fitness".into()))?,
            );
        }
        Ok(gather_rows(&shards)?)
    }

    /// Runs `tell` with a host fitness (lower is better) and advances the generation.
    /// bf16/f16 fitness is refused before anything runs; f64 is rounded to f32.
    pub fn tell(&mut self, fitness: &HostFitness) -> Result<(), Error> {
        let values = fitness.to_f32()?;
        let layout = &self.tell_layout;
        let want = layout.n * layout.tasks;
        if values.len() != want {
            return Err(Error::Invalid(format!(
                "tell got {} fitness values but the population has n = {} members × {} tasks = \
                 {want}; pass one value per member (and task), in member order",
                values.len(),
                layout.n,
                layout.tasks
            )));
        }
        run_tell(&self.client, &self.tell, layout, &mut self.state, &values)
    }

    /// The generation the next `evaluate`/`tell` pair runs.
    pub fn generation(&self) -> u32 {
        self.state.generation_host
    }

    /// Copies the parameters back to the host (from device 0; every device holds the same).
    pub fn params(&self) -> Result<ParamTree, Error> {
        self.state.params()
    }

    /// Copies the optimizer's state back to the host; see [`crate::Trainer::optimizer_state`].
    pub fn optimizer_state(&self) -> Result<Vec<(String, Array)>, Error> {
        self.state.opt_state()
    }

    /// Replaces the optimizer's state on every device; see
    /// [`crate::Trainer::set_optimizer_state`].
    pub fn set_optimizer_state(&mut self, tensors: &[(String, Array)]) -> Result<(), Error> {
        self.state.set_opt_state(&self.client, tensors)
    }

    /// The program layout (`n`, tasks, leaves, batch).
    pub fn layout(&self) -> &Layout {
        &self.state.layout
    }

    /// The `ask + apply` executable.
    pub fn ask_apply_executable(&self) -> &Executable {
        &self.ask_apply
    }

    /// The `tell` executable.
    pub fn tell_executable(&self) -> &Executable {
        &self.tell
    }
}
