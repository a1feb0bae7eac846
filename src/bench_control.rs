//! The control benchmark (`shardes bench` on a control config): environment steps per
//! second, each next to a plain-Rust reference loop of the same environment.
//!
//! - **In-program environment**: the generation program rolls out all `n × E` episodes for
//!   all `T` steps (a terminated episode is masked, not skipped), so a generation is `n · E
//!   · T` environment steps; timed over whole generations (ask, rollouts, tell). The
//!   reference ([`reference_cartpole`]) steps the same number of cart-pole episodes with
//!   the same f32 equations and a policy evaluated in plain Rust ([`HostMlp`]), on one
//!   thread, every episode every step (as the program does).
//! - **MuJoCo model**: [`HostTrainer`] generations, split into the host simulations
//!   (observe + `mj_step`, on host threads), the device policy evaluations (upload of the
//!   observations, one dispatch, download of the actions) and `tell`; environment steps
//!   are the episode steps actually simulated (an ended episode is not stepped). The
//!   reference ([`reference_mjcf`]) runs the same episodes with the policy in plain Rust
//!   on the same host threads, no device.

use crate::population::Place;
use std::time::Instant;

use serde::Serialize;
use shardes_hlo::es::ShardedES;
use shardes_hlo::params::{Array, ParamTree};
use shardes_hlo::prng::Key;
use shardes_hlo::problems::control::cartpole::{
    FORCE_MAG, GRAVITY, HALF_LENGTH, MASS_POLE, POLEMASS_LENGTH, TAU, THETA_THRESHOLD, TOTAL_MASS,
    X_THRESHOLD,
};
use shardes_hlo::problems::control::Control;
use shardes_runtime::Client;

use crate::bench::Stats;
use crate::host_control::{HostControl, HostMlp, HostTrainer, Rollouts};
use crate::{Error, Trainer};

/// One reference loop's measurement.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Reference {
    /// What it runs.
    pub what: String,
    /// Environment steps per second.
    pub env_steps_per_s: f64,
    /// Seconds in the simulation (the rest is the policy).
    pub sim_secs: f64,
    /// Seconds in the policy.
    pub policy_secs: f64,
}

/// What both control benchmarks measure: the population and episodes a generation runs,
/// its time and the environment steps per second. Flattened into each report, so the
/// JSON keeps these fields at its top level.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ControlRun {
    /// Members.
    pub n: usize,
    /// Episodes per member.
    pub episodes: usize,
    /// Steps per episode (at most, where an episode can end early).
    pub steps: usize,
    /// Devices.
    pub devices: usize,
    /// Generation time, ms.
    pub generation_ms: Stats,
    /// Environment steps per second: in the program `n · E · T` over the median generation
    /// time; on MuJoCo the episode steps simulated over the generations' total time.
    pub env_steps_per_s: f64,
}

/// The benchmark of an in-program environment.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct InProgramReport {
    /// The environment.
    pub env: String,
    /// The population, the generation time and the steps per second.
    #[serde(flatten)]
    pub run: ControlRun,
    /// The plain-Rust loop (cart-pole balance only).
    pub reference: Option<Reference>,
}

/// The benchmark of a MuJoCo model.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MjcfReport {
    /// The model file.
    pub model: String,
    /// The population, the generation time and the steps per second.
    #[serde(flatten)]
    pub run: ControlRun,
    /// Of the generations' time: host simulations, device policy evaluations, tell.
    pub sim_secs: f64,
    /// Device policy evaluations, s.
    pub policy_secs: f64,
    /// `tell`, s.
    pub tell_secs: f64,
    /// Control steps run (each one policy dispatch).
    pub dispatches: usize,
    /// The same episodes with the policy in plain Rust.
    pub reference: Reference,
}

/// Times `rounds` generations (after `warmup`) of `control` in the generation program.
#[allow(clippy::too_many_arguments)]
pub fn in_program(
    client: &Client,
    es: &ShardedES,
    control: &Control,
    params: &ParamTree,
    key: Key,
    reset: &Array,
    warmup: usize,
    rounds: usize,
) -> Result<InProgramReport, Error> {
    let batch = std::slice::from_ref(reset);
    let mut t = Trainer::with_state(client, es, control, params, key, batch, 0)?;
    for _ in 0..warmup {
        t.step()?;
    }
    let mut ms = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let t0 = Instant::now();
        t.step()?;
        ms.push(t0.elapsed().as_secs_f64() * 1e3);
    }
    let generation_ms = Stats::of(&ms);
    let steps = es.n() * control.episodes() * control.episode_length();
    let reference = (control.env().name() == "cartpole_balance")
        .then(|| {
            let episodes = es.n() * control.episodes();
            reference_cartpole(
                params,
                &control.widths(),
                reset,
                episodes,
                control.episode_length(),
            )
        })
        .transpose()?;
    Ok(InProgramReport {
        env: control.env().name().into(),
        run: ControlRun {
            n: es.n(),
            episodes: control.episodes(),
            steps: control.episode_length(),
            devices: es.devices(),
            env_steps_per_s: steps as f64 / (generation_ms.median / 1e3).max(1e-12),
            generation_ms,
        },
        reference,
    })
}

/// The plain-Rust cart-pole balance loop: `episodes` episodes (episode `i` from row `i mod
/// E` of `reset`) for `steps` steps each, every episode every step, the policy in plain
/// Rust, one thread. The same f32 equations as the program (`control::cartpole`).
pub fn reference_cartpole(
    params: &ParamTree,
    widths: &[usize],
    reset: &Array,
    episodes: usize,
    steps: usize,
) -> Result<Reference, Error> {
    let mlp = HostMlp::new(params, widths)?;
    let rows = reset.shape()[0].max(1);
    let mut s: Vec<f32> = (0..episodes)
        .flat_map(|i| reset.data()[(i % rows) * 4..][..4].to_vec())
        .collect();
    let mut alive = vec![true; episodes];
    let mut ret = vec![0f32; episodes];
    let (mut sim, mut pol) = (0.0, 0.0);
    for _ in 0..steps {
        let t0 = Instant::now();
        let a = mlp.act(&s);
        let t1 = Instant::now();
        for ((st, a), (al, r)) in s.chunks_mut(4).zip(&a).zip(alive.iter_mut().zip(&mut ret)) {
            let next = cartpole_step(st, *a);
            if *al {
                *r += 1.0;
                st.copy_from_slice(&next);
                *al = !(next[0].abs() > X_THRESHOLD || next[2].abs() > THETA_THRESHOLD);
            }
        }
        pol += (t1 - t0).as_secs_f64();
        sim += t1.elapsed().as_secs_f64();
    }
    // Keeps the loop from being optimized away.
    std::hint::black_box(&ret);
    Ok(Reference {
        what: "plain Rust, one thread: the same f32 cart-pole equations and policy".into(),
        env_steps_per_s: (episodes * steps) as f64 / (sim + pol).max(1e-12),
        sim_secs: sim,
        policy_secs: pol,
    })
}

/// One Euler step of the cart-pole in f32 (`control::cartpole`'s equations).
fn cartpole_step(s: &[f32], a: f32) -> [f32; 4] {
    let (x, x_dot, theta, theta_dot) = (s[0], s[1], s[2], s[3]);
    let force = a.clamp(-1.0, 1.0) * FORCE_MAG;
    let (sin, cos) = theta.sin_cos();
    let temp = (force + POLEMASS_LENGTH * theta_dot * theta_dot * sin) / TOTAL_MASS;
    let theta_acc = (GRAVITY * sin - cos * temp)
        / (HALF_LENGTH * (4.0 / 3.0 - MASS_POLE * cos * cos / TOTAL_MASS));
    let x_acc = temp - POLEMASS_LENGTH * theta_acc * cos / TOTAL_MASS;
    [
        x + TAU * x_dot,
        x_dot + TAU * x_acc,
        theta + TAU * theta_dot,
        theta_dot + TAU * theta_acc,
    ]
}

/// Times `rounds` generations (after `warmup`) of `control` on its MuJoCo model, and the
/// plain-Rust reference on the initial policy.
#[allow(clippy::too_many_arguments)]
pub fn mjcf(
    client: &Client,
    es: &ShardedES,
    control: &HostControl,
    params: &ParamTree,
    key: Key,
    warmup: usize,
    rounds: usize,
) -> Result<MjcfReport, Error> {
    let mut t = HostTrainer::placed(client, es, control, params, key, 0, Place::Alone)?;
    for _ in 0..warmup {
        t.step()?;
    }
    let mut ms = Vec::with_capacity(rounds);
    let (mut sim, mut pol, mut tell, mut steps, mut dispatches) = (0.0, 0.0, 0.0, 0u64, 0);
    for _ in 0..rounds {
        let t0 = Instant::now();
        t.step()?;
        ms.push(t0.elapsed().as_secs_f64() * 1e3);
        if let Some(s) = t.last_stats() {
            sim += s.rollouts.sim_secs;
            pol += s.rollouts.policy_secs;
            tell += s.tell_secs;
            steps += s.rollouts.env_steps;
            dispatches += s.rollouts.steps;
        }
    }
    let reference = reference_mjcf(
        control,
        &t.params()?,
        es.n() * control.spec().episodes(),
        key,
    )?;
    Ok(MjcfReport {
        model: control.env().path().display().to_string(),
        run: ControlRun {
            n: es.n(),
            episodes: control.spec().episodes(),
            steps: control.spec().episode_length(),
            devices: es.devices(),
            generation_ms: Stats::of(&ms),
            env_steps_per_s: steps as f64 / (sim + pol + tell).max(1e-12),
        },
        sim_secs: sim,
        policy_secs: pol,
        tell_secs: tell,
        dispatches,
        reference,
    })
}

/// The plain-Rust reference on a MuJoCo model: `episodes` episodes of `params`' policy
/// (evaluated in plain Rust, batched over the episodes) from the run's reset states, the
/// simulations on the same host threads as [`HostTrainer`]'s.
pub fn reference_mjcf(
    control: &HostControl,
    params: &ParamTree,
    episodes: usize,
    key: Key,
) -> Result<Reference, Error> {
    let mlp = HostMlp::new(params, &control.widths())?;
    let reset = control.reset_states(shardes_hlo::prng::fold_in(key, 1))?;
    let mut r = Rollouts::new(control.env(), episodes, &reset)?;
    let stats = r.run(
        control.spec().episode_length(),
        |obs| Ok(mlp.act(obs)),
        |_, _| Ok(()),
    )?;
    Ok(Reference {
        what: "plain Rust: the same episodes on the same host threads, the policy on the host"
            .into(),
        env_steps_per_s: stats.env_steps as f64 / (stats.sim_secs + stats.policy_secs).max(1e-12),
        sim_secs: stats.sim_secs,
        policy_secs: stats.policy_secs,
    })
}
