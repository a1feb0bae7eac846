//! Control tasks: a tanh MLP policy ([`policy`]) rolled out in an environment written as
//! ops, so a member's whole episode is a `while` loop inside the generation program (no
//! host round trip).
//!
//! # The problem
//!
//! A member's parameters are a policy ([`policy`]: `obs → a ∈ [−1, 1]`, every matmul
//! through [`crate::nn::dense`], so low-rank members never form a perturbed matrix). Each
//! member plays the same `E` episodes of `T` steps (`episodes`, `episode_length`), started
//! from the reset states of the batch input `reset f32[E, S]`. The carry of the rollout
//! loop is `(state, alive, return)`; per step
//!
//! ```text
//! a            = policy(observe(state))
//! next, r, end = env.step(state, a)
//! return      += alive ? r : 0             # the reward of the terminating step counts
//! state        = alive ? next : state      # a terminated episode stays where it ended
//! alive        = alive ∧ ¬end
//! ```
//!
//! so a policy that fell at step 12 collects no reward after it (a `select`, not a
//! multiply: a diverged state cannot turn the masked reward into NaN). The fitness is the
//! negated return (ES minimizes): `[E]` per member for `group_relative`
//! ([`Fitness::PerEpisode`], [`crate::es::Model::tasks`] = `E`), or its mean over the
//! episodes for the 1-D shapings ([`Fitness::Mean`]). [`Control::mean_return`] turns a
//! population's fitness back into the mean return.
//!
//! **Episodes.** The reset states are drawn on the host ([`Control::reset_states`], from
//! the problem's batch key) and are the same for every member and every generation: fixed
//! evaluation episodes, as many ES control setups use, and common random numbers within a
//! generation. Fresh episodes per generation would need the generation inside the loss,
//! which [`crate::es::Model::loss`] does not see (it gets the parameters and the batch, and
//! the trainer uploads the batch once); raise `episodes` if a policy overfits its starts.
//!
//! Arithmetic is f32 throughout; constants are rounded once to f32. Actions are clipped to
//! `[−1, 1]` by every environment and scaled to its physical range there.
//!
//! # Environments ([`Env`])
//!
//! **`cartpole_balance`**: Gym's `CartPole-v1` (Barto, Sutton & Anderson 1983, Gym's
//! constants and explicit Euler), with a continuous force `F = 10 a` N instead of ±10.
//! State `(x, ẋ, θ, θ̇)`, `θ = 0` upright; `g = 9.8`, cart 1 kg, pole 0.1 kg, half-length
//! `l = 0.5` m, `τ = 0.02` s, frictionless:
//!
//! ```text
//! temp = (F + m_p l θ̇² sin θ) / (m_c + m_p)
//! θ̈    = (g sin θ − cos θ · temp) / (l (4/3 − m_p cos²θ / (m_c + m_p)))
//! ẍ    = temp − m_p l θ̈ cos θ / (m_c + m_p)
//! x ← x + τ ẋ,  ẋ ← ẋ + τ ẍ,  θ ← θ + τ θ̇,  θ̇ ← θ̇ + τ θ̈
//! ```
//!
//! Terminal when `|x| > 2.4` or `|θ| > 12°` after the step; reward 1 per step (the
//! terminating one included, as Gym gives it). Reset: each variable `U[−0.05, 0.05)`.
//! Observation: the state.
//!
//! **`cartpole_swingup`**: a documented variant of dm_control's `cartpole swingup` on the
//! cart-pole above (Gym's dynamics and constants, not dm_control's MuJoCo model). Reset as
//! dm_control: `x, ẋ, θ̇ ~ 0.01 N(0, 1)`, `θ ~ π + 0.01 N(0, 1)` (hanging down).
//! Observation `(x, ẋ, cos θ, sin θ, θ̇)`. Reward (dm_control's, on the state after the
//! step, with `tol(v, m) = 0.1^((v/m)²)`, dm_control's gaussian `tolerance`):
//!
//! ```text
//! r = (1 + cos θ)/2 · (1 + tol(x, 2))/2 · (4 + max(0, 1 − a²))/5 · (1 + tol(θ̇, 5))/2
//! ```
//!
//! No angle limit; terminal only when `|x| > 2.4` (dm_control's cart runs on rails; here
//! leaving the track ends the episode and its reward).
//!
//! **`pendulum`**: Gym's `Pendulum-v1`. State `(θ, θ̇)`, `θ = 0` upright; `g = 10`,
//! `m = l = 1`, `dt = 0.05`, torque `u = 2a`:
//!
//! ```text
//! r  = −(angle_normalize(θ)² + 0.1 θ̇² + 0.001 u²)        # of the state before the step
//! θ̇ ← clip(θ̇ + (3g/(2l) sin θ + 3/(m l²) u) dt, −8, 8)
//! θ ← θ + θ̇ dt                                            # semi-implicit Euler
//! ```
//!
//! with `angle_normalize(θ) = ((θ + π) mod 2π) − π` (floored modulo). Never terminal.
//! Reset: `θ ~ U[−π, π)`, `θ̇ ~ U[−1, 1)`. Observation `(cos θ, sin θ, θ̇)`.
//!
//! **`acrobot`**: Gym's `Acrobot-v1`, the **book** dynamics (Sutton & Barto; Gym's
//! default, not the NIPS-paper variant), with a continuous torque `a ∈ [−1, 1]` on the
//! second joint instead of Gym's `{−1, 0, 1}`. State `(θ₁, θ₂, θ̇₁, θ̇₂)`, `θ₁ = 0` hanging
//! down; `m₁ = m₂ = 1`, `l₁ = 1`, `lc₁ = lc₂ = 0.5`, `I₁ = I₂ = 1`, `g = 9.8`:
//!
//! ```text
//! d₁  = m₁lc₁² + m₂(l₁² + lc₂² + 2l₁lc₂ cos θ₂) + I₁ + I₂
//! d₂  = m₂(lc₂² + l₁lc₂ cos θ₂) + I₂
//! φ₂  = m₂lc₂g cos(θ₁ + θ₂ − π/2)
//! φ₁  = −m₂l₁lc₂θ̇₂² sin θ₂ − 2m₂l₁lc₂θ̇₂θ̇₁ sin θ₂ + (m₁lc₁ + m₂l₁)g cos(θ₁ − π/2) + φ₂
//! θ̈₂  = (a + d₂/d₁ φ₁ − m₂l₁lc₂θ̇₁² sin θ₂ − φ₂) / (m₂lc₂² + I₂ − d₂²/d₁)
//! θ̈₁  = −(d₂θ̈₂ + φ₁) / d₁
//! ```
//!
//! integrated by one classical RK4 step of `dt = 0.2` with `a` held (Gym's `rk4` over
//! `[0, dt]`); then `θ₁, θ₂` wrapped into `[−π, π)` (whole periods; Gym's loop keeps an
//! angle of exactly `π`, this maps it to `−π`), `θ̇₁` clipped to `±4π`, `θ̇₂` to `±9π`.
//! Terminal when `−cos θ₁ − cos(θ₁ + θ₂) > 1`; reward −1 per step, 0 for the terminating
//! one. Reset: each variable `U[−0.1, 0.1)`. Observation
//! `(cos θ₁, sin θ₁, cos θ₂, sin θ₂, θ̇₁, θ̇₂)`.
//!
//! **`mountain_car`**: Gym's `MountainCarContinuous-v0`. State `(x, v)`:
//!
//! ```text
//! v ← clip(v + (0.0015 a − 0.0025 cos 3x), −0.07, 0.07)
//! x ← clip(x + v, −1.2, 0.6);   v ← 0 if x = −1.2 and v < 0
//! ```
//!
//! Terminal when `x ≥ 0.45` and `v ≥ 0`; reward `100·[terminal] − 0.1 a²` (Gym squares the
//! unclipped action; the policy's is in `[−1, 1]` already). Reset: `x ~ U[−0.6, −0.4)`,
//! `v = 0`. Observation: the state (unscaled, as Gym's).

use std::fmt;
use std::str::FromStr;

use crate::builder::{HloError, TensorType, Value};
use crate::es::{EsError, Model, ModelParams};
use crate::nn::Act;
use crate::params::{Array, ParamTree};
use crate::prng::{Key, PrngError};

use super::ProblemError;

pub mod acrobot;
pub mod cartpole;
pub mod host;
mod kit;
pub mod mountain_car;
pub mod pendulum;
pub mod policy;
pub mod rollout;

pub use kit::Transition;
use policy::Policy;

/// An environment the rollout can emit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Env {
    /// Cart-pole balance (Gym `CartPole-v1`, continuous force).
    CartpoleBalance,
    /// Cart-pole swing-up (dm_control's reset and reward on Gym's cart-pole).
    CartpoleSwingup,
    /// Pendulum swing-up (Gym `Pendulum-v1`).
    Pendulum,
    /// Acrobot (Gym `Acrobot-v1`, book dynamics, continuous torque).
    Acrobot,
    /// Continuous mountain car (Gym `MountainCarContinuous-v0`).
    MountainCar,
}

/// Every environment, in [`ENV_NAMES`] order.
pub const ENVS: [Env; 5] = [
    Env::CartpoleBalance,
    Env::CartpoleSwingup,
    Env::Pendulum,
    Env::Acrobot,
    Env::MountainCar,
];

/// The environments' names, as configs spell them.
pub const ENV_NAMES: [&str; 5] = [
    "cartpole_balance",
    "cartpole_swingup",
    "pendulum",
    "acrobot",
    "mountain_car",
];

/// An environment name that is not one of [`ENV_NAMES`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown environment \"{name}\"; valid environments: {}", ENV_NAMES.join(", "))]
pub struct UnknownEnv {
    /// The name given.
    pub name: String,
}

impl FromStr for Env {
    type Err = UnknownEnv;

    fn from_str(s: &str) -> Result<Env, UnknownEnv> {
        ENVS.iter()
            .zip(ENV_NAMES)
            .find(|(_, n)| *n == s)
            .map(|(e, _)| *e)
            .ok_or_else(|| UnknownEnv { name: s.into() })
    }
}

impl fmt::Display for Env {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl Env {
    /// The name configs use.
    pub fn name(self) -> &'static str {
        ENVS.iter()
            .zip(ENV_NAMES)
            .find(|(e, _)| **e == self)
            .map_or("?", |(_, n)| n)
    }

    /// State variables `S`.
    pub fn state_dim(self) -> usize {
        match self {
            Env::CartpoleBalance | Env::CartpoleSwingup => cartpole::STATE_DIM,
            Env::Pendulum => pendulum::STATE_DIM,
            Env::Acrobot => acrobot::STATE_DIM,
            Env::MountainCar => mountain_car::STATE_DIM,
        }
    }

    /// Observation size.
    pub fn obs_dim(self) -> usize {
        match self {
            Env::CartpoleBalance => 4,
            Env::CartpoleSwingup => 5,
            Env::Pendulum => 3,
            Env::Acrobot => 6,
            Env::MountainCar => 2,
        }
    }

    /// Action size (1 for every environment here).
    pub fn action_dim(self) -> usize {
        1
    }

    /// `episodes` reset states drawn from `key`, row-major `[episodes, S]`.
    pub fn reset(self, key: Key, episodes: usize) -> Result<Vec<f32>, PrngError> {
        match self {
            Env::CartpoleBalance => cartpole::balance_reset(key, episodes),
            Env::CartpoleSwingup => cartpole::swingup_reset(key, episodes),
            Env::Pendulum => pendulum::reset(key, episodes),
            Env::Acrobot => acrobot::reset(key, episodes),
            Env::MountainCar => mountain_car::reset(key, episodes),
        }
    }

    /// Emits one step from `state [.., S]` under `action [.., 1]` (clipped to `[−1, 1]`).
    pub fn step(self, state: &Value, action: &Value) -> Result<Transition, HloError> {
        match self {
            Env::CartpoleBalance => cartpole::balance_step(state, action),
            Env::CartpoleSwingup => cartpole::swingup_step(state, action),
            Env::Pendulum => pendulum::step(state, action),
            Env::Acrobot => acrobot::step(state, action),
            Env::MountainCar => mountain_car::step(state, action),
        }
    }

    /// Emits the observation `[.., obs_dim]` of `state [.., S]`.
    pub fn observe(self, state: &Value) -> Result<Value, HloError> {
        match self {
            Env::CartpoleBalance => cartpole::balance_observe(state),
            Env::CartpoleSwingup => cartpole::swingup_observe(state),
            Env::Pendulum => pendulum::observe(state),
            Env::Acrobot => acrobot::observe(state),
            Env::MountainCar => mountain_car::observe(state),
        }
    }
}

/// What a member's fitness is made of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Fitness {
    /// The negated mean return over the episodes: one scalar (the 1-D shapings).
    #[default]
    Mean,
    /// The negated return of every episode: `E` columns (for `group_relative`).
    PerEpisode,
}

/// A control problem: environment, episodes, policy shape and fitness.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Control {
    env: Env,
    episodes: usize,
    episode_length: usize,
    hidden: Vec<usize>,
    fitness: Fitness,
}

fn bad(what: &'static str, value: usize, fix: &'static str) -> ProblemError {
    ProblemError::BadDimension { what, value, fix }
}

/// Refuses what no control problem can run: no episodes, an episode length of 0 or past
/// an `i32`, a hidden layer of 0 units (the checks of [`Control::new`], shared with the
/// host-simulated problems).
pub fn check_shape(
    episodes: usize,
    episode_length: usize,
    hidden: &[usize],
) -> Result<(), ProblemError> {
    if episodes == 0 {
        return Err(bad("episodes", 0, "use at least 1 episode per member"));
    }
    if episode_length == 0 || i32::try_from(episode_length).is_err() {
        return Err(bad(
            "episode_length",
            episode_length,
            "use between 1 and 2^31 − 1 steps per episode",
        ));
    }
    if let Some(&w) = hidden.iter().find(|&&w| w == 0) {
        return Err(bad(
            "hidden",
            w,
            "give every hidden layer at least 1 unit (an empty list is a linear policy)",
        ));
    }
    Ok(())
}

impl Control {
    /// A control problem of `episodes` episodes of `episode_length` steps per member, the
    /// policy's hidden layers `hidden` (empty: a linear policy under its tanh), with
    /// [`Fitness::Mean`]. Counts must be at least 1 and the episode length fit an `i32`.
    pub fn new(
        env: Env,
        episodes: usize,
        episode_length: usize,
        hidden: &[usize],
    ) -> Result<Control, ProblemError> {
        check_shape(episodes, episode_length, hidden)?;
        Ok(Control {
            env,
            episodes,
            episode_length,
            hidden: hidden.to_vec(),
            fitness: Fitness::Mean,
        })
    }

    /// The same problem with fitness `fitness`.
    pub fn with_fitness(mut self, fitness: Fitness) -> Control {
        self.fitness = fitness;
        self
    }

    /// The environment.
    pub fn env(&self) -> Env {
        self.env
    }

    /// Episodes per member, `E`.
    pub fn episodes(&self) -> usize {
        self.episodes
    }

    /// Steps per episode, `T`.
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

    /// The policy's layer widths: observation, hidden sizes, action.
    pub fn widths(&self) -> Vec<usize> {
        policy::widths(self.env.obs_dim(), &self.hidden, self.env.action_dim())
    }

    /// Initial policy parameters ([`policy::init`]).
    pub fn init(&self, key: Key) -> Result<ParamTree, ProblemError> {
        policy::init(key, &self.widths())
    }

    /// The batch: the `E` reset states `[E, S]` drawn from `key` ([`Env::reset`]).
    pub fn reset_states(&self, key: Key) -> Result<Array, ProblemError> {
        let data = self.env.reset(key, self.episodes)?;
        Ok(Array::new(vec![self.episodes, self.env.state_dim()], data)?)
    }

    /// The mean return of a population's fitness (every value a negated return, or a
    /// negated mean of returns over the same number of episodes): `−mean(fitness)`.
    pub fn mean_return(fitness: &[f32]) -> f64 {
        let sum: f64 = fitness.iter().map(|&f| f64::from(f)).sum();
        -sum / fitness.len().max(1) as f64
    }

    /// The returns `[C?, E]` of the policy `p` from the reset states `reset [E, S]`.
    pub fn returns(&self, p: &ModelParams, reset: &Value) -> Result<Act, EsError> {
        let (e, s) = (self.episodes as i64, self.env.state_dim() as i64);
        if reset.shape() != [e, s] {
            return Err(EsError::Invalid {
                message: format!(
                    "control reset states are {} but {} episodes of {} need f32[{e}, {s}]",
                    reset.ty(),
                    self.episodes,
                    self.env
                ),
                fix: "pass Control::reset_states as the batch".into(),
            });
        }
        let policy = Policy::read(p, self.widths().len() - 1)?;
        let c = policy.members();
        let f = reset.func();
        // The carry has one fixed type, so a per-member policy starts from per-member states.
        let state = match c {
            Some(c) => reset.broadcast_in_dim(&[c, e, s], &[1, 2])?,
            None => reset.clone(),
        };
        let lead: Vec<i64> = c.into_iter().chain([e]).collect();
        let alive = f.full(true, &lead)?;
        let ret = f.full(0.0f32, &lead)?;
        let zero = f.scalar(0.0f32)?;
        let env = self.env;
        let steps = self.episode_length as i32;
        let dims: Vec<usize> = (0..lead.len()).collect();
        let out = f.fori_loop(
            0,
            steps,
            &[&state, &alive, &ret],
            |_, carry| -> Result<Vec<Value>, HloError> {
                let (state, alive, ret) = (&carry[0], &carry[1], &carry[2]);
                let a = policy.act(&env.observe(state)?)?;
                let t = env.step(state, &a)?;
                let ret = ret.add(&alive.select(&t.reward, &zero)?)?;
                let held = alive.broadcast_in_dim(state.shape(), &dims)?;
                let state = held.select(&t.state, state)?;
                let alive = alive.and(&t.done.not()?)?;
                Ok(vec![state, alive, ret])
            },
        )?;
        let returns = out[2].clone();
        Ok(match c {
            Some(_) => Act::per_member(returns)?,
            None => Act::shared(returns),
        })
    }
}

impl Model for Control {
    fn batch_types(&self) -> Vec<(String, TensorType)> {
        let shape = [self.episodes as i64, self.env.state_dim() as i64];
        vec![("reset".into(), TensorType::f32(&shape))]
    }

    /// Negated returns: logical `[E]` for [`Fitness::PerEpisode`] with `E > 1`, else their
    /// mean (logical `[]`).
    fn loss(&self, p: &ModelParams, batch: &[Value]) -> Result<Act, EsError> {
        let [reset] = batch else {
            return Err(EsError::Invalid {
                message: format!("control takes 1 batch array, got {}", batch.len()),
                fix: "pass the reset states (Control::reset_states)".into(),
            });
        };
        let neg = self.returns(p, reset)?.scale(-1.0)?;
        Ok(if self.tasks() > 1 {
            neg
        } else {
            neg.mean_all()?
        })
    }

    fn tasks(&self) -> usize {
        match self.fitness {
            Fitness::PerEpisode => self.episodes,
            Fitness::Mean => 1,
        }
    }

    /// The widest activation: `E` episodes × the widest layer, f32.
    fn member_bytes(&self) -> Option<usize> {
        let widest = self.widths().into_iter().max().unwrap_or(1);
        Some(self.episodes * widest.max(self.env.state_dim()) * 4)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prng::key;

    #[test]
    fn names_round_trip_and_unknown_lists_all() {
        for (e, n) in ENVS.iter().zip(ENV_NAMES) {
            assert_eq!(n.parse::<Env>(), Ok(*e));
            assert_eq!(e.name(), n);
        }
        let err = "cartpole".parse::<Env>().unwrap_err().to_string();
        for n in ENV_NAMES {
            assert!(err.contains(n), "{err}");
        }
    }

    #[test]
    fn zero_counts_are_refused_and_empty_hidden_is_linear() {
        let e = Env::CartpoleBalance;
        let err = Control::new(e, 0, 10, &[]).unwrap_err().to_string();
        assert!(err.contains("episodes = 0"), "{err}");
        let err = Control::new(e, 2, 0, &[]).unwrap_err().to_string();
        assert!(err.contains("episode_length = 0"), "{err}");
        let err = Control::new(e, 2, 10, &[4, 0]).unwrap_err().to_string();
        assert!(err.contains("hidden = 0"), "{err}");
        let c = Control::new(e, 2, 10, &[]).unwrap();
        assert_eq!(c.widths(), [4, 1]);
        let p = c.init(key(0).unwrap()).unwrap();
        assert_eq!(p.leaf_paths(), ["layers.0.b", "layers.0.w"]);
        assert_eq!(p.shapes(), [vec![1], vec![1, 4]]);
    }

    #[test]
    fn init_scales_by_fan_in_and_resets_have_the_state_shape() {
        let c = Control::new(Env::Acrobot, 3, 10, &[8]).unwrap();
        let k = key(1).unwrap();
        let p = c.init(k).unwrap();
        assert_eq!(
            p.leaf_paths(),
            ["layers.0.b", "layers.0.w", "layers.1.b", "layers.1.w"]
        );
        let w1 = p.get("layers.1.w").unwrap();
        assert_eq!(w1.shape(), &[1, 8]);
        let raw = crate::prng::normal(crate::prng::fold_in(k, 1), &[1, 8]).unwrap();
        let scale = crate::problems::transformer_block::inv_sqrt_d(8);
        for (a, z) in w1.data().iter().zip(raw) {
            assert_eq!(*a, z * scale);
        }
        let r = c.reset_states(k).unwrap();
        assert_eq!(r.shape(), &[3, 4]);
        assert!(r.data().iter().all(|x| x.abs() <= 0.1));
        let sw = Control::new(Env::CartpoleSwingup, 4, 1, &[]).unwrap();
        let r = sw.reset_states(k).unwrap();
        assert!(r
            .data()
            .chunks(4)
            .all(|s| (s[2] - std::f32::consts::PI).abs() < 0.1));
    }

    #[test]
    fn tasks_follow_the_fitness() {
        let c = Control::new(Env::Pendulum, 5, 10, &[]).unwrap();
        assert_eq!(c.tasks(), 1);
        assert_eq!(c.clone().with_fitness(Fitness::PerEpisode).tasks(), 5);
        assert_eq!(Control::mean_return(&[-2.0, -4.0]), 3.0);
    }
}
