//! Many episodes of one MJCF environment stepped together on host threads, and a plain-Rust
//! evaluation of the policy (the reference the benchmark compares the devices with).

use std::sync::Arc;
use std::time::Instant;

use rayon::prelude::*;
use shardes_hlo::params::ParamTree;
use shardes_hlo::problems::control::policy::{bias_path, weight_path};

use crate::mjcf::{Episode, MjcfEnv, MjcfError};
use crate::Error;

/// What a [`Rollouts::run`] did.
#[derive(Debug, Clone, PartialEq)]
pub struct RolloutStats {
    /// Each episode's return.
    pub returns: Vec<f64>,
    /// Control steps run (fewer than asked when every episode ended earlier).
    pub steps: usize,
    /// Episode steps simulated (an ended episode is not stepped).
    pub env_steps: u64,
    /// Seconds spent observing and stepping the simulations.
    pub sim_secs: f64,
    /// Seconds spent in the policy (for the devices: upload, dispatch, download).
    pub policy_secs: f64,
}

/// `count` episodes of one environment.
#[derive(Debug)]
pub struct Rollouts {
    env: Arc<MjcfEnv>,
    episodes: Vec<Episode>,
    obs: Vec<f32>,
}

impl Rollouts {
    /// `count` episodes, episode `i` started from row `i mod rows` of `states`
    /// (`[rows, nq + nv]`, e.g. [`MjcfEnv::reset_states`]).
    pub fn new(env: &Arc<MjcfEnv>, count: usize, states: &[f64]) -> Result<Rollouts, MjcfError> {
        let s = env.state_dim();
        let rows = Self::rows(env, states)?;
        let episodes = (0..count)
            .map(|i| env.episode(&states[(i % rows) * s..][..s]))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Rollouts {
            env: Arc::clone(env),
            obs: vec![0.0; count * env.obs_dim()],
            episodes,
        })
    }

    fn rows(env: &MjcfEnv, states: &[f64]) -> Result<usize, MjcfError> {
        let s = env.state_dim();
        if states.is_empty() || !states.len().is_multiple_of(s) {
            return Err(MjcfError::Size {
                path: env.path().to_path_buf(),
                what: "reset states",
                got: states.len(),
                expected: s,
                fix: "pass whole rows of qpos ‖ qvel (a multiple of that many values)".into(),
            });
        }
        Ok(states.len() / s)
    }

    /// Restarts every episode as [`Rollouts::new`] starts it.
    pub fn restart(&mut self, states: &[f64]) -> Result<(), MjcfError> {
        let s = self.env.state_dim();
        let rows = Self::rows(&self.env, states)?;
        let env = &*self.env;
        self.episodes
            .par_iter_mut()
            .enumerate()
            .try_for_each(|(i, e)| e.restart(env, &states[(i % rows) * s..][..s]))
    }

    /// The episodes.
    pub fn episodes(&self) -> &[Episode] {
        &self.episodes
    }

    /// The environment.
    pub fn env(&self) -> &Arc<MjcfEnv> {
        &self.env
    }

    /// Whether any episode still runs.
    pub fn any_alive(&self) -> bool {
        self.episodes.iter().any(Episode::alive)
    }

    /// Every episode's observation, `[count, obs_dim]`.
    pub fn observe(&mut self) -> &[f32] {
        let k = self.env.obs_dim().max(1);
        // Sequential: a copy of nq + nv values per episode, and a Data is not Sync.
        for (o, e) in self.obs.chunks_mut(k).zip(&self.episodes) {
            e.observe(o);
        }
        &self.obs
    }

    /// Steps every running episode under its row of `actions` (`[count, nu]`).
    pub fn step(&mut self, actions: &[f32]) -> Result<(), MjcfError> {
        let (n, a) = (self.episodes.len(), self.env.action_dim());
        if actions.len() != n * a {
            return Err(MjcfError::Size {
                path: self.env.path().to_path_buf(),
                what: "actions",
                got: actions.len(),
                expected: n * a,
                fix: "give nu actions per episode, episodes in order".into(),
            });
        }
        let env = &*self.env;
        self.episodes
            .par_iter_mut()
            .zip(actions.par_chunks(a.max(1)))
            .try_for_each(|(e, u)| e.step(env, u).map(|_| ()))
    }

    /// Each episode's return so far.
    pub fn returns(&self) -> Vec<f64> {
        self.episodes.iter().map(Episode::ret).collect()
    }

    /// Runs up to `steps` control steps: observe, `policy(obs [count, obs_dim]) →
    /// actions [count, nu]`, step; `each(t, self)` after every step (a trajectory writer).
    /// Stops early once every episode has ended.
    pub fn run(
        &mut self,
        steps: usize,
        mut policy: impl FnMut(&[f32]) -> Result<Vec<f32>, Error>,
        mut each: impl FnMut(usize, &Rollouts) -> Result<(), Error>,
    ) -> Result<RolloutStats, Error> {
        let (mut sim, mut pol) = (0.0, 0.0);
        let mut env_steps = 0u64;
        let mut done = 0;
        for t in 0..steps {
            if !self.any_alive() {
                break;
            }
            let t0 = Instant::now();
            env_steps += self.episodes.iter().filter(|e| e.alive()).count() as u64;
            self.observe();
            let t1 = Instant::now();
            let actions = policy(&self.obs)?;
            let t2 = Instant::now();
            self.step(&actions)?;
            sim += (t1 - t0 + t2.elapsed()).as_secs_f64();
            pol += (t2 - t1).as_secs_f64();
            done = t + 1;
            each(t, self)?;
        }
        Ok(RolloutStats {
            returns: self.returns(),
            steps: done,
            env_steps,
            sim_secs: sim,
            policy_secs: pol,
        })
    }
}

/// The control policy evaluated in plain Rust (f32, `tanh(W h + b)` per layer): the same
/// function as the program's, for references and replays without a device.
#[derive(Debug, Clone)]
pub struct HostMlp {
    /// `(w (out, in) row-major, b, in, out)` per layer.
    layers: Vec<(Vec<f32>, Vec<f32>, usize, usize)>,
}

impl HostMlp {
    /// The policy of layer widths `widths` from `params` (the leaves `layers.{i}.w`,
    /// `layers.{i}.b`).
    pub fn new(params: &ParamTree, widths: &[usize]) -> Result<HostMlp, Error> {
        let leaves = params.leaves();
        let find = |path: &str, shape: &[usize]| -> Result<Vec<f32>, Error> {
            let (_, a) = leaves
                .iter()
                .find(|(p, _)| p == path)
                .ok_or_else(|| Error::Invalid(format!("the policy has no leaf {path}")))?;
            if a.shape() != shape {
                return Err(Error::Invalid(format!(
                    "policy leaf {path} has shape {:?}, but this environment's policy needs \
                     {shape:?}; use parameters trained for this environment and hidden sizes",
                    a.shape()
                )));
            }
            Ok(a.data().to_vec())
        };
        let layers = widths
            .windows(2)
            .enumerate()
            .map(|(i, w)| {
                Ok((
                    find(&weight_path(i), &[w[1], w[0]])?,
                    find(&bias_path(i), &[w[1]])?,
                    w[0],
                    w[1],
                ))
            })
            .collect::<Result<_, Error>>()?;
        Ok(HostMlp { layers })
    }

    /// Actions `[B, act]` for observations `[B, obs]`.
    pub fn act(&self, obs: &[f32]) -> Vec<f32> {
        let mut h = obs.to_vec();
        for (w, b, k, m) in &self.layers {
            let rows = h.len() / k.max(&1);
            let mut next = Vec::with_capacity(rows * m);
            for x in h.chunks(*k.max(&1)) {
                for (wr, bi) in w.chunks(*k.max(&1)).zip(b) {
                    let dot: f32 = wr.iter().zip(x).map(|(a, b)| a * b).sum();
                    next.push((dot + bi).tanh());
                }
            }
            h = next;
        }
        h
    }
}
