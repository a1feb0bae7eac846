//! Tasks and rewards for fine-tuning a language model on text: the host side of a reward
//! run, independent of any model.
//!
//! A [`Task`] supplies each generation's training prompts (chosen deterministically from the
//! run seed and the generation, so a resumed run sees the same prompts), a fixed held-out
//! set, and a [`Reward`] that scores a completion of an item. [`score_batch`] scores a
//! batch of completions in parallel on host threads and contains failing rewards.
//!
//! Built-in tasks:
//! - [`countdown`]: arithmetic puzzles solvable by construction (TinyZero's Countdown),
//!   with the `0.1 · format + 1.0 · correct` reward on the first `<answer>…</answer>`;
//! - [`jsonl`]: `{"prompt": …, "answer": …}` lines with an exact-match reward;
//! - [`chat`] renders a prompt through a checkpoint's chat template (for Instruct models).
//!
//! Any text task can instead be rewarded by a program of the user's, in any language,
//! speaking JSON lines on its stdin and stdout: [`command`] (`[task.reward] command`).
//!
//! # Containment
//!
//! A reward that panics or returns NaN or ±∞ for a completion does not stop the run:
//! [`score_batch`] gives that completion the **floor** (see [`Scores::floor`]), a finite value
//! strictly below every finite reward of the batch, and lists it in [`Scores::contained`] so
//! the run can log the count. Why a finite floor rather than `f32::NEG_INFINITY` or NaN: the
//! run negates rewards into fitness and shapes them; a rank-based shaping
//! (`centered_ranks`, and `group_relative` within each prompt's group, since the floor is
//! below the batch's minimum) ranks the floor last, exactly as it should, while
//! value-based shapings (`centered`, `group_relative`'s mean and standard deviation) stay
//! finite, which an infinity would not (∞ − ∞ is NaN and poisons every member's weight).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;

use thiserror::Error;

use crate::hlo::prng::PrngError;

pub mod chat;
pub mod command;
pub mod countdown;
mod draw;
pub mod jsonl;
pub mod target_token;

/// Errors of tasks, task files, chat templates and batch scoring.
#[derive(Debug, Error)]
pub enum TaskError {
    /// The run seed does not fit the PRNG's key format.
    #[error(transparent)]
    Seed(#[from] PrngError),
    /// A task setting is out of range; the message names it and the accepted range.
    #[error("invalid task setting: {0}")]
    Config(String),
    /// A file could not be read.
    #[error("cannot read {}: {source}; check the path and its permissions", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// A task file holds no items.
    #[error(
        "task file {} is empty (no non-blank lines); give a JSONL file with one \
         {{\"prompt\": ..., \"answer\": ...}} object per line",
        path.display()
    )]
    EmptyTaskFile {
        /// The file.
        path: PathBuf,
    },
    /// A line of a task file is not a valid item.
    #[error(
        "{}:{line}: {reason}; each line must be a JSON object \
         {{\"prompt\": \"...\", \"answer\": \"...\"}} (answer a string or a number)",
        path.display()
    )]
    MalformedLine {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong with the line.
        reason: String,
    },
    /// Every item of a file fell into the held-out split, leaving nothing to train on.
    #[error(
        "all {items} items of {} fall in the held-out split, leaving no training prompt; \
         give a separate held-out file or more items",
        path.display()
    )]
    NoTrainItems {
        /// The file.
        path: PathBuf,
        /// How many items it has.
        items: usize,
    },
    /// The checkpoint has no chat template.
    #[error(
        "{} has no chat template (no `chat_template` key, and no chat_template.jinja beside \
         it); set `task.chat = false` or use a checkpoint with a chat template (an Instruct \
         model)",
        path.display()
    )]
    NoChatTemplate {
        /// The `tokenizer_config.json` looked at.
        path: PathBuf,
    },
    /// A `tokenizer_config.json` could not be understood.
    #[error("{}: {reason}; expected a Hugging Face tokenizer_config.json", path.display())]
    TokenizerConfig {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The chat template failed to compile or to render.
    #[error("chat template from {origin}: {message}")]
    Template {
        /// Where the template came from (a file, or "the given source").
        origin: String,
        /// The template engine's message.
        message: String,
    },
    /// No Countdown puzzle met the settings within the attempt limit.
    #[error(
        "no Countdown puzzle with a target in 1..={max_target} found in {attempts} attempts \
         ({split} split); widen the number range or raise `max_target`"
    )]
    PuzzleSearch {
        /// Attempts made.
        attempts: usize,
        /// The target bound.
        max_target: i64,
        /// `train` or `held-out`.
        split: &'static str,
    },
    /// A reward program failed beyond containment (see [`command`]).
    #[error(transparent)]
    Command(#[from] command::CommandError),
    /// The completions do not pair with the items.
    #[error(
        "{completions} completions for {items} items: completions must be laid out \
         [members, items] row-major, a whole multiple of the item count"
    )]
    Pairing {
        /// Number of completions.
        completions: usize,
        /// Number of items.
        items: usize,
    },
}

/// A task item: the prompt text plus whatever its reward needs.
pub trait TaskItem {
    /// The prompt, before any chat template.
    fn prompt(&self) -> &str;

    /// The item's fields as a JSON object, what a reward program receives as `item`
    /// ([`command`]); by default only `{"prompt": ...}`.
    fn fields(&self) -> serde_json::Value {
        serde_json::json!({ "prompt": self.prompt() })
    }
}

/// Scores one completion of one item; users implement it for their own rewards.
///
/// `Send + Sync` because [`score_batch`] calls it from several host threads at once. A
/// higher reward is better. A panic or a non-finite value is contained by [`score_batch`]
/// (the completion gets the batch's floor and is counted), but a reward should not rely
/// on that: return a low finite value for a bad completion.
///
/// Any `Fn(&I, &str) -> f32 + Send + Sync` closure is a reward.
pub trait Reward<I: ?Sized>: Send + Sync {
    /// The reward of `completion` (the generated text only, without the prompt) for `item`.
    fn score(&self, item: &I, completion: &str) -> f32;
}

impl<I: ?Sized, F> Reward<I> for F
where
    F: Fn(&I, &str) -> f32 + Send + Sync,
{
    fn score(&self, item: &I, completion: &str) -> f32 {
        self(item, completion)
    }
}

/// A source of prompts and their reward.
///
/// Implementations must be deterministic: the same arguments give the same items, on any
/// machine, so a resumed run reproduces its prompts.
pub trait Task: Send + Sync {
    /// The items this task hands out.
    type Item: TaskItem + Send + Sync;

    /// A short name for logs (`countdown`, `jsonl`).
    fn name(&self) -> &str;

    /// `count` training items for `generation` of a run with `seed`, a function of
    /// `(seed, generation, count)` only. Never any held-out item.
    fn train(&self, seed: u64, generation: u32, count: usize)
        -> Result<Vec<Self::Item>, TaskError>;

    /// The first `count` held-out items (fewer if the task has fewer), the same for every
    /// run and seed so runs compare; a smaller `count` gives a prefix of a larger one.
    fn held_out(&self, count: usize) -> Result<Vec<Self::Item>, TaskError>;

    /// The reward of this task's completions.
    fn reward(&self) -> &dyn Reward<Self::Item>;
}

/// The body of the **first** `<answer>…</answer>` of `text`, untrimmed: the text between
/// the first `<answer>` and the first `</answer>` after it. `None` when there is no
/// `<answer>` or it is never closed. Linear in `text`'s length.
pub fn answer_tag(text: &str) -> Option<&str> {
    const OPEN: &str = "<answer>";
    const CLOSE: &str = "</answer>";
    let start = text.find(OPEN)? + OPEN.len();
    let len = text[start..].find(CLOSE)?;
    Some(&text[start..start + len])
}

/// Why a completion's reward was replaced by the floor.
#[derive(Clone, Debug, PartialEq)]
pub enum Failure {
    /// The reward panicked; the panic message (empty when it was not a string).
    Panicked(String),
    /// The reward returned NaN or ±∞ (the value).
    NonFinite(f32),
    /// A reward program answered with something that is not a finite reward (what).
    BadAnswer(String),
    /// A reward program did not answer in time, or died twice before answering.
    NoAnswer,
}

/// One contained failure: which completion and why.
#[derive(Clone, Debug, PartialEq)]
pub struct Contained {
    /// The completion's index in the batch.
    pub index: usize,
    /// What went wrong.
    pub failure: Failure,
}

/// The rewards of a batch, with the failures that were contained.
#[derive(Clone, Debug, PartialEq)]
pub struct Scores {
    /// One finite reward per completion, in batch order.
    pub rewards: Vec<f32>,
    /// The completions whose reward panicked, was not finite or (from a reward program)
    /// was bad or missing, in index order; each got
    /// [`Scores::floor`].
    pub contained: Vec<Contained>,
    /// The value given to contained completions: `m − 1` where `m` is the smallest finite
    /// reward of the batch (the next float below `m` when `m − 1` rounds back to `m`, and `m`
    /// itself in the one case `m = −f32::MAX`), or `−1` when no reward was finite. `None`
    /// when nothing was contained.
    pub floor: Option<f32>,
}

impl Scores {
    /// How many completions were contained (for the run's log).
    pub fn contained_count(&self) -> usize {
        self.contained.len()
    }
}

/// Scores `completions` against `items` in parallel on all available cores; see
/// [`score_batch_on`].
pub fn score_batch<I, R, S>(reward: &R, items: &[I], completions: &[S]) -> Result<Scores, TaskError>
where
    I: Sync,
    R: Reward<I> + ?Sized,
    S: AsRef<str> + Sync,
{
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    score_batch_on(threads, reward, items, completions)
}

/// Scores `completions` against `items` on up to `threads` host threads.
///
/// Completion `j` is scored against `items[j % items.len()]`: completions are laid out
/// `[members, items]` row-major, as a population decodes one prompt batch (with one
/// completion per item, `j` pairs with item `j`). A completion count that is not a multiple
/// of the item count is [`TaskError::Pairing`].
///
/// A panic or a non-finite result is contained (see the [module docs](self)): the
/// completion gets [`Scores::floor`] and is listed in [`Scores::contained`]; the other
/// completions are unaffected. The reward keeps being called after one of its calls
/// panicked, so a reward with interior state must tolerate that (a poisoned lock, say).
/// The process's panic hook still runs for each panic (by default it prints the message).
pub fn score_batch_on<I, R, S>(
    threads: usize,
    reward: &R,
    items: &[I],
    completions: &[S],
) -> Result<Scores, TaskError>
where
    I: Sync,
    R: Reward<I> + ?Sized,
    S: AsRef<str> + Sync,
{
    if completions.is_empty() {
        return Ok(Scores {
            rewards: Vec::new(),
            contained: Vec::new(),
            floor: None,
        });
    }
    if items.is_empty() || !completions.len().is_multiple_of(items.len()) {
        return Err(TaskError::Pairing {
            completions: completions.len(),
            items: items.len(),
        });
    }
    let one = |j: usize| -> Result<f32, Failure> {
        let item = &items[j % items.len()];
        let text = completions[j].as_ref();
        // The reward is only read through `&`; after a panic we keep no value it produced,
        // so its broken invariants (if any) are its own to tolerate, as documented.
        match catch_unwind(AssertUnwindSafe(|| reward.score(item, text))) {
            Ok(r) if r.is_finite() => Ok(r),
            Ok(r) => Err(Failure::NonFinite(r)),
            Err(payload) => Err(Failure::Panicked(panic_message(payload.as_ref()))),
        }
    };
    let mut results: Vec<Result<f32, Failure>> = vec![Ok(0.0); completions.len()];
    let threads = threads.clamp(1, completions.len());
    if threads == 1 {
        for (j, slot) in results.iter_mut().enumerate() {
            *slot = one(j);
        }
    } else {
        let chunk = completions.len().div_ceil(threads);
        std::thread::scope(|s| {
            for (c, slots) in results.chunks_mut(chunk).enumerate() {
                let one = &one;
                s.spawn(move || {
                    for (k, slot) in slots.iter_mut().enumerate() {
                        *slot = one(c * chunk + k);
                    }
                });
            }
        });
    }
    Ok(contain(results))
}

/// Replaces failures by the floor below the finite rewards.
fn contain(results: Vec<Result<f32, Failure>>) -> Scores {
    let mut contained = Vec::new();
    let mut min = f32::INFINITY;
    for (index, r) in results.iter().enumerate() {
        match r {
            Ok(v) => min = min.min(*v),
            Err(failure) => contained.push(Contained {
                index,
                failure: failure.clone(),
            }),
        }
    }
    let floor = if contained.is_empty() {
        None
    } else if min.is_finite() {
        Some(below(min))
    } else {
        Some(-1.0)
    };
    let rewards = results
        .into_iter()
        .map(|r| r.unwrap_or(floor.unwrap_or(-1.0)))
        .collect();
    Scores {
        rewards,
        contained,
        floor,
    }
}

/// A finite value strictly below the finite `m` (or `m` itself for `m = −f32::MAX`).
fn below(m: f32) -> f32 {
    let f = m - 1.0;
    if f < m {
        return f;
    }
    if m == -f32::MAX {
        return m;
    }
    // `m − 1` rounded back to `m`: step one ulp down (|m| ≥ 2^24 here, so m ≠ 0).
    if m > 0.0 {
        f32::from_bits(m.to_bits() - 1)
    } else {
        f32::from_bits(m.to_bits() + 1)
    }
}

/// The text of a panic payload (`panic!` with a literal or a formatted message).
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        String::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn below_is_strictly_below_and_finite() {
        for m in [0.0f32, 1.0, -1.0, 0.1, 1e30, -1e30, 3e7, -3e7, f32::MAX] {
            let f = below(m);
            assert!(f < m && f.is_finite(), "{m} -> {f}");
        }
        assert_eq!(below(-f32::MAX), -f32::MAX);
    }

    #[test]
    fn answer_tag_takes_the_first_closed_tag() {
        assert_eq!(
            answer_tag("a <answer> 1 </answer> <answer>2</answer>"),
            Some(" 1 ")
        );
        assert_eq!(answer_tag("<answer>1"), None);
        assert_eq!(answer_tag("</answer><answer>"), None);
        assert_eq!(answer_tag("</answer><answer>x</answer>"), Some("x"));
        assert_eq!(answer_tag("none"), None);
    }
}
