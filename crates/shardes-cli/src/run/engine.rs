//! What `shardes run` steps: one [`Population`], its evaluator picked from the config
//! (the fused generation program, a reward run decoding and scoring on the host, host
//! simulations on MuJoCo, or under `mpirun` one process's part of a population). The run
//! loop drives it through the population's one interface and never asks which it is.

use anyhow::{Context, Result};
use shardes::hlo::params::{Array, ParamTree};
use shardes::host_control::HostTrainer;
use shardes::population::{CompileWhen, Place, Start};
use shardes::{Evaluator, Population, SplitTrainer, Trainer};

use super::reward;
use crate::config::ConfigError;
use crate::setup::Setup;

/// A run's population, whatever its evaluator.
pub(crate) type Engine = Population<Box<dyn Evaluator>>;

/// The population of `s` at generation `start` on `params` (taken: the devices hold them
/// from here on), placed by `place`: a `[task]`'s reward run, a MuJoCo model's host
/// simulations, else the model's losses (the fused generation program on one process,
/// `ask + apply` and the placed update across processes).
pub(crate) fn build(s: &Setup, params: ParamTree, start: u32, place: Place<'_>) -> Result<Engine> {
    let p = &s.problem;
    if s.config.task.is_some() {
        return Ok(reward::build(s, &params, start, place)?.boxed());
    }
    if let Some(h) = &s.host {
        let t = HostTrainer::placed(&s.client, &s.es, h, &params, p.key, start, place)
            .context("building the policy step and tell programs")?;
        return Ok(t.boxed());
    }
    Ok(match place {
        // Handed over: each leaf's host copy goes as soon as it is on the devices.
        Place::Alone => {
            Trainer::with_state_taking(&s.client, &s.es, &*p.model, params, p.key, &p.batch, start)
                .context("building the generation program")?
                .boxed()
        }
        // No fused program spans processes: each evaluates its own members, the update is
        // placed across them.
        Place::Group(..) => {
            let start = Start {
                key: p.key,
                batch: &p.batch,
                generation: start,
            };
            SplitTrainer::placed(
                &s.client,
                &s.es,
                &*p.model,
                &params,
                start,
                place,
                CompileWhen::Now,
            )
            .context("building this process's programs")?
            .boxed()
        }
    })
}

/// Sets a resumed checkpoint's optimizer state (`tensors`, empty under sgd), refusing
/// a state that does not fit this run's optimizer with a pointer to the config.
pub(crate) fn resume_optimizer(engine: &mut Engine, tensors: &[(String, Array)]) -> Result<()> {
    if tensors.is_empty() && engine.optimizer_state()?.is_empty() {
        return Ok(());
    }
    engine.set_optimizer_state(tensors).map_err(|e| {
        ConfigError::new(
            format!("--resume: the checkpoint's optimizer state does not fit: {e}"),
            "resume with the config that started the run",
        )
        .into()
    })
}
