//! Acrobot: Gym's `Acrobot-v1` dynamics (the "book" variant, Gym's default), one RK4 step
//! of `dt = 0.2` per action, with a continuous torque in `[−1, 1]` instead of Gym's three
//! discrete torques. The equations are in the parent module's docs.

use crate::builder::{Result, Value};
use crate::prng::{uniform, Key, PrngError};

use super::kit::{action, components, observe_angles, stack, Transition, X};

/// Link masses, kg.
pub const LINK_MASS: f32 = 1.0;
/// Length of the first link, m.
pub const LINK_LENGTH_1: f32 = 1.0;
/// Position of each link's centre of mass along it, m.
pub const LINK_COM_POS: f32 = 0.5;
/// Each link's moment of inertia, kg·m².
pub const LINK_MOI: f32 = 1.0;
/// Gravity, m/s².
pub const GRAVITY: f32 = 9.8;
/// The time step (one RK4 step), s.
pub const DT: f32 = 0.2;
/// `|θ̇₁|` is clipped to this, rad/s.
pub const MAX_VEL_1: f32 = 4.0 * std::f32::consts::PI;
/// `|θ̇₂|` is clipped to this, rad/s.
pub const MAX_VEL_2: f32 = 9.0 * std::f32::consts::PI;

/// State variables: `θ₁, θ₂, θ̇₁, θ̇₂` (`θ₁ = 0` hanging down, `θ₂` relative to link 1).
pub const STATE_DIM: usize = 4;

/// Gym's `_dsdt` ("book"): the time derivative of `θ₁, θ₂, θ̇₁, θ̇₂` under torque `a`.
fn dsdt(s: &[X; 4], a: &X) -> [X; 4] {
    let (m1, m2, l1, lc1, lc2) = (
        LINK_MASS,
        LINK_MASS,
        LINK_LENGTH_1,
        LINK_COM_POS,
        LINK_COM_POS,
    );
    let (i1, i2, g) = (LINK_MOI, LINK_MOI, GRAVITY);
    let half_pi = std::f32::consts::FRAC_PI_2;
    let [theta1, theta2, dtheta1, dtheta2] = s;
    let (cos2, sin2) = (theta2.cos(), theta2.sin());
    let d1 = m1 * lc1 * lc1 + m2 * (l1 * l1 + lc2 * lc2 + 2.0 * l1 * lc2 * &cos2) + i1 + i2;
    let d2 = m2 * (lc2 * lc2 + l1 * lc2 * &cos2) + i2;
    let phi2 = m2 * lc2 * g * (theta1 + theta2 - half_pi).cos();
    let phi1 = -m2 * l1 * lc2 * dtheta2.sq() * &sin2
        - 2.0 * m2 * l1 * lc2 * dtheta2 * dtheta1 * &sin2
        + (m1 * lc1 + m2 * l1) * g * (theta1 - half_pi).cos()
        + &phi2;
    let ddtheta2 = (a + &d2 / &d1 * &phi1 - m2 * l1 * lc2 * dtheta1.sq() * &sin2 - &phi2)
        / (m2 * lc2 * lc2 + i2 - d2.sq() / &d1);
    let ddtheta1 = -(&d2 * &ddtheta2 + &phi1) / &d1;
    [dtheta1.clone(), dtheta2.clone(), ddtheta1, ddtheta2]
}

/// `y + h · k`, per state variable.
fn axpy(y: &[X; 4], h: f32, k: &[X; 4]) -> [X; 4] {
    std::array::from_fn(|i| &y[i] + h * &k[i])
}

/// One RK4 step of `dt` (Gym's `rk4` over `[0, dt]`), the torque held constant.
fn rk4(y: &[X; 4], a: &X, dt: f32) -> [X; 4] {
    let k1 = dsdt(y, a);
    let k2 = dsdt(&axpy(y, dt / 2.0, &k1), a);
    let k3 = dsdt(&axpy(y, dt / 2.0, &k2), a);
    let k4 = dsdt(&axpy(y, dt, &k3), a);
    std::array::from_fn(|i| &y[i] + dt / 6.0 * (&k1[i] + 2.0 * &k2[i] + 2.0 * &k3[i] + &k4[i]))
}

/// One step: RK4, angles wrapped into `[−π, π)`, velocities clipped; terminal when the tip
/// is more than one link length above the pivot, `−cos θ₁ − cos(θ₁ + θ₂) > 1`; reward −1 per
/// step that does not end there, 0 for the one that does.
pub fn step(state: &Value, a: &Value) -> Result<Transition> {
    let s = components(state, STATE_DIM)?;
    let y: [X; 4] = std::array::from_fn(|i| s[i].clone());
    let [t1, t2, d1, d2] = rk4(&y, &action(a)?, DT);
    let pi = std::f32::consts::PI;
    let (t1, t2) = (t1.wrap(-pi, pi), t2.wrap(-pi, pi));
    let (d1, d2) = (
        d1.clip(-MAX_VEL_1, MAX_VEL_1),
        d2.clip(-MAX_VEL_2, MAX_VEL_2),
    );
    let done = (-t1.cos() - (&t2 + &t1).cos()).gt(1.0);
    let reward = done.select_lit(0.0, &t1.fill(-1.0));
    Ok(Transition {
        done: done.get()?,
        reward: reward.get()?,
        state: stack(vec![t1, t2, d1, d2])?,
    })
}

/// Observation (Gym's): `cos θ₁, sin θ₁, cos θ₂, sin θ₂, θ̇₁, θ̇₂`.
pub fn observe(state: &Value) -> Result<Value> {
    observe_angles(state, STATE_DIM, &[0, 1])
}

/// Reset (Gym's): every state variable uniform in `[−0.1, 0.1)`.
pub fn reset(key: Key, episodes: usize) -> std::result::Result<Vec<f32>, PrngError> {
    uniform(key, &[episodes, STATE_DIM], -0.1, 0.1)
}
