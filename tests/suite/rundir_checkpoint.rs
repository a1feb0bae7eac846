//! Checkpoints of `shardes::rundir` are atomic as a pair: a write that fails or crashes at
//! any step leaves the previous pair or the new one (bit-identical parameters), never an
//! error, and the next open removes what the write left behind. Reading back names the file
//! and the cause of every kind of damage.
//!
//! The crate's dev-dependency on itself turns on the `failpoints` feature, so the failpoint
//! test runs in the default `cargo test`. Failpoints are global to the process: every test
//! here that writes a checkpoint holds `SERIAL`.

use std::collections::BTreeSet;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use shardes::hlo::params::{Array, ParamTree};
use shardes::rundir::checkpoint::{self, FAILPOINTS, STATE_RENAMED};
use shardes::rundir::layout::generation_file;
use shardes::rundir::{Metric, Mode, RunDir, RunDirError, State};

const HASH: &str = "00112233445566778899aabbccddeeff";
const KEY: [u32; 2] = [0, 7];
const CHILD: &str = "SHARDES_RUNDIR_TEST_CHILD";

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Parameters that differ in every leaf from one generation to the next: a map with a list
/// inside, so the Hugging Face style dotted names (`layers.0.wq`) are exercised too.
fn tree(generation: u32, rows: usize) -> ParamTree {
    let leaf = |salt: f32, shape: Vec<usize>| {
        let n: usize = shape.iter().product();
        let data = (0..n)
            .map(|i| generation as f32 * 1000.0 + salt + i as f32 * 1e-3)
            .collect();
        ParamTree::Leaf(Array::new(shape, data).unwrap())
    };
    ParamTree::map([
        ("embed", leaf(0.5, vec![rows, 4])),
        (
            "layers",
            ParamTree::List(vec![
                ParamTree::map([("wq", leaf(1.5, vec![4, 4]))]),
                ParamTree::map([("wq", leaf(2.5, vec![4, 4]))]),
            ]),
        ),
    ])
}

fn bits(t: &ParamTree) -> Vec<(String, Vec<u32>)> {
    t.leaves()
        .into_iter()
        .map(|(p, a)| (p, a.data().iter().map(|v| v.to_bits()).collect()))
        .collect()
}

fn fresh(out: &Path) -> RunDir {
    RunDir::prepare(out, Mode::Fresh { force: false }, HASH)
        .unwrap()
        .commit()
        .unwrap()
}

fn resume(out: &Path) -> RunDir {
    RunDir::prepare(out, Mode::Resume, HASH)
        .unwrap()
        .commit()
        .unwrap()
}

fn listing(out: &Path) -> BTreeSet<String> {
    std::fs::read_dir(out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

/// After an open's commit: exactly our files, the committed pair, and `params.safetensors`
/// holding the committed parameters.
fn assert_clean(out: &Path, state: &State, context: &str) {
    let expected: BTreeSet<String> = [
        ".lock",
        ".shardes-run",
        "metrics.jsonl",
        "params.safetensors",
        "state.json",
        state.params_file.as_str(),
    ]
    .into_iter()
    .map(String::from)
    .collect();
    assert_eq!(listing(out), expected, "{context}");
    assert_eq!(
        std::fs::read(out.join("params.safetensors")).unwrap(),
        std::fs::read(out.join(&state.params_file)).unwrap(),
        "{context}: params.safetensors is not the committed file"
    );
}

#[test]
fn failpoints_are_compiled_into_the_tests() {
    assert!(
        fail::has_failpoints(),
        "the dev-dependency on shardes with features = [\"failpoints\"] did not take effect"
    );
}

#[test]
fn checkpoints_write_and_read_back() {
    let _g = serial();
    let (dir, out) = crate::support::out_dir();
    let mut rd = fresh(&out);
    assert!(rd.committed().is_none());
    let st = rd
        .write_checkpoint(
            KEY,
            5,
            &tree(5, 8),
            Some(serde_json::json!({"opt": "adam.bin"})),
        )
        .unwrap()
        .clone();
    assert_eq!(st.generation, 5);
    assert_eq!(st.params_file, generation_file(5, &st.params_sha256));
    assert_clean(&out, &st, "after one write");
    // The user-facing file loads with the usual reader, under the tree's names.
    let p = shardes::io::read_params_inferred(out.join("params.safetensors")).unwrap();
    assert_eq!(bits(&p), bits(&tree(5, 8)));
    // Byte for byte what `io::write_params` writes.
    shardes::io::write_params(dir.path().join("w.safetensors"), &tree(5, 8)).unwrap();
    assert_eq!(
        std::fs::read(dir.path().join("w.safetensors")).unwrap(),
        std::fs::read(out.join("params.safetensors")).unwrap()
    );
    // The same generation again (a final checkpoint right after a periodic one).
    rd.write_checkpoint(KEY, 5, &tree(5, 8), None).unwrap();
    let st6 = rd
        .write_checkpoint(KEY, 6, &tree(6, 8), None)
        .unwrap()
        .clone();
    assert_clean(&out, &st6, "after three writes");
    drop(rd);

    let text = std::fs::read_to_string(out.join("state.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["generation"], 6);
    assert_eq!(v["key"], serde_json::json!([0, 7]));
    assert_eq!(v["config_hash"], HASH);
    assert!(v.get("extra").is_none());

    let prep = RunDir::prepare(&out, Mode::Resume, HASH).unwrap();
    let cp = prep.checkpoint().unwrap();
    assert_eq!(cp.state(), &st6);
    assert_eq!(bits(&cp.params(&tree(0, 8)).unwrap()), bits(&tree(6, 8)));
    // Another model's template is a load error naming the tensor, not corruption.
    let e = cp.params(&tree(0, 9)).unwrap_err();
    assert!(matches!(e, RunDirError::ParamsLoad { .. }), "{e}");
    assert!(e.to_string().contains("embed"), "{e}");
}

/// Every failpoint, as an error and as a panic: the reopened directory holds the previous
/// pair (failures before the commit point) or the new one (after), bit-identical, and is
/// clean after the open; writing goes on from there.
#[test]
fn every_failpoint_leaves_the_previous_or_the_new_pair() {
    let _g = serial();
    let commit_at = FAILPOINTS.iter().position(|&f| f == STATE_RENAMED).unwrap();
    for (i, fp) in FAILPOINTS.iter().enumerate() {
        for action in ["return", "panic"] {
            let context = format!("failpoint {fp} ({action})");
            let (_dir, out) = crate::support::out_dir();
            {
                let mut rd = fresh(&out);
                rd.write_checkpoint(KEY, 1, &tree(1, 64), None).unwrap();
                rd.write_checkpoint(KEY, 2, &tree(2, 64), None).unwrap();
            }
            let expected = if i >= commit_at { 3 } else { 2 };
            {
                let mut rd = resume(&out);
                fail::cfg(*fp, action).unwrap();
                let hook = std::panic::take_hook();
                std::panic::set_hook(Box::new(|_| {}));
                let result = catch_unwind(AssertUnwindSafe(|| {
                    rd.write_checkpoint(KEY, 3, &tree(3, 64), None)
                        .map(|s| s.generation)
                }));
                std::panic::set_hook(hook);
                fail::remove(*fp);
                match (action, result) {
                    ("return", Ok(Err(e))) => {
                        assert!(e.to_string().contains(fp), "{context}: {e}");
                        assert!(!e.is_user_error(), "{context}");
                        // The handle knows which pair is on disk.
                        assert_eq!(rd.committed().unwrap().generation, expected, "{context}");
                    }
                    ("panic", Err(_)) => {}
                    (_, other) => panic!("{context}: the write did not fail: {other:?}"),
                }
            }
            let prep = RunDir::prepare(&out, Mode::Resume, HASH)
                .unwrap_or_else(|e| panic!("{context}: reopening failed: {e}"));
            let cp = prep.checkpoint().unwrap();
            assert_eq!(cp.state().generation, expected, "{context}");
            assert_eq!(
                bits(&cp.params_inferred().unwrap()),
                bits(&tree(expected, 64)),
                "{context}: parameters are not those of generation {expected}"
            );
            let mut rd = prep.commit().unwrap();
            let st = rd.committed().unwrap().clone();
            assert_clean(&out, &st, &context);
            let st4 = rd
                .write_checkpoint(KEY, 4, &tree(4, 64), None)
                .unwrap()
                .clone();
            assert_clean(&out, &st4, &context);
        }
    }
}

/// A child process writes checkpoints in a loop and is killed with SIGKILL at random
/// moments; each time the directory reopens to a valid pair whose parameters are exactly
/// those of its generation, and the metrics hold exactly the generations before it.
#[test]
fn kill_9_while_checkpointing_leaves_a_valid_pair() {
    if let Some(out) = std::env::var_os(CHILD) {
        child_checkpoints_forever(Path::new(&out));
        return;
    }
    let _g = serial();
    let (_dir, out) = crate::support::out_dir();
    let seed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .subsec_nanos() as u64
        | 1;
    let mut rng = seed;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut last = 0u32;
    for round in 0..8 {
        let context = format!("round {round} (seed {seed})");
        let mut child = crate::support::this_test_as_child(
            "rundir_checkpoint::kill_9_while_checkpointing_leaves_a_valid_pair",
            CHILD,
            &out,
        )
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
        // Wait for a checkpoint past the last round's, then kill somewhere in the next.
        let t0 = Instant::now();
        loop {
            if let Ok(Some(s)) = checkpoint::read_state(&out) {
                if s.generation > last {
                    break;
                }
            }
            if let Ok(Some(status)) = child.try_wait() {
                panic!("{context}: the child exited: {status}");
            }
            assert!(
                t0.elapsed() < Duration::from_secs(120),
                "{context}: no progress"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
        std::thread::sleep(Duration::from_micros(next() % 60_000));
        child.kill().unwrap();
        child.wait().unwrap();

        let prep = RunDir::prepare(&out, Mode::Resume, HASH)
            .unwrap_or_else(|e| panic!("{context}: reopening failed: {e}"));
        let cp = prep.checkpoint().unwrap();
        let g = cp.state().generation;
        assert!(g > last, "{context}");
        assert_eq!(
            bits(&cp.params_inferred().unwrap()),
            bits(&big_tree(g)),
            "{context}: generation {g}"
        );
        let rd = prep.commit().unwrap();
        eprintln!(
            "{context}: generation {g}, removed {:?}",
            rd.report().removed
        );
        let st = rd.committed().unwrap().clone();
        assert_clean(&out, &st, &context);
        let log = shardes::rundir::read_metrics(&out.join("metrics.jsonl")).unwrap();
        assert!(
            log.bad.is_empty() && log.torn.is_none(),
            "{context}: {log:?}"
        );
        let gens: Vec<u32> = log.records.iter().map(|(m, _)| m.generation).collect();
        assert_eq!(gens, (0..g).collect::<Vec<_>>(), "{context}");
        last = g;
    }
}

/// 1 Mi floats (4 MiB): large enough that a kill often lands inside a write.
fn big_tree(generation: u32) -> ParamTree {
    tree(generation, 1 << 18)
}

fn child_checkpoints_forever(out: &Path) {
    let mode = if out.join("state.json").exists() {
        Mode::Resume
    } else {
        Mode::Fresh { force: false }
    };
    let prep = RunDir::prepare(out, mode, HASH).unwrap();
    let start = prep.checkpoint().map_or(0, |c| c.state().generation);
    let mut rd = prep.commit().unwrap();
    let mut metrics = rd.metrics_writer().unwrap();
    for g in start.. {
        metrics
            .append(&Metric {
                generation: g,
                fitness_mean: f64::from(g),
                fitness_min: f64::NAN,
                fitness_max: f64::INFINITY,
                ms: 1.0,
                extra: Default::default(),
            })
            .unwrap();
        rd.write_checkpoint(KEY, g + 1, &big_tree(g + 1), None)
            .unwrap();
    }
}

/// A checkpoint of generation 3 in a fresh temp dir, the directory unlocked.
fn written() -> (tempfile::TempDir, PathBuf, State) {
    let (dir, out) = crate::support::out_dir();
    let mut rd = fresh(&out);
    let st = rd
        .write_checkpoint(KEY, 3, &tree(3, 8), None)
        .unwrap()
        .clone();
    (dir, out, st)
}

fn resume_error(out: &Path) -> RunDirError {
    RunDir::prepare(out, Mode::Resume, HASH).unwrap_err()
}

#[test]
fn damage_is_named_and_never_blamed_on_a_kill() {
    let _g = serial();

    // Unparseable state.json: the file, the parser's line and column, and --force.
    let (_d, out, _) = written();
    std::fs::write(out.join("state.json"), "{\"key\": [0, 7], \"generation\": ").unwrap();
    let e = resume_error(&out);
    assert!(matches!(e, RunDirError::CorruptState { .. }), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("state.json") && msg.contains("line 1"),
        "{msg}"
    );
    assert!(e.hint().contains("--force"), "{}", e.hint());
    // A fresh start with force recovers, moving the damaged run aside.
    let prep = RunDir::prepare(&out, Mode::Fresh { force: true }, HASH).unwrap();
    let rd = prep.commit().unwrap();
    assert!(rd.committed().is_none());
    assert!(out.join("previous/state.json").exists());
    assert!(!out.join("state.json").exists());
    drop(rd);

    // A state naming a file outside the directory is refused before anything reads it.
    let (_d, out, st) = written();
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("state.json")).unwrap()).unwrap();
    v["params_file"] = "../../etc/passwd".into();
    std::fs::write(out.join("state.json"), v.to_string()).unwrap();
    let e = resume_error(&out);
    assert!(matches!(e, RunDirError::CorruptState { .. }), "{e}");
    assert!(e.to_string().contains("../../etc/passwd"), "{e}");
    drop(st);

    // The parameter file is missing.
    let (_d, out, st) = written();
    std::fs::remove_file(out.join(&st.params_file)).unwrap();
    let e = resume_error(&out);
    assert!(matches!(e, RunDirError::ParamsMissing { .. }), "{e}");
    assert!(e.to_string().contains(&st.params_file), "{e}");

    // One flipped byte: a hash mismatch that names the file and does not blame a kill.
    let (_d, out, st) = written();
    let p = out.join(&st.params_file);
    let mut bytes = std::fs::read(&p).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    // Replace (not modify in place): params.safetensors is a hard link to the same file.
    std::fs::remove_file(&p).unwrap();
    std::fs::write(&p, &bytes).unwrap();
    let e = resume_error(&out);
    assert!(
        matches!(e, RunDirError::ParamsMismatch { legacy: false, .. }),
        "{e}"
    );
    let msg = e.to_string();
    assert!(
        msg.contains(&st.params_file) && msg.contains("changed or damaged"),
        "{msg}"
    );
    assert!(!msg.contains("stopped"), "{msg}");

    // A truncated file whose hash state.json records (it was written from a damaged file):
    // reported as a bad safetensors file, once.
    let (_d, out, _) = written();
    let junk = b"\x08\x00\x00\x00\x00\x00\x00\x00{}".to_vec();
    let sha: String = {
        use sha2::Digest;
        sha2::Sha256::digest(&junk)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    };
    let name = generation_file(9, &sha);
    std::fs::write(out.join(&name), &junk).unwrap();
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("state.json")).unwrap()).unwrap();
    v["params_file"] = name.clone().into();
    v["params_sha256"] = sha.into();
    std::fs::write(out.join("state.json"), v.to_string()).unwrap();
    let e = resume_error(&out);
    assert!(matches!(e, RunDirError::ParamsCorrupt { .. }), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains(&name) && msg.contains("not a valid safetensors"),
        "{msg}"
    );
}

/// A directory written by the CLI before pair-atomic checkpoints (`state.json` without
/// `params_file`, the parameters in `params.safetensors`) resumes, and its next checkpoint is
/// written the new way.
#[test]
fn state_of_the_earlier_format_resumes() {
    let _g = serial();
    let (_dir, out) = crate::support::out_dir();
    std::fs::create_dir_all(&out).unwrap();
    shardes::io::write_params(out.join("params.safetensors"), &tree(4, 8)).unwrap();
    let sha: String = {
        use sha2::Digest;
        sha2::Sha256::digest(std::fs::read(out.join("params.safetensors")).unwrap())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    };
    let legacy = format!(
        "{{\n  \"key\": [0, 7],\n  \"generation\": 4,\n  \"config_hash\": \"{HASH}\",\n  \
         \"params_sha256\": \"{sha}\"\n}}"
    );
    std::fs::write(out.join("state.json"), &legacy).unwrap();
    let line = |g: u32| {
        format!(
            "{{\"generation\":{g},\"fitness_mean\":1.0,\"fitness_min\":0.5,\"fitness_max\":2.0,\
             \"ms\":3.0}}\n"
        )
    };
    std::fs::write(
        out.join("metrics.jsonl"),
        (0..6).map(line).collect::<String>(),
    )
    .unwrap();

    let prep = RunDir::prepare(&out, Mode::Resume, HASH).unwrap();
    let cp = prep.checkpoint().unwrap();
    assert_eq!(cp.state().params_file, "params.safetensors");
    assert_eq!(bits(&cp.params(&tree(0, 8)).unwrap()), bits(&tree(4, 8)));
    let mut rd = prep.commit().unwrap();
    assert_eq!(rd.report().metrics.as_ref().unwrap().kept, 4);
    assert_eq!(rd.report().metrics.as_ref().unwrap().dropped, 2);
    assert!(out.join(".shardes-run").exists());
    let st = rd
        .write_checkpoint(KEY, 5, &tree(5, 8), None)
        .unwrap()
        .clone();
    assert_clean(&out, &st, "after the first new-format checkpoint");

    // A mismatch in a state of the earlier format may be the old writer's window.
    std::fs::write(out.join("state.json"), &legacy).unwrap();
    drop(rd);
    let e = resume_error(&out);
    assert!(
        matches!(e, RunDirError::ParamsMismatch { legacy: true, .. }),
        "{e}"
    );
    assert!(e.to_string().contains("stopped between"), "{e}");
}
