//! What every population holds whatever its fitness comes from: the state on the devices,
//! who holds which members (one process, or one process of several), the tell, and the
//! build and phase timings.

use std::ops::Range;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Instant;

use shardes_hlo::es::{How, Layout, LeafInfo, Part, Program};
use shardes_hlo::params::{Array, ParamTree};
use shardes_runtime::{Buffer, Client, CompileOptions, Executable};

use super::error::PopulationError;
use crate::distributed::update::{barrier_ms, exclusive, Exchange, HostsTell, Process};
use crate::distributed::{params_digest, Distributed};
use crate::state::DeviceState;
use crate::Error;

/// Host-side timings of building a population's programs.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BuildTimes {
    /// Building and printing the StableHLO programs, milliseconds.
    pub emit_ms: f64,
    /// XLA compilation, milliseconds.
    pub compile_ms: f64,
}

/// Where the last generation's time went on this process, and the bytes it sent to the
/// other processes (a population across processes; zeros on one process).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Phases {
    /// The evaluation of this process's members, until their fitness is on the host, ms.
    pub evaluate_ms: f64,
    /// Gathering every process's fitness, ms (with the wait for the slowest process).
    pub gather_ms: f64,
    /// Adding the partial updates across processes (`how_hosts = B`; 0 for `A`), ms.
    pub exchange_ms: f64,
    /// The rest: `tell` (or the partial sum and the update) on the devices, with their host
    /// transfers, until the new parameters are ready, ms.
    pub rest_ms: f64,
    /// Waiting for the other processes before the collectives, ms: measured only with
    /// [`super::Population::with_barriers`] (a barrier before each collective), so that the
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

/// A program's text and its executable, compiled on first use where asked: a population
/// that only evaluates (greedy decoding of the unperturbed parameters) never pays for the
/// perturbed program's or the tell's compile.
pub(crate) struct OnDemand {
    mlir: String,
    devices: usize,
    exe: OnceLock<Executable>,
}

impl OnDemand {
    /// `program` for `devices` devices, not compiled yet.
    pub(crate) fn new(program: &Program, devices: usize) -> OnDemand {
        OnDemand {
            mlir: program.module.to_mlir(),
            devices,
            exe: OnceLock::new(),
        }
    }

    /// The executable, compiled now if it was not yet.
    pub(crate) fn get(&self, client: &Client) -> Result<&Executable, Error> {
        if let Some(exe) = self.exe.get() {
            return Ok(exe);
        }
        let exe = client.compile(&self.mlir, &CompileOptions::new(self.devices))?;
        Ok(self.exe.get_or_init(|| exe))
    }
}

/// When a population compiles its programs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompileWhen {
    /// While it is built (a training run: compile errors and times come first).
    Now,
    /// On first use (an evaluator that may never run its perturbed program or its tell).
    FirstUse,
}

/// Who holds which members, and how the update is placed.
#[allow(clippy::large_enum_variant)] // one per population: boxing buys nothing
pub(crate) enum Placement {
    /// The whole population on this process. `tell` is none where the evaluation program
    /// applies the update itself (the fused generation).
    Local { tell: Option<(OnDemand, Layout)> },
    /// One process of several: its members evaluated here, the update placed by
    /// `how_hosts`.
    Processes {
        tell: HostsTell,
        part: Part,
        /// Placement inside the process: under `B` each device's partial sum is its own.
        how: How,
        /// Held while the devices run ([`Distributed::device_lock`]; threads of one process).
        devices_lock: Option<Arc<Mutex<()>>>,
    },
}

/// The device state of a population, its placement and its tell.
pub struct Core {
    pub(crate) client: Client,
    pub(crate) state: DeviceState,
    pub(crate) placement: Placement,
    /// The whole population (every process's members).
    n: usize,
    /// Fitness columns per member the tell takes.
    tasks: usize,
    pub(crate) times: BuildTimes,
    pub(crate) phases: Phases,
    /// A barrier before each collective, timed apart.
    barriers: bool,
}

/// Refuses a fitness that is not one value per member and column.
fn check_fitness(values: &[f32], n: usize, tasks: usize) -> Result<(), Error> {
    if values.len() != n * tasks {
        return Err(PopulationError::FitnessCount {
            got: values.len(),
            n,
            columns: tasks,
        }
        .into());
    }
    Ok(())
}

impl Core {
    /// A core over `state` placed by `placement`, for a population of `n` members with
    /// `tasks` fitness columns each.
    pub(crate) fn new(
        client: &Client,
        state: DeviceState,
        placement: Placement,
        n: usize,
        tasks: usize,
        times: BuildTimes,
    ) -> Core {
        Core {
            client: client.clone(),
            state,
            placement,
            n,
            tasks,
            times,
            phases: Phases::default(),
            barriers: false,
        }
    }

    /// The client the state lives on.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The whole population's size (every process's members).
    pub fn n(&self) -> usize {
        self.n
    }

    /// The global ids of the members this process evaluates, in order (all `n` on one
    /// process).
    pub fn members(&self) -> Range<usize> {
        match &self.placement {
            Placement::Local { .. } => 0..self.n,
            Placement::Processes { part, .. } => part.members(self.n),
        }
    }

    /// This process's place in its group (process 0 of 1 on one process).
    pub fn part(&self) -> Part {
        match &self.placement {
            Placement::Local { .. } => Part {
                rank: 0,
                processes: 1,
            },
            Placement::Processes { part, .. } => *part,
        }
    }

    /// The devices holding this process's state.
    pub fn devices(&self) -> usize {
        self.state.devices()
    }

    /// The generation the next evaluation belongs to.
    pub fn generation(&self) -> u32 {
        self.state.generation_host
    }

    /// Copies the parameters back to the host (from device 0; every device, and every
    /// process, holds the same bits).
    pub fn params(&self) -> Result<ParamTree, Error> {
        self.state.params()
    }

    /// The group's device lock held while the guard lives (threads of one process sharing
    /// one client); none otherwise.
    pub(crate) fn exclusive(&self) -> Option<MutexGuard<'_, ()>> {
        match &self.placement {
            Placement::Local { .. } => None,
            Placement::Processes { devices_lock, .. } => exclusive(devices_lock),
        }
    }

    /// Runs `exe`, a program of `layout` over this state, with each device's `tail`
    /// arguments (inputs uploaded per call), and hands back each device's results. The
    /// state is unchanged.
    pub(crate) fn execute(
        &self,
        exe: &Executable,
        layout: &Layout,
        tail: &[Vec<Buffer>],
    ) -> Result<Vec<Vec<Buffer>>, Error> {
        let _devices = self.exclusive();
        let args: Vec<Vec<&Buffer>> = (0..self.devices())
            .map(|d| match tail.get(d) {
                Some(t) => self.state.args_with(layout, d, t.iter()),
                None => self.state.args_for(layout, d, None),
            })
            .collect::<Result<_, _>>()?;
        Ok(exe.execute(&args)?)
    }

    /// Refuses a group other than the one this population was built for.
    pub(crate) fn check_group(&self, dist: &Distributed) -> Result<(), Error> {
        let part = self.part();
        if dist.part() != part {
            return Err(PopulationError::WrongGroup {
                rank: part.rank,
                processes: part.processes,
                told_rank: dist.rank(),
                told_processes: dist.size(),
            }
            .into());
        }
        Ok(())
    }

    /// Every process's fitness of its own members (`mine`, this process's members ×
    /// columns), gathered in rank order, which is member order.
    pub(crate) fn gather(&mut self, dist: &Distributed, mine: &[f32]) -> Result<Vec<f32>, Error> {
        let want = self.members().len() * self.tasks;
        if mine.len() != want {
            return Err(PopulationError::OwnFitnessCount {
                process: self.part().rank,
                got: mine.len(),
                members: self.members().len(),
                columns: self.tasks,
            }
            .into());
        }
        if let Placement::Local { .. } = self.placement {
            return Ok(mine.to_vec());
        }
        let waited = barrier_ms(dist, self.barriers)?;
        let t0 = Instant::now();
        let all = dist.gather_fitness(mine)?;
        self.phases.gather_ms = t0.elapsed().as_secs_f64() * 1e3;
        self.phases.wait_ms = waited;
        self.phases.gather_bytes = 4 * mine.len() * (self.part().processes - 1);
        Ok(all)
    }

    /// The update with every member's fitness `values` (the same on every process,
    /// `n × columns` in member order), advancing the generation; a collective under
    /// `how_hosts = B`.
    pub(crate) fn tell(&mut self, dist: &Distributed, values: &[f32]) -> Result<(), Error> {
        self.check_group(dist)?;
        check_fitness(values, self.n, self.tasks)?;
        let t0 = Instant::now();
        let ex = match &self.placement {
            Placement::Local { tell: None } => return Err(PopulationError::UpdatesItself.into()),
            Placement::Local {
                tell: Some((exe, layout)),
            } => {
                let exe = exe.get(&self.client)?;
                self.state.tell(&self.client, exe, layout, values)?;
                Exchange::default()
            }
            Placement::Processes {
                tell,
                part,
                how,
                devices_lock,
            } => {
                let process = Process {
                    client: &self.client,
                    part: *part,
                    how: *how,
                    devices_lock,
                    barriers: self.barriers,
                };
                tell.run(&process, &mut self.state, dist, values)?
            }
        };
        self.phases.rest_ms = t0.elapsed().as_secs_f64() * 1e3 - ex.ms - ex.wait_ms;
        self.phases.exchange_ms = ex.ms;
        self.phases.wait_ms += ex.wait_ms;
        self.phases.exchange_bytes = ex.bytes;
        Ok(())
    }

    /// Starts this process's state again at `params` and `generation` (the optimizer state
    /// zero; key, batch and programs kept), refusing a tree whose leaves are not the
    /// state's; see [`super::Population::restart`].
    pub(crate) fn restart(&mut self, params: &ParamTree, generation: u32) -> Result<(), Error> {
        let got = shardes_hlo::es::leaf_infos(params);
        let want = &self.state.layout.leaves;
        let same = |a: &LeafInfo, b: &LeafInfo| a.path == b.path && a.shape == b.shape;
        let describe = |l: Option<&LeafInfo>| {
            l.map_or_else(
                || "none".to_string(),
                |l| format!("{} {:?}", l.path, l.shape),
            )
        };
        if let Some(position) =
            (0..got.len().max(want.len())).find(|&i| match (got.get(i), want.get(i)) {
                (Some(a), Some(b)) => !same(a, b),
                _ => true,
            })
        {
            return Err(PopulationError::ForeignLeaf {
                position,
                got: describe(got.get(position)),
                want: describe(want.get(position)),
            }
            .into());
        }
        self.state.restart(&self.client, params, generation)
    }

    /// With `on`, a barrier precedes each collective (timed into [`Phases::wait_ms`]).
    pub(crate) fn set_barriers(&mut self, on: bool) {
        self.barriers = on;
    }

    /// Refuses unless every process holds the same parameters (compared by a 64-bit hash),
    /// naming `generation` in the error; a collective. Nothing to compare on one process.
    pub fn check_params(&self, dist: &Distributed, generation: u32) -> Result<(), Error> {
        if let Placement::Local { .. } = self.placement {
            return Ok(());
        }
        let digest = params_digest(&self.params()?);
        dist.agree(
            &format!("the parameters at generation {generation}"),
            digest,
            "the processes ran different programs or hardware; rerun from the last \
             checkpoint, on the same plugin and machine type for every process",
        )
        .map_err(Error::from)
    }

    /// The optimizer's state on the host (from device 0): one named f32 array per entry of
    /// the layout's [`Layout::opt_state`] (`velocity.PATH`; `m.PATH`, `v.PATH`, `count`),
    /// empty under `sgd`.
    pub fn optimizer_state(&self) -> Result<Vec<(String, Array)>, Error> {
        self.state.opt_state()
    }

    /// Replaces the optimizer's state on every device of this process (it starts at zero):
    /// the same names and shapes, in any order.
    pub fn set_optimizer_state(&mut self, tensors: &[(String, Array)]) -> Result<(), Error> {
        self.state.set_opt_state(&self.client, tensors)
    }
}
