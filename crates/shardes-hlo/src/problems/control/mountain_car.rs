//! Continuous mountain car: Gym's `MountainCarContinuous-v0`. The equations are in the
//! parent module's docs.

use crate::builder::{Result, Value};
use crate::prng::{uniform, Key, PrngError};

use super::kit::{action, components, stack, Transition};

/// The engine's power: velocity gained per step at action 1.
pub const POWER: f32 = 0.0015;
/// The hill's pull: `−0.0025 cos(3 x)` per step.
pub const HILL: f32 = 0.0025;
/// `|v|` is clipped to this.
pub const MAX_SPEED: f32 = 0.07;
/// The left wall.
pub const MIN_POSITION: f32 = -1.2;
/// The right bound.
pub const MAX_POSITION: f32 = 0.6;
/// The flag: an episode ends on reaching it with `v ≥ 0`.
pub const GOAL_POSITION: f32 = 0.45;
/// The reward for reaching the flag.
pub const GOAL_REWARD: f32 = 100.0;

/// State variables: position `x` and velocity `v`.
pub const STATE_DIM: usize = 2;

/// One step: `v ← clip(v + a·0.0015 − 0.0025 cos(3x), ±0.07)`, `x ← clip(x + v, −1.2, 0.6)`,
/// `v ← 0` at the left wall when `v < 0`; terminal at `x ≥ 0.45, v ≥ 0` with reward 100;
/// every step costs `0.1 a²`.
pub fn step(state: &Value, a: &Value) -> Result<Transition> {
    let s = components(state, STATE_DIM)?;
    let (x, v) = (&s[0], &s[1]);
    let force = action(a)?;
    let v = (v + (&force * POWER - HILL * (3.0 * x).cos())).clip(-MAX_SPEED, MAX_SPEED);
    let x = (x + &v).clip(MIN_POSITION, MAX_POSITION);
    let v = x.eq(MIN_POSITION).and(&v.lt(0.0)).select_lit(0.0, &v);
    let done = x.ge(GOAL_POSITION).and(&v.ge(0.0));
    let reward = done.select_lit(GOAL_REWARD, &x.fill(0.0)) - 0.1 * force.sq();
    Ok(Transition {
        done: done.get()?,
        reward: reward.get()?,
        state: stack(vec![x, v])?,
    })
}

/// Observation (Gym's): the state, `x, v`.
pub fn observe(state: &Value) -> Result<Value> {
    stack(components(state, STATE_DIM)?)
}

/// Reset (Gym's): `x` uniform in `[−0.6, −0.4)`, `v = 0`.
pub fn reset(key: Key, episodes: usize) -> std::result::Result<Vec<f32>, PrngError> {
    Ok(uniform(key, &[episodes], -0.6, -0.4)?
        .into_iter()
        .flat_map(|x| [x, 0.0])
        .collect())
}
