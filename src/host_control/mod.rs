//! Control on MuJoCo models: the policy of the in-program control problem
//! (`shardes_hlo::problems::control`), its episodes simulated on host threads.
//!
//! Each generation, every member plays the same `E` episodes ([`HostControl::reset_states`],
//! fixed for the run like the in-program environments' reset states) for at most `T`
//! steps. Per step the `n × E` simulations are observed ([`crate::mjcf`]: `qpos ‖ qvel`),
//! the devices evaluate every member's perturbed policy on its own observations in one
//! dispatch ([`Simulations`], the evaluator of a [`crate::Population`]), the actions come back and the simulations step in parallel on
//! the host ([`Rollouts`]). Reward, termination and masking are the model's conventions
//! ([`crate::mjcf`]); an episode that ended is no longer stepped, and once all have ended
//! the generation's remaining steps are skipped. The fitness is the negated return, per
//! episode for `group_relative` or its mean over the episodes, as in the in-program problem.
//!
//! Across processes (`mpirun`), [`HostTrainer::placed`] with a group runs one process's part: the
//! episodes of its own members, their policies on its own devices, the fitness gathered
//! and the update placed by `how_hosts`, with the bits of one process.

mod rollouts;
mod simulations;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use shardes_hlo::params::ParamTree;
use shardes_hlo::prng::Key;
use shardes_hlo::problems::control::{check_shape, policy, Fitness};
use shardes_hlo::problems::ProblemError;

pub use rollouts::{HostMlp, RolloutStats, Rollouts};
pub use simulations::{GenerationStats, HostTrainer, Simulations};

use crate::mjcf::{MjcfEnv, MjcfError};

/// A control problem on an MJCF model, before the model is loaded: the file, the episodes
/// and the policy's shape.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MjcfControl {
    mjcf: PathBuf,
    episodes: usize,
    episode_length: usize,
    hidden: Vec<usize>,
    fitness: Fitness,
}

impl MjcfControl {
    /// `episodes` episodes of at most `episode_length` steps per member on the model file
    /// `mjcf`, the policy's hidden sizes `hidden`, [`Fitness::Mean`]; the same checks as
    /// the in-program problem's (`Control::new`).
    pub fn new(
        mjcf: impl Into<PathBuf>,
        episodes: usize,
        episode_length: usize,
        hidden: &[usize],
    ) -> Result<MjcfControl, ProblemError> {
        check_shape(episodes, episode_length, hidden)?;
        Ok(MjcfControl {
            mjcf: mjcf.into(),
            episodes,
            episode_length,
            hidden: hidden.to_vec(),
            fitness: Fitness::Mean,
        })
    }

    /// The same problem with fitness `fitness`.
    pub fn with_fitness(mut self, fitness: Fitness) -> MjcfControl {
        self.fitness = fitness;
        self
    }

    /// The same problem with `episodes` episodes per member.
    pub fn with_episodes(mut self, episodes: usize) -> Result<MjcfControl, ProblemError> {
        check_shape(episodes, self.episode_length, &self.hidden)?;
        self.episodes = episodes;
        Ok(self)
    }

    /// The model file.
    pub fn mjcf(&self) -> &Path {
        &self.mjcf
    }

    /// Episodes per member, `E`.
    pub fn episodes(&self) -> usize {
        self.episodes
    }

    /// Steps per episode at most, `T`.
    pub fn episode_length(&self) -> usize {
        self.episode_length
    }

    /// The policy's hidden sizes.
    pub fn hidden(&self) -> &[usize] {
        &self.hidden
    }

    /// The fitness layout.
    pub fn fitness(&self) -> Fitness {
        self.fitness
    }

    /// Loads the model (opening the MuJoCo library, `library` first; see
    /// [`shardes_mujoco::locate`]).
    pub fn load(self, library: Option<&Path>) -> Result<HostControl, MjcfError> {
        let env = MjcfEnv::load(library, &self.mjcf)?;
        Ok(HostControl {
            spec: self,
            env: Arc::new(env),
        })
    }
}

/// A control problem on a loaded MJCF model.
#[derive(Debug, Clone)]
pub struct HostControl {
    spec: MjcfControl,
    env: Arc<MjcfEnv>,
}

impl HostControl {
    /// The description it was loaded from.
    pub fn spec(&self) -> &MjcfControl {
        &self.spec
    }

    /// The environment.
    pub fn env(&self) -> &Arc<MjcfEnv> {
        &self.env
    }

    /// The policy's layer widths: observation (`nq + nv`), hidden sizes, action (`nu`).
    pub fn widths(&self) -> Vec<usize> {
        policy::widths(self.env.obs_dim(), &self.spec.hidden, self.env.action_dim())
    }

    /// Initial policy parameters (`policy::init`, as the in-program problem's).
    pub fn init(&self, key: Key) -> Result<ParamTree, ProblemError> {
        policy::init(key, &self.widths())
    }

    /// The `E` reset states `[E, nq + nv]` drawn from `key` ([`MjcfEnv::reset_states`]).
    pub fn reset_states(&self, key: Key) -> Result<Vec<f64>, MjcfError> {
        self.env.reset_states(key, self.spec.episodes)
    }

    /// The same problem with `episodes` episodes per member (for a replay).
    pub fn with_episodes(&self, episodes: usize) -> Result<HostControl, ProblemError> {
        Ok(HostControl {
            spec: self.spec.clone().with_episodes(episodes)?,
            env: Arc::clone(&self.env),
        })
    }

    /// The fitness of `returns` (`[n, E]` row-major): `−return` per episode for
    /// [`Fitness::PerEpisode`] with `E > 1`, else `−mean` over each member's episodes.
    pub fn fitness_of(&self, returns: &[f64]) -> Vec<f32> {
        let e = self.spec.episodes.max(1);
        if self.spec.fitness == Fitness::PerEpisode && e > 1 {
            returns.iter().map(|r| -*r as f32).collect()
        } else {
            returns
                .chunks(e)
                .map(|row| -(row.iter().sum::<f64>() / row.len() as f64) as f32)
                .collect()
        }
    }
}
