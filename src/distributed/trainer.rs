//! [`ProcessTrainer`]: one process's part of a population run across processes, and
//! [`HostFitnessRun`], what a loop that computes fitness on the host (rewards) needs of it
//! or of a one-process [`SplitTrainer`].

use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use shardes_hlo::es::{How, Layout, Model, Part, ShardedES};
use shardes_hlo::params::{Array, ParamTree};
use shardes_hlo::prng::Key;
use shardes_runtime::{gather_rows, Buffer, Client, CompileOptions, Executable};

use super::update::{barrier_ms, exclusive, HostsTell, Process};
use super::{Distributed, DistributedError};
use crate::split::{HostFitness, SplitTrainer};
use crate::state::{check_devices, DeviceState};
use crate::trainer::BuildTimes;
use crate::Error;

/// Where the last generation's time went on this process, and the bytes it sent to the
/// other processes.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Phases {
    /// `ask + apply` of this process's members, until their fitness is on the host, ms.
    pub evaluate_ms: f64,
    /// Gathering every process's fitness, ms (with the wait for the slowest process).
    pub gather_ms: f64,
    /// Adding the partial updates across processes (`how_hosts = B`; 0 for `A`), ms.
    pub exchange_ms: f64,
    /// The rest: `tell` (or the partial sum and the update) on the devices, with their host
    /// transfers, until the new parameters are ready, ms.
    pub rest_ms: f64,
    /// Waiting for the other processes before the collectives, ms: measured only with
    /// [`ProcessTrainer::with_barriers`] (a barrier before each collective), so that the
    /// gather and the exchange are their transfers alone; 0 otherwise, when they include
    /// the wait for the slowest process.
    pub wait_ms: f64,
    /// Bytes this process sent for the fitness gather (its own values to each other
    /// process).
    pub gather_bytes: usize,
    /// Bytes this process sent for the update exchange (`B`: its slices of the partial sum
    /// to each other process, then its summed slice to each; 0 for `A`).
    pub exchange_bytes: usize,
}

/// One process's part of a population across processes (see the module docs of
/// [`super`]): compiled `ask + apply` of its own members and the update placed by
/// `how_hosts`, with the state on its own devices.
///
/// Every process builds it with the same settings and steps it in lockstep: each
/// [`ProcessTrainer::step`] (or [`ProcessTrainer::tell`]) is a collective. The ES is the
/// whole run's, over every process's devices ([`ShardedES::devices`] = processes × the
/// devices of one), so its member chunk and update scale are those of one process with all
/// the devices; each process uses `devices / processes` of its client's devices.
pub struct ProcessTrainer {
    client: Client,
    part: Part,
    n: usize,
    tasks: usize,
    /// Placement inside the process: under `B` each device's partial sum is its own.
    how: How,
    ask_apply: Executable,
    tell: HostsTell,
    state: DeviceState,
    times: BuildTimes,
    phases: Phases,
    /// Held while the devices run ([`Distributed::device_lock`]; threads of one process).
    devices_lock: Option<Arc<Mutex<()>>>,
    /// A barrier before each collective, timed apart ([`ProcessTrainer::with_barriers`]).
    barriers: bool,
}

impl ProcessTrainer {
    /// Builds and compiles the programs of this process of `dist` and uploads the state
    /// (`params` and `batch` replicated on its devices, starting at `generation`); every
    /// process must pass the same settings and state.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        client: &Client,
        es: &ShardedES,
        model: &dyn Model,
        params: &ParamTree,
        key: Key,
        batch: &[Array],
        generation: u32,
        dist: &Distributed,
        how_hosts: How,
    ) -> Result<ProcessTrainer, Error> {
        let part = dist.part();
        let devices = es.local_devices(part)?;
        check_devices(client, devices)?;
        let t0 = Instant::now();
        let leaves = shardes_hlo::es::leaf_infos(params);
        let first = es.part_ask_apply_program(model, &leaves, part)?;
        let mut texts = vec![first.module.to_mlir()];
        let second = HostsTell::programs(es, model, &leaves, part, how_hosts)?;
        texts.extend(second.iter().map(|p| p.module.to_mlir()));
        let emit_ms = t0.elapsed().as_secs_f64() * 1e3;
        let t1 = Instant::now();
        let opts = CompileOptions::new(devices);
        let mut exes = texts
            .iter()
            .map(|t| client.compile(t, &opts))
            .collect::<Result<Vec<_>, _>>()?;
        let compile_ms = t1.elapsed().as_secs_f64() * 1e3;
        let ask_apply = exes.remove(0);
        let tell = HostsTell::from_compiled(how_hosts, second, exes)?;
        let state = DeviceState::upload(
            client,
            devices,
            first.layout,
            params,
            key,
            batch,
            generation,
        )?;
        Ok(ProcessTrainer {
            client: client.clone(),
            part,
            n: es.n(),
            tasks: model.tasks(),
            how: es.how(),
            ask_apply,
            tell,
            state,
            times: BuildTimes {
                emit_ms,
                compile_ms,
            },
            phases: Phases::default(),
            devices_lock: dist.device_lock(),
            barriers: false,
        })
    }

    /// With `on`, every collective of a generation is preceded by a barrier whose time
    /// goes to [`Phases::wait_ms`], so that the gather and the exchange measure their
    /// transfers alone (for benchmarks; one more collective each).
    pub fn with_barriers(mut self, on: bool) -> ProcessTrainer {
        self.barriers = on;
        self
    }

    /// A barrier, when timing them: its milliseconds.
    fn wait(&self, dist: &Distributed) -> Result<f64, Error> {
        barrier_ms(dist, self.barriers)
    }

    /// Refuses a group other than the one this trainer was built for.
    fn check_group(&self, dist: &Distributed) -> Result<(), Error> {
        if dist.part() != self.part {
            return Err(Error::Invalid(format!(
                "this trainer is process {} of {} but was stepped as process {} of {}; build \
                 it with Distributed::part()",
                self.part.rank,
                self.part.processes,
                dist.rank(),
                dist.size()
            )));
        }
        Ok(())
    }

    /// `ask + apply` of this process's members ([`ProcessTrainer::members`]): their losses
    /// in member order (`× tasks`, row-major). The state is unchanged; no other process is
    /// involved.
    pub fn evaluate(&self) -> Result<Vec<f32>, Error> {
        let _devices = exclusive(&self.devices_lock);
        let layout = &self.state.layout;
        let args: Vec<Vec<&Buffer>> = (0..self.state.devices())
            .map(|d| self.state.args_for(layout, d, None))
            .collect::<Result<_, _>>()?;
        let mut shards = Vec::with_capacity(args.len());
        for out in self.ask_apply.execute(&args)? {
            shards.push(
                layout
                    .split_results(out)?
                    .fitness
                    .ok_or_else(|| Error::Invalid("ask_apply returned no fitness".into()))?,
            );
        }
        Ok(gather_rows(&shards)?)
    }

    /// One generation on every process together: this process's members evaluated, the
    /// fitness gathered, the update placed by `how_hosts`. Returns every member's fitness
    /// in global order (the same on every process).
    pub fn step(&mut self, dist: &Distributed) -> Result<Vec<f32>, Error> {
        self.check_group(dist)?;
        let t0 = Instant::now();
        let local = self.evaluate()?;
        let evaluate_ms = t0.elapsed().as_secs_f64() * 1e3;
        let all = self.tell_local(dist, &local)?;
        self.phases.evaluate_ms = evaluate_ms;
        Ok(all)
    }

    /// Gathers every process's fitness of its own members (`local`, this process's
    /// [`ProcessTrainer::members`] `× tasks`), then tells; returns the gathered fitness.
    fn tell_local(&mut self, dist: &Distributed, local: &[f32]) -> Result<Vec<f32>, Error> {
        let want = self.members().len() * self.tasks;
        if local.len() != want {
            return Err(Error::Invalid(format!(
                "process {} got {} fitness values for its {} members × {} tasks = {want}; pass \
                 one value per own member (and task), in member order",
                self.part.rank,
                local.len(),
                self.members().len(),
                self.tasks
            )));
        }
        let waited = self.wait(dist)?;
        let t0 = Instant::now();
        let all = dist.gather_fitness(local)?;
        self.phases.gather_ms = t0.elapsed().as_secs_f64() * 1e3;
        self.phases.wait_ms = waited;
        self.phases.gather_bytes = 4 * local.len() * (self.part.processes - 1);
        self.tell_all(dist, &all)?;
        Ok(all)
    }

    /// `tell` with every member's fitness (the same on every process, `n × tasks`) and
    /// advances the generation; a collective under `how_hosts = B`. bf16/f16 fitness is
    /// refused before anything runs; f64 is rounded to f32.
    pub fn tell(&mut self, dist: &Distributed, fitness: &HostFitness) -> Result<(), Error> {
        self.check_group(dist)?;
        let values = fitness.to_f32()?;
        self.phases = Phases::default();
        self.tell_all(dist, &values)
    }

    fn tell_all(&mut self, dist: &Distributed, values: &[f32]) -> Result<(), Error> {
        let want = self.n * self.tasks;
        if values.len() != want {
            return Err(Error::Invalid(format!(
                "tell got {} fitness values but the population has n = {} members × {} tasks = \
                 {want}; pass one value per member (and task), in member order",
                values.len(),
                self.n,
                self.tasks
            )));
        }
        let t0 = Instant::now();
        let process = Process {
            client: &self.client,
            part: self.part,
            how: self.how,
            devices_lock: &self.devices_lock,
            barriers: self.barriers,
        };
        let ex = self.tell.run(&process, &mut self.state, dist, values)?;
        let (exchange_ms, exchange_wait, exchange_bytes) = (ex.ms, ex.wait_ms, ex.bytes);
        self.phases.rest_ms = t0.elapsed().as_secs_f64() * 1e3 - exchange_ms - exchange_wait;
        self.phases.exchange_ms = exchange_ms;
        self.phases.wait_ms += exchange_wait;
        self.phases.exchange_bytes = exchange_bytes;
        Ok(())
    }

    /// The global ids of the members this process evaluates.
    pub fn members(&self) -> Range<usize> {
        self.part.members(self.n)
    }

    /// This process's place in the group.
    pub fn part(&self) -> Part {
        self.part
    }

    /// The generation the next step runs.
    pub fn generation(&self) -> u32 {
        self.state.generation_host
    }

    /// Copies the parameters back to the host (the same bits on every process).
    pub fn params(&self) -> Result<ParamTree, Error> {
        self.state.params()
    }

    /// Copies the optimizer's state back to the host (the same bits on every process);
    /// see [`crate::Trainer::optimizer_state`].
    pub fn optimizer_state(&self) -> Result<Vec<(String, Array)>, Error> {
        self.state.opt_state()
    }

    /// Replaces the optimizer's state on this process's devices (every process passes the
    /// same, e.g. a checkpoint's); see [`crate::Trainer::set_optimizer_state`].
    pub fn set_optimizer_state(&mut self, tensors: &[(String, Array)]) -> Result<(), Error> {
        self.state.set_opt_state(&self.client, tensors)
    }

    /// Refuses unless every process holds the same parameters (compared by a 64-bit hash),
    /// naming `generation` in the error; a collective.
    pub fn check_params(&self, dist: &Distributed, generation: u32) -> Result<(), Error> {
        let digest = super::params_digest(&self.params()?);
        dist.agree(
            &format!("the parameters at generation {generation}"),
            digest,
            "the processes ran different programs or hardware; rerun from the last \
             checkpoint, on the same plugin and machine type for every process",
        )
        .map_err(Error::from)
    }

    /// Emission and compile times of this process's programs.
    pub fn build_times(&self) -> BuildTimes {
        self.times
    }

    /// Where the last generation's time went.
    pub fn phases(&self) -> Phases {
        self.phases
    }

    /// The `ask + apply` program's layout (this process's `n / P` members).
    pub fn layout(&self) -> &Layout {
        &self.state.layout
    }
}

/// What a loop that computes the fitness on the host needs, on one process
/// ([`SplitTrainer`]) or across processes ([`ProcessTrainer`]): each process evaluates and
/// scores its own members ([`HostFitnessRun::members`]), and
/// [`HostFitnessRun::tell_gathered`] gathers every process's values (like the fitness) and
/// tells.
pub trait HostFitnessRun {
    /// The global ids of the members this process evaluates and scores.
    fn members(&self) -> Range<usize>;
    /// The model's losses of this process's members, in member order.
    fn evaluate(&self) -> Result<Vec<f32>, Error>;
    /// Gathers every process's `local` fitness (its own members', `× tasks`), tells with
    /// all of it, and returns it (global member order, the same on every process).
    fn tell_gathered(&mut self, dist: &Distributed, local: &HostFitness)
        -> Result<Vec<f32>, Error>;
    /// The generation the next evaluation runs.
    fn generation(&self) -> u32;
    /// The parameters on the host.
    fn params(&self) -> Result<ParamTree, Error>;
}

impl HostFitnessRun for ProcessTrainer {
    fn members(&self) -> Range<usize> {
        ProcessTrainer::members(self)
    }
    fn evaluate(&self) -> Result<Vec<f32>, Error> {
        ProcessTrainer::evaluate(self)
    }
    fn tell_gathered(
        &mut self,
        dist: &Distributed,
        local: &HostFitness,
    ) -> Result<Vec<f32>, Error> {
        self.check_group(dist)?;
        let values = local.to_f32()?;
        self.tell_local(dist, &values)
    }
    fn generation(&self) -> u32 {
        ProcessTrainer::generation(self)
    }
    fn params(&self) -> Result<ParamTree, Error> {
        ProcessTrainer::params(self)
    }
}

impl HostFitnessRun for SplitTrainer {
    fn members(&self) -> Range<usize> {
        0..self.layout().n
    }
    fn evaluate(&self) -> Result<Vec<f32>, Error> {
        SplitTrainer::evaluate(self)
    }
    fn tell_gathered(
        &mut self,
        dist: &Distributed,
        local: &HostFitness,
    ) -> Result<Vec<f32>, Error> {
        if dist.size() != 1 {
            return Err(Error::from(DistributedError::Collective(format!(
                "a SplitTrainer runs the whole population in one process, but this is one of \
                 {} processes; use a ProcessTrainer",
                dist.size()
            ))));
        }
        let values = local.to_f32()?;
        self.tell(local)?;
        Ok(values)
    }
    fn generation(&self) -> u32 {
        SplitTrainer::generation(self)
    }
    fn params(&self) -> Result<ParamTree, Error> {
        SplitTrainer::params(self)
    }
}
