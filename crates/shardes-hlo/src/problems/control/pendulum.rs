//! Pendulum swing-up: Gym's `Pendulum-v1` (torque-limited, velocity-clipped, semi-implicit
//! Euler). The equations are in the parent module's docs.

use crate::builder::{Result, Value};
use crate::prng::{fold_in, uniform, Key, PrngError};

use super::kit::{action, components, observe_angles, stack, Transition};

/// Gravity, m/s² (Gym's default `g`).
pub const GRAVITY: f32 = 10.0;
/// Bob mass, kg.
pub const MASS: f32 = 1.0;
/// Rod length, m.
pub const LENGTH: f32 = 1.0;
/// The time step, s.
pub const DT: f32 = 0.05;
/// The torque of action ±1, N·m.
pub const MAX_TORQUE: f32 = 2.0;
/// `|θ̇|` is clipped to this, rad/s.
pub const MAX_SPEED: f32 = 8.0;

/// State variables: `θ, θ̇` (`θ = 0` upright).
pub const STATE_DIM: usize = 2;

/// One step: reward `−(angle_normalize(θ)² + 0.1 θ̇² + 0.001 u²)` of the state before it,
/// then `θ̇ ← clip(θ̇ + (3g/(2l) sin θ + 3/(m l²) u) dt, ±8)`, `θ ← θ + θ̇ dt`. Never
/// terminal.
pub fn step(state: &Value, a: &Value) -> Result<Transition> {
    let s = components(state, STATE_DIM)?;
    let (theta, theta_dot) = (&s[0], &s[1]);
    let u = action(a)? * MAX_TORQUE;
    let cost = theta.angle_normalize().sq() + 0.1 * theta_dot.sq() + 0.001 * u.sq();
    let acc = 3.0 * GRAVITY / (2.0 * LENGTH) * theta.sin() + 3.0 / (MASS * LENGTH * LENGTH) * &u;
    let new_theta_dot = (theta_dot + acc * DT).clip(-MAX_SPEED, MAX_SPEED);
    let new_theta = theta + &new_theta_dot * DT;
    Ok(Transition {
        done: theta.never().get()?,
        reward: (-cost).get()?,
        state: stack(vec![new_theta, new_theta_dot])?,
    })
}

/// Observation (Gym's): `cos θ, sin θ, θ̇`.
pub fn observe(state: &Value) -> Result<Value> {
    observe_angles(state, STATE_DIM, &[0])
}

/// Reset (Gym's): `θ` uniform in `[−π, π)` from `fold_in(key, 0)`, `θ̇` uniform in
/// `[−1, 1)` from `fold_in(key, 1)`.
pub fn reset(key: Key, episodes: usize) -> std::result::Result<Vec<f32>, PrngError> {
    let pi = std::f32::consts::PI;
    let theta = uniform(fold_in(key, 0), &[episodes], -pi, pi)?;
    let theta_dot = uniform(fold_in(key, 1), &[episodes], -1.0, 1.0)?;
    Ok(theta
        .into_iter()
        .zip(theta_dot)
        .flat_map(|(a, b)| [a, b])
        .collect())
}
