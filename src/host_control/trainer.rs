//! [`HostTrainer`]: ES on an MJCF model, the simulations on host threads and the policy on
//! the devices.
//!
//! Two programs, compiled once: the policy step ([`PolicyStep`] through
//! [`ShardedES::outputs_program`]: every member's perturbed policy on its own
//! observations, members sharded over `"pop"`) and `tell` ([`ShardedES::tell_program`]
//! of the same step, whose [`Model::tasks`] sets the fitness columns). The state (params,
//! key, generation) stays on the devices; per control step only the observations
//! (`n × E × obs` floats, replicated) go up and the actions (`n × E × act`) come back.

use std::time::Instant;

use shardes_hlo::es::{leaf_infos, Layout, Model, ProgramKind, ShardedES};
use shardes_hlo::params::ParamTree;
use shardes_hlo::prng::{fold_in, Key};
use shardes_hlo::problems::control::host::PolicyStep;
use shardes_runtime::{gather_rows, Buffer, Client, CompileOptions, Executable};

use super::{HostControl, RolloutStats, Rollouts};
use crate::split::run_tell;
use crate::state::{check_devices, replicate, DeviceState};
use crate::{BuildTimes, Error};

/// What the last generation of a [`HostTrainer`] did, for reports and the benchmark.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerationStats {
    /// The rollouts: every member's episode returns (`[n, E]` row-major), steps, and the
    /// split of time between the host simulations and the device policy evaluations.
    pub rollouts: RolloutStats,
    /// Seconds in `tell` (upload of the fitness, the update).
    pub tell_secs: f64,
}

/// A run on an MJCF model (see the module documentation).
pub struct HostTrainer {
    client: Client,
    step_exe: Executable,
    layout: Layout,
    tell_exe: Executable,
    tell_layout: Layout,
    state: DeviceState,
    control: HostControl,
    reset: Vec<f64>,
    rollouts: Rollouts,
    build: BuildTimes,
    last: Option<GenerationStats>,
}

impl HostTrainer {
    /// Builds and compiles both programs for `control` and the ES `es`, uploads `params`
    /// and `key`, and prepares the `n × E` simulations; the reset states are
    /// `control.reset_states(fold_in(key, 1))` (as [`crate::Problem::mjcf`] documents).
    /// The state starts at `generation`.
    pub fn new(
        client: &Client,
        es: &ShardedES,
        control: &HostControl,
        params: &ParamTree,
        key: Key,
        generation: u32,
    ) -> Result<HostTrainer, Error> {
        let devices = es.devices();
        check_devices(client, devices)?;
        let spec = control.spec();
        let step = PolicyStep::new(&control.widths(), es.n(), spec.episodes())?
            .with_fitness(spec.fitness());
        let leaves = leaf_infos(params);
        let t0 = Instant::now();
        let first = es.outputs_program(&step, &leaves)?;
        // The step itself as the model: its tasks are the fitness columns, its member
        // bytes the chunk the outputs program drew the noise in.
        let second = es.tell_program(&step as &dyn Model, &leaves)?;
        let (a, b) = (first.module.to_mlir(), second.module.to_mlir());
        let t1 = Instant::now();
        let opts = CompileOptions::new(devices);
        let step_exe = client.compile(&a, &opts)?;
        let tell_exe = client.compile(&b, &opts)?;
        let build = BuildTimes {
            emit_ms: (t1 - t0).as_secs_f64() * 1e3,
            compile_ms: t1.elapsed().as_secs_f64() * 1e3,
        };
        let state_layout = Layout::new(ProgramKind::Outputs, leaves, Vec::new(), es.n(), 1)
            .with_stacks(first.layout.stacks.clone());
        let state =
            DeviceState::upload(client, devices, state_layout, params, key, &[], generation)?;
        let reset = control.reset_states(fold_in(key, 1))?;
        let rollouts = Rollouts::new(control.env(), es.n() * spec.episodes(), &reset)?;
        Ok(HostTrainer {
            client: client.clone(),
            step_exe,
            layout: first.layout,
            tell_exe,
            tell_layout: second.layout,
            state,
            control: control.clone(),
            reset,
            rollouts,
            build,
            last: None,
        })
    }

    /// Runs one generation: all `n × E` episodes (every member's from the same reset
    /// states), then `tell`. Returns the fitness in member order (`n`, or `n × E` for
    /// per-episode fitness).
    pub fn step(&mut self) -> Result<Vec<f32>, Error> {
        let HostTrainer {
            client,
            step_exe,
            layout,
            state,
            control,
            reset,
            rollouts,
            ..
        } = self;
        rollouts.restart(reset)?;
        let devices = state.devices();
        let obs_dims: Vec<usize> = layout.batch[0]
            .1
            .shape
            .iter()
            .map(|&d| d as usize)
            .collect();
        let stats = rollouts.run(
            control.spec().episode_length(),
            |obs| {
                let up = replicate(client, obs, &obs_dims, devices)?;
                let args: Vec<Vec<&Buffer>> = (0..devices)
                    .map(|d| state.args_with(layout, d, vec![&up[d]]))
                    .collect::<Result<_, _>>()?;
                let outs = step_exe.execute(&args)?;
                let mut shards = Vec::with_capacity(devices);
                for out in outs {
                    shards.extend(layout.split_outputs(out)?);
                }
                Ok(gather_rows::<f32>(&shards)?)
            },
            |_, _| Ok(()),
        )?;
        let fitness = control.fitness_of(&stats.returns);
        let t0 = Instant::now();
        self.tell(&fitness)?;
        self.last = Some(GenerationStats {
            rollouts: stats,
            tell_secs: t0.elapsed().as_secs_f64(),
        });
        Ok(fitness)
    }

    fn tell(&mut self, fitness: &[f32]) -> Result<(), Error> {
        run_tell(
            &self.client,
            &self.tell_exe,
            &self.tell_layout,
            &mut self.state,
            fitness,
        )
    }

    /// The generation the next [`HostTrainer::step`] runs.
    pub fn generation(&self) -> u32 {
        self.state.generation_host
    }

    /// Copies the parameters back to the host.
    pub fn params(&self) -> Result<ParamTree, Error> {
        self.state.params()
    }

    /// How long building and compiling the two programs took.
    pub fn build_times(&self) -> BuildTimes {
        self.build
    }

    /// What the last generation did (none before the first).
    pub fn last_stats(&self) -> Option<&GenerationStats> {
        self.last.as_ref()
    }

    /// The problem.
    pub fn control(&self) -> &HostControl {
        &self.control
    }
}
