//! The out directory of `shardes::rundir`: its lock (in one process and across processes),
//! the two-phase start (a refused or abandoned start changes nothing; a fresh start never
//! destroys a run without force; force recovers from anything) and `metrics.jsonl` (valid
//! JSON for NaN and infinities, truncation on resume, torn and damaged lines).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::Stdio;

use shardes::hlo::params::{Array, ParamTree};
use shardes::rundir::{
    read_checkpoint, read_metrics, truncate_metrics, Metric, MetricsWriter, Mode, RunDir,
    RunDirError,
};

const HASH: &str = "00112233445566778899aabbccddeeff";
const OTHER: &str = "ffeeddccbbaa99887766554433221100";
const CHILD: &str = "SHARDES_RUNDIR_LOCK_CHILD";

fn tree(v: f32) -> ParamTree {
    ParamTree::map([(
        "w",
        ParamTree::Leaf(Array::new(vec![2, 3], vec![v; 6]).unwrap()),
    )])
}

fn metric(generation: u32) -> Metric {
    Metric {
        generation,
        fitness_mean: 1.0 + f64::from(generation),
        fitness_min: 0.5,
        fitness_max: 2.5,
        ms: 10.0,
        extra: BTreeMap::new(),
    }
}

/// Every file under `dir` (recursively) with its bytes; `.lock` left out.
fn snapshot(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    fn go(root: &Path, dir: &Path, out: &mut BTreeMap<String, Vec<u8>>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            if p.is_dir() {
                out.insert(format!("{rel}/"), Vec::new());
                go(root, &p, out);
            } else if rel != ".lock" {
                out.insert(rel, std::fs::read(&p).unwrap());
            }
        }
    }
    let mut out = BTreeMap::new();
    go(dir, dir, &mut out);
    out
}

/// A finished run of `HASH`: checkpoint at generation 2, two metrics lines.
/// A fresh run under `out`, committed, with the test hash.
fn fresh(out: &Path) -> RunDir {
    RunDir::prepare(out, Mode::Fresh { force: false }, HASH)
        .unwrap()
        .commit()
        .unwrap()
}

fn finished_run(out: &Path) {
    let mut rd = fresh(out);
    rd.write_config("[run]\nseed = 3\n").unwrap();
    let mut m = rd.metrics_writer().unwrap();
    m.append(&metric(0)).unwrap();
    m.append(&metric(1)).unwrap();
    rd.write_checkpoint([0, 3], 2, &tree(2.0), None).unwrap();
}

fn refused(out: &Path, mode: Mode, hash: &str) -> RunDirError {
    let before = snapshot(out);
    let e = RunDir::prepare(out, mode, hash).unwrap_err();
    assert_eq!(
        snapshot(out),
        before,
        "a refused start changed {}",
        out.display()
    );
    assert!(!out.join(".lock").exists(), "a refused start left its lock");
    e
}

#[test]
fn two_opens_in_one_process_conflict() {
    let (dir, out) = crate::support::out_dir();
    let rd = fresh(&out);
    for mode in [Mode::Fresh { force: true }, Mode::Resume] {
        let e = RunDir::prepare(&out, mode, HASH).unwrap_err();
        let RunDirError::Locked { dir: d, holder } = &e else {
            panic!("expected Locked, got {e}");
        };
        assert_eq!(d, &out);
        assert_eq!(holder.pid, Some(std::process::id()));
        let msg = e.to_string();
        assert!(
            msg.contains(&format!(
                "{} is in use by another shardes run (pid {}",
                out.display(),
                std::process::id()
            )),
            "{msg}"
        );
        assert!(e.hint().contains("choose another run.out"), "{}", e.hint());
    }
    // A prepared (not yet committed) start holds the lock too.
    drop(rd);
    let p = RunDir::prepare(&out, Mode::Fresh { force: false }, HASH).unwrap();
    assert!(matches!(
        RunDir::prepare(&out, Mode::Fresh { force: false }, HASH),
        Err(RunDirError::Locked { .. })
    ));
    drop(p);
    // Two fresh starts into a directory that does not exist yet: the first to commit wins.
    let out2 = dir.path().join("new");
    let a = RunDir::prepare(&out2, Mode::Fresh { force: false }, HASH).unwrap();
    let b = RunDir::prepare(&out2, Mode::Fresh { force: false }, HASH).unwrap();
    let a = a.commit().unwrap();
    assert!(matches!(b.commit(), Err(RunDirError::Locked { .. })));
    drop(a);
}

#[test]
fn a_lock_held_by_another_process_names_it_and_dies_with_it() {
    if let Some(out) = std::env::var_os(CHILD) {
        let _rd = RunDir::prepare(Path::new(&out), Mode::Fresh { force: false }, HASH)
            .unwrap()
            .commit()
            .unwrap();
        println!("LOCKED");
        std::io::stdout().flush().unwrap();
        // Hold the lock until the parent closes our stdin (or kills us).
        let _ = std::io::stdin().read_line(&mut String::new());
        return;
    }
    let (_dir, out) = crate::support::out_dir();
    let mut child = crate::support::this_test_as_child(
        "rundir_dir::a_lock_held_by_another_process_names_it_and_dies_with_it",
        CHILD,
        &out,
    )
    .stdin(Stdio::piped())
    .stdout(Stdio::piped())
    .spawn()
    .unwrap();
    let stdout = child.stdout.take().unwrap();
    let locked = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .any(|l| l.contains("LOCKED"));
    assert!(locked, "the child did not take the lock");
    let e = RunDir::prepare(&out, Mode::Resume, HASH).unwrap_err();
    match &e {
        RunDirError::Locked { holder, .. } => assert_eq!(holder.pid, Some(child.id()), "{e}"),
        other => panic!("expected Locked, got {other}"),
    }
    assert!(
        e.to_string().contains(&format!("(pid {}", child.id())),
        "{e}"
    );
    // SIGKILL: no destructor runs, `.lock` stays behind, and still blocks nothing.
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(out.join(".lock").exists());
    let rd = fresh(&out);
    drop(rd);
}

#[test]
fn bad_paths_are_refused() {
    let e = RunDir::prepare("", Mode::Fresh { force: true }, HASH).unwrap_err();
    assert!(matches!(e, RunDirError::EmptyPath), "{e}");
    assert!(e.to_string().contains("current directory"), "{e}");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("f");
    std::fs::write(&file, "x").unwrap();
    let e = RunDir::prepare(&file, Mode::Fresh { force: true }, HASH).unwrap_err();
    assert!(matches!(e, RunDirError::NotADirectory { .. }), "{e}");
    let e = RunDir::prepare("/", Mode::Fresh { force: true }, HASH).unwrap_err();
    assert!(matches!(e, RunDirError::UnsafeDir { .. }), "{e}");
}

/// A start that is abandoned after `prepare` (a compile error) leaves no trace, whether the
/// directory existed or not.
#[test]
fn an_abandoned_start_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let absent = dir.path().join("a/b/out");
    let p = RunDir::prepare(&absent, Mode::Fresh { force: true }, HASH).unwrap();
    drop(p);
    assert!(!dir.path().join("a").exists());

    let out = dir.path().join("out");
    finished_run(&out);
    let before = snapshot(&out);
    for mode in [Mode::Resume, Mode::Fresh { force: true }] {
        let p = RunDir::prepare(&out, mode, HASH).unwrap();
        assert!(out.join(".lock").exists());
        drop(p);
        assert_eq!(snapshot(&out), before, "{mode:?}");
        assert!(!out.join(".lock").exists());
    }
}

#[test]
fn a_fresh_start_never_destroys_a_run_without_force() {
    let (_dir, out) = crate::support::out_dir();
    finished_run(&out);

    // The same config again: refused, and says how to continue or start over.
    let e = refused(&out, Mode::Fresh { force: false }, HASH);
    assert!(
        matches!(
            e,
            RunDirError::RunExists {
                generation: Some(2),
                ..
            }
        ),
        "{e}"
    );
    assert!(e
        .to_string()
        .contains("holds a checkpoint of this config at generation 2"));
    assert!(e.hint().contains("--resume") && e.hint().contains("--force"));

    // Another config: refused, fresh and resume, with the CLI's words.
    let e = refused(&out, Mode::Fresh { force: false }, OTHER);
    assert!(
        e.to_string().contains(&format!(
            "holds a run of another config (hash {HASH} ≠ {OTHER})"
        )),
        "{e}"
    );
    assert!(e.hint().contains("--force"), "{}", e.hint());
    let e = refused(&out, Mode::Resume, OTHER);
    assert!(
        e.to_string().contains("holds a run of another config"),
        "{e}"
    );
    assert!(e.hint().contains("resume with the config that started it"));

    // With force: the old run is moved into previous/, complete and still readable.
    let before = snapshot(&out);
    let p = RunDir::prepare(&out, Mode::Fresh { force: true }, OTHER).unwrap();
    assert!(p.moves_aside());
    assert_eq!(p.existing_state().unwrap().generation, 2);
    let rd = p.commit().unwrap();
    assert_eq!(
        rd.report().moved_aside.as_deref(),
        Some(out.join("previous").as_path())
    );
    let moved = snapshot(&out.join("previous"));
    for (name, bytes) in &before {
        assert_eq!(moved.get(name), Some(bytes), "{name} was not moved intact");
    }
    let old = read_checkpoint(&out.join("previous")).unwrap().unwrap();
    assert_eq!(old.state().generation, 2);
    assert_eq!(old.params(&tree(0.0)).unwrap(), tree(2.0));
    // The new run starts empty.
    assert!(read_checkpoint(&out).unwrap().is_none());
    assert_eq!(std::fs::read(out.join("metrics.jsonl")).unwrap(), b"");
    drop(rd);

    // The new run has no generation yet: a start of its config needs no force, one of
    // another config does.
    refused(&out, Mode::Fresh { force: false }, HASH);
    RunDir::prepare(&out, Mode::Fresh { force: false }, OTHER)
        .unwrap()
        .commit()
        .unwrap();
    assert!(
        out.join("previous/state.json").exists(),
        "previous/ was touched"
    );
}

#[test]
fn files_that_are_not_a_run_are_kept_without_force() {
    let dir = tempfile::tempdir().unwrap();
    // The user's own config.toml in the out directory (e.g. `run.out` = the config's folder).
    let out = dir.path().join("exp");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("config.toml"), "# my notes\n[run]\nout = \".\"\n").unwrap();
    std::fs::write(out.join("data.jsonl"), "{}\n").unwrap();
    let e = refused(&out, Mode::Fresh { force: false }, HASH);
    let RunDirError::NotARunDir { entries, .. } = &e else {
        panic!("expected NotARunDir, got {e}");
    };
    assert_eq!(entries, &["config.toml", "data.jsonl"]);
    assert!(e.to_string().contains("config.toml, data.jsonl"), "{e}");
    assert!(e.hint().contains("--force"), "{}", e.hint());
    let e = refused(&out, Mode::Resume, HASH);
    assert!(matches!(e, RunDirError::NoCheckpoint { .. }), "{e}");
    assert!(e.to_string().contains("holds no checkpoint"), "{e}");

    // Foreign files next to a run of ours also keep a fresh start out.
    let run = dir.path().join("run");
    RunDir::prepare(&run, Mode::Fresh { force: false }, HASH)
        .unwrap()
        .commit()
        .unwrap();
    std::fs::write(run.join("notes.txt"), "mine").unwrap();
    let e = refused(&run, Mode::Fresh { force: false }, HASH);
    assert!(
        matches!(&e, RunDirError::NotARunDir { entries, .. } if entries == &["notes.txt"]),
        "{e}"
    );

    // With force they are moved aside, not deleted.
    let rd = RunDir::prepare(&out, Mode::Fresh { force: true }, HASH)
        .unwrap()
        .commit()
        .unwrap();
    assert_eq!(
        std::fs::read_to_string(out.join("previous/config.toml")).unwrap(),
        "# my notes\n[run]\nout = \".\"\n"
    );
    assert!(out.join("previous/data.jsonl").exists());
    assert!(!out.join("config.toml").exists());
    drop(rd);
}

#[test]
fn an_unfinished_run_is_kept_and_a_corrupt_state_needs_force() {
    let (_dir, out) = crate::support::out_dir();
    // A run that ran generations but never checkpointed (checkpoint_every = 0, killed).
    {
        let rd = fresh(&out);
        let mut m = rd.metrics_writer().unwrap();
        for g in 0..3 {
            m.append(&metric(g)).unwrap();
        }
    }
    let e = refused(&out, Mode::Fresh { force: false }, HASH);
    assert!(
        matches!(
            e,
            RunDirError::RunExists {
                generation: None,
                metrics: 3,
                ..
            }
        ),
        "{e}"
    );
    let e = refused(&out, Mode::Resume, HASH);
    assert!(matches!(e, RunDirError::NoCheckpoint { .. }), "{e}");

    // A corrupt state.json: named, never a crash, and force gets past it.
    std::fs::write(out.join("state.json"), "\u{0}\u{0}garbage").unwrap();
    for mode in [Mode::Fresh { force: false }, Mode::Resume] {
        let e = refused(&out, mode, HASH);
        assert!(
            matches!(e, RunDirError::CorruptState { .. }),
            "{mode:?}: {e}"
        );
        assert!(e.to_string().contains("state.json"), "{e}");
        assert!(e.hint().contains("--force"), "{}", e.hint());
    }
    let rd = RunDir::prepare(&out, Mode::Fresh { force: true }, HASH)
        .unwrap()
        .commit()
        .unwrap();
    assert!(out.join("previous/state.json").exists());
    drop(rd);

    // A corrupt marker likewise.
    std::fs::write(out.join(".shardes-run"), "{").unwrap();
    let e = refused(&out, Mode::Fresh { force: false }, HASH);
    assert!(matches!(e, RunDirError::CorruptMarker { .. }), "{e}");
}

#[test]
fn stale_temporaries_are_removed_on_open() {
    let (_dir, out) = crate::support::out_dir();
    finished_run(&out);
    let stale = [
        ".state.json.tmp4242",
        ".params.000003.0123abcd.safetensors.tmp77",
        ".config.toml.tmp1",
    ];
    for s in stale {
        std::fs::write(out.join(s), "half").unwrap();
    }
    std::fs::write(out.join("params.000001.89abcdef.safetensors"), "old").unwrap();
    let keep = ".my.tmpfile";
    std::fs::write(out.join(keep), "not ours").unwrap();
    let rd = RunDir::prepare(&out, Mode::Resume, HASH)
        .unwrap()
        .commit()
        .unwrap();
    for s in stale {
        assert!(!out.join(s).exists(), "{s} was not removed");
    }
    assert!(!out.join("params.000001.89abcdef.safetensors").exists());
    assert!(out.join(keep).exists());
    assert_eq!(rd.report().removed.len(), 4);
    let st = rd.committed().unwrap();
    assert!(out.join(&st.params_file).exists());
}

#[test]
fn metrics_stay_valid_json_and_resume_truncates_them() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("metrics.jsonl");
    let mut w = MetricsWriter::open(&path).unwrap();
    for g in 0..5 {
        let mut m = metric(g);
        if g == 2 {
            m.fitness_mean = f64::NAN;
            m.fitness_min = f64::NEG_INFINITY;
            m.fitness_max = f64::INFINITY;
            m.extra.insert("reward".into(), f64::NAN);
        }
        w.append(&m).unwrap();
    }
    drop(w);
    let text = std::fs::read_to_string(&path).unwrap();
    for line in text.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        assert!(!line.contains("null"), "{line}");
        assert!(v["generation"].is_u64());
    }
    let log = read_metrics(&path).unwrap();
    assert_eq!(log.records.len(), 5);
    let m2 = &log.records[2].0;
    assert!(m2.fitness_mean.is_nan() && m2.extra["reward"].is_nan());
    assert_eq!(
        (m2.fitness_min, m2.fitness_max),
        (f64::NEG_INFINITY, f64::INFINITY)
    );

    // A kill mid-line: the torn tail is told apart from damage, and resume drops it with
    // the generations past the checkpoint.
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap();
    f.write_all(br#"{"generation":5,"fitness_me"#).unwrap();
    drop(f);
    let log = read_metrics(&path).unwrap();
    assert!(log.bad.is_empty());
    assert_eq!(log.torn.as_ref().unwrap().line, 6);
    let t = truncate_metrics(&path, 3).unwrap();
    assert_eq!((t.kept, t.dropped, t.bad.len()), (3, 2, 0));
    assert!(t.torn.is_some());
    let kept = std::fs::read_to_string(&path).unwrap();
    assert_eq!(
        kept,
        text.lines()
            .take(3)
            .map(|l| format!("{l}\n"))
            .collect::<String>()
    );

    // Damage in the middle is reported, not silently dropped; a writer opened after a torn
    // line starts on a new line, so the next record stays readable.
    std::fs::write(
        &path,
        format!(
            "{}\nnot json\n{}\n{{\"generation\":7",
            metric(0).to_line(),
            metric(1).to_line()
        ),
    )
    .unwrap();
    let mut w = MetricsWriter::open(&path).unwrap();
    w.append(&metric(2)).unwrap();
    drop(w);
    let log = read_metrics(&path).unwrap();
    let gens: Vec<u32> = log.records.iter().map(|(m, _)| m.generation).collect();
    assert_eq!(gens, [0, 1, 2]);
    let bad: Vec<usize> = log.bad.iter().map(|b| b.line).collect();
    assert_eq!(bad, [2, 4], "{log:?}");
    assert!(log.torn.is_none());
    let t = truncate_metrics(&path, 10).unwrap();
    assert_eq!((t.kept, t.bad.len()), (3, 2));
    assert_eq!(t.bad[0].text, "not json");
}

#[test]
fn resume_truncates_the_metrics_to_the_checkpoint() {
    let (_dir, out) = crate::support::out_dir();
    finished_run(&out);
    // Generations past the checkpoint (2): a run killed after writing them.
    let mut w = MetricsWriter::open(&out.join("metrics.jsonl")).unwrap();
    w.append(&metric(2)).unwrap();
    w.append(&metric(3)).unwrap();
    drop(w);
    let rd = RunDir::prepare(&out, Mode::Resume, HASH)
        .unwrap()
        .commit()
        .unwrap();
    let t = rd.report().metrics.as_ref().unwrap();
    assert_eq!((t.kept, t.dropped), (2, 2));
    let log = read_metrics(&out.join("metrics.jsonl")).unwrap();
    let gens: Vec<u32> = log.records.iter().map(|(m, _)| m.generation).collect();
    assert_eq!(gens, [0, 1]);
    assert_eq!(
        std::fs::read_to_string(out.join("config.toml")).unwrap(),
        "[run]\nseed = 3\n"
    );
}
