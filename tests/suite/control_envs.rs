//! Every in-program environment (`shardes::hlo::problems::control::Env`) against the f64
//! host reference in `tests/support/control.rs`, run through XLA on the CPU plugin.
//!
//! Tolerances (`|got − want| ≤ ABS + REL·|want|`, angles compared modulo 2π):
//! - one step from 512 random states (wider than the reset distributions, actions in
//!   `[−1.5, 1.5]` so clipping is exercised): states and rewards within `1e-5 + 1e-5·|want|`
//!   (a handful of f32 roundings, and f32 `sin`/`cos` of angles up to 4π), the acrobot
//!   within `2e-4 + 2e-4·|want|` ([`one_step_tolerance`]); `done` equal wherever the
//!   reference's next state is more than `1e-4` from the terminal boundary;
//! - 200 steps from the library's reset states under a fixed action sequence, the f32
//!   trajectory fed back into itself and the reference run in f64 throughout, so errors
//!   compound: see [`LONG`] for the per-environment tolerance and why;
//! - the acrobot from high-energy states, where it is chaotic, over 8 steps within
//!   `1e-2·(1 + |want|)` (see the test for the measured divergence).

use crate::support::control as reference;
use shardes::hlo::builder::{DType, Module, TensorType, Value};
use shardes::hlo::prng::{fold_in, key, uniform};
use shardes::hlo::problems::control::{Env, ENVS};
use shardes::runtime::{Client, CompileOptions};

/// `(abs, rel)` of the one-step comparison: f32 rounding (measured worst ~1e-7 relative)
/// everywhere but the acrobot, whose RK4 step at velocities up to 9π rad/s amplifies the
/// f32 error of the derivative (measured worst 2.1e-5 relative).
fn one_step_tolerance(env: Env) -> (f64, f64) {
    match env {
        Env::Acrobot => (2e-4, 2e-4),
        _ => (1e-5, 1e-5),
    }
}

/// `(name, steps, abs, rel)` of the 200-step comparison. The measured worst error over the
/// 4 episodes is in each comment; every bound leaves a margin of 10× or more.
const LONG: [(&str, usize, f64, f64); 5] = [
    // Falls, then swings like a driven pendulum: not chaotic at this horizon. Worst
    // 3.4e-4 on θ̇ ≈ −4.3 (step 199).
    ("cartpole_balance", 200, 1e-3, 1e-3),
    // The same dynamics started hanging down, swinging gently. Worst 2.2e-5.
    ("cartpole_swingup", 200, 3e-4, 3e-4),
    // One episode passes near the upright equilibrium, where perturbations grow like
    // e^{√(3g/2l)·t} = e^{3.9 t}: worst 1.2e-3 on θ̇ ≈ 6.6 (step 180); the others stay
    // below 1e-5.
    ("pendulum", 200, 1e-2, 1e-2),
    // A double pendulum is chaotic, but a torque of at most 1 N·m keeps it swinging
    // near the bottom under this sequence, where f32 and f64 stay together: worst 3.3e-6.
    ("acrobot", 200, 1e-4, 1e-4),
    // Damped by the velocity clip: f32 rounding of x only. Worst 2.6e-7.
    ("mountain_car", 200, 1e-5, 1e-4),
];

/// State components that are angles (compared modulo 2π).
fn angles(env: Env) -> &'static [usize] {
    match env {
        Env::Acrobot => &[0, 1],
        _ => &[],
    }
}

/// How far the reference's state is from the terminal boundary (∞ where it never ends).
fn margin(env: Env, s: &[f64]) -> f64 {
    let theta_threshold = 12.0 * 2.0 * std::f64::consts::PI / 360.0;
    match env {
        Env::CartpoleBalance => (2.4 - s[0].abs())
            .abs()
            .min((theta_threshold - s[2].abs()).abs()),
        Env::CartpoleSwingup => (2.4 - s[0].abs()).abs(),
        Env::Pendulum => f64::INFINITY,
        Env::Acrobot => (-s[0].cos() - (s[1] + s[0]).cos() - 1.0).abs(),
        Env::MountainCar => (s[0] - 0.45).abs().min(s[1].abs()),
    }
}

/// `f32[T, B, S]` states, `f32[T, B]` rewards and dones (1.0 terminal) of `T` steps from
/// `state [B, S]` under `actions [T, B]`, all inside one `while` loop.
fn rollout_module(env: Env, b: i64, t: i64) -> Module {
    let s = env.state_dim() as i64;
    let mut m = Module::new("rollout");
    let f = m.func("main");
    let build = || -> shardes::hlo::builder::Result<Vec<Value>> {
        let state = f.arg("state", TensorType::f32(&[b, s]))?;
        let actions = f.arg("actions", TensorType::f32(&[t, b]))?;
        let states = f.full(0.0f32, &[t, b, s])?;
        let rewards = f.full(0.0f32, &[t, b])?;
        let dones = f.full(0.0f32, &[t, b])?;
        let out = f.fori_loop(
            0,
            t as i32,
            &[&state, &states, &rewards, &dones],
            |i, c| -> shardes::hlo::builder::Result<Vec<Value>> {
                let zero = f.scalar(0i32)?;
                let a = actions
                    .dynamic_slice(&[i, &zero], &[1, b])?
                    .reshape(&[b, 1])?;
                let step = env.step(&c[0], &a)?;
                let done = step.done.convert(DType::F32)?;
                let st = step.state.reshape(&[1, b, s])?;
                Ok(vec![
                    step.state.clone(),
                    c[1].dynamic_update_slice(&st, &[i, &zero, &zero])?,
                    c[2].dynamic_update_slice(&step.reward.reshape(&[1, b])?, &[i, &zero])?,
                    c[3].dynamic_update_slice(&done.reshape(&[1, b])?, &[i, &zero])?,
                ])
            },
        )?;
        Ok(out[1..].to_vec())
    };
    for o in build().expect("build") {
        f.output(&o).expect("output");
    }
    m.add(f.finish().expect("finish")).expect("add");
    m
}

struct Rollout {
    states: Vec<f32>,
    rewards: Vec<f32>,
    dones: Vec<f32>,
}

fn run(client: &Client, env: Env, state: &[f32], actions: &[f32], b: usize, t: usize) -> Rollout {
    let m = rollout_module(env, b as i64, t as i64);
    let exe = client
        .compile(&m.to_mlir(), &CompileOptions::new(1))
        .expect("compile");
    let s = env.state_dim();
    let sb = client.buffer_from_host(state, &[b, s], 0).unwrap();
    let ab = client.buffer_from_host(actions, &[t, b], 0).unwrap();
    let mut outs = exe.execute(&[vec![&sb, &ab]]).expect("execute");
    let o = outs.remove(0);
    let get = |i: usize| o[i].to_host::<f32>().unwrap();
    Rollout {
        states: get(0),
        rewards: get(1),
        dones: get(2),
    }
}

fn close(got: f64, want: f64, abs: f64, rel: f64) -> bool {
    (got - want).abs() <= abs + rel * want.abs()
}

/// A state as f64, for the reference.
fn widen(x: &[f32]) -> Vec<f64> {
    x.iter().map(|&x| f64::from(x)).collect()
}

/// How far state variable `j` of `env` is from the reference: around the circle for an
/// angle, plainly otherwise.
fn var_diff(env: Env, j: usize, g: f64, w: f64) -> f64 {
    if angles(env).contains(&j) {
        angle_diff(g, w)
    } else {
        (g - w).abs()
    }
}

fn angle_diff(a: f64, b: f64) -> f64 {
    let tau = std::f64::consts::TAU;
    let d = (a - b).rem_euclid(tau);
    d.min(tau - d)
}

/// Random states per environment, wider than its reset distribution.
fn random_states(env: Env, n: usize) -> Vec<f32> {
    let pi = std::f32::consts::PI;
    let ranges: &[(f32, f32)] = match env {
        Env::CartpoleBalance => &[(-2.4, 2.4), (-3.0, 3.0), (-0.25, 0.25), (-3.0, 3.0)],
        Env::CartpoleSwingup => &[
            (-2.4, 2.4),
            (-3.0, 3.0),
            (-2.0 * pi, 2.0 * pi),
            (-10.0, 10.0),
        ],
        Env::Pendulum => &[(-4.0 * pi, 4.0 * pi), (-8.0, 8.0)],
        Env::Acrobot => &[
            (-pi, pi),
            (-pi, pi),
            (-4.0 * pi, 4.0 * pi),
            (-9.0 * pi, 9.0 * pi),
        ],
        Env::MountainCar => &[(-1.2, 0.6), (-0.07, 0.07)],
    };
    let k = key(7).unwrap();
    let cols: Vec<Vec<f32>> = ranges
        .iter()
        .enumerate()
        .map(|(j, &(lo, hi))| uniform(fold_in(k, j as u32), &[n], lo, hi).unwrap())
        .collect();
    (0..n)
        .flat_map(|i| cols.iter().map(move |c| c[i]))
        .collect()
}

#[test]
fn one_step_from_random_states_matches_the_f64_reference() {
    let client = Client::cpu(1).unwrap();
    let n = 512;
    for env in ENVS {
        let s = env.state_dim();
        let states = random_states(env, n);
        let actions = uniform(key(8).unwrap(), &[n], -1.5, 1.5).unwrap();
        let got = run(&client, env, &states, &actions, n, 1);
        let (abs, rel) = one_step_tolerance(env);
        let (mut worst_s, mut worst_r, mut compared) = (0.0f64, 0.0f64, 0);
        for i in 0..n {
            let s0 = widen(&states[i * s..(i + 1) * s]);
            let want = reference::step(env.name(), &s0, f64::from(actions[i]));
            for j in 0..s {
                let g = f64::from(got.states[i * s + j]);
                let w = want.state[j];
                let d = var_diff(env, j, g, w);
                worst_s = worst_s.max(d / (1.0 + w.abs()));
                assert!(
                    d <= abs + rel * w.abs(),
                    "{env} state {i} var {j}: got {g}, want {w} (from {s0:?}, a {})",
                    actions[i]
                );
            }
            let (g, w) = (f64::from(got.rewards[i]), want.reward);
            worst_r = worst_r.max((g - w).abs() / (1.0 + w.abs()));
            assert!(
                close(g, w, abs, rel),
                "{env} reward {i}: got {g}, want {w} (from {s0:?})"
            );
            if margin(env, &want.state) > 1e-4 {
                compared += 1;
                assert_eq!(
                    got.dones[i] == 1.0,
                    want.done,
                    "{env} done {i} (next {:?})",
                    want.state
                );
            }
        }
        println!("{env}: one step, worst state err {worst_s:.2e}, reward err {worst_r:.2e}, {compared} dones compared");
        assert!(
            compared > n * 9 / 10,
            "{env}: only {compared} dones compared"
        );
    }
}

/// A fixed, varied action sequence: `1.2 sin(0.07 t + 0.5 b) `, clipped by the env.
fn action_sequence(t: usize, b: usize) -> Vec<f32> {
    (0..t)
        .flat_map(|i| (0..b).map(move |j| (1.2 * (0.07 * i as f64 + 0.5 * j as f64).sin()) as f32))
        .collect()
}

#[test]
fn two_hundred_steps_under_fixed_actions_match_the_f64_reference() {
    let client = Client::cpu(1).unwrap();
    let (b, t) = (4, 200);
    for (name, steps, abs, rel) in LONG {
        let env: Env = name.parse().unwrap();
        let s = env.state_dim();
        let reset = env.reset(key(3).unwrap(), b).unwrap();
        let actions = action_sequence(t, b);
        let got = run(&client, env, &reset, &actions, b, t);
        let mut worst = 0.0f64;
        let mut ret_got = 0.0f64;
        let mut ret_want = 0.0f64;
        for e in 0..b {
            let mut st = widen(&reset[e * s..(e + 1) * s]);
            for k in 0..steps {
                let out = reference::step(name, &st, f64::from(actions[k * b + e]));
                for j in 0..s {
                    let g = f64::from(got.states[(k * b + e) * s + j]);
                    let w = out.state[j];
                    let d = var_diff(env, j, g, w);
                    worst = worst.max(d / (abs + rel * w.abs()));
                    assert!(
                        d <= abs + rel * w.abs(),
                        "{name} episode {e} step {k} var {j}: got {g}, want {w}"
                    );
                }
                ret_got += f64::from(got.rewards[k * b + e]);
                ret_want += out.reward;
                st = out.state;
            }
        }
        println!(
            "{name}: {steps} steps, worst error {worst:.3} of the tolerance; unmasked reward sum {ret_got:.4} vs {ret_want:.4}"
        );
        assert!(
            close(ret_got, ret_want, abs * steps as f64, rel),
            "{name}: rewards"
        );
    }
}

/// The acrobot is chaotic at high energy: from states with velocities up to 9π rad/s the
/// f32 and f64 trajectories separate by about 2.5× per step (measured worst error relative
/// to `1 + |want|` over 8 states: 7e-7 at step 0, 3.5e-5 at 5, 8.2e-4 at 8, 4e-2 at 12,
/// O(1) from 15 on). So this compares the first [`CHAOS_STEPS`] steps within
/// `1e-2·(1 + |want|)`, which covers the measured 8.2e-4 twelve times over.
#[test]
fn acrobot_at_high_energy_agrees_until_chaos_separates_the_trajectories() {
    let client = Client::cpu(1).unwrap();
    let env = Env::Acrobot;
    let b = 8;
    let start = random_states(env, b);
    let actions = action_sequence(CHAOS_STEPS, b);
    let got = run(&client, env, &start, &actions, b, CHAOS_STEPS);
    let s = env.state_dim();
    for e in 0..b {
        let mut st = widen(&start[e * s..(e + 1) * s]);
        for k in 0..CHAOS_STEPS {
            let out = reference::step("acrobot", &st, f64::from(actions[k * b + e]));
            for j in 0..s {
                let g = f64::from(got.states[(k * b + e) * s + j]);
                let w = out.state[j];
                let d = var_diff(env, j, g, w);
                assert!(
                    d <= 1e-2 * (1.0 + w.abs()),
                    "acrobot episode {e} step {k} var {j}: got {g}, want {w}"
                );
            }
            st = out.state;
        }
    }
}

/// Steps of [`acrobot_at_high_energy_agrees_until_chaos_separates_the_trajectories`].
const CHAOS_STEPS: usize = 8;
