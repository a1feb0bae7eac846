//! [`HostProcessTrainer`]: one process's part of a MuJoCo control run across processes
//! (`mpirun -np P shardes run` on an `mjcf` problem).
//!
//! Process `p` of `P` simulates the episodes of its own global members
//! `[p·n/P, (p+1)·n/P)` only, evaluates their policies on its own devices (the outputs
//! program of those members, [`OutputsRunner::for_process`]), and the fitness of every
//! member is gathered in rank order, which is member order; the update is then placed
//! across processes by `how_hosts`, as for any run across processes.
//!
//! Every member sees what it sees on one process: the same reset states (drawn from the
//! key, the same on every process), the same perturbation (global member ids) and, per
//! step, its own episodes' observations. The observation input keeps its one-process shape
//! `[n, E, obs]` (each chunk of members reads its rows at its global ids), with this
//! process's rows filled and the others' left at zero, which no member of this process
//! reads; so each member's actions, its episodes and its fitness have the bits of
//! [`super::HostTrainer`] with every process's devices.

use std::ops::Range;
use std::time::Instant;

use shardes_hlo::es::{How, MemberOutputs, Model, ShardedES, WithTasks};
use shardes_hlo::params::ParamTree;
use shardes_hlo::prng::{fold_in, Key};
use shardes_hlo::problems::control::host::PolicyStep;
use shardes_runtime::Client;

use super::{GenerationStats, HostControl, Rollouts};
use crate::distributed::Distributed;
use crate::outputs::{HostArray, HostData, OutputsRunner};
use crate::split::HostFitness;
use crate::{BuildTimes, Error};

/// One process's part of a control run on an MJCF model across processes (see the module
/// docs). Every process builds it with the same settings and state and steps it together.
pub struct HostProcessTrainer {
    runner: OutputsRunner,
    control: HostControl,
    reset: Vec<f64>,
    /// The episodes of this process's members (`members × E`, member-major).
    rollouts: Rollouts,
    /// The policy step's observation input, `[n, E, obs]`: this process's rows filled.
    obs: HostArray,
    /// Where this process's rows start in `obs`.
    offset: usize,
    build: BuildTimes,
    last: Option<GenerationStats>,
}

impl HostProcessTrainer {
    /// Builds and compiles this process's policy step (its members' outputs) and the
    /// update placed by `how_hosts`, uploads `params` and `key` on its devices (starting at
    /// `generation`), and prepares its members' `members × E` simulations from the reset
    /// states `control.reset_states(fold_in(key, 1))`, as [`super::HostTrainer::new`]
    /// does. `es` is the whole run's (its devices every process's).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        client: &Client,
        es: &ShardedES,
        control: &HostControl,
        params: &ParamTree,
        key: Key,
        generation: u32,
        dist: &Distributed,
        how_hosts: How,
    ) -> Result<HostProcessTrainer, Error> {
        let spec = control.spec();
        let step = PolicyStep::new(&control.widths(), es.n(), spec.episodes())?
            .with_fitness(spec.fitness());
        // The tell program takes the step's fitness columns, as HostTrainer's does.
        let model = WithTasks(&step, Model::tasks(&step));
        let t0 = Instant::now();
        let runner = OutputsRunner::for_process(
            client,
            es,
            &model as &dyn MemberOutputs,
            params,
            key,
            generation,
            dist,
            how_hosts,
        )?;
        let build = BuildTimes {
            emit_ms: 0.0,
            compile_ms: t0.elapsed().as_secs_f64() * 1e3,
        };
        let reset = control.reset_states(fold_in(key, 1))?;
        let members = runner.members();
        let e = spec.episodes();
        let rollouts = Rollouts::new(control.env(), members.len() * e, &reset)?;
        let k = step.obs_dim();
        let obs = HostArray::f32(&[es.n(), e, k], vec![0.0; es.n() * e * k]);
        Ok(HostProcessTrainer {
            runner,
            control: control.clone(),
            reset,
            rollouts,
            obs,
            offset: members.start * e * k,
            build,
            last: None,
        })
    }

    /// One generation on every process together: this process's members' episodes, the
    /// fitness of every member gathered, then the update. Returns every member's fitness
    /// in global order (`n`, or `n × E` for per-episode fitness), the same on every
    /// process.
    pub fn step(&mut self, dist: &Distributed) -> Result<Vec<f32>, Error> {
        let HostProcessTrainer {
            runner,
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
                let mut out = runner.outputs(std::slice::from_ref(obs))?;
                match out.pop().map(|a| a.data) {
                    Some(HostData::F32(actions)) => Ok(actions),
                    _ => Err(Error::Invalid(
                        "the policy step returned no f32 actions".into(),
                    )),
                }
            },
            |_, _| Ok(()),
        )?;
        let local = control.fitness_of(&stats.returns);
        let t0 = Instant::now();
        let all = dist.gather_fitness(&local)?;
        self.runner.tell_in(dist, &HostFitness::F32(all.clone()))?;
        self.last = Some(GenerationStats {
            rollouts: stats,
            tell_secs: t0.elapsed().as_secs_f64(),
        });
        Ok(all)
    }

    /// The global ids of the members this process simulates.
    pub fn members(&self) -> Range<usize> {
        self.runner.members()
    }

    /// The generation the next [`HostProcessTrainer::step`] runs.
    pub fn generation(&self) -> u32 {
        self.runner.generation()
    }

    /// Copies the parameters back to the host (the same bits on every process).
    pub fn params(&self) -> Result<ParamTree, Error> {
        self.runner.params()
    }

    /// How long building and compiling the programs took (emission and compilation
    /// together, as compile time).
    pub fn build_times(&self) -> BuildTimes {
        self.build
    }

    /// What this process's part of the last generation did: its own members' episodes
    /// (`returns` is `members × E`), and the gather and update (none before the first).
    pub fn last_stats(&self) -> Option<&GenerationStats> {
        self.last.as_ref()
    }

    /// The problem.
    pub fn control(&self) -> &HostControl {
        &self.control
    }
}
