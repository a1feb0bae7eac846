//! `[problem] name = "control", mjcf = "…"` end to end: the shipped MuJoCo cart-pole
//! learns to balance from the CLI, `shardes rollout` replays it (returns per episode, the
//! qpos trajectory as CSV), `shardes bench` measures both control paths, and every bad
//! input is refused with a hint.
//!
//! The MuJoCo library is provisioned into the per-user cache on first use (as the PJRT
//! plugin); once it is there these tests need no network.

use std::path::{Path, PathBuf};

use crate::common::*;
use serde_json::Value;

/// The mean return the run must reach, of the episodes' maximum of 200.
const TARGET: f64 = 190.0;

/// A cart-pole config on the shipped MuJoCo model: 8 devices, n = 32, 4 episodes of at
/// most 200 steps, policy 4→16→1 (the library's learning test's settings); `extra` goes
/// into [problem].
fn mujoco_cartpole(out: &Path, generations: usize, extra: &str) -> String {
    let problem = format!("episodes = 4\nepisode_length = 200\nhidden = [16]\n{extra}");
    crate::common::mujoco_cartpole(
        8,
        &problem,
        "shaping = \"centered_ranks\"",
        generations,
        out,
    )
}

/// `shardes bench CONFIG` of `generations` after `warmup`, its JSON report written to
/// `json`: the table and the report, after checking that it exited 0.
fn bench(config: &Path, generations: &str, warmup: &str, json: &Path) -> (String, Value) {
    let flags = format!("--generations {generations} --warmup {warmup} --json");
    let (stdout, _) = ok_flags("bench", config, &flags, &[s(json)]);
    (stdout, json_file(json))
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
    let (stdout, _) = ok(&["run", s(&cfg)]);
    has_all(
        &stdout,
        &[
            "(MuJoCo, 4 episodes × ≤ 200 steps on host threads, tanh policy 4→16→1",
            "env_steps_per_s",
            "sim_share",
        ],
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
    let (stdout, _) = ok(&["rollout", s(&cfg), "--csv", s(&csv)]);
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
    let (stdout, _) = ok(&["rollout", s(&cfg), "--episodes", "2"]);
    has_all(
        &stdout,
        &["2 episodes of at most 200 steps", "episode 1: return"],
    );
    assert!(!stdout.contains("episode 2:"), "{stdout}");
}

/// `shardes bench` on both control paths: environment steps per second, the reference
/// loop, and for MuJoCo the host/device split, in the table and the JSON.
#[test]
fn bench_measures_environment_steps_on_both_paths() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("r.json");
    let (stdout, r) = bench(&repo().join("examples/cartpole.toml"), "2", "1", &json);
    has_all(
        &stdout,
        &[
            "control cartpole_balance (in the program)",
            "reference env steps/s",
        ],
    );
    assert!(r["env_steps_per_s"].as_f64().unwrap() > 0.0, "{r}");
    assert!(
        r["reference"]["env_steps_per_s"].as_f64().unwrap() > 0.0,
        "{r}"
    );

    let out = dir.path().join("out");
    let cfg = write(dir.path(), "m.toml", &mujoco_cartpole(&out, 1, ""));
    let (stdout, r) = bench(&cfg, "1", "0", &json);
    has_all(
        &stdout,
        &[
            "host simulation",
            "device policy evaluation",
            "tell",
            "reference env steps/s",
        ],
    );
    assert!(r["sim_secs"].as_f64().unwrap() > 0.0, "{r}");
    assert!(r["policy_secs"].as_f64().unwrap() > 0.0, "{r}");
    assert!(r["dispatches"].as_u64().unwrap() >= 1, "{r}");
}

#[test]
fn bad_mujoco_inputs_are_refused_with_a_hint() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    // A model MuJoCo cannot parse: its own message.
    let xml =
        "<mujoco><worldbody><body><geom type=\"spherex\" size=\"1\"/></body></worldbody></mujoco>";
    let broken = write(dir.path(), "broken.xml", xml);
    // The config of `mjcf` (of another `out` where given) with `extra` in [problem].
    let on = |mjcf: &Path, out: &Path, extra: &str| {
        mujoco_cartpole(out, 1, extra).replace(
            &model("cartpole.xml").display().to_string(),
            &mjcf.display().to_string(),
        )
    };
    let cfg = |mjcf: &Path, extra: &str| {
        write(dir.path(), "c.toml", &on(mjcf, &out, extra))
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
    refused(&["run", s(&zero)], "problem.episodes = 0", "at least 1");
    let cartpole = cfg(&model("cartpole.xml"), "");
    let (_, stderr) = exited(&shardes(&["rollout", &cartpole, "--episodes", "0"]), 2);
    has_all(&stderr, &["--episodes", "must be at least 1"]);

    // A policy for another action size: trained on the reacher (nu = 2), replayed on the
    // cart-pole (nu = 1).
    let reacher_out = dir.path().join("reacher");
    let reacher = on(&model("reacher.xml"), &reacher_out, "")
        .replace("episode_length = 200", "episode_length = 5");
    ok(&["run", s(&write(dir.path(), "r.toml", &reacher))]);
    let params = reacher_out.join("params.safetensors");
    refused(
        &["rollout", &cartpole, "--params", s(&params)],
        "its policy gives 2 actions, but",
        "--params of a run of this config",
    );
    // --csv is for MuJoCo models; rollout is for control problems.
    let table = repo().join("examples/cartpole.toml");
    refused(
        &["rollout", s(&table), "--csv", s(&dir.path().join("x.csv"))],
        "--csv writes the qpos of MuJoCo models",
        "problem.mjcf",
    );
    let quick = repo().join("examples/quickstart.toml");
    refused(
        &["rollout", s(&quick)],
        "shardes rollout replays control policies",
        "control problem",
    );
}
