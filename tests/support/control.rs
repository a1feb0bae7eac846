//! Host references of the control environments in f64, written from Gym's and
//! dm_control's Python sources (`CartPole-v1`, `Pendulum-v1`, `Acrobot-v1` "book",
//! `MountainCarContinuous-v0`, dm_control's `cartpole swingup` reward) with the deviations
//! `shardes_hlo::problems::control` documents (continuous actions in `[-1, 1]`, the
//! swing-up on Gym's cart-pole). Shares nothing with the emitted code but the environment
//! names.

use std::f64::consts::PI;

/// One step's outcome.
#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    /// The state after the step.
    pub state: Vec<f64>,
    /// The step's reward.
    pub reward: f64,
    /// Whether the state after the step is terminal.
    pub done: bool,
}

fn clip(x: f64, lo: f64, hi: f64) -> f64 {
    x.max(lo).min(hi)
}

fn cartpole_dynamics(s: &[f64], a: f64) -> Vec<f64> {
    let (gravity, masscart, masspole) = (9.8, 1.0, 0.1);
    let total_mass = masspole + masscart;
    let length = 0.5;
    let polemass_length = masspole * length;
    let force_mag = 10.0;
    let tau = 0.02;
    let (x, x_dot, theta, theta_dot) = (s[0], s[1], s[2], s[3]);
    let force = force_mag * clip(a, -1.0, 1.0);
    let (costheta, sintheta) = (theta.cos(), theta.sin());
    let temp = (force + polemass_length * theta_dot * theta_dot * sintheta) / total_mass;
    let thetaacc = (gravity * sintheta - costheta * temp)
        / (length * (4.0 / 3.0 - masspole * costheta * costheta / total_mass));
    let xacc = temp - polemass_length * thetaacc * costheta / total_mass;
    vec![
        x + tau * x_dot,
        x_dot + tau * xacc,
        theta + tau * theta_dot,
        theta_dot + tau * thetaacc,
    ]
}

/// Gym `CartPole-v1` with force `10 a`.
pub fn cartpole_balance(s: &[f64], a: f64) -> Step {
    let n = cartpole_dynamics(s, a);
    let theta_threshold = 12.0 * 2.0 * PI / 360.0;
    let done = n[0] < -2.4 || n[0] > 2.4 || n[2] < -theta_threshold || n[2] > theta_threshold;
    Step {
        state: n,
        reward: 1.0,
        done,
    }
}

/// dm_control `rewards.tolerance(x, bounds=(0, 0), margin, sigmoid="gaussian")`.
fn tolerance_gaussian(x: f64, margin: f64) -> f64 {
    let value_at_margin: f64 = 0.1;
    let scale = (-2.0 * value_at_margin.ln()).sqrt();
    let d = x.abs() / margin;
    (-0.5 * (d * scale).powi(2)).exp()
}

/// dm_control `rewards.tolerance(u, margin=1, value_at_margin=0, sigmoid="quadratic")`.
fn tolerance_quadratic(u: f64) -> f64 {
    if u.abs() < 1.0 {
        1.0 - u * u
    } else {
        0.0
    }
}

/// The swing-up variant: Gym's cart-pole, dm_control's reward, terminal off the track.
pub fn cartpole_swingup(s: &[f64], a: f64) -> Step {
    let n = cartpole_dynamics(s, a);
    let u = clip(a, -1.0, 1.0);
    let upright = (n[2].cos() + 1.0) / 2.0;
    let centered = (1.0 + tolerance_gaussian(n[0], 2.0)) / 2.0;
    let small_control = (4.0 + tolerance_quadratic(u)) / 5.0;
    let small_velocity = (1.0 + tolerance_gaussian(n[3], 5.0)) / 2.0;
    Step {
        reward: upright * small_control * small_velocity * centered,
        done: n[0] < -2.4 || n[0] > 2.4,
        state: n,
    }
}

/// Python's `%` for floats (result has the divisor's sign).
fn py_mod(x: f64, m: f64) -> f64 {
    let r = x % m;
    if r != 0.0 && (r < 0.0) != (m < 0.0) {
        r + m
    } else {
        r
    }
}

/// Gym `Pendulum-v1` with torque `2 a`.
pub fn pendulum(s: &[f64], a: f64) -> Step {
    let (g, m, l, dt) = (10.0, 1.0, 1.0, 0.05);
    let (th, thdot) = (s[0], s[1]);
    let u = clip(2.0 * a, -2.0, 2.0);
    let angle_normalize = py_mod(th + PI, 2.0 * PI) - PI;
    let costs = angle_normalize.powi(2) + 0.1 * thdot.powi(2) + 0.001 * u.powi(2);
    let newthdot = thdot + (3.0 * g / (2.0 * l) * th.sin() + 3.0 / (m * l * l) * u) * dt;
    let newthdot = clip(newthdot, -8.0, 8.0);
    let newth = th + newthdot * dt;
    Step {
        state: vec![newth, newthdot],
        reward: -costs,
        done: false,
    }
}

fn acrobot_dsdt(s: &[f64; 5]) -> [f64; 5] {
    let (m1, m2, l1, lc1, lc2, i1, i2, g) = (1.0, 1.0, 1.0, 0.5, 0.5, 1.0, 1.0, 9.8);
    let a = s[4];
    let (theta1, theta2, dtheta1, dtheta2) = (s[0], s[1], s[2], s[3]);
    let d1 = m1 * lc1 * lc1 + m2 * (l1 * l1 + lc2 * lc2 + 2.0 * l1 * lc2 * theta2.cos()) + i1 + i2;
    let d2 = m2 * (lc2 * lc2 + l1 * lc2 * theta2.cos()) + i2;
    let phi2 = m2 * lc2 * g * (theta1 + theta2 - PI / 2.0).cos();
    let phi1 = -m2 * l1 * lc2 * dtheta2 * dtheta2 * theta2.sin()
        - 2.0 * m2 * l1 * lc2 * dtheta2 * dtheta1 * theta2.sin()
        + (m1 * lc1 + m2 * l1) * g * (theta1 - PI / 2.0).cos()
        + phi2;
    // "book" (Gym's default).
    let ddtheta2 = (a + d2 / d1 * phi1 - m2 * l1 * lc2 * dtheta1 * dtheta1 * theta2.sin() - phi2)
        / (m2 * lc2 * lc2 + i2 - d2 * d2 / d1);
    let ddtheta1 = -(d2 * ddtheta2 + phi1) / d1;
    [dtheta1, dtheta2, ddtheta1, ddtheta2, 0.0]
}

/// Gym's `wrap(x, m, M)`.
fn wrap(mut x: f64, m: f64, big_m: f64) -> f64 {
    let diff = big_m - m;
    while x > big_m {
        x -= diff;
    }
    while x < m {
        x += diff;
    }
    x
}

/// Gym `Acrobot-v1` ("book") with a continuous torque `a` in `[-1, 1]`.
pub fn acrobot(s: &[f64], a: f64) -> Step {
    let dt = 0.2;
    let y0 = [s[0], s[1], s[2], s[3], clip(a, -1.0, 1.0)];
    let add = |y: &[f64; 5], h: f64, k: &[f64; 5]| -> [f64; 5] {
        std::array::from_fn(|i| y[i] + h * k[i])
    };
    let dt2 = dt / 2.0;
    let k1 = acrobot_dsdt(&y0);
    let k2 = acrobot_dsdt(&add(&y0, dt2, &k1));
    let k3 = acrobot_dsdt(&add(&y0, dt2, &k2));
    let k4 = acrobot_dsdt(&add(&y0, dt, &k3));
    let y: Vec<f64> = (0..4)
        .map(|i| y0[i] + dt / 6.0 * (k1[i] + 2.0 * k2[i] + 2.0 * k3[i] + k4[i]))
        .collect();
    let ns = vec![
        wrap(y[0], -PI, PI),
        wrap(y[1], -PI, PI),
        clip(y[2], -4.0 * PI, 4.0 * PI),
        clip(y[3], -9.0 * PI, 9.0 * PI),
    ];
    let done = -ns[0].cos() - (ns[1] + ns[0]).cos() > 1.0;
    Step {
        state: ns,
        reward: if done { 0.0 } else { -1.0 },
        done,
    }
}

/// Gym `MountainCarContinuous-v0`.
pub fn mountain_car(s: &[f64], a: f64) -> Step {
    let (min_position, max_position, max_speed) = (-1.2, 0.6, 0.07);
    let (goal_position, goal_velocity, power) = (0.45, 0.0, 0.0015);
    let (mut position, mut velocity) = (s[0], s[1]);
    let force = clip(a, -1.0, 1.0);
    velocity += force * power - 0.0025 * (3.0 * position).cos();
    velocity = clip(velocity, -max_speed, max_speed);
    position += velocity;
    position = clip(position, min_position, max_position);
    if position == min_position && velocity < 0.0 {
        velocity = 0.0;
    }
    let done = position >= goal_position && velocity >= goal_velocity;
    let mut reward = if done { 100.0 } else { 0.0 };
    reward -= force * force * 0.1;
    Step {
        state: vec![position, velocity],
        reward,
        done,
    }
}

/// The reference step of the environment called `name`.
pub fn step(name: &str, s: &[f64], a: f64) -> Step {
    match name {
        "cartpole_balance" => cartpole_balance(s, a),
        "cartpole_swingup" => cartpole_swingup(s, a),
        "pendulum" => pendulum(s, a),
        "acrobot" => acrobot(s, a),
        "mountain_car" => mountain_car(s, a),
        other => panic!("no reference for {other}"),
    }
}

/// The observation of `s` in environment `name`.
pub fn observe(name: &str, s: &[f64]) -> Vec<f64> {
    match name {
        "cartpole_balance" | "mountain_car" => s.to_vec(),
        "cartpole_swingup" => vec![s[0], s[1], s[2].cos(), s[2].sin(), s[3]],
        "pendulum" => vec![s[0].cos(), s[0].sin(), s[1]],
        "acrobot" => vec![s[0].cos(), s[0].sin(), s[1].cos(), s[1].sin(), s[2], s[3]],
        other => panic!("no reference for {other}"),
    }
}

/// The masked return of `steps` steps from `s0` under `policy`: rewards up to and
/// including the first terminating step.
pub fn masked_return(
    name: &str,
    s0: &[f64],
    steps: usize,
    policy: &dyn Fn(&[f64]) -> f64,
) -> (f64, Option<usize>) {
    let mut s = s0.to_vec();
    let mut ret = 0.0;
    for t in 0..steps {
        let a = policy(&observe(name, &s));
        let out = step(name, &s, a);
        ret += out.reward;
        if out.done {
            return (ret, Some(t));
        }
        s = out.state;
    }
    (ret, None)
}
