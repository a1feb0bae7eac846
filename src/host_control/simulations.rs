//! [`Simulations`]: a population's fitness from host simulations on an MJCF model, the
//! policy on the devices.
//!
//! Two programs, compiled once: the policy step ([`PolicyStep`] through the outputs
//! program: every member's perturbed policy on its own observations, members sharded over
//! `"pop"`) and the tell of the same step, whose [`Model::tasks`] sets the fitness
//! columns. The state (params, key, generation) stays on the devices; per control step
//! only the observations (`n × E × obs` floats, replicated) go up and the actions come
//! back.
//!
//! Across processes, process `p` of `P` simulates the episodes of its own global members
//! `[p·n/P, (p+1)·n/P)` only and evaluates their policies on its own devices; the fitness
//! of every member is gathered in rank order, which is member order, and the update is
//! placed across processes by `how_hosts`. Every member sees what it sees on one process:
//! the same reset states (drawn from the key), the same perturbation (global member ids)
//! and, per step, its own episodes' observations. The observation input keeps its
//! one-process shape `[n, E, obs]` (each chunk of members reads its rows at its global
//! ids), with this process's rows filled and the others' left at zero, which no member of
//! this process reads; so each member's actions, its episodes and its fitness have the
//! bits of one process with every process's devices.

use std::collections::BTreeMap;

use shardes_hlo::es::{MemberOutputs, Model, ShardedES, WithTasks};
use shardes_hlo::params::ParamTree;
use shardes_hlo::prng::{fold_in, Key};
use shardes_hlo::problems::control::host::PolicyStep;
use shardes_runtime::Client;

use super::{HostControl, RolloutStats, Rollouts};
use crate::distributed::Distributed;
use crate::population::{
    CompileWhen, Core, Evaluator, Fitness, HostArray, HostData, Outputs, Place, Population,
    PopulationError,
};
use crate::Error;

/// What the last generation of a host-simulation population did, for reports and the
/// benchmark.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerationStats {
    /// The rollouts of this process's members: their episode returns (`[members, E]`
    /// row-major), steps, and the split of time between the host simulations and the
    /// device policy evaluations.
    pub rollouts: RolloutStats,
    /// Seconds in `tell` (upload of the fitness, the update; with the gather and the
    /// exchange across processes).
    pub tell_secs: f64,
}

/// Host simulations of this process's members driving their policies on the devices.
pub struct Simulations {
    policy: Outputs,
    control: HostControl,
    reset: Vec<f64>,
    /// The episodes of this process's members (`members × E`, member-major).
    rollouts: Rollouts,
    /// The policy step's observation input, `[n, E, obs]`: this process's rows filled.
    obs: HostArray,
    /// Where this process's rows start in `obs`.
    offset: usize,
    last: Option<RolloutStats>,
}

/// The population of host simulations on an MJCF model.
pub type HostTrainer = Population<Simulations>;

impl Population<Simulations> {
    /// Builds and compiles the policy step and the tell for `control` and the ES `es`,
    /// uploads `params` and `key`, and prepares this process's `members × E` simulations;
    /// the reset states are `control.reset_states(fold_in(key, 1))` (as
    /// [`crate::Problem::mjcf`] documents). The state starts at `generation`. Alone, the
    /// whole population; in a group, this process's members' simulations and policy step
    /// on its own devices, the update placed by `how_hosts` (`es` is the whole run's).
    pub fn placed(
        client: &Client,
        es: &ShardedES,
        control: &HostControl,
        params: &ParamTree,
        key: Key,
        generation: u32,
        place: Place<'_>,
    ) -> Result<HostTrainer, Error> {
        let spec = control.spec();
        let step = PolicyStep::new(&control.widths(), es.n(), spec.episodes())?
            .with_fitness(spec.fitness());
        // The tell takes the step's fitness columns; its member bytes size the chunk the
        // policy step drew the noise in.
        let model = WithTasks(&step, Model::tasks(&step));
        let policy = Population::<Outputs>::placed(
            client,
            es,
            &model as &dyn MemberOutputs,
            params,
            key,
            generation,
            place,
            CompileWhen::Now,
        )?;
        let reset = control.reset_states(fold_in(key, 1))?;
        let members = policy.members();
        let e = spec.episodes();
        let rollouts = Rollouts::new(control.env(), members.len() * e, &reset)?;
        let k = step.obs_dim();
        let obs = HostArray::f32(&[es.n(), e, k], vec![0.0; es.n() * e * k]);
        let (core, policy) = policy.into_parts();
        let simulations = Simulations {
            policy,
            control: control.clone(),
            reset,
            rollouts,
            obs,
            offset: members.start * e * k,
            last: None,
        };
        Ok(Population::from_parts(core, simulations))
    }

    /// What this process's part of the last generation did: its own members' episodes
    /// and the tell (none before the first).
    pub fn last_stats(&self) -> Option<GenerationStats> {
        let p = self.phases();
        self.evaluator()
            .last
            .clone()
            .map(|rollouts| GenerationStats {
                rollouts,
                tell_secs: (p.gather_ms + p.exchange_ms + p.rest_ms + p.wait_ms) / 1e3,
            })
    }

    /// The problem.
    pub fn control(&self) -> &HostControl {
        &self.evaluator().control
    }
}

impl Evaluator for Simulations {
    /// All `members × E` episodes (every member's from the same reset states): this
    /// process's members' fitness (`members`, or `members × E` per episode).
    fn evaluate(&mut self, core: &mut Core, _dist: &Distributed) -> Result<Fitness, Error> {
        let Simulations {
            policy,
            control,
            reset,
            rollouts,
            obs,
            offset,
            ..
        } = self;
        rollouts.restart(reset)?;
        let stats = rollouts.run(
            control.spec().episode_length(),
            |mine| {
                if let HostData::F32(all) = &mut obs.data {
                    all[*offset..*offset + mine.len()].copy_from_slice(mine);
                }
                let mut out = policy.outputs(core, std::slice::from_ref(obs))?;
                match out.pop().map(|a| a.data) {
                    Some(HostData::F32(actions)) => Ok(actions),
                    _ => {
                        Err(PopulationError::MissingResult("the policy step", "f32 actions").into())
                    }
                }
            },
            |_, _| Ok(()),
        )?;
        let fitness = control.fitness_of(&stats.returns);
        self.last = Some(stats);
        Ok(Fitness::Mine(fitness))
    }

    /// The environment steps per second and the simulations' share of the time of a
    /// generation (across processes, of this process's members).
    fn metrics(&self) -> BTreeMap<String, f64> {
        let mut extra = BTreeMap::new();
        if let Some(r) = &self.last {
            let total = (r.sim_secs + r.policy_secs).max(1e-12);
            extra.insert("env_steps_per_s".to_string(), r.env_steps as f64 / total);
            extra.insert("sim_share".to_string(), r.sim_secs / total);
        }
        extra
    }
}
