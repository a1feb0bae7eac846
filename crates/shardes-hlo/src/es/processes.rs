//! One population across processes: the programs one process of `P` runs.
//!
//! A [`ShardedES`] for a run across processes describes the whole run: `n` members over all
//! `P × D` devices (`devices()` counts every process's devices), so its checks, its member
//! chunk and its update scale are those of one process with `P × D` devices. Process `p`
//! ([`Part`]) evaluates the global members `[p·n/P, (p+1)·n/P)` on its own `D` devices;
//! member ids stay global, so every member's noise, and with the same member chunk its
//! fitness, are the bits one process computes.
//!
//! A generation across processes is cut where the processes must agree:
//! 1. [`ShardedES::part_ask_apply_program`]: this process's members' fitness;
//! 2. the host gathers the `n` fitness values from every process (in rank order, which is
//!    member order);
//! 3. the update, placed across processes one of two ways (`es.how_hosts`):
//!    - `A`: every process runs the whole population's `tell`
//!      ([`ShardedES::part_tell_program`]); only fitness values crossed between processes;
//!    - `B`: each process contracts its own members ([`ShardedES::partial_program`]), the
//!      hosts add the `P` partial sums in rank order (so every process holds the same bits),
//!      and [`ShardedES::update_program`] applies the sum.
//!
//! Inside a process, `how` places the work over its devices as it does for one process.

use std::ops::Range;

use crate::builder::{Sharding, Value};

use super::error::{invalid, EsError};
use super::generation::Emitter;
use super::layout::{check_leaves, Layout, ProgramArgs, ProgramKind, ProgramResults};
use super::model::Model;
use super::program::{build_on, Program};
use super::settings::ShardedES;
use super::spec::How;
use super::strategy::LeafInfo;

/// One process of a run across `processes` processes: its rank in `0..processes`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Part {
    /// This process's rank.
    pub rank: usize,
    /// The number of processes.
    pub processes: usize,
}

impl Part {
    /// The only process of a run on one process.
    pub const SINGLE: Part = Part {
        rank: 0,
        processes: 1,
    };

    /// Process `rank` of `processes`, refusing a rank out of range.
    pub fn new(rank: usize, processes: usize) -> Result<Part, EsError> {
        if rank >= processes {
            return Err(invalid(
                format!("process rank {rank} of {processes} processes"),
                "use a rank below the number of processes".into(),
            ));
        }
        Ok(Part { rank, processes })
    }

    /// The global ids of the members this process evaluates out of `n`:
    /// `[rank·n/P, (rank+1)·n/P)`.
    pub fn members(&self, n: usize) -> Range<usize> {
        let per = n / self.processes.max(1);
        self.rank * per..(self.rank + 1) * per
    }
}

/// Refuses a population that does not split evenly over `processes` processes of `devices`
/// devices each (and the strategy's `pairing`), naming all three numbers and two valid
/// populations nearby. The config's keys (`es.n`, `devices`) are named, as a run refuses
/// its config.
pub fn check_processes(
    n: usize,
    processes: usize,
    devices: usize,
    pairing: usize,
    strategy: &str,
) -> Result<(), EsError> {
    if processes == 0 || devices == 0 {
        return Err(invalid(
            format!("{processes} processes × {devices} devices"),
            "run at least one process with at least one device".into(),
        ));
    }
    let per = processes
        .saturating_mul(devices)
        .saturating_mul(pairing.max(1));
    if n == 0 || !n.is_multiple_of(per) {
        let lower = (n / per).max(1) * per;
        let upper = ((n / per + 1) * per).max(lower + per);
        return Err(invalid(
            format!(
                "es.n = {n} is not divisible by processes ({processes}) × devices ({devices}) × \
                 pairing ({} for {strategy}): each process evaluates n / processes members, \
                 split evenly over its devices",
                pairing.max(1)
            ),
            format!(
                "set es.n to a multiple of {per}, e.g. {lower} or {upper}, or change the number \
                 of processes (mpirun -np) or devices"
            ),
        ));
    }
    Ok(())
}

impl ShardedES {
    /// The devices of one process of `part`: [`ShardedES::devices`] (all processes' devices)
    /// divided by the processes, refusing a count that does not divide.
    pub fn local_devices(&self, part: Part) -> Result<usize, EsError> {
        if part.processes == 0 || !self.devices.is_multiple_of(part.processes) {
            return Err(invalid(
                format!(
                    "{} devices do not split over {} processes",
                    self.devices, part.processes
                ),
                "build the ES with processes × devices per process devices".into(),
            ));
        }
        Ok(self.devices / part.processes)
    }

    /// The checks every program of one process makes (its leaves, `model`'s tasks, the
    /// part's devices), and its devices and member chunk.
    fn part_setup(
        &self,
        model: &dyn Model,
        leaves: &[LeafInfo],
        part: Part,
    ) -> Result<(usize, usize), EsError> {
        check_leaves(leaves)?;
        self.check_tasks(model.tasks())?;
        let devices = self.local_devices(part)?;
        Ok((devices, self.member_chunk_for(model)?))
    }

    /// Process `part`'s `ask + apply`: the layout of [`ShardedES::ask_apply_program`] with
    /// `n / P` members, the fitness of the global members [`Part::members`] in order, on
    /// this process's devices. One process's program is `ask_apply_program`'s.
    pub fn part_ask_apply_program(
        &self,
        model: &dyn Model,
        leaves: &[LeafInfo],
        part: Part,
    ) -> Result<Program, EsError> {
        let (devices, chunk) = self.part_setup(model, leaves, part)?;
        let members = part.members(self.n);
        let layout = Layout::new(
            ProgramKind::AskApply,
            leaves.to_vec(),
            model.batch_types(),
            members.len(),
            model.tasks(),
        )
        .with_opt_state(self.optimizer.state_types(leaves))
        .with_layers(model.layers().as_ref());
        build_on("ask_apply", devices, layout, |_, layout, args| {
            Emitter::new(self, layout, chunk)?
                .with_members(members.start, members.len())
                .with_layers(model.layers())
                .ask_apply(model, args)
        })
    }

    /// The whole population's `tell` on process `part`'s devices, with the fitness of every
    /// member (`how_hosts = A`): [`ShardedES::tell_program`]'s layout, and the arithmetic of
    /// one process with every process's devices, so every process computes the same
    /// parameters from the same fitness, and the bits of one process with `P × D` devices.
    /// Under `how = B` each of this process's `D` devices contracts the members of `P` of
    /// those devices, one sum each, and the `P × D` sums are added in device order, as the
    /// all-reduce of one process adds them (every device holds all `P × D` sums of a leaf
    /// for that, where one process would hold one).
    pub fn part_tell_program(
        &self,
        model: &dyn Model,
        leaves: &[LeafInfo],
        part: Part,
    ) -> Result<Program, EsError> {
        let (devices, chunk) = self.part_setup(model, leaves, part)?;
        let layout = Layout::new(
            ProgramKind::Tell,
            leaves.to_vec(),
            Vec::new(),
            self.n,
            model.tasks(),
        )
        .with_opt_state(self.optimizer.state_types(leaves))
        .with_layers(model.layers().as_ref());
        if part.processes == 1 || self.how == How::A {
            // Every device contracts every member: one process's program, the same bits.
            return build_on("tell", devices, layout, |_, layout, args| {
                Emitter::new(self, layout, chunk)?
                    .with_layers(model.layers())
                    .tell_host(args)
            });
        }
        build_on("tell", devices, layout, |f, layout, args| {
            let fitness = fitness_arg(args, "tell")?;
            let emitter = Emitter::new(self, layout, chunk)?.with_layers(model.layers());
            let (base_key, next) = emitter.ask(&args.key, &args.generation)?;
            let weights = emitter.shape_fitness(fitness)?;
            let rows = emitter.partials(&base_key, &weights, part.processes)?;
            let u = rows
                .iter()
                .map(sum_rows_in_order)
                .collect::<Result<Vec<_>, _>>()?;
            let (params, opt_state) = emitter.update(f, &args.params, u, &args.opt_state)?;
            Ok(ProgramResults {
                params,
                generation: Some(next),
                fitness: None,
                opt_state,
            })
        })
    }

    /// Process `part`'s share of `tell`'s sum (`how_hosts = B`): `(params…, key,
    /// generation, fitness) → u…` with the fitness of every member (shaped here, as every
    /// process shapes it), contracting only this process's members. Each `u` is
    /// `[D, ..leaf]`, one row per device: under `how = B` each device's sum of its own
    /// members, unreduced, so that the host can add every process's rows in device order
    /// (the bits of one process's all-reduce); under `how = A` every row is the sum over
    /// all of this process's members. Nothing is donated; the sum goes to
    /// [`ShardedES::update_program`].
    pub fn partial_program(
        &self,
        model: &dyn Model,
        leaves: &[LeafInfo],
        part: Part,
    ) -> Result<Program, EsError> {
        let (devices, chunk) = self.part_setup(model, leaves, part)?;
        let members = part.members(self.n);
        let active = self.active_leaves(leaves)?;
        let layout = Layout::new(
            ProgramKind::Partial,
            leaves.to_vec(),
            Vec::new(),
            self.n,
            model.tasks(),
        )
        .with_sums(&active)
        .with_layers(model.layers().as_ref());
        build_on("partial", devices, layout, |_, layout, args| {
            let fitness = fitness_arg(args, "partial")?;
            let emitter = Emitter::new(self, layout, chunk)?
                .with_members(members.start, members.len())
                .with_layers(model.layers());
            let (base_key, _) = emitter.ask(&args.key, &args.generation)?;
            let weights = emitter.shape_fitness(fitness)?.slice_in_dim(
                members.start as i64,
                members.end as i64,
                0,
            )?;
            Ok(ProgramResults {
                params: emitter.partials(&base_key, &weights, 1)?,
                generation: None,
                fitness: None,
                opt_state: Vec::new(),
            })
        })
    }

    /// `(params…, key, generation, u…, opt…) → (params'…, generation + 1, opt'…)` on
    /// process `part`'s devices: the update of `tell` (sgd's `θ − lr/(nσ) · u` or the
    /// optimizer's step) with the sum `u` over every member given, one per leaf that gets
    /// noise. Parameters, generation and optimizer state are donated. `model` is the one
    /// the partial programs evaluate: only its [`Model::layers`] is read, which says how
    /// the parameters are held ([`Layout::with_layers`]).
    pub fn update_program(
        &self,
        model: &dyn Model,
        leaves: &[LeafInfo],
        part: Part,
    ) -> Result<Program, EsError> {
        check_leaves(leaves)?;
        let devices = self.local_devices(part)?;
        let active = self.active_leaves(leaves)?;
        let layout = Layout::new(ProgramKind::Update, leaves.to_vec(), Vec::new(), self.n, 1)
            .with_sums(&active)
            .with_opt_state(self.optimizer.state_types(leaves))
            .with_layers(model.layers().as_ref());
        build_on("update", devices, layout, |f, layout, args| {
            // The update only: no member is evaluated, so no chunk is needed.
            let (params, opt_state) = Emitter::new(self, layout, 1)?.update(
                f,
                &args.params,
                args.batch.clone(),
                &args.opt_state,
            )?;
            Ok(ProgramResults {
                params,
                generation: Some(args.generation.add(&f.scalar(1u32)?)?),
                fitness: None,
                opt_state,
            })
        })
    }
}

/// The fitness argument of a program declared with a fitness (`name` in the message).
fn fitness_arg<'v>(args: &'v ProgramArgs<Value>, name: &str) -> Result<&'v Value, EsError> {
    args.fitness.as_ref().ok_or_else(|| {
        invalid(
            format!("the {name} program was declared without a fitness argument"),
            "declare it with a layout that takes the fitness".into(),
        )
    })
}

/// `rows [R, ..shape]` (split over "pop") summed over its rows in order,
/// `((r₀ + r₁) + r₂) + …`, replicated: every row on every device, then one add at a time,
/// which is how XLA's CPU all-reduce adds the devices' values (measured bit for bit).
fn sum_rows_in_order(rows: &Value) -> Result<Value, EsError> {
    let all = rows.shard(&Sharding::replicated(rows.rank()))?;
    let shape = all.shape()[1..].to_vec();
    let row =
        |r: i64| -> Result<Value, EsError> { Ok(all.slice_in_dim(r, r + 1, 0)?.reshape(&shape)?) };
    let mut acc = row(0)?;
    for r in 1..all.shape()[0] {
        acc = acc.add(&row(r)?)?;
    }
    Ok(acc)
}

#[cfg(test)]
mod tests;
