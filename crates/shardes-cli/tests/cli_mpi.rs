//! The multi-process tier (issue #17), loss runs: `shardes` built with the feature `mpi`,
//! started by Open MPI's `mpirun` on this machine, the processes talking over TCP on
//! loopback, the CPU plugin on each. Run by `.ci/mpi-tier` (after the default tier, with
//! `cli_mpi_tasks.rs`, the reward and MuJoCo runs):
//! `cargo test --release -p shardes-cli --features mpi --test cli_mpi --test cli_mpi_tasks --
//! --test-threads=1`. Without the feature this file is empty.
//!
//! It checks: the quickstart on 2 × 4 prints the trajectory of 1 × 8 (the issue's "done
//! when"); 2 × 4 and 4 × 2 give the same fitness and parameters bit for bit, for low rank
//! and seed regenerated, `how_hosts` A and B, and agree with 1 × 8 within the device-count
//! tolerance (1e-5 relative; bit for bit wherever one process's split programs have its
//! fused program's bits, as for the quickstart: here seed regenerated's generation 0 differs
//! in one member's last bit between the two on one process already); a checkpoint resumes
//! under another process count on the same trajectory; processes given different configs
//! are refused, as is `n` not divisible by processes × devices (by every process, exit 2);
//! a killed process stops the others with a non-zero exit and the last checkpoint intact;
//! SIGINT to `mpirun` checkpoints once, with Open MPI's default SIGKILL timeout and a
//! longer one; `bench` times the phases on every process. No timings are asserted.

#![cfg(feature = "mpi")]

mod common;

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::mpi::*;
use common::*;

/// The strategy of most runs here.
const LOWRANK: &str = "mirrored(lowrank(r=1))";

/// A small transformer_block run of `strategy` on `devices` devices per process.
fn config(
    out: &Path,
    devices: usize,
    strategy: &str,
    how_hosts: &str,
    generations: usize,
    checkpoint_every: usize,
) -> String {
    let es = format!("how = \"B\"\nkeep_noise_mib = 0\nhow_hosts = \"{how_hosts}\"");
    block_config(out, devices, strategy, &es, generations, checkpoint_every)
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
    for strategy in [LOWRANK, "seed_regenerated(chunk=4)"] {
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
    let s = LOWRANK;
    let reference = dir.path().join("ref");
    run_config(
        1,
        dir.path(),
        "ref.toml",
        &config(&reference, 8, s, "A", 6, 3),
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
    let s = LOWRANK;
    let adam = |c: String| c.replace("how = \"B\"", "how = \"B\"\noptimizer = \"adam\"");
    let reference = dir.path().join("ref");
    run_config(
        1,
        dir.path(),
        "ref.toml",
        &adam(config(&reference, 8, s, "B", 6, 3)),
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
    let base = config(&out, 4, LOWRANK, "A", 3, 0);
    let a = write(dir.path(), "a.toml", &base);
    let b = write(
        dir.path(),
        "b.toml",
        &base.replace("sigma = 0.01", "sigma = 0.02"),
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
    let text = config(&out, 4, LOWRANK, "A", 3, 0).replace("n = 32", "n = 40");
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
        &config(out, 4, LOWRANK, "B", 1_000_000, 2),
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
        &config(out, 8, LOWRANK, "B", generations, 2),
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
    let cfg = config(&dir.path().join("o"), 4, LOWRANK, "A", 3, 0);
    let cfg = write(dir.path(), "b.toml", &cfg);
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
