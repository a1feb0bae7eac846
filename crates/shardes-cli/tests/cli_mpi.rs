//! The multi-process tier (issue #17): `shardes` built with the feature `mpi`, started by
//! Open MPI's `mpirun` on this machine, the processes talking over TCP on loopback, the CPU
//! plugin on each. Run by `.ci/mpi-tier` (after the default tier):
//! `cargo test --release -p shardes-cli --features mpi --test cli_mpi -- --test-threads=1`.
//! Without the feature this file is empty.
//!
//! It checks: the quickstart on 2 × 4 prints the trajectory of 1 × 8 (the issue's "done
//! when"); 2 × 4 and 4 × 2 give the same fitness and parameters bit for bit, for low rank
//! and seed regenerated, `how_hosts` A and B, and agree with 1 × 8 within the device-count
//! tolerance (1e-5 relative; bit for bit wherever one process's split programs have its
//! fused program's bits, as for the quickstart: here seed regenerated's generation 0 differs
//! in one member's last bit between the two on one process already); a checkpoint resumes under another process count on the same trajectory; processes
//! given different configs are refused, as is `n` not divisible by processes × devices
//! (by every process, exit 2); a killed process stops the others with a non-zero exit and
//! the last checkpoint intact; SIGINT to `mpirun` checkpoints once, with Open MPI's default
//! SIGKILL timeout and a longer one. No timings are asserted.

#![cfg(feature = "mpi")]

mod common;

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// `mpirun -np NP shardes` on loopback: TCP between the processes (as between hosts),
/// processes not bound to cores (2 cores here, up to 4 processes), root allowed (CI).
fn mpirun(np: usize) -> Command {
    let mut c = mpirun_base();
    c.args(["-np", &np.to_string(), env!("CARGO_BIN_EXE_shardes")]);
    c
}

/// [`mpirun`]'s launcher options, without the processes.
fn mpirun_base() -> Command {
    let mut c = Command::new("mpirun");
    c.args(["--oversubscribe", "--bind-to", "none"])
        .args([
            "--mca",
            "btl",
            "self,tcp",
            "--mca",
            "btl_tcp_if_include",
            "lo",
        ])
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
    c
}

/// A small transformer_block run of `strategy` on `devices` devices per process.
fn config(
    out: &Path,
    devices: usize,
    strategy: &str,
    how_hosts: &str,
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
how = "B"
keep_noise_mib = 0
how_hosts = "{how_hosts}"
[run]
seed = 3
generations = {generations}
out = "{}"
checkpoint_every = {checkpoint_every}
"#,
        out.display()
    )
}

/// Runs `shardes run CONFIG [extra]` on `np` processes (1: without mpirun) and returns its
/// output after checking that it exited 0.
fn run(np: usize, cfg: &Path, extra: &[&str]) -> Output {
    let mut c = if np == 1 { bin() } else { mpirun(np) };
    let o = c
        .arg("run")
        .arg(cfg)
        .args(extra)
        .output()
        .expect("spawning the run");
    exited(&o, 0);
    o
}

/// The fitness of every generation (mean, min, max as logged) and the checkpoint's digest.
fn trajectory(out: &Path) -> (Vec<[f64; 3]>, String) {
    let m = metrics(out)
        .iter()
        .map(|m| [m.fitness_mean, m.fitness_min, m.fitness_max])
        .collect();
    let sha = state(out)["params_sha256"]
        .as_str()
        .expect("params_sha256")
        .to_string();
    (m, sha)
}

/// The parameters of `out`'s checkpoint, leaf by leaf.
fn params(out: &Path) -> Vec<Vec<f32>> {
    let p = shardes::io::read_params_inferred(out.join("params.safetensors")).unwrap();
    p.leaves()
        .into_iter()
        .map(|(_, a)| a.data().to_vec())
        .collect()
}

/// `‖a − b‖ / ‖b‖` of the worst leaf.
fn worst_leaf(a: &[Vec<f32>], b: &[Vec<f32>]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| {
            let d: f64 = x.iter().zip(y).map(|(u, v)| f64::from(u - v).powi(2)).sum();
            let n: f64 = y.iter().map(|v| f64::from(*v).powi(2)).sum();
            (d / n.max(f64::MIN_POSITIVE)).sqrt()
        })
        .fold(0.0, f64::max)
}

/// The `gen k/N fitness ...` lines of a run's output, without the timings.
fn trajectory_lines(o: &Output) -> Vec<String> {
    text(o)
        .0
        .lines()
        .filter(|l| l.starts_with("gen "))
        .map(|l| l.split(" | ").next().unwrap_or(l).to_string())
        .collect()
}

#[test]
fn the_quickstart_on_two_processes_prints_the_trajectory_of_one() {
    let dir = tempfile::tempdir().unwrap();
    let quick = std::fs::read_to_string(repo().join("examples/quickstart.toml")).unwrap();
    let with = |devices: &str, out: &str| {
        let body = quick
            .replace("devices = 8 ", &format!("devices = {devices} "))
            .replace("generations = 30", "generations = 5")
            .replace(
                "out = \"runs/quickstart\"",
                &format!("out = \"{}\"", dir.path().join(out).display()),
            );
        assert_ne!(body, quick);
        write(dir.path(), &format!("{out}.toml"), &body)
    };
    let one = trajectory_lines(&run(1, &with("8", "one"), &[]));
    assert_eq!(one.len(), 5);
    let two = trajectory_lines(&run(2, &with("4", "two"), &[]));
    assert_eq!(two, one);
    assert_eq!(
        trajectory(&dir.path().join("two")),
        trajectory(&dir.path().join("one"))
    );
}

#[test]
fn processes_times_devices_give_the_trajectory_of_one_process() {
    let dir = tempfile::tempdir().unwrap();
    for strategy in ["mirrored(lowrank(r=1))", "seed_regenerated(chunk=4)"] {
        let one = dir.path().join("one");
        let cfg = write(
            dir.path(),
            "one.toml",
            &config(&one, 8, strategy, "A", 3, 0),
        );
        run(1, &cfg, &["--force"]);
        let (f1, p1) = (trajectory(&one).0, params(&one));
        assert_eq!(f1.len(), 3);
        let mut first: Option<(Vec<[f64; 3]>, String)> = None;
        for (np, devices) in [(2, 4), (4, 2)] {
            for hosts in ["A", "B"] {
                let case = format!("{strategy}, {np} × {devices}, how_hosts {hosts}");
                let out = dir.path().join(format!("p{np}{hosts}"));
                let body = config(&out, devices, strategy, hosts, 3, 0);
                let cfg = write(dir.path(), "many.toml", &body);
                let o = run(np, &cfg, &["--force"]);
                let (stdout, _) = text(&o);
                // Only process 0 prints.
                assert_eq!(stdout.matches("shardes run").count(), 1, "{case}: {stdout}");
                assert!(
                    stdout.contains(&format!("processes {np} × {devices} devices")),
                    "{case}: {stdout}"
                );
                let got = trajectory(&out);
                for (g, (a, b)) in got.0.iter().zip(&f1).enumerate() {
                    for (x, y) in a.iter().zip(b) {
                        assert!((x - y).abs() <= 1e-5 * y.abs(), "{case}: generation {g}");
                    }
                }
                let d = worst_leaf(&params(&out), &p1);
                assert!(d <= 1e-5, "{case}: parameters differ from 1 × 8 by {d:e}");
                match &first {
                    None => first = Some(got),
                    Some(f) => assert_eq!(&got, f, "{case}: bit for bit as 2 × 4, how_hosts A"),
                }
            }
        }
    }
}

#[test]
fn a_checkpoint_resumes_under_another_process_count() {
    let dir = tempfile::tempdir().unwrap();
    let s = "mirrored(lowrank(r=1))";
    let reference = dir.path().join("ref");
    run(
        1,
        &write(dir.path(), "ref.toml", &config(&reference, 8, s, "A", 6, 3)),
        &[],
    );
    let want = trajectory(&reference);
    // 2 × 4 for three generations, then 1 × 8 for the other three; and 1 × 8 then 4 × 2.
    for (first, second) in [((2, 4), (1, 8)), ((1, 8), (4, 2))] {
        let out = dir.path().join(format!("r{}{}", first.0, second.0));
        let a = write(dir.path(), "a.toml", &config(&out, first.1, s, "A", 3, 3));
        run(first.0, &a, &[]);
        assert_eq!(state(&out)["generation"], 3);
        let b = write(dir.path(), "b.toml", &config(&out, second.1, s, "A", 6, 3));
        let o = run(second.0, &b, &["--resume"]);
        assert!(
            text(&o).0.contains("resuming at generation 3"),
            "{first:?} then {second:?}"
        );
        assert_eq!(trajectory(&out), want, "{first:?} then {second:?}");
    }
}

#[test]
fn adam_state_resumes_under_another_process_count() {
    // The checkpoint's optimizer state (adam's moments) reaches every process on resume:
    // a follower left with zeros would hold other parameters, which the hash comparison
    // at the end refuses. adam's step is its own program across processes, so the
    // trajectory matches one process to the device-count tolerance, 1e-5 relative.
    let dir = tempfile::tempdir().unwrap();
    let s = "mirrored(lowrank(r=1))";
    let adam = |c: String| c.replace("how = \"B\"", "how = \"B\"\noptimizer = \"adam\"");
    let reference = dir.path().join("ref");
    run(
        1,
        &write(
            dir.path(),
            "ref.toml",
            &adam(config(&reference, 8, s, "B", 6, 3)),
        ),
        &[],
    );
    let out = dir.path().join("resumed");
    let a = write(dir.path(), "a.toml", &adam(config(&out, 8, s, "B", 3, 3)));
    run(1, &a, &[]);
    let b = write(dir.path(), "b.toml", &adam(config(&out, 4, s, "B", 6, 3)));
    let o = run(2, &b, &["--resume"]);
    assert!(text(&o).0.contains("resuming at generation 3"));
    assert_eq!(state(&out)["generation"], 6);
    let diff = worst_leaf(&params(&out), &params(&reference));
    assert!(
        diff <= 1e-5,
        "parameters after resuming adam under 2 × 4: {diff:e}"
    );
    let (got, want) = (trajectory(&out).0, trajectory(&reference).0);
    for (g, (x, y)) in got.iter().zip(&want).enumerate() {
        for (u, v) in x.iter().zip(y) {
            assert!(
                (u - v).abs() <= 1e-5 * v.abs().max(1.0),
                "generation {g}: {x:?} vs {y:?}"
            );
        }
    }
}

#[test]
fn processes_given_different_configs_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let a = write(
        dir.path(),
        "a.toml",
        &config(&out, 4, "mirrored(lowrank(r=1))", "A", 3, 0),
    );
    let b = write(
        dir.path(),
        "b.toml",
        &config(&out, 4, "mirrored(lowrank(r=1))", "A", 3, 0)
            .replace("sigma = 0.01", "sigma = 0.02"),
    );
    // One process with each config (mpirun's MPMD form).
    let mut c = mpirun(1);
    c.arg("run")
        .arg(&a)
        .arg(":")
        .args(["-np", "1", env!("CARGO_BIN_EXE_shardes")]);
    let o = c.arg("run").arg(&b).output().expect("spawning mpirun");
    let (_, stderr) = exited(&o, 2);
    for rank in [0, 1] {
        let line = format!("error: process {rank}: the processes disagree on the config");
        assert!(stderr.contains(&line), "no {line:?} in {stderr}");
    }
    assert!(
        stderr.contains("hint: start every process with the same config"),
        "{stderr}"
    );
    assert!(!out.exists(), "nothing written");
}

#[test]
fn a_population_that_does_not_split_is_refused_by_every_process() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    // 40 members: a multiple of 4 devices × pairing 2, not of 2 processes × 4 × 2.
    let text = config(&out, 4, "mirrored(lowrank(r=1))", "A", 3, 0).replace("n = 32", "n = 40");
    let cfg = write(dir.path(), "c.toml", &text);
    let o = mpirun(2)
        .arg("run")
        .arg(&cfg)
        .output()
        .expect("spawning mpirun");
    let (_, stderr) = exited(&o, 2);
    for rank in [0, 1] {
        let line = format!(
            "error: process {rank} of 2: es.n = 40 is not divisible by processes (2) × devices \
             (4) × pairing (2 for mirrored(lowrank(r=1)))"
        );
        assert!(stderr.contains(&line), "no {line:?} in {stderr}");
    }
    assert!(
        stderr.contains("hint: set es.n to a multiple of 16, e.g. 32 or 48"),
        "{stderr}"
    );
    assert!(!out.exists(), "nothing written");
}

/// The config of a long run of 4 devices per process writing a checkpoint every 2
/// generations.
fn long_config(dir: &Path, out: &Path) -> std::path::PathBuf {
    write(
        dir,
        "long.toml",
        &config(out, 4, "mirrored(lowrank(r=1))", "B", 1_000_000, 2),
    )
}

/// `c` started with its output piped.
fn spawn_piped(c: &mut Command) -> Child {
    c.stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning mpirun")
}

/// A long run of 2 × 4 processes writing a checkpoint every 2 generations, started.
fn long_run(dir: &Path, out: &Path) -> Child {
    spawn_piped(mpirun(2).arg("run").arg(long_config(dir, out)))
}

/// The pids of `mpirun`'s children that are MPI rank `rank` (from their environment).
fn rank_pid(mpirun: u32, rank: usize) -> Option<i32> {
    let want = format!("OMPI_COMM_WORLD_RANK={rank}");
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: i32 = e.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // The parent pid is the fourth field, after the parenthesized command name.
        let ppid: u32 = stat
            .rsplit(')')
            .next()?
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()?;
        let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
        let env = String::from_utf8_lossy(&env);
        (ppid == mpirun && env.split('\0').any(|v| v == want)).then_some(pid)
    })
}

/// Waits up to `limit` for `child` to exit.
fn wait_at_most(child: &mut Child, limit: Duration) -> std::process::ExitStatus {
    let t0 = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("waiting") {
            return status;
        }
        assert!(t0.elapsed() < limit, "mpirun still runs after {limit:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits up to 60 s for process `pid` to be gone (or a zombie nobody reaps).
fn gone(pid: i32) {
    let t0 = Instant::now();
    loop {
        let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok();
        let alive = state.is_some_and(|s| {
            s.rsplit(')')
                .next()
                .and_then(|r| r.split_whitespace().next())
                != Some("Z")
        });
        if !alive {
            return;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "process {pid} still runs"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The config of `out`'s run on one process with all 8 devices, for `generations`.
fn one_process_resume(dir: &Path, out: &Path, generations: usize) -> std::path::PathBuf {
    write(
        dir,
        "resume.toml",
        &config(out, 8, "mirrored(lowrank(r=1))", "B", generations, 2),
    )
}

#[test]
fn a_killed_process_stops_the_others_and_the_last_checkpoint_is_intact() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let mut child = long_run(dir.path(), &out);
    wait_until(&mut child, "two checkpoints", || {
        std::fs::read_to_string(out.join("state.json"))
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
            .and_then(|s| s["generation"].as_u64())
            .is_some_and(|g| g >= 4)
    });
    let victim = rank_pid(child.id(), 1).expect("rank 1's pid");
    let lead = rank_pid(child.id(), 0).expect("rank 0's pid");
    // SAFETY: a plain kill(2) of a process this test started (through mpirun).
    assert_eq!(unsafe { libc::kill(victim, libc::SIGKILL) }, 0);
    let status = wait_at_most(&mut child, Duration::from_secs(120));
    assert!(!status.success(), "mpirun exited {status}");
    gone(lead);
    // The checkpoint on disk verifies (its sha256, its pair) and continues.
    let g = state(&out)["generation"].as_u64().expect("generation") as usize;
    let cfg = one_process_resume(dir.path(), &out, g + 1);
    let o = run(1, &cfg, &["--resume"]);
    assert!(text(&o).0.contains(&format!("resuming at generation {g}")));
    assert_eq!(state(&out)["generation"].as_u64(), Some(g as u64 + 1));
}

/// `mpirun -np 2` of [`long_run`]'s config with the launcher options `launcher` (MCA
/// settings), each process started by a shell that records its exit code in `codes`
/// (`rank R exit C`, one line per process). The shell only waits: it ignores the stop
/// signals, which reach it with its process (the group mpirun signals), and it is
/// `mpirun`'s child, so `rank_pid` finds it.
fn long_run_recorded(dir: &Path, out: &Path, codes: &Path, launcher: &[&str]) -> Child {
    let record = format!(
        "trap : INT TERM HUP; \"$0\" \"$@\"; c=$?; echo \"rank $OMPI_COMM_WORLD_RANK exit $c\" >> '{}'",
        codes.display()
    );
    spawn_piped(
        mpirun_base()
            .args(launcher)
            .args([
                "-np",
                "2",
                "sh",
                "-c",
                &record,
                env!("CARGO_BIN_EXE_shardes"),
            ])
            .arg("run")
            .arg(long_config(dir, out)),
    )
}

/// Reads `child`'s stdout and stderr on threads of their own; returns a channel of the
/// stdout lines as they come and the threads, which return everything read.
fn read_output(
    child: &mut Child,
) -> (
    std::sync::mpsc::Receiver<String>,
    [std::thread::JoinHandle<String>; 2],
) {
    use std::io::{BufRead, Read};
    let (tx, rx) = std::sync::mpsc::channel();
    let stdout = child.stdout.take().expect("piped stdout");
    let mut stderr = child.stderr.take().expect("piped stderr");
    let out = std::thread::spawn(move || {
        let mut all = String::new();
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            all.push_str(&line);
            all.push('\n');
            let _ = tx.send(line);
        }
        all
    });
    let err = std::thread::spawn(move || {
        let mut all = String::new();
        let _ = stderr.read_to_string(&mut all);
        all
    });
    (rx, [out, err])
}

/// Ctrl-C on `mpirun` (SIGINT to it) once the run prints its first generation, with the
/// launcher options `launcher`. Open MPI 4.1 answers with SIGCONT to the processes, then
/// after `odls_base_sigkill_timeout` seconds SIGTERM, then after as long again SIGKILL
/// (cut short when a process exits), and reads none of their output meanwhile. Checks
/// that the processes stop once (one SIGTERM each, no second signal), after the same
/// generation, the lead writing the checkpoint of that generation, that every recorded
/// exit code is 143 (and, with `all_codes`, that both processes recorded one: with the
/// default timeout of 1 s the first process's exit makes mpirun kill the other at once,
/// which may beat its shell to recording it), that mpirun exits and the checkpoint
/// resumes.
fn sigint_to_mpirun(launcher: &[&str], all_codes: bool) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let codes = dir.path().join("codes");
    let mut child = long_run_recorded(dir.path(), &out, &codes, launcher);
    let (lines, [stdout, stderr]) = read_output(&mut child);
    let t0 = Instant::now();
    loop {
        match lines.recv_timeout(Duration::from_secs(1)) {
            Ok(l) if l.starts_with("gen ") => break,
            Ok(_) | Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                let _ = child.kill();
                panic!(
                    "mpirun ended before its first generation: {}",
                    stderr.join().unwrap_or_default()
                );
            }
        }
        assert!(
            t0.elapsed() < Duration::from_secs(300),
            "no generation in 300 s"
        );
    }
    let ranks = [0, 1].map(|r| rank_pid(child.id(), r).expect("the processes' pids"));
    let pid = i32::try_from(child.id()).expect("pid");
    // SAFETY: a plain kill(2) of the mpirun this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGINT) }, 0);
    let status = wait_at_most(&mut child, Duration::from_secs(240));
    drop(lines);
    let (stdout, stderr) = (stdout.join().unwrap(), stderr.join().unwrap());
    let all = format!("stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(!status.success(), "mpirun exited {status}");
    ranks.into_iter().for_each(gone);
    // One SIGTERM per process, and no second signal: one stop.
    assert_eq!(
        stderr
            .matches("SIGTERM: finishing this generation and writing a checkpoint")
            .count(),
        2,
        "{all}"
    );
    assert!(!stderr.contains("quitting now"), "{all}");
    // The lead's report goes to stderr under mpirun (stdout is not read while it stops
    // the job), once.
    assert_eq!(
        stderr
            .matches("interrupted: checkpoint at generation")
            .count(),
        1,
        "{all}"
    );
    let g = state(&out)["generation"].as_u64().expect("generation");
    assert!(
        stderr.contains(&format!("interrupted: checkpoint at generation {g} in")),
        "{all}"
    );
    assert!(g >= 1, "{all}");
    assert_eq!(
        metrics(&out).len() as u64,
        g,
        "one metrics line per generation run, the checkpoint at the last: {all}"
    );
    let recorded = std::fs::read_to_string(&codes).unwrap_or_default();
    let mut seen: Vec<&str> = recorded.lines().collect();
    seen.sort_unstable();
    for line in &seen {
        assert!(line.ends_with(" exit 143"), "{recorded}\n{all}");
    }
    if all_codes {
        assert_eq!(seen, ["rank 0 exit 143", "rank 1 exit 143"], "{all}");
    }
    let cfg = one_process_resume(dir.path(), &out, g as usize + 1);
    let o = run(1, &cfg, &["--resume"]);
    assert!(text(&o).0.contains(&format!("resuming at generation {g}")));
    assert_eq!(state(&out)["generation"].as_u64(), Some(g + 1));
}

#[test]
fn sigint_to_mpirun_checkpoints_once() {
    sigint_to_mpirun(&[], false);
}

#[test]
fn sigint_to_mpirun_with_a_longer_sigkill_timeout_checkpoints_once_and_every_process_exits_143() {
    // 3 s: the processes get SIGTERM 3 s after the Ctrl-C and mpirun waits up to 3 s more,
    // each process's exit shortening that by less than a second, so that both exit
    // before the SIGKILL.
    sigint_to_mpirun(&["--mca", "odls_base_sigkill_timeout", "3"], true);
}

#[test]
fn bench_under_mpirun_times_the_phases_on_every_process() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write(
        dir.path(),
        "b.toml",
        &config(
            &dir.path().join("o"),
            4,
            "mirrored(lowrank(r=1))",
            "A",
            3,
            0,
        ),
    );
    let o = mpirun(2)
        .args(["bench"])
        .arg(&cfg)
        .args(["--how-hosts", "AB", "--generations", "2", "--warmup", "1"])
        .output()
        .expect("spawning mpirun");
    let (stdout, _) = exited(&o, 0);
    assert_eq!(
        stdout.matches("processes=2 × devices=4").count(),
        1,
        "{stdout}"
    );
    for phase in [
        "local evaluation",
        "fitness gather",
        "update exchange",
        "rest",
    ] {
        assert_eq!(stdout.matches(phase).count(), 2, "{phase} in {stdout}");
    }
    // 16 members of 4 bytes to the other process; B sends its partial sums too.
    assert!(stdout.contains("fitness 64 B, update 0 B"), "{stdout}");
}

/// A reward run (`[task]` target_token on the tiny random Qwen2) on `devices` devices per
/// process, with `es` lines added under [es].
fn reward_config(out: &Path, devices: usize, es: &str, generations: usize) -> String {
    format!(
        r#"devices = {devices}
[problem]
name = "qwen2"
size = "tiny"
[es]
strategy = "mirrored(lowrank(r=1))"
n = 32
sigma = 0.05
lr = 0.05
shaping = "centered_ranks"
how = "B"
{es}
[task]
name = "target_token"
token = 7
prompts = 2
prompt_tokens = 4
prompt_len = 4
max_new_tokens = 6
[eval]
every = 2
prompts = 4
[run]
seed = 0
generations = {generations}
out = "{}"
checkpoint_every = 2
"#,
        out.display()
    )
}

/// Every metrics line without its timings: `ms` and the `extra` scalars `timed`.
fn untimed_metrics(out: &Path, timed: &[&str]) -> Vec<serde_json::Value> {
    std::fs::read_to_string(out.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
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
    run(
        1,
        &write(dir.path(), "one.toml", &reward_config(&one, 8, "", 4)),
        &[],
    );
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
    run(
        1,
        &write(
            dir.path(),
            "a1.toml",
            &reward_config(&reference, 8, adam, 4),
        ),
        &[],
    );
    let out = dir.path().join("adam2");
    run(
        2,
        &write(dir.path(), "a2.toml", &reward_config(&out, 4, adam, 2)),
        &[],
    );
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
    format!(
        r#"devices = {devices}
[problem]
name = "control"
mjcf = "{}"
episodes = 2
episode_length = 60
hidden = [8]
[es]
strategy = "mirrored(lowrank(r=1))"
n = 32
sigma = 0.1
lr = 0.3
how = "B"
{es}
[run]
seed = 0
generations = 3
out = "{}"
checkpoint_every = 0
"#,
        repo().join("examples/mujoco/cartpole.xml").display(),
        out.display()
    )
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
        run(
            1,
            &write(dir.path(), "one.toml", &mujoco_config(&one, 8, &es)),
            &[],
        );
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
            let cfg = write(dir.path(), "two.toml", &mujoco_config(&out, 4, &es));
            let o = run(2, &cfg, &[]);
            let (stdout, _) = text(&o);
            assert_eq!(stdout.matches("shardes run").count(), 1, "{case}: {stdout}");
            assert!(
                stdout.contains("processes 2 × 4 devices"),
                "{case}: {stdout}"
            );
            assert!(stdout.contains("(MuJoCo, 2 episodes"), "{case}: {stdout}");
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
[es]
strategy = "mirrored(lowrank(r=1))"
n = 16
sigma = 0.05
lr = 0.05
shaping = "centered_ranks"
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
    let (log_one, log_two) = (dir.path().join("log1"), dir.path().join("log2"));
    std::fs::create_dir_all(&log_one).unwrap();
    std::fs::create_dir_all(&log_two).unwrap();
    let one = dir.path().join("one");
    run(
        1,
        &write(
            dir.path(),
            "one.toml",
            &reward_command_config(&one, 8, &log_one),
        ),
        &[],
    );
    let two = dir.path().join("two");
    run(
        2,
        &write(
            dir.path(),
            "two.toml",
            &reward_command_config(&two, 4, &log_two),
        ),
        &[],
    );
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
