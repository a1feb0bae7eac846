//! The parallel batch scorer: pairing of completions with items, containment of panicking
//! and non-finite rewards (floor below every finite reward, counted), thread-count
//! independence.
//!
//! Tolerances: none; rewards are compared exactly.

use shardes::tasks::countdown::{CountdownConfig, CountdownTask};
use shardes::tasks::{
    score_batch, score_batch_on, Contained, Failure, Reward, Scores, Task, TaskError,
};

/// A reward that misbehaves on request: "panic", "nan", "inf" and "-inf" completions.
fn flaky(item: &f32, completion: &str) -> f32 {
    match completion {
        "panic" => panic!("reward exploded"),
        "nan" => f32::NAN,
        "inf" => f32::INFINITY,
        "-inf" => f32::NEG_INFINITY,
        _ => item + completion.len() as f32,
    }
}

#[test]
fn failures_are_contained_and_counted() {
    let items = [0.0f32];
    let completions = ["ab", "panic", "a", "nan", "abcd", "inf", "-inf"];
    let s = score_batch(&flaky, &items, &completions).unwrap();
    let floor = 1.0 - 1.0; // the smallest finite reward (1.0, "a") minus 1
    assert_eq!(s.floor, Some(floor));
    assert_eq!(s.rewards, vec![2.0, floor, 1.0, floor, 4.0, floor, floor]);
    assert_eq!(s.contained_count(), 4);
    assert_eq!(
        s.contained[0],
        Contained {
            index: 1,
            failure: Failure::Panicked("reward exploded".into())
        }
    );
    assert_eq!(s.contained[1].index, 3);
    assert!(matches!(s.contained[1].failure, Failure::NonFinite(v) if v.is_nan()));
    assert_eq!(s.contained[2].failure, Failure::NonFinite(f32::INFINITY));
    assert_eq!(
        s.contained[3].failure,
        Failure::NonFinite(f32::NEG_INFINITY)
    );
    // The floor ranks last: strictly below every finite reward.
    let worst_finite = s
        .rewards
        .iter()
        .enumerate()
        .filter(|(j, _)| !s.contained.iter().any(|c| c.index == *j))
        .map(|(_, &r)| r)
        .fold(f32::INFINITY, f32::min);
    assert!(floor < worst_finite);
    assert!(s.rewards.iter().all(|r| r.is_finite()));
}

#[test]
fn formatted_panics_and_all_failing_batches() {
    let r = |_: &(), c: &str| -> f32 {
        if c.is_empty() {
            panic!("empty completion {}", 7)
        }
        f32::NAN
    };
    let s = score_batch(&r, &[()], &["", "x"]).unwrap();
    assert_eq!(s.floor, Some(-1.0), "no finite reward: the floor is -1");
    assert_eq!(s.rewards, vec![-1.0, -1.0]);
    assert_eq!(
        s.contained[0].failure,
        Failure::Panicked("empty completion 7".into())
    );
    // Nothing contained: no floor.
    let ok = score_batch(&|_: &(), _: &str| 0.5, &[()], &["a", "b"]).unwrap();
    assert_eq!(
        ok,
        Scores {
            rewards: vec![0.5, 0.5],
            contained: vec![],
            floor: None
        }
    );
}

#[test]
fn completions_pair_with_items_row_major() {
    // 3 members × 2 items: completion j belongs to item j % 2.
    let items = [10.0f32, 20.0];
    let completions = ["a", "a", "bb", "bb", "ccc", "ccc"];
    let s = score_batch(&flaky, &items, &completions).unwrap();
    assert_eq!(s.rewards, vec![11.0, 21.0, 12.0, 22.0, 13.0, 23.0]);
    let err = score_batch(&flaky, &items, &["a", "b", "c"]).unwrap_err();
    assert!(matches!(
        err,
        TaskError::Pairing {
            completions: 3,
            items: 2
        }
    ));
    assert!(err.to_string().contains("[members, items]"), "{err}");
    assert!(score_batch(&flaky, &[] as &[f32], &["a"]).is_err());
    assert!(score_batch(&flaky, &[] as &[f32], &[] as &[&str])
        .unwrap()
        .rewards
        .is_empty());
}

#[test]
fn results_do_not_depend_on_the_thread_count() {
    let items: Vec<f32> = (0..7).map(|i| i as f32).collect();
    let completions: Vec<String> = (0..700)
        .map(|j| match j % 13 {
            0 => "panic".to_string(),
            5 => "nan".to_string(),
            k => "x".repeat(k),
        })
        .collect();
    let one = score_batch_on(1, &flaky, &items, &completions).unwrap();
    let indices = |s: &Scores| s.contained.iter().map(|c| c.index).collect::<Vec<_>>();
    for threads in [2, 3, 8, 64, 10_000] {
        // Scores hold NaN failures, which never compare equal: compare the parts.
        let many = score_batch_on(threads, &flaky, &items, &completions).unwrap();
        assert_eq!(one.rewards, many.rewards);
        assert_eq!(one.floor, many.floor);
        assert_eq!(indices(&one), indices(&many));
    }
    let bad = (0..700).filter(|j| j % 13 == 0 || j % 13 == 5).count();
    assert_eq!(one.contained_count(), bad);
}

#[test]
fn scores_a_task_through_its_dyn_reward() {
    let task = CountdownTask::new(CountdownConfig::default()).unwrap();
    let items = task.train(3, 0, 4).unwrap();
    let mut completions = Vec::new();
    for member in 0..2 {
        for p in &items {
            completions.push(if member == 0 {
                format!("<answer>{}</answer>", p.solution)
            } else {
                "<answer>1 + 1</answer>".to_string()
            });
        }
    }
    let reward: &dyn Reward<_> = task.reward();
    let s = score_batch(reward, &items, &completions).unwrap();
    assert_eq!(s.rewards[..4], [1.0; 4]);
    assert!(s.rewards[4..].iter().all(|&r| r == 0.1 || r == 1.0));
    assert_eq!(s.contained_count(), 0);
}
