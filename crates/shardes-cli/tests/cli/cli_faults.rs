//! Faults a run must survive (issue #15): closed and full stdout, stop signals, reruns into
//! a finished run, a corrupt state, divergence, a second run into a live directory, failing
//! starts; and quiet plugin logging (issue #20). Every run uses the small config of
//! `common` (2 devices, d_model 16), which compiles and runs in seconds.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

use crate::common::*;

/// Every file under `dir` (recursively, hidden ones included) with its bytes.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut files = BTreeMap::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                todo.push(p);
            } else {
                let bytes = std::fs::read(&p).unwrap();
                files.insert(p.strip_prefix(dir).unwrap().to_path_buf(), bytes);
            }
        }
    }
    files
}

/// The parameters in `out/params.safetensors` as bits, leaf by leaf.
fn param_bits(out: &Path) -> Vec<(String, Vec<u32>)> {
    let p = shardes::io::read_params_inferred(out.join("params.safetensors")).unwrap();
    p.leaves()
        .into_iter()
        .map(|(path, a)| (path, a.data().iter().map(|v| v.to_bits()).collect()))
        .collect()
}

/// `metrics.jsonl` as the library reads it (NaN written as a string), every line a record.
fn records(out: &Path) -> Vec<shardes::rundir::Metric> {
    let log = shardes::rundir::read_metrics(&out.join("metrics.jsonl")).unwrap();
    assert!(log.bad.is_empty() && log.torn.is_none(), "{log:?}");
    log.records.into_iter().map(|(m, _)| m).collect()
}

/// A finished run of `generations` into `dir/name` (checkpoint every generation).
fn finished(dir: &Path, name: &str, generations: usize) -> (PathBuf, PathBuf) {
    let out = dir.join(name);
    let text = small_config(&out, generations, 1);
    let cfg = write(dir, &format!("{name}.toml"), &text);
    ok(&["run", s(&cfg)]);
    (cfg, out)
}

/// A run of a million generations into `dir/name` (`name.toml`, no checkpoints), started,
/// once `after` generations are in its metrics: its config, its directory and the child.
fn live_run(dir: &Path, name: &str, after: usize) -> (PathBuf, PathBuf, Child) {
    let out = dir.join(name);
    let cfg = write(
        dir,
        &format!("{name}.toml"),
        &small_config(&out, 1_000_000, 0),
    );
    let mut child = spawn_run(&cfg, &[]);
    wait_for_metrics(&out, after, &mut child);
    (cfg, out, child)
}

/// Spawns `shardes run cfg` with piped output.
fn spawn_run(cfg: &Path, extra: &[&str]) -> Child {
    bin()
        .arg("run")
        .arg(cfg)
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn signal(child: &Child, sig: i32) {
    let pid = i32::try_from(child.id()).unwrap();
    // SAFETY: sending a signal to our own child process.
    assert_eq!(unsafe { libc::kill(pid, sig) }, 0);
}

fn dev_full() -> Stdio {
    Stdio::from(
        std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap(),
    )
}

/// `bash -c 'set -o pipefail; shardes ARGS | head -1'`: the pipeline's status is shardes'
/// unless it is 0.
fn piped_to_head(args: &[&str]) -> Output {
    Command::new("bash")
        .arg("-c")
        .arg("set -o pipefail; \"$0\" \"$@\" | head -1")
        .arg(env!("CARGO_BIN_EXE_shardes"))
        .args(args)
        .output()
        .unwrap()
}

/// `run | head -1` and `run > /dev/full`: the run goes on to its final checkpoint and exits
/// 0, with a note on stderr; its metrics hold every generation.
#[test]
fn closed_or_full_stdout_does_not_stop_the_run() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("pipe");
    let cfg = write(d.path(), "pipe.toml", &small_config(&out, 12, 0));
    // The header line comes before the compile, so the pipe is closed long before the
    // progress lines: they hit EPIPE.
    let o = piped_to_head(&["run", cfg.to_str().unwrap()]);
    let (stdout, stderr) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{stdout}\n{stderr}");
    assert_eq!(stdout.trim(), format!("shardes run {}", cfg.display()));
    assert!(stderr.contains("note: stdout was closed"), "{stderr}");
    assert_eq!(state(&out)["generation"], 12);
    assert_eq!(records(&out).len(), 12);

    // The same with the read end closed by hand, as `head` does.
    let out2 = d.path().join("pipe2");
    let cfg2 = write(d.path(), "pipe2.toml", &small_config(&out2, 12, 0));
    let mut child = spawn_run(&cfg2, &[]);
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert!(first.starts_with("shardes run"), "{first}");
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{:?}", text(&o));
    assert_eq!(state(&out2)["generation"], 12);

    let out3 = d.path().join("full");
    let cfg3 = write(d.path(), "full.toml", &small_config(&out3, 12, 5));
    let o = bin()
        .arg("run")
        .arg(&cfg3)
        .stdout(dev_full())
        .output()
        .unwrap();
    let (_, stderr) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("cannot write to stdout") && stderr.contains("No space left"),
        "{stderr}"
    );
    assert_eq!(state(&out3)["generation"], 12);
    assert_eq!(records(&out3).len(), 12);
}

/// `hlo`, `devices` and `check` into a closed pipe end quietly with their normal code; into
/// a full disk they fail with exit 1 and say why.
#[test]
fn inspect_commands_into_a_closed_pipe_or_a_full_disk() {
    let d = tempfile::tempdir().unwrap();
    let cfg = small_in(d.path());
    let c = s(&cfg);
    for args in [
        vec!["hlo", c],
        vec!["check", c],
        vec!["devices", "--devices", "2"],
    ] {
        let o = piped_to_head(&args);
        let (stdout, stderr) = text(&o);
        assert_eq!(o.status.code(), Some(0), "{args:?}: {stdout}\n{stderr}");
        assert_eq!(stdout.lines().count(), 1, "{args:?}: {stdout}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");

        let o = bin().args(&args).stdout(dev_full()).output().unwrap();
        let (_, stderr) = text(&o);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(
            stderr.contains("error: writing to stdout: No space left on device"),
            "{args:?}: {stderr}"
        );
    }
    // The whole program through a pipe closed before it is written.
    let mut child = bin()
        .args(["hlo", c])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{:?}", text(&o));
    assert!(o.stderr.is_empty(), "{:?}", text(&o));
}

/// SIGTERM mid-run finishes the generation, checkpoints and exits 143; `--resume` then ends
/// with parameters bit-identical to an uninterrupted run.
#[test]
fn sigterm_checkpoints_exits_143_and_resumes_bit_identically() {
    let d = tempfile::tempdir().unwrap();
    let (_, b, child) = live_run(d.path(), "b", 3);
    signal(&child, libc::SIGTERM);
    let o = child.wait_with_output().unwrap();
    let (stdout, stderr) = text(&o);
    assert_eq!(o.status.code(), Some(143), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("SIGTERM: finishing this generation"),
        "{stderr}"
    );
    let g = state(&b)["generation"].as_u64().unwrap() as usize;
    assert!(
        stdout.contains(&format!("interrupted: checkpoint at generation {g}")),
        "{stdout}"
    );
    assert_eq!(records(&b).len(), g);

    let a = d.path().join("a");
    let cfg_a = write(d.path(), "a.toml", &small_config(&a, g + 2, 0));
    let cfg_b = write(d.path(), "b.toml", &small_config(&b, g + 2, 0));
    ok(&["run", s(&cfg_a)]);
    let (stdout, _) = ok(&["run", s(&cfg_b), "--resume"]);
    assert!(stdout.contains(&format!("resuming at generation {g}")));
    assert_eq!(param_bits(&a), param_bits(&b));
    let fit = |m: &shardes::rundir::Metric| (m.generation, m.fitness_mean, m.fitness_min);
    let (ma, mb) = (records(&a), records(&b));
    assert_eq!(ma.len(), g + 2);
    assert_eq!(
        ma.iter().map(fit).collect::<Vec<_>>(),
        mb.iter().map(fit).collect::<Vec<_>>()
    );
}

/// A second run into a directory in use is refused (exit 2, naming the holder's pid), with
/// or without --force or --resume; SIGHUP then stops the first like SIGINT, exit 129.
#[test]
fn a_second_run_into_a_live_directory_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let (cfg, out, child) = live_run(d.path(), "live", 1);
    let holder = format!("is in use by another shardes run (pid {}", child.id());
    let c = cfg.to_str().unwrap();
    for extra in [None, Some("--force"), Some("--resume")] {
        let mut args = vec!["run", c];
        args.extend(extra);
        refused(&args, &holder, "wait for it to finish");
    }
    signal(&child, libc::SIGHUP);
    let o = child.wait_with_output().unwrap();
    let (stdout, stderr) = text(&o);
    assert_eq!(o.status.code(), Some(129), "{stdout}\n{stderr}");
    let g = state(&out)["generation"].as_u64().unwrap() as usize;
    assert!(g >= 1);
    assert_eq!(records(&out).len(), g);
    assert!(!out.join(".lock").exists(), "the lock outlived its run");
}

/// Starts that fail, for whatever reason, leave a previous run byte-identical: a rerun
/// without --resume, a plugin that does not exist (with --force and with --resume), a late
/// config error, and a resume with nothing to do.
#[test]
fn a_failing_start_changes_nothing() {
    let d = tempfile::tempdir().unwrap();
    let (cfg, out) = finished(d.path(), "done", 2);
    let before = snapshot(&out);
    assert!(before.contains_key(Path::new("state.json")));
    assert!(!before.contains_key(Path::new(".lock")));
    let c = cfg.to_str().unwrap();
    let missing = d.path().join("no_such_plugin.so");
    let m = missing.to_str().unwrap();

    refused(
        &["run", c],
        "holds a checkpoint of this config at generation 2",
        "--resume",
    );
    assert_eq!(snapshot(&out), before);
    for extra in ["--force", "--resume"] {
        refused(
            &["run", c, extra, "--plugin", m],
            "does not exist",
            "check the path",
        );
        assert_eq!(snapshot(&out), before, "{extra}");
    }
    let late = write(d.path(), "late.toml", &small_config(&out, 5_000_000_000, 1));
    let o = shardes(&["run", late.to_str().unwrap(), "--force"]);
    assert_eq!(o.status.code(), Some(2), "{:?}", text(&o));
    assert_eq!(snapshot(&out), before);
    let (stdout, _) = ok(&["run", c, "--resume"]);
    assert!(stdout.contains("nothing to do"));
    assert_eq!(snapshot(&out), before);
}

/// A corrupt state.json refuses a plain start and a resume, naming the file, and --force
/// starts over, moving it to previous/.
#[test]
fn force_recovers_from_a_corrupt_state() {
    let d = tempfile::tempdir().unwrap();
    let (cfg, out) = finished(d.path(), "corrupt", 2);
    std::fs::write(out.join("state.json"), "{\"key\": [0, 0], \"gener").unwrap();
    let c = cfg.to_str().unwrap();
    refused(
        &["run", c],
        "state.json is not a valid shardes checkpoint state",
        "--force",
    );
    refused(
        &["run", c, "--resume"],
        "state.json is not a valid shardes checkpoint state",
        "--force",
    );
    let (stdout, _) = ok(&["run", c, "--force"]);
    assert!(stdout.contains("moved it to"), "{stdout}");
    assert_eq!(state(&out)["generation"], 2);
    assert_eq!(
        std::fs::read_to_string(out.join("previous/state.json")).unwrap(),
        "{\"key\": [0, 0], \"gener"
    );
}

/// `es.lr = 1e30`: generation 0 is fine and checkpointed, generation 1's fitness is NaN. The
/// run exits 1 naming the generation and es.lr; the checkpoint of generation 1 stays, finite
/// and equal to an uninterrupted run's of 1 generation; metrics.jsonl holds the NaN line and
/// reads back; a resume verifies the checkpoint and diverges again, deterministically.
#[test]
fn divergence_exits_1_and_keeps_the_last_finite_checkpoint() {
    let d = tempfile::tempdir().unwrap();
    let diverging = |name: &str, generations: usize, from: &str, to: &str| {
        let out = d.path().join(name);
        let text = small_config(&out, generations, 1).replace(from, to);
        (write(d.path(), &format!("{name}.toml"), &text), out)
    };
    let fails = |cfg: &Path| exited(&shardes(&["run", s(cfg)]), 1).1;
    let (cfg, out) = diverging("lr", 6, "lr = 0.01", "lr = 1e30");
    has_all(
        &fails(&cfg),
        &[
            "error: the run diverged at generation 1:",
            "likely cause: es.lr = 1e30",
            "the last finite checkpoint (generation 1) is kept",
        ],
    );
    assert_eq!(state(&out)["generation"], 1);
    let m = records(&out);
    assert_eq!(m.len(), 2);
    assert!(m[0].fitness_mean.is_finite() && m[1].fitness_mean.is_nan());
    assert!(std::fs::read_to_string(out.join("metrics.jsonl"))
        .unwrap()
        .contains("\"fitness_mean\":\"NaN\""));
    let bits = param_bits(&out);
    assert!(bits
        .iter()
        .all(|(_, b)| b.iter().all(|&x| f32::from_bits(x).is_finite())));
    let (one, out1) = diverging("one", 1, "lr = 0.01", "lr = 1e30");
    ok(&["run", s(&one)]);
    assert_eq!(bits, param_bits(&out1));

    let before = std::fs::read(out.join("state.json")).unwrap();
    let (stdout, _) = exited(&shardes(&["run", s(&cfg), "--resume"]), 1);
    assert!(stdout.contains("resuming at generation 1"));
    assert_eq!(std::fs::read(out.join("state.json")).unwrap(), before);
    assert_eq!(param_bits(&out), bits);
    assert_eq!(records(&out).len(), 2);

    // σ = 1e30: NaN from generation 0, nothing to keep.
    let (cfg, out) = diverging("sigma", 6, "sigma = 0.01", "sigma = 1e30");
    has_all(
        &fails(&cfg),
        &[
            "diverged at generation 0",
            "es.sigma = 1e30 is too large",
            "no checkpoint was written",
        ],
    );
    assert!(!out.join("state.json").exists());
    assert!(records(&out)[0].fitness_mean.is_nan());

    // lr = 1e38: lr/(n·σ) is still finite, but the first update overflows: the fitness of
    // generation 0 is finite, the parameters after it are not; that checkpoint is refused.
    let (cfg, out) = diverging("huge_lr", 6, "lr = 0.01", "lr = 1e38");
    has_all(
        &fails(&cfg),
        &["made the parameters non-finite", "es.lr = 1e38"],
    );
    assert!(!out.join("state.json").exists());

    // σ = 1e-45 (subnormal: XLA flushes it to zero) is refused before anything runs.
    let (cfg, out) = diverging("tiny", 6, "sigma = 0.01", "sigma = 1e-45");
    refused(
        &["run", cfg.to_str().unwrap()],
        "es.sigma = 1e-45 is too small for float32",
        "es.sigma",
    );
    assert!(!out.exists());
}

/// By default neither stdout nor stderr holds a line of XLA's own logging; `-v` shows them.
#[test]
fn plugin_logging_is_quiet_unless_verbose() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("qs");
    let text = example("quickstart.toml")
        .replace("generations = 30", "generations = 1")
        .replace(
            "out = \"runs/quickstart\"",
            &format!("out = \"{}\"", out.display()),
        );
    let cfg = write(d.path(), "quickstart.toml", &text);
    let run = |args: &[&str]| {
        bin()
            .args(args)
            .env_remove("SHARDES_LOG")
            .env_remove("TF_CPP_MIN_LOG_LEVEL")
            .env_remove("TF_CPP_MAX_VLOG_LEVEL")
            .output()
            .unwrap()
    };
    let logs = |o: &Output| {
        let all = format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        all.contains("I0000") || all.contains("absl::InitializeLog")
    };
    let o = run(&["run", cfg.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0));
    assert!(!logs(&o), "{}", String::from_utf8_lossy(&o.stderr));
    let o = run(&["-v", "run", cfg.to_str().unwrap(), "--force"]);
    assert_eq!(o.status.code(), Some(0));
    assert!(logs(&o), "{}", String::from_utf8_lossy(&o.stderr));
    let o = run(&["devices", "--devices", "2", "--verbose"]);
    assert!(logs(&o), "{}", String::from_utf8_lossy(&o.stderr));
}
