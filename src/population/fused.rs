//! [`Fused`]: the generation program, ask + apply + tell in one executable, with the
//! state on the devices ([`crate::Trainer`] is its population).
//!
//! Parameters, key and generation live in device buffers between generations; each step
//! donates the parameters and the generation to the program and takes its outputs as the
//! new state, so nothing parameter-sized crosses to the host unless
//! [`Population::params`] is called. Each step returns the population's fitness (n floats).

use std::time::Instant;

use shardes_hlo::es::{Layout, Model, ShardedES};
use shardes_hlo::params::{Array, ParamTree};
use shardes_hlo::prng::Key;
use shardes_runtime::{gather_rows, Buffer, Client, CompileOptions, Executable};

use super::{
    BuildTimes, Core, Evaluator, Fitness, Place, Placement, Population, PopulationError, Start,
};
use crate::distributed::Distributed;
use crate::state::DeviceState;
use crate::Error;

/// The compiled generation program of a population on one process.
pub struct Fused {
    exe: Executable,
    mlir: String,
    /// Generations each dispatch runs.
    per_dispatch: u32,
}

impl Evaluator for Fused {
    fn evaluate(&mut self, core: &mut Core, _dist: &Distributed) -> Result<Fitness, Error> {
        let layout = core.state.layout.clone();
        let outs = core.execute(&self.exe, &layout, &[])?;
        let fitness: Vec<Buffer> = core
            .state
            .absorb_for(&layout, outs, self.per_dispatch)?
            .into_iter()
            .flatten()
            .collect();
        Ok(Fitness::Told(gather_rows(&fitness)?))
    }
}

impl Population<Fused> {
    /// Builds, compiles and uploads `problem`: its parameters and batch are replicated on
    /// every device, the state starts at generation 0 with the problem's key.
    pub fn new(
        client: &Client,
        es: &ShardedES,
        problem: &crate::Problem,
    ) -> Result<Population<Fused>, Error> {
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
    ) -> Result<Population<Fused>, Error> {
        let start = Start {
            key,
            batch,
            generation,
        };
        Self::with_generations_per_dispatch(client, es, model, params, start, 1)
    }

    /// Like [`Population::<Fused>::with_state`], but each dispatch runs `per_dispatch`
    /// generations inside one executable ([`ShardedES::generation_program_multi`]):
    /// [`Population::step`] then advances `per_dispatch` generations and returns the last
    /// one's fitness. The parameters are those of as many single steps; only the host
    /// round trips between generations go.
    pub fn with_generations_per_dispatch(
        client: &Client,
        es: &ShardedES,
        model: &dyn Model,
        params: &ParamTree,
        start: Start<'_>,
        per_dispatch: usize,
    ) -> Result<Population<Fused>, Error> {
        let per = u32::try_from(per_dispatch)
            .ok()
            .filter(|&k| k > 0)
            .ok_or(PopulationError::PerDispatch(per_dispatch))?;
        let (fused, layout, times) = compiled(client, es, model, params, per)?;
        let devices = es.devices();
        let Start {
            key,
            batch,
            generation,
        } = start;
        let state = DeviceState::upload(client, devices, layout, params, key, batch, generation)?;
        Ok(Self::around(client, es, model, state, fused, times))
    }

    /// [`Population::<Fused>::with_state`] consuming `params`: each leaf's host array is
    /// freed as soon as it is on the devices, so a caller that has no further use for the
    /// host tree (a run reads the parameters back from the devices) never holds it beside
    /// the device copies.
    pub fn with_state_taking(
        client: &Client,
        es: &ShardedES,
        model: &dyn Model,
        params: ParamTree,
        key: Key,
        batch: &[Array],
        generation: u32,
    ) -> Result<Population<Fused>, Error> {
        let (fused, layout, times) = compiled(client, es, model, &params, 1)?;
        let state = DeviceState::upload_taking(
            client,
            es.devices(),
            layout,
            params,
            key,
            batch,
            generation,
        )?;
        Ok(Self::around(client, es, model, state, fused, times))
    }

    fn around(
        client: &Client,
        es: &ShardedES,
        model: &dyn Model,
        state: DeviceState,
        fused: Fused,
        times: BuildTimes,
    ) -> Population<Fused> {
        let core = Core::new(
            client,
            state,
            Placement::Local { tell: None },
            es.n(),
            model.tasks(),
            times,
        );
        Population::from_parts(core, fused)
    }

    /// Runs `k` generations (a multiple of [`Population::<Fused>::generations_per_dispatch`])
    /// and returns the last one's fitness.
    pub fn step_many(&mut self, k: usize) -> Result<Vec<f32>, Error> {
        let per = self.generations_per_dispatch();
        if k == 0 || !k.is_multiple_of(per) {
            return Err(PopulationError::StepMany { k, per }.into());
        }
        let mut fitness = Vec::new();
        for _ in 0..k / per {
            fitness = self.step()?;
        }
        Ok(fitness)
    }

    /// Generations each [`Population::step`] runs.
    pub fn generations_per_dispatch(&self) -> usize {
        self.evaluator().per_dispatch as usize
    }

    /// The generation program's MLIR text.
    pub fn mlir(&self) -> &str {
        &self.evaluator().mlir
    }

    /// The compiled executable (for `optimized_hlo()` and memory statistics).
    pub fn executable(&self) -> &Executable {
        &self.evaluator().exe
    }

    /// The program layout.
    pub fn layout(&self) -> &Layout {
        &self.core().state.layout
    }
}

/// The compiled generation program of `per_dispatch` generations for `params`' leaves,
/// its layout and the build times.
fn compiled(
    client: &Client,
    es: &ShardedES,
    model: &dyn Model,
    params: &ParamTree,
    per_dispatch: u32,
) -> Result<(Fused, Layout, BuildTimes), Error> {
    Place::Alone.devices(client, es)?;
    let t0 = Instant::now();
    let leaves = shardes_hlo::es::leaf_infos(params);
    let program = es.generation_program_multi(model, &leaves, per_dispatch as usize)?;
    let mlir = program.module.to_mlir();
    let emit_ms = t0.elapsed().as_secs_f64() * 1e3;
    let t1 = Instant::now();
    let exe = client.compile(&mlir, &CompileOptions::new(es.devices()))?;
    let compile_ms = t1.elapsed().as_secs_f64() * 1e3;
    let fused = Fused {
        exe,
        mlir,
        per_dispatch,
    };
    Ok((
        fused,
        program.layout,
        BuildTimes {
            emit_ms,
            compile_ms,
        },
    ))
}
