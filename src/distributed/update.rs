//! The update of a population across processes, whatever its evaluator: every process's `tell` with the whole population's
//! fitness (`how_hosts = A`), or each process's partial sum added across processes in rank
//! order, then the update (`B`).

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use shardes_hlo::es::{How, Layout, LeafInfo, Model, Part, Program, ShardedES};
use shardes_runtime::{Buffer, Client, Executable};

use super::Distributed;
use crate::state::{replicate, DeviceState};
use crate::Error;

/// The update across processes: the whole population's `tell` on every process (`A`), or
/// each process's partial sum, added across processes, then the update (`B`).
#[allow(clippy::large_enum_variant)] // one per trainer: boxing buys nothing
pub(crate) enum HostsTell {
    Whole {
        exe: Executable,
        layout: Layout,
    },
    Shares {
        partial: Executable,
        partial_layout: Layout,
        update: Executable,
        update_layout: Layout,
    },
}

/// What one [`HostsTell::run`] spent exchanging: milliseconds in the exchange, waiting
/// before it (with barriers) and the bytes sent (all 0 under `A`).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Exchange {
    pub(crate) ms: f64,
    pub(crate) wait_ms: f64,
    pub(crate) bytes: usize,
}

/// How one process runs its update: its client, place, placement inside the process, the
/// group's device lock and whether a barrier precedes each collective.
pub(crate) struct Process<'a> {
    pub(crate) client: &'a Client,
    pub(crate) part: Part,
    pub(crate) how: How,
    pub(crate) devices_lock: &'a Option<Arc<Mutex<()>>>,
    pub(crate) barriers: bool,
}

impl HostsTell {
    /// The update programs of process `part` placed by `how_hosts` (one for `A`, the
    /// partial sum and the update for `B`), sized after `model` (its fitness columns and
    /// member chunk).
    pub(crate) fn programs(
        es: &ShardedES,
        model: &dyn Model,
        leaves: &[LeafInfo],
        part: Part,
        how_hosts: How,
    ) -> Result<Vec<Program>, Error> {
        Ok(match how_hosts {
            How::A => vec![es.part_tell_program(model, leaves, part)?],
            How::B => vec![
                es.partial_program(model, leaves, part)?,
                es.update_program(model, leaves, part)?,
            ],
        })
    }

    /// The update from `programs` ([`HostsTell::programs`]) and their executables, in
    /// the same order.
    pub(crate) fn from_compiled(
        how_hosts: How,
        programs: Vec<Program>,
        exes: Vec<Executable>,
    ) -> Result<HostsTell, Error> {
        let missing = || Error::Invalid("an update program was not compiled".into());
        let mut layouts = programs.into_iter().map(|p| p.layout);
        let mut exes = exes.into_iter();
        let mut next = || {
            Ok::<_, Error>((
                exes.next().ok_or_else(missing)?,
                layouts.next().ok_or_else(missing)?,
            ))
        };
        Ok(match how_hosts {
            How::A => {
                let (exe, layout) = next()?;
                HostsTell::Whole { exe, layout }
            }
            How::B => {
                let (partial, partial_layout) = next()?;
                let (update, update_layout) = next()?;
                HostsTell::Shares {
                    partial,
                    partial_layout,
                    update,
                    update_layout,
                }
            }
        })
    }

    /// The update with every member's fitness `values` (the same on every process) over
    /// `state`, advancing its generation; a collective under `B`.
    pub(crate) fn run(
        &self,
        p: &Process<'_>,
        state: &mut DeviceState,
        dist: &Distributed,
        values: &[f32],
    ) -> Result<Exchange, Error> {
        let devices = state.devices();
        let mut ex = Exchange::default();
        match self {
            HostsTell::Whole { exe, layout } => {
                let _devices = exclusive(p.devices_lock);
                state.tell(p.client, exe, layout, values)?;
                // The phases end when the parameters are ready, not when the dispatch
                // returns (and the devices are free when the lock is released).
                state.sync()?;
            }
            HostsTell::Shares {
                partial,
                partial_layout,
                update,
                update_layout,
            } => {
                let devices_held = exclusive(p.devices_lock);
                let fit = replicate(p.client, values, &partial_layout.fitness_dims(), devices)?;
                let args: Vec<Vec<&Buffer>> = (0..devices)
                    .map(|d| state.args_for(partial_layout, d, Some(&fit[d])))
                    .collect::<Result<_, _>>()?;
                // Each device's own sums (under how = A every device holds the same).
                let parts = if p.how == How::B { devices } else { 1 };
                let mut u = Vec::new();
                for out in partial.execute(&args)?.into_iter().take(parts) {
                    for b in partial_layout.split_results(out)?.params {
                        u.extend(b.to_host::<f32>()?);
                    }
                }
                // Not held across the collective: the other processes need the devices to
                // reach it.
                drop(devices_held);
                ex.wait_ms = barrier_ms(dist, p.barriers)?;
                let t1 = Instant::now();
                let sum = dist.sum_in_rank_order(&u, parts)?;
                ex.ms = t1.elapsed().as_secs_f64() * 1e3;
                let procs = p.part.processes;
                ex.bytes = 4 * (parts + 1) * (u.len() / parts).div_ceil(procs) * (procs - 1);
                let _devices = exclusive(p.devices_lock);
                let mut u_dev: Vec<Vec<Buffer>> = Vec::with_capacity(update_layout.sums.len());
                let mut at = 0;
                for leaf in &update_layout.sums {
                    let dims: Vec<usize> = leaf.shape.iter().map(|&d| d as usize).collect();
                    let len: usize = dims.iter().product();
                    let part = sum.get(at..at + len).ok_or_else(|| {
                        Error::Invalid("the summed update is shorter than the leaves".into())
                    })?;
                    u_dev.push(replicate(p.client, part, &dims, devices)?);
                    at += len;
                }
                let args: Vec<Vec<&Buffer>> = (0..devices)
                    .map(|d| state.args_with(update_layout, d, u_dev.iter().map(|u| &u[d])))
                    .collect::<Result<_, _>>()?;
                let outs = update.execute(&args)?;
                state.absorb_for(update_layout, outs, 1)?;
                state.sync()?;
            }
        }
        Ok(ex)
    }
}

/// A barrier when `on` (timing the collectives apart): its milliseconds, else 0.
pub(crate) fn barrier_ms(dist: &Distributed, on: bool) -> Result<f64, Error> {
    if !on {
        return Ok(0.0);
    }
    let t0 = Instant::now();
    dist.barrier()?;
    Ok(t0.elapsed().as_secs_f64() * 1e3)
}

/// Holds a group's device lock, where it has one, while the guard lives.
pub(crate) fn exclusive(lock: &Option<Arc<Mutex<()>>>) -> Option<MutexGuard<'_, ()>> {
    // A poisoned lock only means another thread panicked; the devices are still usable.
    lock.as_ref()
        .map(|l| l.lock().unwrap_or_else(|e| e.into_inner()))
}
