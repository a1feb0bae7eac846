//! `[problem] name = "control"` end to end: `examples/cartpole.toml` learns to balance with
//! both published strategies, a linear policy and per-episode fitness run, and every bad
//! input is refused with a hint.

use std::path::Path;

use crate::common::*;

/// The mean return a run must reach, of CartPole-v1's maximum of 500.
const TARGET: f64 = 450.0;

/// The mean return generation 0 must stay below (a random policy), so that reaching
/// [`TARGET`] is learning.
const START_BELOW: f64 = 100.0;

/// `examples/cartpole.toml` (8 devices, n = 64, 8 episodes × 500 steps, policy 4→16→1,
/// σ 0.1, lr 0.3, seed 0, 60 generations) with `strategy`, writing to `out`.
fn cartpole(dir: &Path, strategy: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let text = std::fs::read_to_string(repo().join("examples/cartpole.toml")).unwrap();
    for s in [
        "strategy = \"mirrored(lowrank(r=1))\"",
        "generations = 60",
        "out = \"runs/cartpole\"",
    ] {
        assert!(text.contains(s), "examples/cartpole.toml lacks {s}");
    }
    let out = dir.join("out");
    let text = text
        .replace(
            "strategy = \"mirrored(lowrank(r=1))\"",
            &format!("strategy = \"{strategy}\""),
        )
        .replace(
            "out = \"runs/cartpole\"",
            &format!("out = \"{}\"", out.display()),
        );
    (write(dir, "cartpole.toml", &text), out)
}

/// Runs the example with `strategy` and checks it learns: the mean return (the negated
/// mean fitness) starts below [`START_BELOW`] and reaches [`TARGET`] within the example's
/// 60 generations. Returns the learning curve.
fn learns(strategy: &str) -> Vec<f64> {
    let dir = tempfile::tempdir().unwrap();
    let (cfg, out) = cartpole(dir.path(), strategy);
    let o = shardes(&["run", cfg.to_str().unwrap()]);
    let (stdout, _) = exited(&o, 0);
    assert!(
        stdout.contains("control cartpole_balance (8 episodes × 500 steps"),
        "{stdout}"
    );
    let m = metrics(&out);
    assert_eq!(m.len(), 60);
    let curve: Vec<f64> = m.iter().map(|r| -r.fitness_mean).collect();
    // The progress line reports the return next to the fitness.
    let last = format!("return {:.2}", curve[59]);
    assert!(stdout.contains(&last), "no `{last}` in {stdout}");
    let shown: Vec<String> = curve.iter().map(|r| format!("{r:.0}")).collect();
    println!(
        "{strategy}: mean return per generation: {}",
        shown.join(" ")
    );
    assert!(
        curve[0] < START_BELOW,
        "{strategy}: generation 0 already at {}",
        curve[0]
    );
    let reached = curve.iter().position(|&r| r >= TARGET);
    assert!(
        reached.is_some(),
        "{strategy}: mean return never reached {TARGET} in 60 generations: {curve:?}"
    );
    println!("{strategy}: reached {TARGET} at generation {:?}", reached);
    curve
}

/// Low-rank mirrored ES learns cart-pole balance from the CLI: mean return from below
/// [`START_BELOW`] to at least [`TARGET`] (of 500) within 60 generations. Measured (seed 0,
/// ~3 s for the whole run): 34 at generation 0, first ≥ 450 at generation 23 (468), 500
/// from generation 30 on.
#[test]
fn cartpole_learns_with_mirrored_lowrank() {
    learns("mirrored(lowrank(r=1))");
}

/// The same with full-rank seed-regenerated noise. Measured (seed 0, ~3.5 s): 35 at
/// generation 0, first ≥ 450 at generation 14 (453), 500 from generation 21 on.
#[test]
fn cartpole_learns_with_mirrored_seed_regenerated() {
    learns("mirrored(seed_regenerated)");
}

/// A small control config on 2 devices writing to `out`.
fn small(out: &Path, problem: &str, shaping: &str) -> String {
    format!(
        r#"devices = 2
[problem]
name = "control"
{problem}
[es]
strategy = "mirrored(lowrank(r=1))"
n = 16
sigma = 0.1
lr = 0.1
shaping = "{shaping}"
[run]
seed = 1
generations = 2
out = "{}"
checkpoint_every = 0
"#,
        out.display()
    )
}

/// A linear policy (`hidden = []`) with per-episode fitness for `group_relative`, and the
/// other environments, each run for two generations; `check` finds nothing to report.
#[test]
fn linear_policies_per_episode_fitness_and_every_environment_run() {
    let dir = tempfile::tempdir().unwrap();
    for (i, env) in [
        "cartpole_balance",
        "cartpole_swingup",
        "pendulum",
        "acrobot",
        "mountain_car",
    ]
    .iter()
    .enumerate()
    {
        let out = dir.path().join(format!("out{i}"));
        let shaping = if i % 2 == 0 {
            "group_relative"
        } else {
            "centered_ranks"
        };
        let problem = format!("env = \"{env}\"\nepisodes = 3\nepisode_length = 20\nhidden = []");
        let cfg = write(
            dir.path(),
            &format!("{env}.toml"),
            &small(&out, &problem, shaping),
        );
        let o = shardes(&["run", cfg.to_str().unwrap()]);
        let (stdout, stderr) = text(&o);
        assert_eq!(o.status.code(), Some(0), "{env}: {stdout}\n{stderr}");
        let per_episode = shaping == "group_relative";
        assert_eq!(
            stdout.contains("−return per episode"),
            per_episode,
            "{stdout}"
        );
        assert!(
            stdout.contains(&format!("tanh policy {}→1", obs(env))),
            "{stdout}"
        );
        assert_eq!(metrics(&out).len(), 2);
        let o = shardes(&["check", cfg.to_str().unwrap()]);
        let (stdout, stderr) = text(&o);
        assert_eq!(o.status.code(), Some(0), "{env}: {stdout}\n{stderr}");
    }
}

fn obs(env: &str) -> usize {
    match env {
        "cartpole_balance" => 4,
        "cartpole_swingup" => 5,
        "pendulum" => 3,
        "acrobot" => 6,
        _ => 2,
    }
}

#[test]
fn bad_control_settings_are_refused_with_a_hint() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let cfg = |problem: &str| {
        write(
            dir.path(),
            "c.toml",
            &small(&out, problem, "centered_ranks"),
        )
        .to_string_lossy()
        .into_owned()
    };
    let valid = "cartpole_balance, cartpole_swingup, pendulum, acrobot, mountain_car";
    let suggested = format!("did you mean \"cartpole_balance\"? valid: {valid}");
    let listed = format!("valid environments: {valid}");
    let pendulum = |line: &str| format!("env = \"pendulum\"\n{line}");
    for (sub, problem, what, hint) in [
        (
            "run",
            "env = \"cartpol_balance\"".to_string(),
            "problem.env: unknown environment \"cartpol_balance\"",
            suggested.as_str(),
        ),
        (
            "check",
            "env = \"walker\"".to_string(),
            "unknown environment \"walker\"",
            &listed,
        ),
        (
            "run",
            "episodes = 2".to_string(),
            "problem \"control\" needs problem.env",
            valid,
        ),
        (
            "run",
            pendulum("episodes = 0"),
            "problem.episodes = 0",
            "at least 1",
        ),
        (
            "run",
            pendulum("episode_length = 0"),
            "problem.episode_length = 0",
            "at least 1",
        ),
        (
            "run",
            pendulum("hidden = [8, 0]"),
            "problem.hidden = 0",
            "hidden = [] is a linear policy",
        ),
        (
            "run",
            pendulum("seq = 4"),
            "problem.seq does not apply to problem \"control\"",
            "control reads: env, episodes, episode_length, hidden",
        ),
        (
            "run",
            pendulum("episodes = -1"),
            "(`episodes = -1`)",
            "type of each key",
        ),
    ] {
        refused(&[sub, &cfg(&problem)], what, hint);
    }
}
