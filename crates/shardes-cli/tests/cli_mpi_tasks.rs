//! The multi-process tier (issue #17), runs whose fitness is computed on the host: reward
//! fine-tuning (`[task]`, a built-in reward and a reward program) and MuJoCo control, each
//! on 2 × 4 processes × devices against 1 × 8. Run by `.ci/mpi-tier` with `cli_mpi.rs`
//! (which says how); without the feature `mpi` this file is empty.
//!
//! It checks: a reward run's metrics, eval lines and parameters on two processes equal one
//! process's (how_hosts A and B; adam to 1e-5 relative, across a resume); a MuJoCo run's
//! metrics and parameters equal one process's bit for bit (the mean fitness and
//! group_relative's per-episode fitness); each process feeds only its own members to its
//! own reward program.

#![cfg(feature = "mpi")]

mod common;

use std::path::Path;

use common::mpi::*;
use common::*;

/// A reward run (`[task]` target_token on the tiny random Qwen2) on `devices` devices per
/// process, with `es` lines added under [es].
fn reward_config(out: &Path, devices: usize, es: &str, generations: usize) -> String {
    TargetToken {
        devices,
        n: 32,
        max_new_tokens: 6,
        es: &format!("shaping = \"centered_ranks\"\nhow = \"B\"\n{es}"),
        eval: "[eval]\nevery = 2\nprompts = 4",
        run: &format!("seed = 0\ngenerations = {generations}\ncheckpoint_every = 2"),
        ..TargetToken::default()
    }
    .config(out)
}

/// Every metrics line without its timings: `ms` and the `extra` scalars `timed`.
fn untimed_metrics(out: &Path, timed: &[&str]) -> Vec<serde_json::Value> {
    json_lines(&out.join("metrics.jsonl"))
        .into_iter()
        .map(|mut v| {
            let o = v.as_object_mut().unwrap();
            o.remove("ms");
            let x = o["extra"].as_object_mut().unwrap();
            for key in timed {
                x.remove(*key);
            }
            v
        })
        .collect()
}

/// A reward run's metrics lines without their timings (fitness, reward, accuracy, format).
fn reward_metrics(out: &Path) -> Vec<serde_json::Value> {
    untimed_metrics(out, &["tok/s", "host_share"])
}

#[test]
fn a_reward_run_on_two_processes_matches_one() {
    // Each process decodes and scores its own 16 members, the rewards are gathered in
    // member order and every process tells with all of them: with how = B inside the
    // processes the programs compute one process's bits, so the metrics, the eval lines
    // (decoded by the lead) and the parameters equal 1 × 8's exactly, with how_hosts A and
    // B. adam's step is a program of its own under B (1e-5 relative, as for the fitness
    // runs); its state is checkpointed by the lead and resumed on every process.
    let dir = tempfile::tempdir().unwrap();
    let one = dir.path().join("one");
    run_config(1, dir.path(), "one.toml", &reward_config(&one, 8, "", 4));
    let want = reward_metrics(&one);
    assert_eq!(want.len(), 4);
    assert!(
        want.iter()
            .any(|m| m["fitness_min"].as_f64() < m["fitness_max"].as_f64()),
        "the rewards never differ between members: {want:?}"
    );
    let evals = |out: &Path| std::fs::read_to_string(out.join("eval.jsonl")).unwrap();
    for hosts in ["A", "B"] {
        let out = dir.path().join(format!("two{hosts}"));
        let es = format!("how_hosts = \"{hosts}\"");
        let cfg = write(dir.path(), "two.toml", &reward_config(&out, 4, &es, 4));
        let o = run(2, &cfg, &[]);
        assert!(text(&o).0.contains("processes 2 × 4 devices"), "{hosts}");
        assert_eq!(reward_metrics(&out), want, "how_hosts {hosts}");
        assert_eq!(evals(&out), evals(&one), "how_hosts {hosts}");
        assert_eq!(trajectory(&out).1, trajectory(&one).1, "how_hosts {hosts}");
    }

    // adam: 1 × 8 for 4 generations against 2 × 4 for 2, resumed under 2 × 4 for 2 more.
    let adam = "how_hosts = \"B\"\noptimizer = \"adam\"";
    let reference = dir.path().join("adam1");
    run_config(
        1,
        dir.path(),
        "a1.toml",
        &reward_config(&reference, 8, adam, 4),
    );
    let out = dir.path().join("adam2");
    run_config(2, dir.path(), "a2.toml", &reward_config(&out, 4, adam, 2));
    let cfg = write(dir.path(), "a2.toml", &reward_config(&out, 4, adam, 4));
    let o = run(2, &cfg, &["--resume"]);
    assert!(text(&o).0.contains("resuming at generation 2"));
    let diff = worst_leaf(&params(&out), &params(&reference));
    assert!(
        diff <= 1e-5,
        "adam across processes after a resume: {diff:e}"
    );
    assert_ne!(
        trajectory(&reference).1,
        trajectory(&one).1,
        "adam stepped as sgd"
    );
}

/// A MuJoCo cart-pole run (the shipped model) on `devices` devices per process: 2
/// episodes of at most 60 steps per member, policy 4→8→1, `how = "B"` inside the
/// processes, `es` lines added under [es].
fn mujoco_config(out: &Path, devices: usize, es: &str) -> String {
    let problem = "episodes = 2\nepisode_length = 60\nhidden = [8]";
    mujoco_cartpole(devices, problem, &format!("how = \"B\"\n{es}"), 3, out)
}

/// A MuJoCo run's metrics lines without their timings (the host split `env_steps_per_s`
/// and `sim_share` are process 0's own under mpirun).
fn mujoco_metrics(out: &Path) -> Vec<serde_json::Value> {
    untimed_metrics(out, &["env_steps_per_s", "sim_share"])
}

#[test]
fn a_mujoco_run_on_two_processes_matches_one() {
    // Each process simulates the episodes of its own 16 members and evaluates their
    // policies on its 4 devices (global member ids: the same noise), the fitness is
    // gathered in member order and every process tells with all of it: the metrics (mean
    // return included) and the parameters equal 1 × 8's bit for bit, with how_hosts A and
    // B, for the mean fitness and for group_relative's fitness per episode.
    let dir = tempfile::tempdir().unwrap();
    for shaping in ["centered_ranks", "group_relative"] {
        let es = format!("shaping = \"{shaping}\"");
        let one = dir.path().join(format!("one-{shaping}"));
        run_config(1, dir.path(), "one.toml", &mujoco_config(&one, 8, &es));
        let want = mujoco_metrics(&one);
        assert_eq!(want.len(), 3, "{shaping}");
        assert!(
            want.iter()
                .any(|m| m["fitness_min"].as_f64() < m["fitness_max"].as_f64()),
            "{shaping}: the members' returns never differ: {want:?}"
        );
        for hosts in ["A", "B"] {
            let case = format!("{shaping}, how_hosts {hosts}");
            let out = dir.path().join(format!("two-{shaping}-{hosts}"));
            let es = format!("{es}\nhow_hosts = \"{hosts}\"");
            let o = run_config(2, dir.path(), "two.toml", &mujoco_config(&out, 4, &es));
            let (stdout, _) = text(&o);
            assert_eq!(stdout.matches("shardes run").count(), 1, "{case}: {stdout}");
            for want in ["processes 2 × 4 devices", "(MuJoCo, 2 episodes"] {
                assert!(stdout.contains(want), "{case}: {stdout}");
            }
            assert_eq!(mujoco_metrics(&out), want, "{case}");
            assert_eq!(trajectory(&out).1, trajectory(&one).1, "{case}");
        }
    }
}

/// A Countdown run of the tiny random Qwen2 (the countdown tokenizer) rewarded by the test
/// reward program, which logs each request's member into `log` per process.
fn reward_command_config(out: &Path, devices: usize, log: &Path) -> String {
    let fixture = repo().join("tests/fixtures/reward/fixture.py");
    let tokenizer = repo().join("examples/countdown_tokenizer.json");
    format!(
        r#"devices = {devices}
[problem]
name = "qwen2"
size = "tiny"
tokenizer = "{}"
{}shaping = "centered_ranks"
how = "B"
[task]
name = "countdown"
style = "compact"
prompts = 2
prompt_len = 24
max_new_tokens = 6
max_number = 20
[task.reward]
command = ["python3", "{}", "logged", "{}"]
[run]
seed = 0
generations = 2
out = "{}"
checkpoint_every = 2
"#,
        tokenizer.display(),
        mirrored_es(16, 0.05, 0.05),
        fixture.display(),
        log.display(),
        out.display()
    )
}

#[test]
fn under_mpirun_each_process_scores_its_own_members_with_its_own_reward_program() {
    // One reward program per process, each fed only its process's members (global ids):
    // 2 × 4 devices split the 16 members 0..8 and 8..16, and the rewards gathered in
    // member order give 1 × 8's metrics and parameters exactly.
    let dir = tempfile::tempdir().unwrap();
    // 1 × 8 into `one`, logging into `log1`; 2 × 4 into `two`, logging into `log2`.
    let [(one, log_one), (two, log_two)] = [(1, "one", 8), (2, "two", 4)].map(|(np, name, d)| {
        let (out, log) = (dir.path().join(name), dir.path().join(format!("log{np}")));
        std::fs::create_dir_all(&log).unwrap();
        let config = reward_command_config(&out, d, &log);
        run_config(np, dir.path(), &format!("{name}.toml"), &config);
        (out, log)
    });
    assert_eq!(reward_metrics(&two), reward_metrics(&one));
    assert_eq!(trajectory(&two).1, trajectory(&one).1);
    let members = |log: &Path| -> Vec<std::collections::BTreeSet<u64>> {
        let mut per: Vec<_> = std::fs::read_dir(log)
            .unwrap()
            .map(|e| {
                std::fs::read_to_string(e.unwrap().path())
                    .unwrap()
                    .lines()
                    .map(|l| l.parse::<u64>().unwrap())
                    .collect::<std::collections::BTreeSet<u64>>()
            })
            .collect();
        per.sort();
        per
    };
    let all: std::collections::BTreeSet<u64> = (0..16).collect();
    assert_eq!(members(&log_one), vec![all]);
    assert_eq!(
        members(&log_two),
        vec![(0..8).collect(), (8..16).collect()],
        "each process's program scores its own members"
    );
}
