//! Countdown: the reward table, the bounds on hostile completions, puzzle generation
//! (solvable, checked by an independent brute-force oracle; held-out disjoint from
//! training; deterministic).
//!
//! Tolerances: none; rewards are exactly 1.0, 0.1 or 0.0 and puzzles are compared exactly.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use shardes::tasks::countdown::{
    self, grade, instruction, reward, split_of, CountdownConfig, CountdownTask, Flaw, Grade,
    ParseFault, PromptStyle, Puzzle, Split, Unformatted, MAX_BODY_BYTES, MAX_DEPTH,
};
use shardes::tasks::{Task, TaskError, TaskItem};

fn tag(body: &str) -> String {
    format!("<answer>{body}</answer>")
}

#[test]
fn reward_table() {
    let n237: &[u32] = &[2, 3, 7];
    let cases: Vec<(&str, &[u32], i64, String, f32)> = vec![
        (
            "correct with parentheses",
            n237,
            20,
            tag("(7 + 3) * 2"),
            1.0,
        ),
        ("correct, a number left unused", n237, 10, tag("7 + 3"), 1.0),
        ("wrong value", n237, 20, tag("7 + 3 * 2"), 0.1),
        (
            "a number used twice",
            n237,
            20,
            tag("(7 + 3) + (7 + 3)"),
            0.1,
        ),
        ("a number not given", n237, 20, tag("10 * 2"), 0.1),
        (
            "a number not given, value right",
            n237,
            20,
            tag("(7 + 3) * 2 * 1"),
            0.1,
        ),
        ("division by zero", &[3, 3, 5], 5, tag("5 / (3 - 3)"), 0.1),
        (
            "non-integer intermediate",
            &[3, 2, 4],
            6,
            tag("(3 / 2) * 4"),
            1.0,
        ),
        ("non-integer result", &[3, 2, 4], 6, tag("3 / 2 + 4"), 0.1),
        ("no tag", n237, 20, "the answer is (7 + 3) * 2".into(), 0.0),
        ("unclosed tag", n237, 20, "<answer>(7 + 3) * 2".into(), 0.0),
        (
            "closing tag only",
            n237,
            20,
            "(7 + 3) * 2</answer>".into(),
            0.0,
        ),
        (
            "two tags, the first (wrong) counts",
            n237,
            20,
            format!("{} then {}", tag("7 + 3"), tag("(7 + 3) * 2")),
            0.1,
        ),
        (
            "two tags, the first (right) counts",
            n237,
            20,
            format!("{} then {}", tag("(7 + 3) * 2"), tag("x")),
            1.0,
        ),
        (
            "whitespace and newlines",
            n237,
            20,
            tag("\n  (7 +\t3)\n *\r\n 2 \n"),
            1.0,
        ),
        (
            "reasoning around the tag",
            n237,
            20,
            format!("<think>7+3=10, 10*2=20</think> {}", tag(" (7+3)*2 ")),
            1.0,
        ),
        ("'=' in the body", n237, 20, tag("(7 + 3) * 2 = 20"), 0.0),
        ("'×' in the body", n237, 20, tag("(7 + 3) × 2"), 0.0),
        ("a letter in the body", n237, 20, tag("x"), 0.0),
        ("a decimal point", n237, 10, tag("7.0 + 3"), 0.0),
        ("empty body", n237, 20, tag("  \n "), 0.0),
        ("leading unary minus", &[3, 10, 2], 7, tag("-3 + 10"), 1.0),
        (
            "unary minus on a group",
            &[3, 10, 2],
            7,
            tag("-(3 - 10)"),
            1.0,
        ),
        (
            "unary minus after an operator",
            &[3, 10, 2],
            20,
            tag("-2 * -10"),
            1.0,
        ),
        ("double unary minus", &[3, 10, 2], 7, tag("--3 + 4"), 0.1),
        ("unbalanced, open", n237, 20, tag("((7 + 3) * 2"), 0.1),
        ("unbalanced, close", n237, 20, tag("(7 + 3)) * 2"), 0.1),
        ("dangling operator", n237, 20, tag("(7 + 3) * 2 +"), 0.1),
        ("only operators", n237, 20, tag("+ - * /"), 0.1),
        ("overflowing literal", n237, 20, tag(&"9".repeat(50)), 0.1),
        (
            "leading zeros compare by value",
            n237,
            20,
            tag("(07 + 3) * 2"),
            1.0,
        ),
    ];
    for (name, numbers, target, completion, want) in cases {
        assert_eq!(
            reward(numbers, target, &completion),
            want,
            "{name}: {completion:?} -> {:?}",
            grade(numbers, target, &completion)
        );
    }
}

#[test]
fn grades_say_why() {
    let n: &[u32] = &[2, 3, 7];
    assert_eq!(grade(n, 20, &tag("(7+3)*2")), Grade::Correct);
    assert_eq!(grade(n, 20, &tag("7+3")), Grade::Wrong(Flaw::WrongValue));
    assert_eq!(grade(n, 20, &tag("7+7")), Grade::Wrong(Flaw::NumberReused));
    assert_eq!(
        grade(n, 20, &tag("7+5")),
        Grade::Wrong(Flaw::NumberNotGiven)
    );
    assert_eq!(
        grade(&[3, 3, 5], 1, &tag("5/(3-3)")),
        Grade::Wrong(Flaw::Invalid(ParseFault::DivisionByZero))
    );
    assert_eq!(
        grade(n, 20, &tag("(7")),
        Grade::Wrong(Flaw::Invalid(ParseFault::Syntax))
    );
    assert_eq!(
        grade(n, 20, "<answer>1"),
        Grade::Unformatted(Unformatted::NoClosedTag)
    );
    assert_eq!(
        grade(n, 20, &tag("2 × 10")),
        Grade::Unformatted(Unformatted::Character('×'))
    );
    assert_eq!(
        grade(n, 20, &tag("")),
        Grade::Unformatted(Unformatted::Empty)
    );
}

/// Runs `f` on a thread with a small stack: a parser that recursed per parenthesis would
/// overflow it on the deep inputs below.
fn promptly<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> (T, Duration) {
    let t = Instant::now();
    let v = std::thread::Builder::new()
        .stack_size(256 * 1024)
        .spawn(f)
        .unwrap()
        .join()
        .unwrap();
    (v, t.elapsed())
}

#[test]
fn hostile_completions_are_bounded() {
    // 100 kB of filler, then a correct answer.
    let long = format!("{}{}", "blah ".repeat(20_000), tag("(7 + 3) * 2"));
    assert!(long.len() >= 100_000);
    let (r, t) = promptly(move || reward(&[2, 3, 7], 20, &long));
    assert_eq!(r, 1.0);
    assert!(t < Duration::from_secs(1), "{t:?}");

    // A 100 kB body of allowed characters: not parsed (over MAX_BODY_BYTES), 0.1.
    let body = "1 + ".repeat(25_000) + "1";
    let c = tag(&body);
    let (g, t) = promptly(move || grade(&[1], 1, &c));
    assert_eq!(g, Grade::Wrong(Flaw::TooLong));
    assert!(t < Duration::from_secs(1), "{t:?}");

    // 100 000 nested parentheses around a correct answer.
    let deep = tag(&format!(
        "{}(7 + 3) * 2{}",
        "(".repeat(100_000),
        ")".repeat(100_000)
    ));
    let (g, t) = promptly(move || grade(&[2, 3, 7], 20, &deep));
    assert_eq!(g, Grade::Wrong(Flaw::TooLong));
    assert!(t < Duration::from_secs(1), "{t:?}");

    // 100 000 open parentheses and no closing tag.
    let open = format!("<answer>{}", "(".repeat(100_000));
    let (g, _) = promptly(move || grade(&[2], 2, &open));
    assert_eq!(g, Grade::Unformatted(Unformatted::NoClosedTag));

    // Within the length bound but past the depth bound: 0.1, no recursion past MAX_DEPTH.
    let d = MAX_DEPTH + 1;
    let too_deep = tag(&format!("{}(7 + 3) * 2{}", "(".repeat(d), ")".repeat(d)));
    assert!(too_deep.len() < MAX_BODY_BYTES);
    let (g, _) = promptly(move || grade(&[2, 3, 7], 20, &too_deep));
    assert_eq!(g, Grade::Wrong(Flaw::Invalid(ParseFault::TooDeep)));

    // At the depth bound: parsed and correct.
    let d = MAX_DEPTH - 1;
    let at_bound = tag(&format!("{}(7 + 3) * 2{}", "(".repeat(d), ")".repeat(d)));
    let (g, _) = promptly(move || grade(&[2, 3, 7], 20, &at_bound));
    assert_eq!(g, Grade::Correct);

    // Many tags and almost-tags: still linear.
    let spam = "<answer".repeat(20_000) + &"</answer".repeat(20_000);
    let (r, t) = promptly(move || reward(&[1], 1, &spam));
    assert_eq!(r, 0.0);
    assert!(t < Duration::from_secs(1), "{t:?}");
}

#[test]
fn prompt_wording() {
    assert_eq!(
        instruction(&[44, 19, 35], 98),
        "Using the numbers [44, 19, 35], create an equation that equals 98. You can use basic \
         arithmetic operations (+, -, *, /) and each number can only be used once. Show your \
         work in <think> </think> tags. And return the final answer in <answer> </answer> \
         tags, for example <answer> (1 + 2) / 3 </answer>."
    );
    let base = countdown::prompt(&[44, 19, 35], 98, PromptStyle::Base);
    assert!(base.starts_with("A conversation between User and Assistant."));
    assert!(base.contains(&format!("\nUser: {}\n", instruction(&[44, 19, 35], 98))));
    assert!(base.ends_with("Assistant: Let me solve this step by step.\n<think>"));
}

// ---- An independent oracle: brute force over all expressions of a sub-multiset. ----

/// A fraction `(num, den)` with `den > 0`, reduced.
type Frac = (i128, i128);

fn gcd(a: i128, b: i128) -> i128 {
    if b == 0 {
        a.abs()
    } else {
        gcd(b, a % b)
    }
}

fn frac(n: i128, d: i128) -> Option<Frac> {
    if d == 0 {
        return None;
    }
    let g = gcd(n, d);
    let s = if d < 0 { -1 } else { 1 };
    Some((s * n / g, s * d / g))
}

/// Whether some expression over a sub-multiset of `vals` (each once) equals `target`.
fn reachable(vals: &[Frac], target: i128) -> bool {
    if vals.iter().any(|&(n, d)| d == 1 && n == target) {
        return true;
    }
    for i in 0..vals.len() {
        for j in i + 1..vals.len() {
            let ((a, b), (c, d)) = (vals[i], vals[j]);
            let rest: Vec<Frac> = (0..vals.len())
                .filter(|&k| k != i && k != j)
                .map(|k| vals[k])
                .collect();
            let results = [
                frac(a * d + c * b, b * d),
                frac(a * d - c * b, b * d),
                frac(c * b - a * d, b * d),
                frac(a * c, b * d),
                frac(a * d, b * c),
                frac(c * b, d * a),
            ];
            for r in results.into_iter().flatten() {
                let mut next = rest.clone();
                next.push(r);
                if reachable(&next, target) {
                    return true;
                }
            }
        }
    }
    false
}

fn key(p: &Puzzle) -> (Vec<u32>, i64) {
    let mut s = p.numbers.clone();
    s.sort_unstable();
    (s, p.target)
}

fn check_puzzle(p: &Puzzle, c: &CountdownConfig) {
    assert!(
        (c.min_numbers..=c.max_numbers).contains(&p.numbers.len()),
        "{p:?}"
    );
    assert!(p
        .numbers
        .iter()
        .all(|n| (c.min_number..=c.max_number).contains(n)));
    assert!((1..=c.max_target).contains(&p.target), "{p:?}");
    let vals: Vec<Frac> = p.numbers.iter().map(|&n| (i128::from(n), 1)).collect();
    assert!(reachable(&vals, i128::from(p.target)), "unsolvable: {p:?}");
    // The construction's own expression is a correct answer, and the prompt names the puzzle.
    assert_eq!(
        reward(&p.numbers, p.target, &tag(&p.solution)),
        1.0,
        "{p:?}"
    );
    assert_eq!(p.prompt(), instruction(&p.numbers, p.target));
}

#[test]
fn every_puzzle_is_solvable() {
    for config in [
        CountdownConfig::default(),
        CountdownConfig {
            min_numbers: 3,
            max_numbers: 3,
            max_target: 1000,
            ..CountdownConfig::default()
        },
    ] {
        let task = CountdownTask::new(config.clone()).unwrap();
        let mut n = 0;
        for g in 0..3 {
            for p in task.train(11, g, 100).unwrap() {
                check_puzzle(&p, &config);
                n += 1;
            }
        }
        for p in task.held_out(100).unwrap() {
            check_puzzle(&p, &config);
            n += 1;
        }
        assert_eq!(n, 400);
    }
}

#[test]
fn held_out_is_disjoint_from_training() {
    let task = CountdownTask::new(CountdownConfig::default()).unwrap();
    let held: Vec<Puzzle> = task.held_out(300).unwrap();
    assert_eq!(held.len(), 300);
    let held_keys: HashSet<_> = held.iter().map(key).collect();
    assert_eq!(held_keys.len(), 300, "held-out puzzles are distinct");
    assert!(held
        .iter()
        .all(|p| split_of(&p.numbers, p.target) == Split::HeldOut));
    let mut train = 0;
    for seed in [0, 1, 2, 12345] {
        for g in [0, 1, 7, 1000] {
            for p in task.train(seed, g, 100).unwrap() {
                assert_eq!(split_of(&p.numbers, p.target), Split::Train);
                assert!(!held_keys.contains(&key(&p)), "{p:?} is held out");
                train += 1;
            }
        }
    }
    assert_eq!(train, 1600);
    // The split ignores the order of the numbers.
    assert_eq!(split_of(&[3, 1, 2], 6), split_of(&[1, 2, 3], 6));
}

#[test]
fn prompts_are_deterministic_per_seed_and_generation() {
    let task = CountdownTask::new(CountdownConfig::default()).unwrap();
    let a = task.train(7, 3, 16).unwrap();
    assert_eq!(a, task.train(7, 3, 16).unwrap());
    // A fresh task (a resumed run) reproduces them.
    let again = CountdownTask::new(CountdownConfig::default()).unwrap();
    assert_eq!(a, again.train(7, 3, 16).unwrap());
    // Fewer prompts are a prefix.
    assert_eq!(a[..4], task.train(7, 3, 4).unwrap()[..]);
    assert_ne!(a, task.train(7, 4, 16).unwrap());
    assert_ne!(a, task.train(8, 3, 16).unwrap());
    // Different generations give mostly different puzzles.
    let b: HashSet<_> = task.train(7, 4, 16).unwrap().iter().map(key).collect();
    let shared = a.iter().filter(|p| b.contains(&key(p))).count();
    assert!(shared <= 2, "{shared} shared puzzles");
    // Held-out sets: independent of the run seed, prefixes of each other.
    let h = task.held_out(20).unwrap();
    assert_eq!(h[..10], task.held_out(10).unwrap()[..]);
    let other = CountdownTask::new(CountdownConfig {
        eval_seed: 1,
        ..CountdownConfig::default()
    })
    .unwrap();
    assert_ne!(h, other.held_out(20).unwrap());
    // Both sizes in range are drawn.
    let sizes: HashSet<usize> = a.iter().map(|p| p.numbers.len()).collect();
    assert_eq!(sizes, HashSet::from([3, 4]));
}

#[test]
fn task_reward_scores_puzzles() {
    let task = CountdownTask::new(CountdownConfig::default()).unwrap();
    let p = &task.train(0, 0, 1).unwrap()[0];
    let r = task.reward();
    assert_eq!(r.score(p, &tag(&p.solution)), 1.0);
    assert_eq!(r.score(p, "no idea"), 0.0);
    assert_eq!(task.name(), "countdown");
}

#[test]
fn bad_settings_are_refused() {
    // Each an edit of the default config.
    let bad: [fn(&mut CountdownConfig); 6] = [
        |c| c.min_numbers = 1,
        |c| (c.min_numbers, c.max_numbers) = (5, 4),
        |c| c.max_numbers = 7,
        |c| c.min_number = 0,
        |c| c.max_number = 100_000,
        |c| c.max_target = 0,
    ];
    for edit in bad {
        let mut c = CountdownConfig::default();
        edit(&mut c);
        let err = CountdownTask::new(c.clone()).unwrap_err();
        assert!(matches!(err, TaskError::Config(_)), "{c:?}: {err}");
    }
    let err = CountdownTask::new(CountdownConfig {
        eval_seed: 1 << 63,
        ..CountdownConfig::default()
    })
    .unwrap_err();
    assert!(err.to_string().contains("2^63"), "{err}");
    let task = CountdownTask::new(CountdownConfig::default()).unwrap();
    assert!(matches!(task.train(1 << 63, 0, 1), Err(TaskError::Seed(_))));
}
