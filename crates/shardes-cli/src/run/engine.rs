//! What `shardes run` steps: the fused generation program, a reward run (decode, score on
//! the host, `tell`) with held-out evaluations, or host simulations (MuJoCo) with the
//! policy on the devices; under `mpirun`, one process's part of a population across
//! processes (of a fused generation, or of host simulations).

use std::collections::BTreeMap;

use anyhow::Result;
use shardes::distributed::{Distributed, ProcessTrainer};
use shardes::hlo::params::{Array, ParamTree};
use shardes::host_control::{GenerationStats, HostProcessTrainer, HostTrainer};
use shardes::{BuildTimes, Trainer};

use super::reward::RewardRun;
use super::step::StepOut;
use crate::config::ConfigError;

/// A run's stepper.
#[allow(clippy::large_enum_variant)] // one per run: boxing the trainer buys nothing
pub(crate) enum Engine {
    /// One program per generation (the model's loss in the program).
    Fused(Trainer),
    /// Decoding program + host reward + tell program.
    Reward(Box<RewardRun>),
    /// Host simulations (MuJoCo) with the policy on the devices.
    Host(Box<HostTrainer>),
    /// One process of several (`mpirun`): its members' evaluation, the fitness gathered,
    /// the update placed by `es.how_hosts`.
    Processes(Box<ProcessTrainer>),
    /// One process of several running host simulations (MuJoCo): its members' episodes,
    /// the fitness gathered, the update placed by `es.how_hosts`.
    HostProcesses(Box<HostProcessTrainer>),
}

/// The environment steps per second and the simulations' share of the time of a host
/// generation (under `mpirun`, of this process's members).
fn host_extra(stats: Option<&GenerationStats>) -> BTreeMap<String, f64> {
    let mut extra = BTreeMap::new();
    if let Some(s) = stats {
        let r = &s.rollouts;
        let total = (r.sim_secs + r.policy_secs).max(1e-12);
        extra.insert("env_steps_per_s".to_string(), r.env_steps as f64 / total);
        extra.insert("sim_share".to_string(), r.sim_secs / total);
    }
    extra
}

impl Engine {
    /// Runs one generation (with every process of `dist` together for
    /// [`Engine::Processes`]).
    pub fn step(&mut self, dist: &Distributed) -> Result<StepOut> {
        match self {
            Engine::Fused(t) => Ok(StepOut {
                fitness: t.step()?,
                extra: BTreeMap::new(),
            }),
            Engine::Processes(t) => Ok(StepOut {
                fitness: t.step(dist)?,
                extra: BTreeMap::new(),
            }),
            Engine::Reward(r) => r.step(dist),
            Engine::Host(t) => {
                let fitness = t.step()?;
                Ok(StepOut {
                    fitness,
                    extra: host_extra(t.last_stats()),
                })
            }
            Engine::HostProcesses(t) => {
                let fitness = t.step(dist)?;
                Ok(StepOut {
                    fitness,
                    extra: host_extra(t.last_stats()),
                })
            }
        }
    }

    /// The parameters, copied to the host.
    pub fn params(&self) -> Result<ParamTree> {
        Ok(match self {
            Engine::Fused(t) => t.params()?,
            Engine::Reward(r) => r.params()?,
            Engine::Host(t) => t.params()?,
            Engine::HostProcesses(t) => t.params()?,
            Engine::Processes(t) => t.params()?,
        })
    }

    /// The optimizer's state on the host (empty under sgd, and for host simulations,
    /// which take sgd only).
    pub fn optimizer_state(&self) -> Result<Vec<(String, Array)>> {
        Ok(match self {
            Engine::Fused(t) => t.optimizer_state()?,
            Engine::Processes(t) => t.optimizer_state()?,
            Engine::Reward(r) => r.optimizer_state()?,
            Engine::Host(_) | Engine::HostProcesses(_) => Vec::new(),
        })
    }

    /// Replaces the optimizer state on this process's devices (every process passes the
    /// same); nothing to do without one.
    pub fn set_optimizer_state(&mut self, tensors: &[(String, Array)]) -> Result<()> {
        match self {
            Engine::Fused(t) => t.set_optimizer_state(tensors)?,
            Engine::Processes(t) => t.set_optimizer_state(tensors)?,
            Engine::Reward(r) => r.set_optimizer_state(tensors)?,
            Engine::Host(_) | Engine::HostProcesses(_) if tensors.is_empty() => {}
            Engine::Host(_) | Engine::HostProcesses(_) => anyhow::bail!(
                "a host-simulation run keeps no optimizer state; resume with the config that \
                 started the run"
            ),
        }
        Ok(())
    }

    /// Sets a resumed checkpoint's optimizer state (`tensors`, empty under sgd), refusing
    /// a state that does not fit this run's optimizer with a pointer to the config.
    pub fn resume_optimizer(&mut self, tensors: &[(String, Array)]) -> Result<()> {
        let set = match self {
            Engine::Fused(t) if !tensors.is_empty() || t.layout().opt_count() > 0 => {
                t.set_optimizer_state(tensors)
            }
            Engine::Processes(t) if !tensors.is_empty() || !t.optimizer_state()?.is_empty() => {
                t.set_optimizer_state(tensors)
            }
            Engine::Reward(r) if !tensors.is_empty() || !r.optimizer_state()?.is_empty() => {
                r.set_optimizer_state(tensors)
            }
            _ => Ok(()),
        };
        set.map_err(|e| {
            ConfigError::new(
                format!("--resume: the checkpoint's optimizer state does not fit: {e}"),
                "resume with the config that started the run",
            )
            .into()
        })
    }

    /// The generation the next step runs.
    pub fn generation(&self) -> u32 {
        match self {
            Engine::Fused(t) => t.generation(),
            Engine::Reward(r) => r.generation(),
            Engine::Host(t) => t.generation(),
            Engine::HostProcesses(t) => t.generation(),
            Engine::Processes(t) => t.generation(),
        }
    }

    /// Emit and compile times.
    pub fn build_times(&self) -> BuildTimes {
        match self {
            Engine::Fused(t) => t.build_times(),
            Engine::Reward(r) => r.build_times(),
            Engine::Host(t) => t.build_times(),
            Engine::HostProcesses(t) => t.build_times(),
            Engine::Processes(t) => t.build_times(),
        }
    }

    /// Evaluates on held-out prompts when `done` generations call for it (a reward run with
    /// `[eval]`): at 0, every `eval.every` and, with `last`, at the end. Returns the line
    /// to print.
    pub fn evaluate_if_due(&mut self, done: u32, last: bool) -> Result<Option<String>> {
        match self {
            Engine::Fused(_)
            | Engine::Host(_)
            | Engine::HostProcesses(_)
            | Engine::Processes(_) => Ok(None),
            Engine::Reward(r) => r.evaluate_if_due(done, last),
        }
    }
}
