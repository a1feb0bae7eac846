//! `[task.reward]` from the command line: the shipped `examples/jsonl_reward.toml` runs with
//! a reward program whose rewards are checked exactly (a fixture program hashes each
//! completion's text, which the eval log shows), and a program that keeps dying stops the
//! run (exit 1) with its stderr in the message, leaving a checkpoint that resumes.

mod common;

use std::path::{Path, PathBuf};
use std::process::Output;

use common::*;
use sha2::{Digest, Sha256};

fn fixture() -> PathBuf {
    repo().join("tests/fixtures/reward/fixture.py")
}

/// The shipped example with `generations`, a checkpoint every generation, `out`, and
/// `command` as the reward program.
fn config(
    dir: &Path,
    out: &Path,
    generations: usize,
    command: &[String],
    restarts: u32,
) -> PathBuf {
    let text = std::fs::read_to_string(repo().join("examples/jsonl_reward.toml")).unwrap();
    let cmd = serde_json::to_string(command).unwrap();
    let text = text
        .replace("generations = 10", &format!("generations = {generations}"))
        .replace("checkpoint_every = 5", "checkpoint_every = 1")
        .replace("\"runs/jsonl_reward\"", &format!("\"{}\"", out.display()))
        .replace("[\"python3\", \"examples/reward.py\"]", &cmd)
        .replace("restarts = 3", &format!("restarts = {restarts}"));
    assert!(text.contains(&cmd), "the example's command line changed");
    write(dir, "reward.toml", &text)
}

fn run(cfg: &Path, resume: bool) -> Output {
    let mut c = bin();
    c.current_dir(repo()).args(["run", cfg.to_str().unwrap()]);
    if resume {
        c.arg("--resume");
    }
    c.output().unwrap()
}

fn hashed(text: &str) -> f64 {
    let d = Sha256::digest(text.as_bytes());
    let hex: String = d.iter().map(|b| format!("{b:02x}")).collect();
    f64::from(u32::from_str_radix(&hex[..5], 16).unwrap())
}

fn lines(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn python(args: &[&str]) -> Vec<String> {
    let mut v = vec!["python3".to_string(), fixture().display().to_string()];
    v.extend(args.iter().map(|s| s.to_string()));
    v
}

/// The shipped example as it is (examples/reward.py), shortened to 2 generations: finite
/// rewards, nothing contained. (The default tier checks examples/reward.py against the
/// built-in reward in tests/reward_command.rs and runs this config with another program.)
#[test]
#[ignore = "slow: a second run of the tiny model; the default tier runs the same config"]
fn slow_the_shipped_reward_example_runs() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("example");
    let text = std::fs::read_to_string(repo().join("examples/jsonl_reward.toml"))
        .unwrap()
        .replace("generations = 10", "generations = 2")
        .replace("\"runs/jsonl_reward\"", &format!("\"{}\"", out.display()));
    let cfg = write(dir.path(), "example.toml", &text);
    exited(&run(&cfg, false), 0);
    for m in lines(&out.join("metrics.jsonl")) {
        let r = m["extra"]["reward"].as_f64().unwrap();
        assert!(
            r.is_finite() && m["extra"].get("contained").is_none(),
            "{m}"
        );
    }
}

/// A program whose reward is a hash of the completion: the eval samples (the unperturbed
/// parameters' completions) carry exactly that, and the training rewards are large, never
/// contained.
#[test]
fn the_example_runs_with_a_reward_program_and_its_rewards_are_exact() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("hash");
    let cfg = config(dir.path(), &out, 2, &python(&["hash"]), 0);
    exited(&run(&cfg, false), 0);
    let evals = lines(&out.join("eval.jsonl"));
    assert_eq!(evals.len(), 2);
    for e in &evals {
        assert_eq!(e["contained"], 0);
        for s in e["samples"].as_array().unwrap() {
            let text = s["completion"].as_str().unwrap();
            assert_eq!(s["reward"].as_f64().unwrap(), hashed(text), "{s}");
        }
    }
    for m in lines(&out.join("metrics.jsonl")) {
        assert!(m["extra"]["reward"].as_f64().unwrap() > 1.0, "{m}");
        assert!(m["extra"].get("contained").is_none(), "{m}");
    }
}

#[test]
fn a_reward_program_that_keeps_dying_stops_the_run_and_the_checkpoint_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let counter = dir.path().join("count");
    // n = 16 members × 2 prompts = 32 requests a generation, and 1 held-out prompt at
    // generation 0: generations 0 and 1 are scored, generation 2's program dies, its
    // restart dies too (generation 2 is contained), and generation 3 needs a second
    // restart that restarts = 1 does not allow.
    let limit = (1 + 2 * 32).to_string();
    let cmd = python(&["dies_after", &limit, counter.to_str().unwrap()]);
    let cfg = config(dir.path(), &out, 6, &cmd, 1);
    let (_, stderr) = exited(&run(&cfg, false), 1);
    assert!(
        stderr.contains("giving up after 65 requests") && stderr.contains("task.reward.restarts"),
        "{stderr}"
    );
    assert!(stderr.contains("running generation 3"), "{stderr}");
    let m = lines(&out.join("metrics.jsonl"));
    assert_eq!(m.len(), 3);
    assert_eq!(m[2]["extra"]["contained"].as_f64(), Some(32.0));
    assert_eq!(state(&out)["generation"], 3);

    // The checkpoint resumes once the program works again (its count starts over; the
    // same command, since the reward is part of the trajectory's config).
    std::fs::remove_file(&counter).unwrap();
    let cfg = config(dir.path(), &out, 4, &cmd, 1);
    exited(&run(&cfg, true), 0);
    assert_eq!(state(&out)["generation"], 4);
}

#[test]
fn a_missing_reward_program_is_a_config_error_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let cfg = config(dir.path(), &out, 1, &["/no/such/reward".to_string()], 0);
    let (_, stderr) = exited(&run(&cfg, false), 2);
    assert!(
        stderr.contains("task.reward.command") && stderr.contains("/no/such/reward"),
        "{stderr}"
    );
    let o = bin()
        .current_dir(repo())
        .args(["check", cfg.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!o.status.success());
}
