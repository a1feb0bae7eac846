//! JSONL tasks: parse errors name the file and line, the exact-match reward's extraction
//! and normalisation, the held-out split, deterministic per-generation sampling.
//!
//! Tolerances: none.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use shardes::tasks::jsonl::{
    answers_match, extract_answer, is_held_out, parse_jsonl, read_jsonl, reward, JsonlTask, QaItem,
};
use shardes::tasks::{Task, TaskError};

/// A scratch directory for this test binary, removed by the caller.
fn scratch(name: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("shardes-tasks-jsonl-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn parses_items() {
    let text = "\u{feff}{\"prompt\": \"2+2?\", \"answer\": \"4\"}\r\n\n   \n\
                {\"prompt\": \"half of 3?\", \"answer\": 1.5, \"id\": 7}\n\
                {\"prompt\": \"big\", \"answer\": 12345678901}";
    let items = parse_jsonl(text.as_bytes(), Path::new("mem.jsonl")).unwrap();
    assert_eq!(
        items,
        vec![
            QaItem::new("2+2?", "4"),
            QaItem {
                extra: serde_json::json!({"id": 7}).as_object().unwrap().clone(),
                ..QaItem::new("half of 3?", "1.5")
            },
            QaItem::new("big", "12345678901"),
        ]
    );
}

#[test]
fn errors_name_the_file_and_line() {
    let dir = scratch("errors");
    let cases = [
        (
            "{\"prompt\": \"a\", \"answer\": \"1\"}\n\n{\"prompt\": \"b\", \"answer\": }\n",
            3,
            "invalid JSON",
        ),
        ("[1, 2]\n", 1, "not a JSON object"),
        (
            "{\"prompt\": \"a\", \"answer\": \"1\"}\n{\"answer\": \"1\"}\n",
            2,
            "no \"prompt\"",
        ),
        (
            "{\"prompt\": 5, \"answer\": \"1\"}\n",
            1,
            "\"prompt\" is not a string",
        ),
        ("{\"prompt\": \"a\"}\n", 1, "no \"answer\""),
        (
            "{\"prompt\": \"a\", \"answer\": [1]}\n",
            1,
            "neither a string nor a number",
        ),
    ];
    for (i, (text, line, what)) in cases.iter().enumerate() {
        let path = write(&dir, &format!("bad{i}.jsonl"), text);
        let err = read_jsonl(&path).unwrap_err();
        match &err {
            TaskError::MalformedLine {
                path: p, line: l, ..
            } => {
                assert_eq!(p, &path);
                assert_eq!(l, line, "{err}");
            }
            other => panic!("expected MalformedLine, got {other}"),
        }
        let msg = err.to_string();
        assert!(
            msg.starts_with(&format!("{}:{line}: ", path.display())),
            "{msg}"
        );
        assert!(msg.contains(what), "{msg}");
    }
    // Invalid UTF-8 is a line error too.
    let path = dir.join("latin1.jsonl");
    std::fs::write(
        &path,
        b"{\"prompt\": \"a\", \"answer\": \"1\"}\n{\"prompt\": \"\xe9\"}\n",
    )
    .unwrap();
    let err = read_jsonl(&path).unwrap_err();
    assert!(
        matches!(err, TaskError::MalformedLine { line: 2, .. }),
        "{err}"
    );
    // An empty file, or one of blank lines only.
    for text in ["", "\n  \n\r\n"] {
        let path = write(&dir, "empty.jsonl", text);
        let err = read_jsonl(&path).unwrap_err();
        assert!(
            matches!(&err, TaskError::EmptyTaskFile { path: p } if p == &path),
            "{err}"
        );
        assert!(err.to_string().contains("is empty"), "{err}");
    }
    // A missing file.
    let err = read_jsonl(&dir.join("missing.jsonl")).unwrap_err();
    assert!(matches!(err, TaskError::Read { .. }), "{err}");
    assert!(err.to_string().contains("missing.jsonl"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn exact_match_reward() {
    let cases: [(&str, &str, f32); 16] = [
        ("42", "<answer>42</answer>", 1.0),
        ("42", "<answer>\n 42 \n</answer>", 1.0),
        ("42", "so the answer is 42.", 1.0),
        ("42", "first 41, finally 42!", 1.0),
        ("42", "42 at first, then 43", 0.0),
        ("42", "<answer>42</answer> and later 43", 1.0),
        ("42", "<answer>43</answer> and later 42", 0.0),
        ("42", "<answer>The answer is 42</answer>", 0.0),
        ("1000", "It costs 1,000 dollars", 1.0),
        ("1000.5", "<answer>1,000.50</answer>", 1.0),
        ("-3", "x = -3", 1.0),
        ("3", "x = -3", 0.0),
        ("0", "<answer>-0.0</answer>", 1.0),
        ("Paris", "<answer> Paris </answer>", 1.0),
        ("Paris", "<answer>paris</answer>", 0.0),
        ("42", "no number here", 0.0),
    ];
    for (answer, completion, want) in cases {
        assert_eq!(
            reward(answer, completion),
            want,
            "{answer:?} vs {completion:?}"
        );
    }
    assert_eq!(extract_answer("a <answer> b </answer>"), Some("b"));
    assert_eq!(extract_answer("unclosed <answer> 7"), Some("7"));
    assert_eq!(extract_answer("nothing"), None);
    assert!(answers_match(" 7 ", "7"));
    assert!(!answers_match("7", "7.5"));
}

fn items(n: usize) -> Vec<QaItem> {
    (0..n)
        .map(|i| QaItem::new(format!("question {i}"), i.to_string()))
        .collect()
}

#[test]
fn training_prompts_walk_seeded_epochs() {
    let task = JsonlTask::from_items(items(10), items(3)).unwrap();
    // Generations 0..5 with 4 prompts each cover two epochs: each item twice, once per
    // epoch.
    let mut seen: Vec<String> = Vec::new();
    for g in 0..5 {
        seen.extend(task.train(9, g, 4).unwrap().into_iter().map(|q| q.prompt));
    }
    for epoch in seen.chunks(10) {
        let distinct: HashSet<&String> = epoch.iter().collect();
        assert_eq!(distinct.len(), 10, "{epoch:?}");
    }
    assert_ne!(seen[..10], seen[10..], "epochs are shuffled differently");
    // Deterministic; seeds differ.
    assert_eq!(task.train(9, 3, 4).unwrap(), task.train(9, 3, 4).unwrap());
    assert_ne!(task.train(9, 3, 4).unwrap(), task.train(10, 3, 4).unwrap());
    // More prompts than items: several epochs in one generation.
    assert_eq!(task.train(1, 0, 25).unwrap().len(), 25);
    // Held out: a prefix of the file's order.
    assert_eq!(task.held_out(2).unwrap(), items(3)[..2]);
    assert_eq!(task.held_out(10).unwrap().len(), 3);
    assert_eq!(task.name(), "jsonl");
    let item = &task.train(0, 0, 1).unwrap()[0];
    let right = format!("<answer>{}</answer>", item.answer);
    assert_eq!(task.reward().score(item, &right), 1.0);
    assert!(JsonlTask::from_items(vec![], items(1)).is_err());
}

#[test]
fn one_file_is_split_by_prompt() {
    let dir = scratch("split");
    let mut text = String::new();
    for i in 0..200 {
        // Duplicates too: a duplicated prompt lands on one side only.
        text.push_str(&format!(
            "{{\"prompt\": \"q{}\", \"answer\": \"{i}\"}}\n",
            i % 150
        ));
    }
    let path = write(&dir, "all.jsonl", &text);
    let task = JsonlTask::open(&path, None).unwrap();
    let train: HashSet<&str> = task
        .train_items()
        .iter()
        .map(|q| q.prompt.as_str())
        .collect();
    let held: HashSet<&str> = task
        .held_out_items()
        .iter()
        .map(|q| q.prompt.as_str())
        .collect();
    assert!(train.is_disjoint(&held));
    assert_eq!(task.train_items().len() + task.held_out_items().len(), 200);
    assert!(
        !held.is_empty() && held.len() < 40,
        "{} held out",
        held.len()
    );
    assert!(held.iter().all(|p| is_held_out(p)));
    for g in 0..20 {
        for q in task.train(5, g, 16).unwrap() {
            assert!(!held.contains(q.prompt.as_str()));
        }
    }
    // With a separate held-out file, the training file is used whole.
    let eval = write(
        &dir,
        "eval.jsonl",
        "{\"prompt\": \"e\", \"answer\": \"1\"}\n",
    );
    let task = JsonlTask::open(&path, Some(&eval)).unwrap();
    assert_eq!(task.train_items().len(), 200);
    assert_eq!(task.held_out(5).unwrap().len(), 1);
    // A file whose only prompt is held out leaves nothing to train on.
    let lonely = (0..)
        .map(|i| format!("p{i}"))
        .find(|p| is_held_out(p))
        .unwrap();
    let one = write(
        &dir,
        "one.jsonl",
        &format!("{{\"prompt\": \"{lonely}\", \"answer\": \"1\"}}\n"),
    );
    let err = JsonlTask::open(&one, None).unwrap_err();
    assert!(
        matches!(err, TaskError::NoTrainItems { items: 1, .. }),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
