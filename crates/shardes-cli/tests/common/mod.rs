//! Shared helpers of the `shardes` binary's end-to-end tests.

#![allow(dead_code)] // each test file uses a subset

#[cfg(feature = "mpi")]
pub mod mpi;

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
    let es = "shaping = \"centered_ranks\"\nhow = \"B\"";
    let strategy = "mirrored(lowrank(r=1))";
    block_config(out, 2, strategy, es, generations, checkpoint_every)
}

/// [`small_config`]'s transformer block (d_model 16, batch 2, seq 4; n = 32, sigma = lr =
/// 0.01, seed 3) of `strategy` on `devices` devices, `es` lines added to [es].
pub fn block_config(
    out: &Path,
    devices: usize,
    strategy: &str,
    es: &str,
    generations: usize,
    checkpoint_every: usize,
) -> String {
    format!(
        r#"devices = {devices}
[problem]
name = "transformer_block"
d_model = 16
batch = 2
seq = 4
[es]
strategy = "{strategy}"
n = 32
sigma = 0.01
lr = 0.01
{es}
[run]
seed = 3
generations = {generations}
out = "{}"
checkpoint_every = {checkpoint_every}
"#,
        out.display()
    )
}

/// [`small_config`] (2 generations, a checkpoint every one, writing to `dir/out`) with `from`
/// replaced by `to`, written to `dir/c.toml`: its path.
pub fn small_with(dir: &Path, from: &str, to: &str) -> String {
    let base = small_config(&dir.join("out"), 2, 1);
    assert!(base.contains(from), "{from:?} not in the base config");
    write(dir, "c.toml", &base.replace(from, to))
        .to_string_lossy()
        .into_owned()
}

/// `[es]` of the mirrored low-rank (r = 1) population most tests run: `n` members, `sigma`
/// and `lr`.
pub fn mirrored_es(n: usize, sigma: f64, lr: f64) -> String {
    format!("[es]\nstrategy = \"mirrored(lowrank(r=1))\"\nn = {n}\nsigma = {sigma}\nlr = {lr}\n")
}

/// A config of the shipped MuJoCo cart-pole (examples/mujoco/cartpole.xml) on `devices`
/// devices writing to `out`: `problem` lines (episodes, their length, the policy) added to
/// [problem], a [`mirrored_es`] population of 32 with sigma 0.1 and lr 0.3 and `es` lines
/// added, seed 0, no checkpoints.
pub fn mujoco_cartpole(
    devices: usize,
    problem: &str,
    es: &str,
    generations: usize,
    out: &Path,
) -> String {
    format!(
        "devices = {devices}\n[problem]\nname = \"control\"\nmjcf = \"{}\"\n{problem}\n{}{es}\n\
         [run]\nseed = 0\ngenerations = {generations}\nout = \"{}\"\ncheckpoint_every = 0\n",
        repo().join("examples/mujoco/cartpole.xml").display(),
        mirrored_es(32, 0.1, 0.3),
        out.display()
    )
}

/// A loss config of the random Qwen2 of `size` on 2 devices, n = 8 ([`mirrored_es`], sigma
/// = lr = 0.01), 1 generation, on the token-id lines `data` (written to `dir/d.jsonl`),
/// writing to `dir/out`; written to `dir/q.toml`.
pub fn qwen2_ids_config(dir: &Path, size: &str, data: &str) -> PathBuf {
    let data = write(dir, "d.jsonl", data);
    let text = format!(
        "devices = 2\n[problem]\nname = \"qwen2\"\nsize = \"{size}\"\ndata = \"{}\"\n{}\
         [run]\ngenerations = 1\nout = \"{}\"\n",
        data.display(),
        mirrored_es(8, 0.01, 0.01),
        dir.join("out").display()
    );
    write(dir, "q.toml", &text)
}

/// A target_token reward config of the tiny random Qwen2 on token ids (the reward: the share
/// of token 7 in a completion) with a [`mirrored_es`] population. The sizes have defaults
/// (2 devices, n = 4, sigma = lr = 0.05, 2 prompts of 4 tokens, 4 new tokens); the other
/// fields are lines added to a section: `es` to [es], `task` to [task], `eval` after [task]
/// (an `[eval]` section or nothing), `run` to [run] (before `out`).
pub struct TargetToken<'a> {
    pub devices: usize,
    pub n: usize,
    pub step: f64,
    pub prompts: usize,
    pub max_new_tokens: usize,
    pub es: &'a str,
    pub task: &'a str,
    pub eval: &'a str,
    pub run: &'a str,
}

impl Default for TargetToken<'_> {
    fn default() -> Self {
        TargetToken {
            devices: 2,
            n: 4,
            step: 0.05,
            prompts: 2,
            max_new_tokens: 4,
            es: "",
            task: "",
            eval: "",
            run: "",
        }
    }
}

impl TargetToken<'_> {
    /// The config writing to `out`.
    pub fn config(&self, out: &Path) -> String {
        let TargetToken {
            devices,
            n,
            step,
            prompts,
            max_new_tokens,
            es,
            task,
            eval,
            run,
        } = self;
        format!(
            "devices = {devices}\n[problem]\nname = \"qwen2\"\nsize = \"tiny\"\n{}{es}\n\
             [task]\nname = \"target_token\"\ntoken = 7\nprompts = {prompts}\nprompt_tokens = 4\n\
             prompt_len = 4\nmax_new_tokens = {max_new_tokens}\n{task}\n{eval}\n\
             [run]\n{run}\nout = \"{}\"\n",
            mirrored_es(*n, *step, *step),
            out.display()
        )
    }
}

/// Writes `text` to `dir/name` and returns the path.
pub fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).expect("writing a test config");
    p
}

/// The text of `examples/NAME`.
pub fn example(name: &str) -> String {
    std::fs::read_to_string(repo().join("examples").join(name))
        .unwrap_or_else(|e| panic!("examples/{name}: {e}"))
}

/// Runs the binary with `args`.
pub fn shardes(args: &[&str]) -> Output {
    bin().args(args).output().expect("spawning shardes")
}

/// Runs the binary with `args` from the repository root (the examples' paths are relative
/// to it).
pub fn at_repo(args: &[&str]) -> Output {
    bin()
        .current_dir(repo())
        .args(args)
        .output()
        .expect("spawning shardes")
}

/// Runs `shardes <args>` and returns its text after checking that it exited 0.
pub fn ok(args: &[&str]) -> (String, String) {
    exited(&shardes(args), 0)
}

/// The JSON document `shardes <args>` prints, after checking that it exited 0.
pub fn json_out(args: &[&str]) -> serde_json::Value {
    let o = shardes(args);
    exited(&o, 0);
    serde_json::from_slice(&o.stdout).expect("one JSON document on stdout")
}

/// `shardes SUB CONFIG FLAGS… REST…` (`flags` split at white space) after checking that it
/// exited 0: its text.
pub fn ok_flags(sub: &str, config: &Path, flags: &str, rest: &[&str]) -> (String, String) {
    let mut args = vec![sub, s(config)];
    args.extend(flags.split_whitespace());
    args.extend(rest);
    ok(&args)
}

/// `p` as a command-line argument.
pub fn s(p: &Path) -> &str {
    p.to_str().expect("a UTF-8 path")
}

/// [`small_config`] of 2 generations, a checkpoint every one, writing to `dir/out`, written
/// to `dir/c.toml`.
pub fn small_in(dir: &Path) -> PathBuf {
    write(dir, "c.toml", &small_config(&dir.join("out"), 2, 1))
}

/// Checks that `text` contains every one of `wants` (the message names the one missing).
pub fn has_all(text: &str, wants: &[&str]) {
    for want in wants {
        assert!(text.contains(want), "missing {want:?} in:\n{text}");
    }
}

/// Every line of the JSON-lines file at `path`, parsed.
pub fn json_lines(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad line {l:?}: {e}")))
        .collect()
}

/// The JSON document at `path`.
pub fn json_file(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
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
    json_file(&out.join("state.json"))
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
