//! One population runner: [`Population`], whatever its fitness comes from and whoever holds
//! its members.
//!
//! A population is a [`Core`] (the parameters, key, generation and optimizer state on the
//! devices; the placement of its members on one process or across processes; the tell)
//! and an evaluator `E`, the one thing that varies:
//! - [`Fused`]: the generation program (ask + apply + tell in one executable);
//! - [`Losses`]: `ask + apply` returning the model's losses, the tell apart;
//! - [`Outputs`]: a program returning per-member outputs that the caller scores
//!   ([`Population::outputs`], then [`Population::tell`]);
//! - [`crate::decode::Decode`]: decoding prompts under each member's perturbation;
//! - [`crate::host_control::Simulations`]: host simulations (MuJoCo) driving the policy on
//!   the devices;
//! - `finetune::Reward` (feature `models`): decoding, a reward on the host, held-out
//!   evaluations.
//!
//! Evaluators that produce a fitness by themselves implement [`Evaluator`]; their
//! population steps with [`Population::step`] (one process) or [`Population::step_in`]
//! (every process of a group together). One generation is always the same three moves:
//! the evaluator's fitness of this process's members, gathered across processes, told.
//! The check that a tell got one value per member and column lives in [`Core`], once.
//!
//! The names of the earlier runners are kept as names of their populations:
//! [`crate::Trainer`] is `Population<Fused>`, [`crate::SplitTrainer`] `Population<Losses>`,
//! [`crate::OutputsRunner`] `Population<Outputs>` and [`crate::PopulationDecoder`]
//! `Population<Decode>`.

mod core;
mod error;
mod fitness;
mod fused;
mod losses;
pub(crate) mod outputs;

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::Path;

use shardes_hlo::es::{How, LeafInfo, Model, Part, ShardedES};
use shardes_hlo::params::{Array, ParamTree};
use shardes_hlo::prng::Key;
use shardes_runtime::{Client, CompileOptions};

pub use self::core::{BuildTimes, CompileWhen, Core, Phases};
pub(crate) use self::core::{OnDemand, Placement};
pub use error::PopulationError;
pub use fitness::HostFitness;
pub use fused::Fused;
pub use losses::Losses;
pub use outputs::{HostArray, HostData, Outputs};

use crate::distributed::update::HostsTell;
use crate::distributed::Distributed;
use crate::state::check_devices;
use crate::Error;

/// One generation's fitness as an evaluator hands it over.
#[derive(Clone, Debug, PartialEq)]
pub enum Fitness {
    /// This process's members' values (× columns, in member order): gathered across
    /// processes, then told.
    Mine(Vec<f32>),
    /// Every member's values, the same on every process (an evaluator that gathers what it
    /// needs itself): told.
    All(Vec<f32>),
    /// Every member's values, the update already applied by the evaluation program.
    Told(Vec<f32>),
}

/// Where a population's fitness comes from.
///
/// [`Evaluator::evaluate`] evaluates this process's members on the state `core` holds;
/// the population gathers and tells. Everything else has a default: no extra metrics, no
/// held-out evaluation, no files.
pub trait Evaluator {
    /// One generation's fitness (of every process together, where `dist` has several).
    fn evaluate(&mut self, core: &mut Core, dist: &Distributed) -> Result<Fitness, Error>;

    /// Scalars of the last generation beside the fitness (`extra` in `metrics.jsonl`).
    fn metrics(&self) -> BTreeMap<String, f64> {
        BTreeMap::new()
    }

    /// The run directory is this run's from here on, resuming at `start`: an evaluator
    /// that keeps a log there opens it (dropping what lies past `start`).
    fn attach(&mut self, _dir: &Path, _start: u32) -> Result<(), Error> {
        Ok(())
    }

    /// A held-out evaluation when one is due after `done` generations (`last`: the end of
    /// the run): its one-line summary. None by default.
    fn held_out(&mut self, _core: &Core, _done: u32, _last: bool) -> Result<Option<String>, Error> {
        Ok(None)
    }
}

impl<E: Evaluator + ?Sized> Evaluator for Box<E> {
    fn evaluate(&mut self, core: &mut Core, dist: &Distributed) -> Result<Fitness, Error> {
        (**self).evaluate(core, dist)
    }
    fn metrics(&self) -> BTreeMap<String, f64> {
        (**self).metrics()
    }
    fn attach(&mut self, dir: &Path, start: u32) -> Result<(), Error> {
        (**self).attach(dir, start)
    }
    fn held_out(&mut self, core: &Core, done: u32, last: bool) -> Result<Option<String>, Error> {
        (**self).held_out(core, done, last)
    }
}

/// A population: its state on the devices ([`Core`]) and where its fitness comes from
/// (`E`). See the module documentation.
pub struct Population<E> {
    core: Core,
    evaluator: E,
}

impl<E> Population<E> {
    /// A population of `evaluator` over `core`.
    pub(crate) fn from_parts(core: Core, evaluator: E) -> Population<E> {
        Population { core, evaluator }
    }

    /// The state and the evaluator apart (to build a population on another's programs).
    pub(crate) fn into_parts(self) -> (Core, E) {
        (self.core, self.evaluator)
    }

    /// The state, placement and tell.
    pub fn core(&self) -> &Core {
        &self.core
    }

    /// The evaluator.
    pub fn evaluator(&self) -> &E {
        &self.evaluator
    }

    /// The evaluator, mutably.
    pub fn evaluator_mut(&mut self) -> &mut E {
        &mut self.evaluator
    }

    /// The same population with its evaluator boxed: what a caller that steps any kind of
    /// population holds.
    pub fn boxed<'a>(self) -> Population<Box<dyn Evaluator + 'a>>
    where
        E: Evaluator + 'a,
    {
        Population {
            core: self.core,
            evaluator: Box::new(self.evaluator),
        }
    }

    /// Tells a host fitness (one value per member and column, in member order, lower is
    /// better: negate a reward) and advances the generation. bf16/f16 fitness is refused
    /// before anything runs; f64 is rounded to f32. A population of one process of several
    /// refuses: it tells with [`Population::tell_in`].
    pub fn tell(&mut self, fitness: &HostFitness) -> Result<(), Error> {
        self.tell_in(&Distributed::single(), fitness)
    }

    /// [`Population::tell`] as one process of `dist` with every member's fitness (the same
    /// on every process): the update placed across processes, a collective under
    /// `how_hosts = B`.
    pub fn tell_in(&mut self, dist: &Distributed, fitness: &HostFitness) -> Result<(), Error> {
        let values = fitness.to_f32()?;
        self.core.phases = Phases::default();
        self.core.tell(dist, &values)
    }

    /// Gathers every process's `mine` (this process's members' fitness, × columns), tells
    /// with all of it and returns it (global member order, the same on every process).
    pub fn tell_gathered(
        &mut self,
        dist: &Distributed,
        mine: &HostFitness,
    ) -> Result<Vec<f32>, Error> {
        let values = mine.to_f32()?;
        let all = self.core.gather(dist, &values)?;
        self.core.tell(dist, &all)?;
        Ok(all)
    }

    /// With `on`, every collective of a generation is preceded by a barrier whose time
    /// goes to [`Phases::wait_ms`], so that the gather and the exchange measure their
    /// transfers alone (for benchmarks; one more collective each).
    pub fn with_barriers(mut self, on: bool) -> Population<E> {
        self.core.set_barriers(on);
        self
    }

    /// The global ids of the members this process evaluates (all `n` on one process).
    pub fn members(&self) -> Range<usize> {
        self.core.members()
    }

    /// This process's place in its group.
    pub fn part(&self) -> Part {
        self.core.part()
    }

    /// The whole population's size.
    pub fn n(&self) -> usize {
        self.core.n()
    }

    /// The devices holding this process's state.
    pub fn devices(&self) -> usize {
        self.core.devices()
    }

    /// The generation the next step (or evaluation and tell) runs.
    pub fn generation(&self) -> u32 {
        self.core.generation()
    }

    /// Copies the parameters back to the host (from device 0; every device holds the same).
    pub fn params(&self) -> Result<ParamTree, Error> {
        self.core.params()
    }

    /// Copies the optimizer's state back to the host; see [`Core::optimizer_state`]. With
    /// [`Population::set_optimizer_state`] it resumes a run bit-identically.
    pub fn optimizer_state(&self) -> Result<Vec<(String, Array)>, Error> {
        self.core.optimizer_state()
    }

    /// Replaces the optimizer's state on every device (e.g. a checkpoint's).
    pub fn set_optimizer_state(&mut self, tensors: &[(String, Array)]) -> Result<(), Error> {
        self.core.set_optimizer_state(tensors)
    }

    /// Starts the population again at `params` and `generation`, as if it had been built
    /// there: the parameters and the generation replaced on every device and the
    /// optimizer state zero; the key, the batch, the compiled programs and the evaluator
    /// are kept, so nothing is compiled again. `params` must have the leaves (paths and
    /// shapes, in order) the population was built with ([`PopulationError::ForeignLeaf`]
    /// otherwise). Across processes every process restarts alike.
    ///
    /// [`crate::estimate::Estimator`] restarts one population at `θ` for a generation's
    /// fitness and at zero for the tell that gives its estimate.
    pub fn restart(&mut self, params: &ParamTree, generation: u32) -> Result<(), Error> {
        self.core.restart(params, generation)
    }

    /// Refuses unless every process holds the same parameters; see [`Core::check_params`].
    pub fn check_params(&self, dist: &Distributed, generation: u32) -> Result<(), Error> {
        self.core.check_params(dist, generation)
    }

    /// Emission and compile times of the programs.
    pub fn build_times(&self) -> BuildTimes {
        self.core.times
    }

    /// Where the last generation's time went (a population across processes).
    pub fn phases(&self) -> Phases {
        self.core.phases
    }

    /// The client the state lives on.
    pub fn client(&self) -> &Client {
        &self.core.client
    }
}

impl<E: Evaluator> Population<E> {
    /// Runs one generation on this process alone; returns every member's fitness in
    /// member order (`n` values, or `n × columns` row-major).
    pub fn step(&mut self) -> Result<Vec<f32>, Error> {
        self.step_in(&Distributed::single())
    }

    /// One generation on every process of `dist` together: this process's members
    /// evaluated, the fitness gathered, the update placed. Returns every member's fitness
    /// in global order (the same on every process).
    pub fn step_in(&mut self, dist: &Distributed) -> Result<Vec<f32>, Error> {
        // Before anything runs: an evaluator whose program applies the update (Told) never
        // reaches the tell's own check.
        self.core.check_group(dist)?;
        let t0 = std::time::Instant::now();
        self.core.phases = Phases::default();
        let fitness = self.evaluator.evaluate(&mut self.core, dist)?;
        let evaluate_ms = t0.elapsed().as_secs_f64() * 1e3;
        let all = match fitness {
            Fitness::Told(all) => all,
            Fitness::All(all) => {
                self.core.tell(dist, &all)?;
                all
            }
            Fitness::Mine(mine) => {
                let all = self.core.gather(dist, &mine)?;
                self.core.tell(dist, &all)?;
                all
            }
        };
        self.core.phases.evaluate_ms = evaluate_ms;
        Ok(all)
    }

    /// The evaluator's scalars of the last generation ([`Evaluator::metrics`]).
    pub fn metrics(&self) -> BTreeMap<String, f64> {
        self.evaluator.metrics()
    }

    /// See [`Evaluator::attach`].
    pub fn attach(&mut self, dir: &Path, start: u32) -> Result<(), Error> {
        self.evaluator.attach(dir, start)
    }

    /// See [`Evaluator::held_out`].
    pub fn held_out(&mut self, done: u32, last: bool) -> Result<Option<String>, Error> {
        self.evaluator.held_out(&self.core, done, last)
    }
}

/// Where a population's state starts beside its parameters: the run's key, the batch (one
/// array per [`Model::batch_types`] entry, in order; replicated on every device) and the
/// generation (0 to start a run; a checkpoint's to resume one).
#[derive(Clone, Copy)]
pub struct Start<'a> {
    /// The run's key; generation `g` draws its noise from `fold_in(key, g)`.
    pub key: Key,
    /// The batch arrays in [`Model::batch_types`] order.
    pub batch: &'a [Array],
    /// The generation the state starts at.
    pub generation: u32,
}

/// How a population's members are placed: on this process alone, or as process
/// `dist.part()` of a run across processes with the update placed by `how_hosts`.
#[derive(Clone, Copy)]
pub enum Place<'a> {
    /// The whole population on this process.
    Alone,
    /// One process of `dist`, the update placed by `how_hosts`.
    Group(&'a Distributed, How),
}

impl Place<'_> {
    /// This process's part of the population.
    pub(crate) fn part(&self) -> Part {
        match self {
            Place::Alone => Part {
                rank: 0,
                processes: 1,
            },
            Place::Group(dist, _) => dist.part(),
        }
    }

    /// The devices of this process for `es` (the whole run's ES), checked against the
    /// client's.
    pub(crate) fn devices(&self, client: &Client, es: &ShardedES) -> Result<usize, Error> {
        let devices = match self {
            Place::Alone => es.devices(),
            Place::Group(_, _) => es.local_devices(self.part())?,
        };
        check_devices(client, devices)?;
        Ok(devices)
    }
}

/// The tell of a population of `model` (its fitness columns and member chunk) placed by
/// `place` on this process's `devices`: the tell program on one process (compiled `when`
/// asked), the update programs placed by `how_hosts` across processes (compiled now).
pub(crate) fn placement(
    client: &Client,
    es: &ShardedES,
    place: Place<'_>,
    model: &dyn Model,
    leaves: &[LeafInfo],
    devices: usize,
    when: CompileWhen,
) -> Result<Placement, Error> {
    let (dist, how_hosts) = match place {
        Place::Alone => {
            let program = es.tell_program(model, leaves)?;
            let exe = OnDemand::new(&program, devices);
            if when == CompileWhen::Now {
                exe.get(client)?;
            }
            return Ok(Placement::Local {
                tell: Some((exe, program.layout)),
            });
        }
        Place::Group(dist, how_hosts) => (dist, how_hosts),
    };
    let programs = HostsTell::programs(es, model, leaves, dist.part(), how_hosts)?;
    let opts = CompileOptions::new(devices);
    let exes = programs
        .iter()
        .map(|p| client.compile(&p.module.to_mlir(), &opts))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Placement::Processes {
        tell: HostsTell::from_compiled(how_hosts, programs, exes)?,
        part: dist.part(),
        how: es.how(),
        devices_lock: dist.device_lock(),
    })
}
