//! What `shardes run` steps: the fused generation program ([`Trainer`]), or for a control
//! problem on a MuJoCo model the host simulations with the policy on the devices
//! ([`HostTrainer`]). Both keep the state on the devices and hand back the fitness.

use anyhow::{Context, Result};
use shardes::hlo::params::ParamTree;
use shardes::host_control::HostTrainer;
use shardes::{BuildTimes, Trainer};

use crate::setup::Setup;

/// A run's trainer.
pub enum Runner {
    /// The generation program.
    Fused(Box<Trainer>),
    /// Host simulations, device policy.
    Host(Box<HostTrainer>),
}

impl Runner {
    /// The trainer of `s` at generation `start` with `s.problem.params`.
    pub fn new(s: &Setup, start: u32) -> Result<Runner> {
        let p = &s.problem;
        Ok(match &s.host {
            Some(h) => Runner::Host(Box::new(
                HostTrainer::new(&s.client, &s.es, h, &p.params, p.key, start)
                    .context("building the policy step and tell programs")?,
            )),
            None => Runner::Fused(Box::new(
                Trainer::with_state(
                    &s.client, &s.es, &*p.model, &p.params, p.key, &p.batch, start,
                )
                .context("building the generation program")?,
            )),
        })
    }

    /// Runs one generation; the fitness in member order.
    pub fn step(&mut self) -> Result<Vec<f32>> {
        Ok(match self {
            Runner::Fused(t) => t.step()?,
            Runner::Host(t) => t.step()?,
        })
    }

    /// The generation the next step runs.
    pub fn generation(&self) -> u32 {
        match self {
            Runner::Fused(t) => t.generation(),
            Runner::Host(t) => t.generation(),
        }
    }

    /// The parameters, copied to the host.
    pub fn params(&self) -> Result<ParamTree> {
        Ok(match self {
            Runner::Fused(t) => t.params()?,
            Runner::Host(t) => t.params()?,
        })
    }

    /// How long building and compiling took.
    pub fn build_times(&self) -> BuildTimes {
        match self {
            Runner::Fused(t) => t.build_times(),
            Runner::Host(t) => t.build_times(),
        }
    }

    /// Scalars of the last generation beside the fitness: for the host path, the
    /// environment steps per second and the share of the time in the simulations.
    pub fn extra(&self) -> Vec<(&'static str, f64)> {
        let Runner::Host(t) = self else {
            return Vec::new();
        };
        let Some(s) = t.last_stats() else {
            return Vec::new();
        };
        let r = &s.rollouts;
        let total = r.sim_secs + r.policy_secs;
        vec![
            ("env_steps_per_s", r.env_steps as f64 / total.max(1e-12)),
            ("sim_share", r.sim_secs / total.max(1e-12)),
        ]
    }
}
