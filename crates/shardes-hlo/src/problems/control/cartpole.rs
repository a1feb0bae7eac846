//! Cart-pole: the Barto–Sutton–Anderson dynamics with Gym's `CartPole-v1` constants, a
//! continuous force, and two tasks: balance (Gym's termination and reward) and swing-up
//! (dm_control's reset and reward, on the same dynamics). The equations are in the parent
//! module's docs.

use crate::builder::{Result, Value};
use crate::prng::{normal, uniform, Key, PrngError};

use super::kit::{action, components, observe_angles, stack, Transition, X};

/// Gravity, m/s².
pub const GRAVITY: f32 = 9.8;
/// Cart mass, kg.
pub const MASS_CART: f32 = 1.0;
/// Pole mass, kg.
pub const MASS_POLE: f32 = 0.1;
/// Cart plus pole mass, kg.
pub const TOTAL_MASS: f32 = 1.1;
/// Half the pole's length, m (Gym's `length`).
pub const HALF_LENGTH: f32 = 0.5;
/// `MASS_POLE · HALF_LENGTH`.
pub const POLEMASS_LENGTH: f32 = 0.05;
/// The force of action ±1, N.
pub const FORCE_MAG: f32 = 10.0;
/// The Euler step, s.
pub const TAU: f32 = 0.02;
/// `|x|` beyond which an episode terminates, m.
pub const X_THRESHOLD: f32 = 2.4;
/// `|θ|` beyond which a balance episode terminates: 12°, in radians.
pub const THETA_THRESHOLD: f32 = (12.0 * 2.0 * std::f64::consts::PI / 360.0) as f32;

/// State variables: `x, ẋ, θ, θ̇` (`θ = 0` upright).
pub const STATE_DIM: usize = 4;

/// One Euler step of the frictionless cart-pole under action `a` (clipped to `[-1, 1]`):
/// the next `x, ẋ, θ, θ̇`.
fn dynamics(s: &[X], a: &X) -> [X; 4] {
    let [x, x_dot, theta, theta_dot] = [&s[0], &s[1], &s[2], &s[3]];
    let force = a * FORCE_MAG;
    let (cos, sin) = (theta.cos(), theta.sin());
    let temp = (force + POLEMASS_LENGTH * theta_dot.sq() * &sin) / TOTAL_MASS;
    let theta_acc = (GRAVITY * &sin - &cos * &temp)
        / (HALF_LENGTH * (4.0 / 3.0 - MASS_POLE * cos.sq() / TOTAL_MASS));
    let x_acc = temp - POLEMASS_LENGTH * &theta_acc * &cos / TOTAL_MASS;
    [
        x + TAU * x_dot,
        x_dot + TAU * x_acc,
        theta + TAU * theta_dot,
        theta_dot + TAU * theta_acc,
    ]
}

/// `|x| > X_THRESHOLD`.
fn off_track(x: &X) -> X {
    x.lt(-X_THRESHOLD).or(&x.gt(X_THRESHOLD))
}

/// Balance: reward 1 per step (the terminating step included, as in Gym); terminal when the
/// cart leaves `[-2.4, 2.4]` or the pole leans more than 12°.
pub fn balance_step(state: &Value, a: &Value) -> Result<Transition> {
    let s = components(state, STATE_DIM)?;
    let next = dynamics(&s, &action(a)?);
    let theta = &next[2];
    let done = off_track(&next[0])
        .or(&theta.lt(-THETA_THRESHOLD))
        .or(&theta.gt(THETA_THRESHOLD));
    let reward = next[0].fill(1.0);
    Ok(Transition {
        done: done.get()?,
        reward: reward.get()?,
        state: stack(next.into())?,
    })
}

/// dm_control's `tolerance(x, bounds=(0, 0), margin, sigmoid="gaussian",
/// value_at_margin=0.1)`: `0.1^((x / margin)²)`.
fn gaussian_tolerance(x: &X, margin: f32) -> X {
    let ln_01 = (0.1f64).ln() as f32;
    ((x / margin).sq() * ln_01).exp()
}

/// Swing-up: dm_control's smooth reward on the state after the step,
/// `upright · centered · small_control · small_velocity`; terminal only when the cart
/// leaves `[-2.4, 2.4]` (dm_control's cart runs on rails instead).
pub fn swingup_step(state: &Value, a: &Value) -> Result<Transition> {
    let s = components(state, STATE_DIM)?;
    let u = action(a)?;
    let next = dynamics(&s, &u);
    let upright = (next[2].cos() + 1.0) / 2.0;
    let centered = (1.0 + gaussian_tolerance(&next[0], 2.0)) / 2.0;
    let small_control = (4.0 + (1.0 - u.sq()).max(0.0)) / 5.0;
    let small_velocity = (1.0 + gaussian_tolerance(&next[3], 5.0)) / 2.0;
    let reward = upright * small_control * small_velocity * centered;
    Ok(Transition {
        done: off_track(&next[0]).get()?,
        reward: reward.get()?,
        state: stack(next.into())?,
    })
}

/// Balance observation: the state itself.
pub fn balance_observe(state: &Value) -> Result<Value> {
    stack(components(state, STATE_DIM)?)
}

/// Swing-up observation (dm_control's): `x, ẋ, cos θ, sin θ, θ̇`.
pub fn swingup_observe(state: &Value) -> Result<Value> {
    observe_angles(state, STATE_DIM, &[2])
}

/// Balance reset (Gym's): every state variable uniform in `[-0.05, 0.05)`.
pub fn balance_reset(key: Key, episodes: usize) -> std::result::Result<Vec<f32>, PrngError> {
    uniform(key, &[episodes, STATE_DIM], -0.05, 0.05)
}

/// Swing-up reset (dm_control's): `x, ẋ, θ̇ ~ 0.01 · N(0, 1)`, `θ ~ π + 0.01 · N(0, 1)`.
pub fn swingup_reset(key: Key, episodes: usize) -> std::result::Result<Vec<f32>, PrngError> {
    let mut s: Vec<f32> = normal(key, &[episodes, STATE_DIM])?
        .into_iter()
        .map(|z| 0.01 * z)
        .collect();
    for row in s.chunks_mut(STATE_DIM) {
        row[2] += std::f32::consts::PI;
    }
    Ok(s)
}
