//! [`Losses`]: `ask + apply` returning the model's losses, with the tell apart, so that
//! the fitness can come from the host ([`crate::SplitTrainer`] is its population).
//!
//! The generation is cut in two executables, each compiled once: `ask + apply`
//! ([`Population::evaluate`]) returns the population's losses as the model computes them,
//! and the tell ([`Population::tell`]) takes a fitness array from the host, so the rewards
//! can be computed in Rust (from decoded text, a simulator, a human...). Feeding
//! `evaluate`'s own output back to `tell` gives the same parameters as the fused program
//! (the same ask, the same shaping and contraction); [`Population::step`] does exactly that.
//!
//! As one process of a run across processes ([`Population::<Losses>::placed`] with [`Place::Group`]) the
//! program evaluates that process's members only and the update is placed by `how_hosts`.

use std::time::Instant;

use shardes_hlo::es::{Layout, Model, ShardedES};
use shardes_hlo::params::{Array, ParamTree};
use shardes_hlo::prng::Key;
use shardes_runtime::{gather_rows, Client, CompileOptions, Executable};

use super::{
    placement, BuildTimes, CompileWhen, Core, Evaluator, Fitness, Place, Population,
    PopulationError, Start,
};
use crate::distributed::Distributed;
use crate::state::DeviceState;
use crate::Error;

/// The compiled `ask + apply` of this process's members.
pub struct Losses {
    ask_apply: Executable,
}

impl Losses {
    /// The losses of this process's members on `core`'s state, in member order.
    fn losses(&self, core: &Core) -> Result<Vec<f32>, Error> {
        let layout = &core.state.layout;
        let mut shards = Vec::with_capacity(core.devices());
        for out in core.execute(&self.ask_apply, layout, &[])? {
            shards.push(
                layout
                    .split_results(out)?
                    .fitness
                    .ok_or(PopulationError::MissingResult("ask_apply", "fitness"))?,
            );
        }
        Ok(gather_rows(&shards)?)
    }
}

impl Evaluator for Losses {
    fn evaluate(&mut self, core: &mut Core, _dist: &Distributed) -> Result<Fitness, Error> {
        Ok(Fitness::Mine(self.losses(core)?))
    }
}

impl Population<Losses> {
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
    ) -> Result<Population<Losses>, Error> {
        let start = Start {
            key,
            batch,
            generation,
        };
        let (place, when) = (Place::Alone, CompileWhen::Now);
        Self::placed(client, es, model, params, start, place, when)
    }

    /// The population of `model`'s losses at `start`, placed by `place`:
    /// [`Population::<Losses>::new`] alone; in a group (`Place::Group(dist, how_hosts)`)
    /// `es` is the whole run's (its devices every process's), `ask + apply` evaluates this
    /// process's members on its own devices, and the update is placed across processes by
    /// `how_hosts`. Every process builds it with the same settings and state and steps it
    /// together ([`Population::step_in`]).
    ///
    /// The tell compiles `when` asked, across processes always now: a caller alone that
    /// may only evaluate (the `ask + apply` timing of `bench`, central differences) asks
    /// for [`CompileWhen::FirstUse`] and never pays for the tell's compile; the programs,
    /// the state and the results are the same.
    #[allow(clippy::too_many_arguments)]
    pub fn placed(
        client: &Client,
        es: &ShardedES,
        model: &dyn Model,
        params: &ParamTree,
        start: Start<'_>,
        place: Place<'_>,
        when: CompileWhen,
    ) -> Result<Population<Losses>, Error> {
        let devices = place.devices(client, es)?;
        let t0 = Instant::now();
        let leaves = shardes_hlo::es::leaf_infos(params);
        let first = match place {
            Place::Alone => es.ask_apply_program(model, &leaves)?,
            Place::Group(dist, _) => es.part_ask_apply_program(model, &leaves, dist.part())?,
        };
        let mlir = first.module.to_mlir();
        let emit_ms = t0.elapsed().as_secs_f64() * 1e3;
        let t1 = Instant::now();
        let ask_apply = client.compile(&mlir, &CompileOptions::new(devices))?;
        // The same model: tell takes its fitness columns and sizes its chunks as the fused
        // program for this model would.
        let placement = placement(client, es, place, model, &leaves, devices, when)?;
        let compile_ms = t1.elapsed().as_secs_f64() * 1e3;
        let state = DeviceState::upload(
            client,
            devices,
            first.layout,
            params,
            start.key,
            start.batch,
            start.generation,
        )?;
        let times = BuildTimes {
            emit_ms,
            compile_ms,
        };
        let core = Core::new(client, state, placement, es.n(), model.tasks(), times);
        Ok(Population::from_parts(core, Losses { ask_apply }))
    }

    /// Runs `ask + apply` on the current state: the fitness of this process's members
    /// ([`Population::members`], all `n` on one process) in member order (`× tasks`,
    /// row-major). The state is unchanged; no other process is involved.
    pub fn evaluate(&self) -> Result<Vec<f32>, Error> {
        self.evaluator().losses(self.core())
    }

    /// The program layout (`n`, tasks, leaves, batch) of `ask + apply`.
    pub fn layout(&self) -> &Layout {
        &self.core().state.layout
    }

    /// The `ask + apply` executable.
    pub fn ask_apply_executable(&self) -> &Executable {
        &self.evaluator().ask_apply
    }
}
