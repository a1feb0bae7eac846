//! What `shardes run` leaves to look at: `OUT/curves.svg` at every checkpoint, and with
//! `run.tensorboard = true` event files under `OUT/tb/` whose scalars are metrics.jsonl's.
//!
//! Exact: TensorBoard scalars are f32, and each must equal its metrics.jsonl value rounded
//! to f32; the steps are the generations, in order.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use crate::common::*;

/// `small_config` with `run.tensorboard` set.
fn config(out: &Path, generations: usize, every: usize, tensorboard: bool) -> String {
    format!(
        "{}tensorboard = {tensorboard}\n",
        small_config(out, generations, every)
    )
}

/// [`config`] writing to `dir/run`, written to `dir/name`: the run directory and the config.
fn config_in(
    dir: &Path,
    name: &str,
    generations: usize,
    every: usize,
    tensorboard: bool,
) -> (PathBuf, PathBuf) {
    let out = dir.join("run");
    let cfg = write(dir, name, &config(&out, generations, every, tensorboard));
    (out, cfg)
}

/// The event files under `out/tb`, in name order (creation order within a second).
fn event_files(out: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(out.join("tb"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    files
}

/// Every scalar of the event files under `out/tb`, file by file.
fn tb_scalars(out: &Path) -> Vec<(String, i64, f32)> {
    event_files(out)
        .iter()
        .flat_map(|f| shardes::tensorboard::scalars(&shardes::tensorboard::read_events(f).unwrap()))
        .collect()
}

/// The scalars the metrics of generations `from..` of `out` should have become.
fn expected(out: &Path, from: u32) -> Vec<(String, i64, f32)> {
    metrics(out)
        .iter()
        .filter(|m| m.generation >= from)
        .flat_map(|m| {
            let step = i64::from(m.generation);
            [
                ("fitness/mean", m.fitness_mean),
                ("fitness/min", m.fitness_min),
                ("fitness/max", m.fitness_max),
                ("time/ms_per_generation", m.ms),
            ]
            .map(|(tag, v)| (tag.to_string(), step, v as f32))
        })
        .collect()
}

/// Checks that `out` holds `generations` metrics lines and that its event files hold the
/// scalars of generations `from..`.
fn assert_scalars(out: &Path, generations: usize, from: u32) {
    assert_eq!(metrics(out).len(), generations);
    assert_eq!(tb_scalars(out), expected(out, from));
}

fn assert_svg(path: &Path) {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let doc = roxmltree::Document::parse(&text).expect("curves.svg is XML");
    assert_eq!(doc.root_element().tag_name().name(), "svg");
}

#[test]
fn a_run_leaves_curves_and_tensorboard_scalars_that_match_its_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let (out, cfg) = config_in(dir.path(), "c.toml", 4, 2, true);
    let (stdout, stderr) = ok(&["run", s(&cfg)]);
    assert!(!stderr.contains("warning"), "{stderr}");
    assert_svg(&out.join("curves.svg"));
    let line = stdout
        .lines()
        .find(|l| l.starts_with("  curves   "))
        .unwrap_or_else(|| panic!("no curves line in the summary:\n{stdout}"));
    assert!(
        line.contains(&out.join("curves.svg").display().to_string())
            && line.contains(&format!(
                "tensorboard --logdir {}",
                out.join("tb").display()
            )),
        "{line}"
    );
    assert_eq!(event_files(&out).len(), 1);
    assert_scalars(&out, 4, 0);
}

/// `run.tensorboard` is an output setting: turning it on for a resume is accepted, and the
/// new event file holds the generations this process ran.
#[test]
fn tensorboard_can_be_turned_on_for_a_resume() {
    let dir = tempfile::tempdir().unwrap();
    let (out, off) = config_in(dir.path(), "off.toml", 2, 0, false);
    let (stdout, _) = ok(&["run", s(&off)]);
    assert_svg(&out.join("curves.svg"));
    assert!(!out.join("tb").exists());
    assert!(!stdout.contains("tensorboard --logdir"), "{stdout}");

    let (_, on) = config_in(dir.path(), "on.toml", 4, 0, true);
    ok(&["run", s(&on), "--resume"]);
    assert_scalars(&out, 4, 2);
}

/// The curves are redrawn at every checkpoint, not only at the end: a long run has them
/// while it is still going; SIGTERM then checkpoints and leaves the event file complete.
#[test]
fn curves_appear_at_the_first_checkpoint_of_a_running_run() {
    let dir = tempfile::tempdir().unwrap();
    let (out, cfg) = config_in(dir.path(), "c.toml", 1_000_000, 2, true);
    let mut child = bin()
        .args(["run", cfg.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_until(&mut child, "curves", || {
        out.join("curves.svg").exists() && out.join("tb").exists()
    });
    assert!(
        child.try_wait().unwrap().is_none(),
        "the run is still going"
    );
    let pid = i32::try_from(child.id()).unwrap();
    // SAFETY: sending a signal to our own child process.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let o = child.wait_with_output().unwrap();
    let (stdout, stderr) = text(&o);
    assert_eq!(o.status.code(), Some(143), "{stdout}\n{stderr}");
    assert_svg(&out.join("curves.svg"));
    let st = state(&out);
    assert_eq!(
        metrics(&out).len() as u64,
        st["generation"].as_u64().unwrap()
    );
    assert_eq!(tb_scalars(&out), expected(&out, 0));
}
