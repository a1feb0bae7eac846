//! `shardes init` end to end: for each problem the starter config parses, runs one
//! generation through `shardes run` (qwen2 once its two paths are filled in with the tiny
//! fixture), and lists every key the README documents.
//!
//! A problem this build does not have yet (`control`) must say so and exit 2; the two that
//! exist must not.

use std::path::Path;
use std::process::Output;

use crate::common::*;

/// The starter config for `problem`, or `None` when this build does not have it.
fn init(problem: &str) -> Option<String> {
    let o = shardes(&["init", "--problem", problem]);
    let (stdout, stderr) = text(&o);
    if o.status.code() == Some(2) && stderr.contains("not available in this build yet") {
        assert!(stdout.is_empty(), "{stdout}");
        return None;
    }
    assert!(o.status.success(), "init --problem {problem}: {stderr}");
    assert!(stderr.is_empty(), "{stderr}");
    Some(String::from_utf8(o.stdout).unwrap())
}

/// `text` with the line `key = ...` replaced by `key = value`.
fn set(text: &str, key: &str, value: &str) -> String {
    let prefix = format!("{key} = ");
    let mut found = false;
    let lines: Vec<String> = text
        .lines()
        .map(|l| {
            if l.starts_with(&prefix) {
                found = true;
                format!("{prefix}{value}")
            } else {
                l.to_string()
            }
        })
        .collect();
    assert!(found, "no `{key} = ` line in\n{text}");
    lines.join("\n") + "\n"
}

/// `shardes run config` in `dir` (the config's relative `out` lands there).
fn run_in(dir: &Path, config: &str) -> Output {
    let path = write(dir, "init.toml", config);
    bin()
        .current_dir(dir)
        .args(["run", path.to_str().unwrap()])
        .output()
        .unwrap()
}

/// Runs `config` for one generation in a fresh directory and checks what it leaves.
fn runs_one_generation(problem: &str, config: &str) {
    let dir = tempfile::tempdir().unwrap();
    let o = run_in(dir.path(), &set(config, "generations", "1"));
    let (stdout, stderr) = text(&o);
    assert!(o.status.success(), "{problem}: {stdout}\n{stderr}");
    let out = dir.path().join("runs/default");
    let m = metrics(&out);
    assert_eq!(m.len(), 1, "{problem}");
    assert!(m[0].fitness_mean.is_finite(), "{problem}: {m:?}");
    assert_eq!(state(&out)["generation"], 1, "{problem}");
    assert!(out.join("curves.svg").is_file(), "{problem}");
}

#[test]
fn each_problems_starter_config_runs_one_generation() {
    let tb = init("transformer_block").expect("transformer_block is available");
    runs_one_generation("transformer_block", &tb);
    // `init` with no flag is transformer_block's.
    let o = shardes(&["init"]);
    assert_eq!(String::from_utf8(o.stdout).unwrap(), tb);

    let qwen2 = init("qwen2").expect("qwen2 is available");
    // As written it parses, and the run says which path to fill in.
    let dir = tempfile::tempdir().unwrap();
    let o = run_in(dir.path(), &qwen2);
    let (_, stderr) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("error: problem.checkpoint"), "{stderr}");
    assert!(qwen2.contains("FILL IN"), "{qwen2}");
    let fixture = repo().join("tests/fixtures/qwen2_tiny");
    let data = repo().join("examples/qwen2_tiny.jsonl");
    let filled = set(&qwen2, "checkpoint", &format!("\"{}\"", fixture.display()));
    let filled = set(&filled, "data", &format!("\"{}\"", data.display()));
    runs_one_generation("qwen2", &filled);

    if let Some(control) = init("control") {
        runs_one_generation("control", &control);
    }
}

#[test]
fn unavailable_problems_and_tasks_are_refused_with_what_is_available() {
    if init("control").is_none() {
        refused(
            &["init", "--problem", "control"],
            "--problem control: not available in this build yet",
            "available problems: transformer_block, qwen2",
        );
    }
    let o = shardes(&["init", "--problem", "qwen2", "--task", "countdown"]);
    if o.status.code() == Some(2) {
        refused(
            &["init", "--problem", "qwen2", "--task", "countdown"],
            "--task countdown: not available in this build yet",
            "leave out --task",
        );
    }
    // Not a problem at all: clap's own usage error.
    let o = shardes(&["init", "--problem", "quadratic"]);
    assert_eq!(o.status.code(), Some(2));
    let (_, stderr) = text(&o);
    assert!(stderr.contains("possible values"), "{stderr}");
}

/// The keys of every ```toml block in `text` that follows a heading containing `heading`,
/// as `(section, key)`: set lines and commented-out ones (`# key = ...`).
fn documented_keys(text: &str, heading: &str) -> Vec<(String, String)> {
    let mut keys = Vec::new();
    let mut under = false;
    // Inside a fenced block: whether it is TOML.
    let mut block: Option<bool> = None;
    let mut section = String::new();
    for line in text.lines() {
        if line.starts_with("```") {
            block = match block {
                Some(_) => None,
                None => Some(line == "```toml"),
            };
            section.clear();
            continue;
        }
        match block {
            None => {
                if line.starts_with('#') {
                    under = line.contains(heading);
                }
                continue;
            }
            Some(false) => continue,
            Some(true) if !under => continue,
            Some(true) => {}
        }
        if let Some(s) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = s.to_string();
            continue;
        }
        let body = line.strip_prefix("# ").unwrap_or(line);
        if let Some((k, _)) = body.split_once(" = ") {
            if !k.is_empty() && k.bytes().all(|b| b.is_ascii_lowercase() || b == b'_') {
                keys.push((section.clone(), k.to_string()));
            }
        }
    }
    keys
}

/// Whether `config` has a line for `[section] key`, set or commented out.
fn lists(config: &str, section: &str, key: &str) -> bool {
    let mut current = "";
    for line in config.lines() {
        if let Some(s) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            current = s;
        } else if current == section {
            let body = line.strip_prefix("# ").unwrap_or(line);
            if body.starts_with(&format!("{key} = ")) {
                return true;
            }
        }
    }
    false
}

#[test]
fn starter_configs_list_every_key_the_readme_documents() {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    for (heading, problem) in [("The config", "transformer_block"), ("Qwen2", "qwen2")] {
        let documented = documented_keys(&readme, heading);
        assert!(documented.len() > 5, "{heading}: {documented:?}");
        let config = init(problem).unwrap();
        for (section, key) in documented {
            assert!(
                lists(&config, &section, &key),
                "README's `{section}.{key}` ({heading}) is not in `shardes init --problem {problem}`"
            );
        }
    }
}
