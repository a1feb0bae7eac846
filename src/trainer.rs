//! The device-resident run loop: compile the generation once, keep the state on the
//! devices, step.
//!
//! Parameters, key and generation live in device buffers between generations; each step
//! donates the parameters and the generation to the program and takes its outputs as the
//! new state, so nothing parameter-sized crosses to the host unless [`Trainer::params`] is
//! called. Each step returns the population's fitness (n floats).

use std::time::Instant;

use shardes_hlo::es::{Layout, Model, ShardedES};
use shardes_hlo::params::{Array, ParamTree};
use shardes_hlo::prng::Key;
use shardes_runtime::{gather_rows, Buffer, Client, CompileOptions, Executable};

use crate::problem::Problem;
use crate::state::{check_devices, DeviceState};
use crate::Error;

/// Host-side timings of building the trainer.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BuildTimes {
    /// Building and printing the StableHLO program, milliseconds.
    pub emit_ms: f64,
    /// XLA compilation, milliseconds.
    pub compile_ms: f64,
}

/// A compiled generation with its state on the devices.
pub struct Trainer {
    client: Client,
    exe: Executable,
    mlir: String,
    state: DeviceState,
    /// Generations each dispatch runs.
    per_dispatch: u32,
    times: BuildTimes,
}

impl Trainer {
    /// Builds, compiles and uploads `problem`: its parameters and batch are replicated on
    /// every device, the state starts at generation 0 with the problem's key.
    pub fn new(client: &Client, es: &ShardedES, problem: &Problem) -> Result<Trainer, Error> {
        Self::with_state(
            client,
            es,
            &*problem.model,
            &problem.params,
            problem.key,
            &problem.batch,
            0,
        )
    }

    /// Builds, compiles and uploads: `params` and `batch` (one array per
    /// [`Model::batch_types`] entry, in order) are replicated on every device;
    /// the state starts at `generation` (e.g. a checkpoint's, to resume a run).
    pub fn with_state(
        client: &Client,
        es: &ShardedES,
        model: &dyn Model,
        params: &ParamTree,
        key: Key,
        batch: &[Array],
        generation: u32,
    ) -> Result<Trainer, Error> {
        Self::with_generations_per_dispatch(client, es, model, params, key, batch, generation, 1)
    }

    /// Like [`Trainer::with_state`], but each dispatch runs `per_dispatch` generations inside one
    /// executable ([`ShardedES::generation_program_multi`]): [`Trainer::step`] then advances
    /// `per_dispatch` generations and returns the last one's fitness. The parameters are
    /// those of as many single steps; only the host round trips between generations go.
    #[allow(clippy::too_many_arguments)]
    pub fn with_generations_per_dispatch(
        client: &Client,
        es: &ShardedES,
        model: &dyn Model,
        params: &ParamTree,
        key: Key,
        batch: &[Array],
        generation: u32,
        per_dispatch: usize,
    ) -> Result<Trainer, Error> {
        let per_dispatch_u32 = u32::try_from(per_dispatch)
            .ok()
            .filter(|&k| k > 0)
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "{per_dispatch} generations per dispatch; use between 1 and 2^32 − 1"
                ))
            })?;
        let (exe, mlir, layout, times) = compiled(client, es, model, params, per_dispatch)?;
        let state =
            DeviceState::upload(client, es.devices(), layout, params, key, batch, generation)?;
        Ok(Trainer {
            client: client.clone(),
            exe,
            mlir,
            state,
            per_dispatch: per_dispatch_u32,
            times,
        })
    }

    /// [`Trainer::with_state`] consuming `params`: each leaf's host array is freed as soon
    /// as it is on the devices, so a caller that has no further use for the host tree (a
    /// run reads the parameters back from the devices) never holds it beside the device
    /// copies. The trainer is the one [`Trainer::with_state`] builds.
    pub fn with_state_taking(
        client: &Client,
        es: &ShardedES,
        model: &dyn Model,
        params: ParamTree,
        key: Key,
        batch: &[Array],
        generation: u32,
    ) -> Result<Trainer, Error> {
        let (exe, mlir, layout, times) = compiled(client, es, model, &params, 1)?;
        let state = DeviceState::upload_taking(
            client,
            es.devices(),
            layout,
            params,
            key,
            batch,
            generation,
        )?;
        Ok(Trainer {
            client: client.clone(),
            exe,
            mlir,
            state,
            per_dispatch: 1,
            times,
        })
    }
}

/// The compiled generation program of `per_dispatch` generations for `params`' leaves:
/// the executable, its text, its layout and the build times.
fn compiled(
    client: &Client,
    es: &ShardedES,
    model: &dyn Model,
    params: &ParamTree,
    per_dispatch: usize,
) -> Result<(Executable, String, Layout, BuildTimes), Error> {
    let devices = es.devices();
    check_devices(client, devices)?;
    let t0 = Instant::now();
    let leaves = shardes_hlo::es::leaf_infos(params);
    let program = es.generation_program_multi(model, &leaves, per_dispatch)?;
    let mlir = program.module.to_mlir();
    let emit_ms = t0.elapsed().as_secs_f64() * 1e3;
    let t1 = Instant::now();
    let exe = client.compile(&mlir, &CompileOptions::new(devices))?;
    let compile_ms = t1.elapsed().as_secs_f64() * 1e3;
    Ok((
        exe,
        mlir,
        program.layout,
        BuildTimes {
            emit_ms,
            compile_ms,
        },
    ))
}

impl Trainer {
    /// Runs one generation; returns the fitness of every member in global member order
    /// (`n` values, or `n × g` row-major for several tasks).
    pub fn step(&mut self) -> Result<Vec<f32>, Error> {
        let outs = self.dispatch()?;
        self.absorb(outs)
    }

    /// Executes the program on the current state (the state buffers are donated).
    fn dispatch(&self) -> Result<Vec<Vec<Buffer>>, Error> {
        let args = (0..self.state.devices())
            .map(|d| self.state.args_for(&self.state.layout, d, None))
            .collect::<Result<Vec<_>, Error>>()?;
        Ok(self.exe.execute(&args)?)
    }

    fn absorb(&mut self, outs: Vec<Vec<Buffer>>) -> Result<Vec<f32>, Error> {
        let layout = self.state.layout.clone();
        let fitness: Vec<Buffer> = self
            .state
            .absorb_for(&layout, outs, self.per_dispatch)?
            .into_iter()
            .flatten()
            .collect();
        Ok(gather_rows(&fitness)?)
    }

    /// Runs `k` generations (a multiple of [`Trainer::generations_per_dispatch`]) and
    /// returns the last one's fitness.
    pub fn step_many(&mut self, k: usize) -> Result<Vec<f32>, Error> {
        let per = self.per_dispatch as usize;
        if k == 0 || !k.is_multiple_of(per) {
            return Err(Error::Invalid(format!(
                "step_many({k}): this trainer runs {per} generations per dispatch; ask for a \
                 positive multiple of {per}"
            )));
        }
        let mut fitness = Vec::new();
        for _ in 0..k / per {
            fitness = self.step()?;
        }
        Ok(fitness)
    }

    /// Generations each [`Trainer::step`] runs.
    pub fn generations_per_dispatch(&self) -> usize {
        self.per_dispatch as usize
    }

    /// The generation the next step will run.
    pub fn generation(&self) -> u32 {
        self.state.generation_host
    }

    /// Copies the parameters back to the host (from device 0; every device holds the same).
    pub fn params(&self) -> Result<ParamTree, Error> {
        self.state.params()
    }

    /// Copies the optimizer's state back to the host (from device 0): one named f32 array
    /// per entry of the layout's [`Layout::opt_state`] (`velocity.PATH`; `m.PATH`, `v.PATH`,
    /// `count`), empty under `sgd`. With [`Trainer::set_optimizer_state`] it resumes a run
    /// bit-identically.
    pub fn optimizer_state(&self) -> Result<Vec<(String, Array)>, Error> {
        self.state.opt_state()
    }

    /// Replaces the optimizer's state on every device (it starts at zero), e.g. with a
    /// checkpoint's [`Trainer::optimizer_state`]: the same names and shapes, in any order.
    pub fn set_optimizer_state(&mut self, tensors: &[(String, Array)]) -> Result<(), Error> {
        self.state.set_opt_state(&self.client, tensors)
    }

    /// The generation program's MLIR text.
    pub fn mlir(&self) -> &str {
        &self.mlir
    }

    /// The compiled executable (for `optimized_hlo()` and memory statistics).
    pub fn executable(&self) -> &Executable {
        &self.exe
    }

    /// Emission and compile times.
    pub fn build_times(&self) -> BuildTimes {
        self.times
    }

    /// The program layout.
    pub fn layout(&self) -> &Layout {
        &self.state.layout
    }

    /// The client the state lives on.
    pub fn client(&self) -> &Client {
        &self.client
    }
}
