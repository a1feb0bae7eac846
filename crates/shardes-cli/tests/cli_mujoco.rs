//! `[problem] name = "control", mjcf = "…"` end to end: the shipped MuJoCo cart-pole
//! learns to balance from the CLI, `shardes rollout` replays it (returns per episode, the
//! qpos trajectory as CSV), `shardes bench` measures both control paths, and every bad
//! input is refused with a hint.
//!
//! The MuJoCo library is provisioned into the per-user cache on first use (as the PJRT
//! plugin); once it is there these tests need no network.

mod common;

use std::path::{Path, PathBuf};

use common::*;

/// The mean return the run must reach, of the episodes' maximum of 200.
const TARGET: f64 = 190.0;

/// A cart-pole config on the shipped MuJoCo model: 8 devices, n = 32, 4 episodes of at
/// most 200 steps, policy 4→16→1 (the library's learning test's settings).
fn mujoco_cartpole(out: &Path, generations: usize, extra: &str) -> String {
    format!(
        r#"devices = 8
[problem]
name = "control"
mjcf = "{}"
episodes = 4
episode_length = 200
hidden = [16]
{extra}
[es]
strategy = "mirrored(lowrank(r=1))"
n = 32
sigma = 0.1
lr = 0.3
shaping = "centered_ranks"
[run]
seed = 0
generations = {generations}
out = "{}"
checkpoint_every = 0
"#,
        model("cartpole.xml").display(),
        out.display()
    )
}

fn model(name: &str) -> PathBuf {
    repo().join("examples/mujoco").join(name)
}

/// The run learns (mean return from under 60 to at least [`TARGET`] within 30
/// generations; measured: 34 at generation 0, 195 at generation 11), the progress line
/// shows the return and the host/device split, and `rollout` replays the final policy on
/// the training episodes with the returns of a balancing policy.
#[test]
fn mujoco_cartpole_learns_and_replays() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let cfg = write(dir.path(), "c.toml", &mujoco_cartpole(&out, 30, ""));
    let o = shardes(&["run", cfg.to_str().unwrap()]);
    let (stdout, _) = exited(&o, 0);
    assert!(
        stdout.contains("(MuJoCo, 4 episodes × ≤ 200 steps on host threads, tanh policy 4→16→1"),
        "{stdout}"
    );
    assert!(
        stdout.contains("env_steps_per_s") && stdout.contains("sim_share"),
        "{stdout}"
    );
    let curve: Vec<f64> = metrics(&out).iter().map(|m| -m.fitness_mean).collect();
    let shown: Vec<String> = curve.iter().map(|r| format!("{r:.0}")).collect();
    println!(
        "MuJoCo cart-pole: mean return per generation: {}",
        shown.join(" ")
    );
    assert!(curve[0] < 60.0, "{curve:?}");
    assert!(curve.iter().any(|&r| r >= TARGET), "{curve:?}");

    let csv = dir.path().join("qpos.csv");
    let o = shardes(&[
        "rollout",
        cfg.to_str().unwrap(),
        "--csv",
        csv.to_str().unwrap(),
    ]);
    let (stdout, _) = exited(&o, 0);
    let returns: Vec<f64> = stdout
        .lines()
        .filter_map(|l| {
            l.strip_prefix("episode ")?
                .split("return ")
                .nth(1)?
                .parse()
                .ok()
        })
        .collect();
    assert_eq!(returns.len(), 4, "{stdout}");
    // The final policy on the training episodes: its mean is the last generation's centre.
    assert!(
        returns
            .iter()
            .all(|r| *r >= 1.0 && *r <= 200.0 && r.fract() == 0.0),
        "{stdout}"
    );
    let text = std::fs::read_to_string(&csv).unwrap();
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("episode,step,qpos_0,qpos_1"));
    let rows: Vec<Vec<f64>> = lines
        .map(|l| l.split(',').map(|x| x.parse().unwrap()).collect())
        .collect();
    // Each episode from step 0 to the step that ended it (or the last step).
    for (e, r) in returns.iter().enumerate() {
        let steps: Vec<f64> = rows
            .iter()
            .filter(|x| x[0] == e as f64)
            .map(|x| x[1])
            .collect();
        assert_eq!(steps.len(), *r as usize + 1, "episode {e}");
        assert_eq!(steps[0], 0.0);
    }
    // Fewer episodes: the first rows' starts are drawn afresh, still valid runs.
    let o = shardes(&["rollout", cfg.to_str().unwrap(), "--episodes", "2"]);
    let (stdout, _) = exited(&o, 0);
    assert!(
        stdout.contains("2 episodes of at most 200 steps"),
        "{stdout}"
    );
    assert!(
        stdout.contains("episode 1: return") && !stdout.contains("episode 2:"),
        "{stdout}"
    );
}

/// `shardes bench` on both control paths: environment steps per second, the reference
/// loop, and for MuJoCo the host/device split, in the table and the JSON.
#[test]
fn bench_measures_environment_steps_on_both_paths() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("r.json");
    let o = shardes(&[
        "bench",
        repo().join("examples/cartpole.toml").to_str().unwrap(),
        "--generations",
        "2",
        "--warmup",
        "1",
        "--json",
        json.to_str().unwrap(),
    ]);
    let (stdout, _) = exited(&o, 0);
    assert!(
        stdout.contains("control cartpole_balance (in the program)"),
        "{stdout}"
    );
    assert!(stdout.contains("reference env steps/s"), "{stdout}");
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert!(r["env_steps_per_s"].as_f64().unwrap() > 0.0, "{r}");
    assert!(
        r["reference"]["env_steps_per_s"].as_f64().unwrap() > 0.0,
        "{r}"
    );

    let out = dir.path().join("out");
    let cfg = write(dir.path(), "m.toml", &mujoco_cartpole(&out, 1, ""));
    let o = shardes(&[
        "bench",
        cfg.to_str().unwrap(),
        "--generations",
        "1",
        "--warmup",
        "0",
        "--json",
        json.to_str().unwrap(),
    ]);
    let (stdout, _) = exited(&o, 0);
    for s in [
        "host simulation",
        "device policy evaluation",
        "tell",
        "reference env steps/s",
    ] {
        assert!(stdout.contains(s), "no {s} in {stdout}");
    }
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert!(r["sim_secs"].as_f64().unwrap() > 0.0, "{r}");
    assert!(r["policy_secs"].as_f64().unwrap() > 0.0, "{r}");
    assert!(r["dispatches"].as_u64().unwrap() >= 1, "{r}");
}

#[test]
fn bad_mujoco_inputs_are_refused_with_a_hint() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    // A model MuJoCo cannot parse: its own message.
    let broken = write(
        dir.path(),
        "broken.xml",
        "<mujoco><worldbody><body><geom type=\"spherex\" size=\"1\"/></body></worldbody></mujoco>",
    );
    let cfg = |mjcf: &Path, extra: &str| {
        let text = mujoco_cartpole(&out, 1, extra).replace(
            &model("cartpole.xml").display().to_string(),
            &mjcf.display().to_string(),
        );
        write(dir.path(), "c.toml", &text)
            .to_string_lossy()
            .into_owned()
    };
    refused(
        &["run", &cfg(&broken, "")],
        "MuJoCo cannot load it: XML Error: invalid keyword: 'spherex'; Element 'geom', line 1",
        "an MJCF model file MuJoCo 4.0 loads",
    );
    refused(
        &["run", &cfg(&dir.path().join("missing.xml"), "")],
        "missing.xml\": MuJoCo cannot load it: no such file",
        "an MJCF model file",
    );
    // A model without actuators cannot be acted on; an unknown convention is named.
    let passive = write(
        dir.path(),
        "passive.xml",
        "<mujoco><worldbody><body><joint type=\"hinge\"/><geom size=\"0.1\" mass=\"1\"/></body></worldbody></mujoco>",
    );
    refused(
        &["run", &cfg(&passive, "")],
        "no actuators (nu = 0)",
        "MuJoCo models",
    );
    // env and mjcf together, and counts of zero.
    refused(
        &["run", &cfg(&model("cartpole.xml"), "env = \"pendulum\"")],
        "problem.env = \"pendulum\" and problem.mjcf",
        "keep one",
    );
    let zero = mujoco_cartpole(&out, 1, "").replace("episodes = 4", "episodes = 0");
    let zero = write(dir.path(), "z.toml", &zero);
    refused(
        &["run", zero.to_str().unwrap()],
        "problem.episodes = 0",
        "at least 1",
    );
    let o = shardes(&[
        "rollout",
        &cfg(&model("cartpole.xml"), ""),
        "--episodes",
        "0",
    ]);
    let (_, stderr) = exited(&o, 2);
    assert!(
        stderr.contains("--episodes") && stderr.contains("must be at least 1"),
        "{stderr}"
    );

    // A policy for another action size: trained on the reacher (nu = 2), replayed on the
    // cart-pole (nu = 1).
    let reacher_out = dir.path().join("reacher");
    let reacher = mujoco_cartpole(&reacher_out, 1, "")
        .replace(
            &model("cartpole.xml").display().to_string(),
            &model("reacher.xml").display().to_string(),
        )
        .replace("episode_length = 200", "episode_length = 5");
    let reacher = write(dir.path(), "r.toml", &reacher);
    exited(&shardes(&["run", reacher.to_str().unwrap()]), 0);
    let params = reacher_out.join("params.safetensors");
    refused(
        &[
            "rollout",
            &cfg(&model("cartpole.xml"), ""),
            "--params",
            params.to_str().unwrap(),
        ],
        "its policy gives 2 actions, but",
        "--params of a run of this config",
    );
    // --csv is for MuJoCo models; rollout is for control problems.
    let cartpole = repo().join("examples/cartpole.toml");
    refused(
        &[
            "rollout",
            cartpole.to_str().unwrap(),
            "--csv",
            dir.path().join("x.csv").to_str().unwrap(),
        ],
        "--csv writes the qpos of MuJoCo models",
        "problem.mjcf",
    );
    let quick = repo().join("examples/quickstart.toml");
    refused(
        &["rollout", quick.to_str().unwrap()],
        "shardes rollout replays control policies",
        "control problem",
    );
}
