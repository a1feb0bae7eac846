//! Shared helpers of the `shardes` binary's end-to-end tests.

#![allow(dead_code)] // each test file uses a subset

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The built `shardes` binary.
pub fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_shardes"))
}

/// The repository root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A small config (2 devices, n = 32, d_model 16) writing to `out`: a few generations compile
/// and run in seconds.
pub fn small_config(out: &Path, generations: usize, checkpoint_every: usize) -> String {
    format!(
        r#"devices = 2
[problem]
name = "transformer_block"
d_model = 16
batch = 2
seq = 4
[es]
strategy = "mirrored(lowrank(r=1))"
n = 32
sigma = 0.01
lr = 0.01
shaping = "centered_ranks"
how = "B"
[run]
seed = 3
generations = {generations}
out = "{}"
checkpoint_every = {checkpoint_every}
"#,
        out.display()
    )
}

/// Writes `text` to `dir/name` and returns the path.
pub fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).expect("writing a test config");
    p
}

/// Runs the binary with `args`.
pub fn shardes(args: &[&str]) -> Output {
    bin().args(args).output().expect("spawning shardes")
}

/// Stdout and stderr, with XLA's `I0000`/absl log lines removed.
pub fn text(o: &Output) -> (String, String) {
    let clean = |b: &[u8]| {
        String::from_utf8_lossy(b)
            .lines()
            .filter(|l| !l.starts_with("I0000") && !l.starts_with("WARNING: All log messages"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    (clean(&o.stdout), clean(&o.stderr))
}

/// One line of metrics.jsonl.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
pub struct Metric {
    pub generation: u32,
    pub fitness_mean: f64,
    pub fitness_min: f64,
    pub fitness_max: f64,
    pub ms: f64,
}

/// Parses metrics.jsonl strictly: every line one object with every field.
pub fn metrics(out: &Path) -> Vec<Metric> {
    let text = std::fs::read_to_string(out.join("metrics.jsonl")).expect("reading metrics.jsonl");
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad metrics line {l:?}: {e}")))
        .collect()
}

/// `state.json` as JSON.
pub fn state(out: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(out.join("state.json")).expect("reading state.json");
    serde_json::from_str(&text).expect("state.json is JSON")
}

/// Runs `shardes <args>` and checks: exit code 2, an `error:` line containing `what`, and a
/// `hint:` line containing `hint`.
pub fn refused(args: &[&str], what: &str, hint: &str) {
    let o = shardes(args);
    let (stdout, stderr) = text(&o);
    assert_eq!(
        o.status.code(),
        Some(2),
        "{args:?}: stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    let lines: Vec<&str> = stderr.lines().collect();
    let err = lines
        .iter()
        .find(|l| l.starts_with("error: "))
        .unwrap_or_else(|| panic!("no error line in {stderr}"));
    assert!(err.contains(what), "{err:?} does not say {what:?}");
    let h = lines
        .iter()
        .find(|l| l.trim_start().starts_with("hint: "))
        .unwrap_or_else(|| panic!("no hint line in {stderr}"));
    assert!(h.contains(hint), "{h:?} does not say {hint:?}");
}

/// Polls `done` every 20 ms while `child` runs, failing if the child exits first or 300 s
/// pass without it (`what` names the awaited state in the message).
pub fn wait_until(child: &mut std::process::Child, what: &str, mut done: impl FnMut() -> bool) {
    let t0 = std::time::Instant::now();
    while !done() {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("shardes exited early: {status}");
        }
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(300),
            "no {what} in 300 s"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Waits until `out/metrics.jsonl` holds `n` lines while `child` runs.
pub fn wait_for_metrics(out: &Path, n: usize, child: &mut std::process::Child) {
    wait_until(child, "progress", || {
        std::fs::read_to_string(out.join("metrics.jsonl"))
            .map(|t| t.lines().count())
            .unwrap_or(0)
            >= n
    });
}

/// The output's text after checking that it exited with `code` (the message shows both
/// streams).
pub fn exited(o: &Output, code: i32) -> (String, String) {
    let (stdout, stderr) = text(o);
    assert_eq!(
        o.status.code(),
        Some(code),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    (stdout, stderr)
}

/// Creates `out` holding a `state.json` of another config (hash `0123456789abcdef`) at
/// `generation`, with no parameter file.
pub fn foreign_state(out: &Path, generation: u32) {
    std::fs::create_dir_all(out).unwrap();
    std::fs::write(
        out.join("state.json"),
        format!(
            r#"{{"key":[0,0],"generation":{generation},"config_hash":"0123456789abcdef","params_sha256":""}}"#
        ),
    )
    .unwrap();
}
