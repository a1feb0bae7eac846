//! A reward program (`shardes::tasks::command`) against fixture programs that misbehave in
//! every way the protocol allows (tests/fixtures/reward/fixture.py, one mode each): each
//! failure is contained per completion, counted, and never blocks; a program that keeps
//! dying is an error with its stderr tail; the program is gone once the command is dropped.
//! Exact: rewards are whole numbers (exact in f32), compared with `==`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use shardes::finetune::{Completion, RewardTask, TextTask};
use shardes::tasks::command::{CommandError, CommandSpec, RewardCommand, RewardRequest};
use shardes::tasks::jsonl::{JsonlTask, QaItem};
use shardes::tasks::{score_batch, Failure, Scores, Task, TaskError};

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/reward/fixture.py")
}

fn spec(mode: &str, timeout_s: f64, restarts: u32) -> CommandSpec {
    CommandSpec {
        command: vec![
            "python3".into(),
            fixture().display().to_string(),
            mode.into(),
        ],
        timeout: Duration::from_secs_f64(timeout_s),
        restarts,
    }
}

fn command(mode: &str, timeout_s: f64) -> RewardCommand {
    RewardCommand::new(spec(mode, timeout_s, 3)).unwrap()
}

/// The fixture's `hash` reward of a text.
fn hashed(text: &str) -> f32 {
    let d = Sha256::digest(text.as_bytes());
    let hex: String = d.iter().map(|b| format!("{b:02x}")).collect();
    u32::from_str_radix(&hex[..5], 16).unwrap() as f32
}

/// Requests for `texts`, one member, prompt index = position.
fn requests<'a>(texts: &'a [String], item: &'a Value) -> Vec<RewardRequest<'a>> {
    texts
        .iter()
        .enumerate()
        .map(|(j, t)| RewardRequest {
            member: Some(0),
            prompt_index: j,
            prompt: "p",
            completion: t,
            item,
        })
        .collect()
}

/// `c`'s answer to the [`requests`] for `texts` (of a prompt with no fields).
fn score(c: &RewardCommand, texts: &[String]) -> Result<Scores, CommandError> {
    c.score(&requests(texts, &json!({})))
}

fn texts(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("completion {i}")).collect()
}

fn alive(pid: u32) -> bool {
    // Reaped processes have no /proc entry; a zombie would still have one (state Z).
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => !s.split(") ").nth(1).is_some_and(|r| r.starts_with('Z')),
        Err(_) => false,
    }
}

#[test]
fn a_good_program_scores_in_any_order_and_text_round_trips_exactly() {
    // Every oddity a completion may hold: NUL, control characters, a lone-surrogate
    // escape as text, U+2028, non-BMP characters, quotes and backslashes, and 1 MB.
    let mut t: Vec<String> = vec![
        "plain".into(),
        "nul \0 and \u{1} \u{7f} \u{1b}[31m".into(),
        "\\ud800 looks like a lone surrogate; \"quoted\" \\\\".into(),
        "line\u{2028}sep\u{2029} \u{feff} \u{ffff} 😀 𝔘".into(),
        "\n\r\t".into(),
        "é".repeat(500_000),
    ];
    t.push(String::new());
    t.push("last".into());
    for mode in ["hash", "pairs"] {
        let c = command(mode, 10.0);
        let s = score(&c, &t).unwrap();
        let want: Vec<f32> = t.iter().map(|x| hashed(x)).collect();
        assert_eq!(s.rewards, want, "{mode}");
        assert!(s.contained.is_empty(), "{mode}: {:?}", s.contained);
        // A second batch on the same process: ids stay unique, answers still match.
        let s = score(&c, &t[..2]).unwrap();
        assert_eq!(s.rewards, want[..2], "{mode}");
        assert_eq!(c.stats().starts, 1);
    }
}

#[test]
fn a_missing_or_unexecutable_program_names_the_key() {
    let e = RewardCommand::new(CommandSpec::new(vec!["/no/such/reward".into()])).unwrap_err();
    assert!(matches!(e, CommandError::Spawn { .. }));
    let msg = e.to_string();
    assert!(
        msg.contains("task.reward.command") && msg.contains("/no/such/reward"),
        "{msg}"
    );
    let e = RewardCommand::new(CommandSpec::new(vec!["no-such-reward-program-x".into()]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("not found on PATH"), "{e}");
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("r.sh");
    std::fs::write(&script, "#!/bin/sh\n").unwrap();
    let e = RewardCommand::new(CommandSpec::new(vec![script.display().to_string()]))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("not executable") && e.contains("task.reward.command"),
        "{e}"
    );
    let e = RewardCommand::new(CommandSpec::new(vec![])).unwrap_err();
    assert!(matches!(e, CommandError::Empty));
}

#[test]
fn silence_times_out_and_is_contained() {
    let c = command("silent", 0.3);
    let t0 = Instant::now();
    let s = score(&c, &texts(4)).unwrap();
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
    assert_eq!(s.contained.len(), 4);
    assert!(s.contained.iter().all(|x| x.failure == Failure::NoAnswer));
    assert_eq!(s.floor, Some(-1.0));
    assert_eq!(c.stats().missing_answers, 4);
}

#[test]
fn binary_lines_are_counted_and_contained() {
    // The timeout is waited in full (no answer ever matches): short, but longer than
    // Python's start on a loaded machine.
    let c = command("binary", 2.0);
    let s = score(&c, &texts(3)).unwrap();
    assert_eq!(s.contained.len(), 3);
    assert_eq!(c.stats().bad_lines, 3);
}

#[test]
fn floods_of_stdout_and_stderr_neither_block_nor_exhaust_memory() {
    let c = command("flood", 20.0);
    let t = texts(5);
    let s = score(&c, &t).unwrap();
    let want: Vec<f32> = t.iter().map(|x| hashed(x)).collect();
    assert_eq!(s.rewards, want);
    // The 3 MB line and the 10,000 short ones.
    assert_eq!(c.stats().bad_lines, 10_001);
}

#[test]
fn late_answers_are_contained_then_ignored_as_stray() {
    let c = command("sleep", 0.3);
    assert_eq!(score(&c, &texts(1)).unwrap().contained.len(), 1);
    // The late answer arrives before the next batch, whose id differs.
    std::thread::sleep(Duration::from_millis(1500));
    let t = texts(1);
    let s = score(&c, &t).unwrap();
    assert_eq!(c.stats().stray_answers, 1, "{s:?}");
    assert_eq!(s.rewards, vec![hashed(&t[0])]);
}

#[test]
fn answers_for_ids_not_asked_are_ignored_and_counted() {
    let c = command("stray", 5.0);
    let s = score(&c, &texts(3)).unwrap();
    assert_eq!(s.rewards, vec![1.0; 3]);
    assert_eq!(c.stats().stray_answers, 3);
}

#[test]
fn rewards_that_are_not_finite_numbers_are_contained_at_once() {
    let c = command("nonfinite", 30.0);
    let t0 = Instant::now();
    let s = score(&c, &texts(6)).unwrap();
    // No timeout was waited for: each bad answer names its id.
    assert!(t0.elapsed() < Duration::from_secs(10));
    let idx: Vec<usize> = s.contained.iter().map(|x| x.index).collect();
    assert_eq!(idx, vec![0, 1, 2, 3, 4]);
    assert!(s
        .contained
        .iter()
        .all(|x| matches!(x.failure, Failure::BadAnswer(_))));
    assert_eq!(s.rewards, vec![1.0, 1.0, 1.0, 1.0, 1.0, 2.0]);
    assert_eq!(s.floor, Some(1.0));
}

#[test]
fn a_program_that_keeps_exiting_is_restarted_then_an_error_with_its_stderr() {
    let c = RewardCommand::new(spec("exit", 5.0, 2)).unwrap();
    // Process 1 dies, restart 1 gets the batch again and dies: contained.
    let s = score(&c, &texts(2)).unwrap();
    assert_eq!(s.contained.len(), 2);
    // Restart 2 dies; a third is not allowed.
    let e = score(&c, &texts(2)).unwrap_err();
    assert_eq!(c.stats().starts, 3);
    let msg = e.to_string();
    assert!(
        msg.contains("fatal: the reward model is missing")
            && msg.contains("starting up")
            && msg.contains("exit code 0")
            && msg.contains("task.reward.restarts"),
        "{msg}"
    );
}

#[test]
fn a_program_that_dies_once_gets_the_batch_again() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("died");
    let mut sp = spec("dies_once", 5.0, 1);
    sp.command.push(marker.display().to_string());
    let c = RewardCommand::new(sp).unwrap();
    let t = texts(3);
    let s = score(&c, &t).unwrap();
    assert_eq!(s.rewards, t.iter().map(|x| hashed(x)).collect::<Vec<_>>());
    assert_eq!(c.stats().starts, 2);
}

#[test]
fn the_program_and_its_children_are_gone_after_drop() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("sleep.pid");
    let script = format!(
        "sleep 300 & echo $! > {}; exec python3 {} hash",
        pidfile.display(),
        fixture().display()
    );
    let c = RewardCommand::new(CommandSpec::new(vec!["sh".into(), "-c".into(), script])).unwrap();
    assert_eq!(c.pid(), None, "started lazily");
    let t = texts(1);
    assert_eq!(score(&c, &t).unwrap().rewards, vec![hashed(&t[0])]);
    let pid = c.pid().unwrap();
    let sleeper: u32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(alive(pid) && alive(sleeper));
    drop(c);
    assert!(!alive(pid), "the program outlived its command");
    // The sleeper is reparented (to init or a subreaper) and reaped by it: allow a moment.
    let t0 = Instant::now();
    while alive(sleeper) && t0.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!alive(sleeper), "a child of the program outlived it");
}

/// The JSONL task through `TextTask` with a program that implements the built-in rule
/// (`examples/reward.py --format-bonus 0`): the same rewards, bit for bit; and the request
/// carries the global member, the prompt index and every key of the item's line.
#[test]
fn the_example_program_equals_the_built_in_reward_and_requests_carry_the_item() {
    let mk = |p: &str, a: &str, k: i64| QaItem {
        extra: json!({"k": k, "note": "kept"}).as_object().unwrap().clone(),
        ..QaItem::new(p, a)
    };
    let items = vec![mk("a", "4", 10), mk("b", "1,000.5", 20), mk("c", "yes", 30)];
    let task = JsonlTask::from_items(items.clone(), items.clone()).unwrap();
    let outs = [
        "4",
        "so 1000.50.",
        "<answer> yes </answer>",
        "<answer>5</answer> 4",
        "x -4",
        "no",
        "1,000.50!",
        "<answer>Yes</answer>",
        "nothing",
        "\0",
        "4.0",
        "<answer>yes",
    ];
    let completions: Vec<Completion> = outs
        .iter()
        .map(|t| Completion {
            ids: vec![],
            text: t.to_string(),
        })
        .collect();
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/reward.py");
    let spec = CommandSpec::new(vec![
        "python3".into(),
        example.display().to_string(),
        "--format-bonus".into(),
        "0".into(),
    ]);
    let with = TextTask::with_command(
        JsonlTask::from_items(items.clone(), items.clone()).unwrap(),
        RewardCommand::new(spec).unwrap(),
    );
    let batch = with.held_out(3).unwrap();
    let got = batch.score(&completions).unwrap();
    let want = score_batch(task.reward(), &task.held_out(3).unwrap(), &outs).unwrap();
    assert_eq!(got, want);
    assert!(want.rewards.contains(&1.0) && want.rewards.contains(&0.0));

    // member = first + row, prompt_index = column, item = the line's keys.
    let member = TextTask::with_command(
        JsonlTask::from_items(items.clone(), items).unwrap(),
        RewardCommand::new(spec_member()).unwrap(),
    );
    let b = member.held_out(3).unwrap();
    let s = b.score_from(&completions[..6], 5).unwrap();
    assert_eq!(
        s.rewards,
        vec![5010.0, 5021.0, 5032.0, 6010.0, 6021.0, 6032.0]
    );
    let s = b.score_plain(&completions[..3]).unwrap();
    assert_eq!(s.rewards, vec![-990.0, -979.0, -968.0]);
    let e = b.score(&completions[..2]).unwrap_err();
    assert!(matches!(e, TaskError::Pairing { .. }), "{e}");
}

fn spec_member() -> CommandSpec {
    spec("member", 10.0, 0)
}
