//! Countdown: reach a target from a few numbers with `+ - * /` (TinyZero's task, used by
//! Qiu et al.'s ES fine-tuning).
//!
//! # Puzzles
//!
//! A puzzle draws 3–4 numbers (configurable) uniformly in `1..=99` (configurable) and
//! builds its target by combining them all with random `+ − × ÷` in exact rational
//! arithmetic (two values at a time, until one is left; intermediates may be fractions or
//! negative); draws are redone until that value is an integer in `1..=max_target`. So every
//! puzzle is **solvable by construction**; [`Puzzle::solution`] is the expression built.
//!
//! Training puzzles are fresh every generation: item `i` of generation `g` comes from
//! the stream `fold_in(fold_in(fold_in(key(seed), TRAIN_TAG), g), i)` of the host threefry
//! PRNG, so a resumed run reproduces its prompts. Held-out puzzles come from
//! [`CountdownConfig::eval_seed`] (not the run seed, so runs with different seeds are
//! evaluated on the same puzzles), without duplicates.
//!
//! **Disjointness.** Every puzzle has a key, its sorted numbers and its target, and the key
//! alone decides its split ([`split_of`]): a fixed threefry hash of the key (the same for
//! every seed) puts one key in [`HELD_OUT_MODULUS`] in the held-out class, the rest in the
//! training class. Training draws keep only training-class puzzles and held-out draws only
//! held-out-class ones, so no key can be in both sets, whatever the seeds, the generation or
//! the set sizes: disjointness is a property of a function, not of a search, and holds
//! across runs. (Generating the held-out set first and excluding it would also work within
//! one run, but every training draw would depend on the held-out size.)
//!
//! # Reward
//!
//! [`reward`] reads the body of the **first** `<answer>…</answer>` of the completion (the
//! text between the first `<answer>` and the first `</answer>` after it), trimmed:
//! - **1.0** when the body is an expression over the puzzle's numbers (each used at most
//!   once, as a multiset; not all need be used) whose exact rational value equals the
//!   target;
//! - **0.1** when the body (non-empty) consists only of ASCII digits, `+ - * /`,
//!   parentheses and whitespace but is not such an expression: a wrong value, a number
//!   used more often than given or not given, division by zero, a syntax error
//!   (unbalanced parentheses, a dangling operator), an overflow of i128, or a body over
//!   the bounds below;
//! - **0.0** otherwise: no `<answer>`, no closing `</answer>`, an empty body, or any
//!   other character (`=`, `×`, `.`, a letter, ...).
//!
//! Expressions follow the grammar `expr := term (('+'|'-') term)*`,
//! `term := operand (('*'|'/') operand)*`, `operand := '-'? primary`,
//! `primary := integer | '(' expr ')'`: the usual precedence, left associativity, and one
//! unary minus allowed before any operand (`-3 + 10`, `4 * -(1 - 3)`; not `--3` or `+3`).
//! Literals are compared by value (`07` is 7). The expression is evaluated only by our
//! own parser, in exact rationals with i128 numerator and denominator and checked
//! arithmetic; nothing is ever handed to an evaluator.
//!
//! # Bounds
//!
//! A hostile completion costs time linear in its length (two substring searches and one
//! character scan) and no more: the parser runs only on bodies of at most
//! [`MAX_BODY_BYTES`] bytes (longer ones score 0.1 or 0.0 by their characters), and
//! parentheses may nest at most [`MAX_DEPTH`] deep (deeper is 0.1), so the recursion depth
//! is bounded (four frames per level).

mod expr;

use std::collections::HashSet;

use serde::Serialize;

use super::draw::{task_key, Draws};
use super::{answer_tag, Reward, Task, TaskError, TaskItem};
use crate::hlo::prng::{fold_in, key, Key};

pub use expr::ParseFault;

use expr::Rational;

/// Longest answer body (trimmed, in bytes) that is parsed; longer ones are not expressions.
pub const MAX_BODY_BYTES: usize = 1024;

/// Deepest parenthesis nesting that is parsed; deeper bodies are not expressions.
pub const MAX_DEPTH: usize = 64;

/// Most numbers a puzzle may have.
pub const MAX_NUMBERS: usize = 6;

/// Largest number a puzzle may draw.
pub const MAX_NUMBER: u32 = 10_000;

/// Largest target bound [`CountdownConfig::max_target`] accepts.
pub const MAX_TARGET: i64 = 1_000_000;

/// One puzzle key in this many is held out (see [`split_of`]).
pub const HELD_OUT_MODULUS: u32 = 8;

/// Draws tried per puzzle before giving up with [`TaskError::PuzzleSearch`].
pub const MAX_ATTEMPTS: usize = 100_000;

/// The reward of a correct answer.
pub const CORRECT: f32 = 1.0;

/// The reward of a well-formed but wrong answer.
pub const FORMAT: f32 = 0.1;

// Stream tags (ASCII): keep training and held-out streams apart from each other and from
// the other streams of a run.
const TRAIN_TAG: u32 = 0x6364_7472; // "cdtr"
const HELD_OUT_TAG: u32 = 0x6364_6576; // "cdev"
const SPLIT_SEED: u64 = 0x636f_756e_7464_6f77; // "countdow"

/// How a puzzle's prompt is worded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PromptStyle {
    /// The instruction alone (TinyZero's user message): for Instruct models, usually
    /// wrapped with the checkpoint's chat template ([`super::chat`]).
    #[default]
    Instruction,
    /// TinyZero's framing for base models: `A conversation between User and Assistant. …
    /// User: {instruction}\nAssistant: Let me solve this step by step.\n<think>` (the
    /// model continues the thinking it was started on).
    Base,
    /// One short line, `numbers 3 5 7 target 15 answer`, for tiny models with few
    /// positions (smoke tests, examples); the completion is graded the same way.
    Compact,
}

/// Countdown settings.
#[derive(Clone, Debug, PartialEq)]
pub struct CountdownConfig {
    /// Fewest numbers per puzzle (at least 2).
    pub min_numbers: usize,
    /// Most numbers per puzzle (at most [`MAX_NUMBERS`]).
    pub max_numbers: usize,
    /// Smallest number drawn (at least 1).
    pub min_number: u32,
    /// Largest number drawn (at most [`MAX_NUMBER`]).
    pub max_number: u32,
    /// Targets lie in `1..=max_target` (at most [`MAX_TARGET`]).
    pub max_target: i64,
    /// Seed of the held-out set (independent of the run seed).
    pub eval_seed: u64,
    /// How prompts are worded.
    pub prompt: PromptStyle,
}

impl Default for CountdownConfig {
    /// TinyZero's Countdown: 3–4 numbers in 1..=99, targets up to 100.
    fn default() -> Self {
        CountdownConfig {
            min_numbers: 3,
            max_numbers: 4,
            min_number: 1,
            max_number: 99,
            max_target: 100,
            eval_seed: 0,
            prompt: PromptStyle::Instruction,
        }
    }
}

/// A setting's `min_{what}` and `max_{what}`: `lo ≤ min ≤ max ≤ top`; the error names the
/// setting and its range.
fn bounds(what: &str, lo: u64, min: u64, max: u64, top: u64) -> Result<(), TaskError> {
    if min < lo || min > max {
        return Err(TaskError::Config(format!(
            "countdown min_{what} = {min} must lie in {lo}..=max_{what} ({max})"
        )));
    }
    if max > top {
        return Err(TaskError::Config(format!(
            "countdown max_{what} = {max} must be at most {top}"
        )));
    }
    Ok(())
}

impl CountdownConfig {
    /// Checks every setting's range; the error names the setting and the range.
    pub fn validate(&self) -> Result<(), TaskError> {
        let bad = |m: String| Err(TaskError::Config(m));
        // usize is at most 64 bits: the casts are lossless.
        bounds(
            "numbers",
            2,
            self.min_numbers as u64,
            self.max_numbers as u64,
            MAX_NUMBERS as u64,
        )?;
        bounds(
            "number",
            1,
            self.min_number.into(),
            self.max_number.into(),
            MAX_NUMBER.into(),
        )?;
        if !(1..=MAX_TARGET).contains(&self.max_target) {
            return bad(format!(
                "countdown max_target = {} must lie in 1..={MAX_TARGET}",
                self.max_target
            ));
        }
        Ok(())
    }
}

/// The split a puzzle key belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Split {
    /// Training puzzles.
    Train,
    /// Held-out puzzles.
    HeldOut,
}

/// The split of the puzzle with `numbers` (any order) and `target`: a fixed function of
/// the sorted numbers and the target only (see the module docs).
pub fn split_of(numbers: &[u32], target: i64) -> Split {
    let mut sorted = numbers.to_vec();
    sorted.sort_unstable();
    // A fixed key, so the partition is the same for every run seed. Truncations are the
    // encoding: the seed's and the target's halves are folded separately, the count fits.
    let mut h = Key::from_data([(SPLIT_SEED >> 32) as u32, SPLIT_SEED as u32]);
    h = fold_in(h, sorted.len() as u32);
    for n in sorted {
        h = fold_in(h, n);
    }
    h = fold_in(fold_in(h, target as u32), (target >> 32) as u32);
    if h.data()[0].is_multiple_of(HELD_OUT_MODULUS) {
        Split::HeldOut
    } else {
        Split::Train
    }
}

/// One Countdown puzzle.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Puzzle {
    /// The numbers, in the order the prompt shows them.
    pub numbers: Vec<u32>,
    /// The target, in `1..=max_target`.
    pub target: i64,
    /// The expression the target was built from (uses every number once).
    pub solution: String,
    /// The prompt text.
    pub prompt: String,
}

impl TaskItem for Puzzle {
    fn prompt(&self) -> &str {
        &self.prompt
    }

    /// `{"prompt", "numbers", "target", "solution"}` (one expression that reaches the
    /// target; others may too).
    fn fields(&self) -> serde_json::Value {
        serde_json::json!({
            "prompt": self.prompt,
            "numbers": self.numbers,
            "target": self.target,
            "solution": self.solution,
        })
    }
}

/// The instruction of a puzzle (TinyZero's wording).
pub fn instruction(numbers: &[u32], target: i64) -> String {
    format!(
        "Using the numbers {numbers:?}, create an equation that equals {target}. You can use \
         basic arithmetic operations (+, -, *, /) and each number can only be used once. Show \
         your work in <think> </think> tags. And return the final answer in <answer> \
         </answer> tags, for example <answer> (1 + 2) / 3 </answer>."
    )
}

/// The prompt of a puzzle in `style`.
pub fn prompt(numbers: &[u32], target: i64, style: PromptStyle) -> String {
    let ask = instruction(numbers, target);
    match style {
        PromptStyle::Instruction => ask,
        PromptStyle::Base => format!(
            "A conversation between User and Assistant. The user asks a question, and the \
             Assistant solves it. The assistant first thinks about the reasoning process in \
             the mind and then provides the user with the answer.\nUser: {ask}\nAssistant: \
             Let me solve this step by step.\n<think>"
        ),
        PromptStyle::Compact => {
            let list: Vec<String> = numbers.iter().map(u32::to_string).collect();
            format!("numbers {} target {target} answer", list.join(" "))
        }
    }
}

/// The grade of a completion; [`Grade::reward`] maps it to the reward.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Grade {
    /// The answer reaches the target: 1.0.
    Correct,
    /// Well-formed (allowed characters only) but not a correct expression: 0.1.
    Wrong(Flaw),
    /// No usable answer: 0.0.
    Unformatted(Unformatted),
}

/// Why a well-formed answer is not correct.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flaw {
    /// A valid expression whose value is not the target.
    WrongValue,
    /// A given number used more times than it was given.
    NumberReused,
    /// A number that was not given.
    NumberNotGiven,
    /// Not a valid expression (see [`ParseFault`]).
    Invalid(ParseFault),
    /// The body is longer than [`MAX_BODY_BYTES`].
    TooLong,
}

/// Why a completion has no usable answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unformatted {
    /// No `<answer>`, or no `</answer>` after it.
    NoClosedTag,
    /// The trimmed body is empty.
    Empty,
    /// The body holds a character other than digits, `+ - * /`, parentheses, whitespace.
    Character(char),
}

impl Grade {
    /// 1.0, 0.1 or 0.0.
    pub fn reward(self) -> f32 {
        match self {
            Grade::Correct => CORRECT,
            Grade::Wrong(_) => FORMAT,
            Grade::Unformatted(_) => 0.0,
        }
    }
}

/// Grades `completion` for the puzzle (`numbers`, `target`); see the module docs.
pub fn grade(numbers: &[u32], target: i64, completion: &str) -> Grade {
    let Some(body) = answer_tag(completion) else {
        return Grade::Unformatted(Unformatted::NoClosedTag);
    };
    let body = body.trim();
    if body.is_empty() {
        return Grade::Unformatted(Unformatted::Empty);
    }
    let allowed = |c: char| c.is_ascii_digit() || "+-*/()".contains(c) || c.is_whitespace();
    if let Some(c) = body.chars().find(|&c| !allowed(c)) {
        return Grade::Unformatted(Unformatted::Character(c));
    }
    if body.len() > MAX_BODY_BYTES {
        return Grade::Wrong(Flaw::TooLong);
    }
    let (value, literals) = match expr::evaluate(body, MAX_DEPTH) {
        Ok(v) => v,
        Err(fault) => return Grade::Wrong(Flaw::Invalid(fault)),
    };
    let mut left: Vec<i128> = numbers.iter().map(|&n| i128::from(n)).collect();
    for lit in literals {
        match left.iter().position(|&n| n == lit) {
            Some(p) => {
                left.swap_remove(p);
            }
            None if numbers.iter().any(|&n| i128::from(n) == lit) => {
                return Grade::Wrong(Flaw::NumberReused)
            }
            None => return Grade::Wrong(Flaw::NumberNotGiven),
        }
    }
    if value.as_integer() == Some(i128::from(target)) {
        Grade::Correct
    } else {
        Grade::Wrong(Flaw::WrongValue)
    }
}

/// The Countdown reward of `completion` for the puzzle (`numbers`, `target`): 1.0, 0.1 or
/// 0.0 (see the module docs). For scoring your own completions.
pub fn reward(numbers: &[u32], target: i64, completion: &str) -> f32 {
    grade(numbers, target, completion).reward()
}

/// The Countdown reward as a [`Reward`] of [`Puzzle`]s.
#[derive(Clone, Copy, Debug, Default)]
pub struct CountdownReward;

impl Reward<Puzzle> for CountdownReward {
    fn score(&self, item: &Puzzle, completion: &str) -> f32 {
        reward(&item.numbers, item.target, completion)
    }
}

/// The Countdown task: fresh training puzzles every generation, a fixed held-out set.
#[derive(Clone, Debug)]
pub struct CountdownTask {
    config: CountdownConfig,
}

impl CountdownTask {
    /// A task with `config` (checked by [`CountdownConfig::validate`]).
    pub fn new(config: CountdownConfig) -> Result<CountdownTask, TaskError> {
        config.validate()?;
        key(config.eval_seed)?;
        Ok(CountdownTask { config })
    }

    /// The settings.
    pub fn config(&self) -> &CountdownConfig {
        &self.config
    }

    /// The first puzzle of `split` drawn from the stream of `item_key`.
    fn puzzle(&self, item_key: Key, split: Split) -> Result<Puzzle, TaskError> {
        let c = &self.config;
        let mut d = Draws::new(item_key);
        for _ in 0..MAX_ATTEMPTS {
            let count = d.between(c.min_numbers as u64, c.max_numbers as u64) as usize;
            let numbers: Vec<u32> = (0..count)
                // Within min_number..=max_number, so the value fits u32.
                .map(|_| d.between(u64::from(c.min_number), u64::from(c.max_number)) as u32)
                .collect();
            let Some((value, solution)) = combine(&mut d, &numbers) else {
                continue;
            };
            let Some(target) = value.as_integer().and_then(|v| i64::try_from(v).ok()) else {
                continue;
            };
            if (1..=c.max_target).contains(&target) && split_of(&numbers, target) == split {
                let prompt = prompt(&numbers, target, c.prompt);
                return Ok(Puzzle {
                    numbers,
                    target,
                    solution,
                    prompt,
                });
            }
        }
        Err(TaskError::PuzzleSearch {
            attempts: MAX_ATTEMPTS,
            max_target: c.max_target,
            split: match split {
                Split::Train => "train",
                Split::HeldOut => "held-out",
            },
        })
    }
}

/// Combines all `numbers` with random operations, two values at a time; `None` when a
/// step divides by zero or overflows (the caller draws again).
fn combine(d: &mut Draws, numbers: &[u32]) -> Option<(Rational, String)> {
    let mut vals: Vec<(Rational, String)> = numbers
        .iter()
        .map(|&n| (Rational::int(i128::from(n)), n.to_string()))
        .collect();
    while vals.len() > 1 {
        let len = vals.len() as u64;
        // Below len, so the casts cannot truncate.
        let i = d.below(len) as usize;
        let mut j = d.below(len - 1) as usize;
        if j >= i {
            j += 1;
        }
        let op = d.below(4);
        let (a, ea) = &vals[i];
        let (b, eb) = &vals[j];
        let (v, sym) = match op {
            0 => (a.add(*b), '+'),
            1 => (a.sub(*b), '-'),
            2 => (a.mul(*b), '*'),
            _ => (a.div(*b), '/'),
        };
        let v = v.ok()?;
        let e = format!("({ea} {sym} {eb})");
        vals.remove(i.max(j));
        vals.remove(i.min(j));
        vals.push((v, e));
    }
    let (v, e) = vals.pop()?;
    // The outer parentheses add nothing.
    let e = match e.strip_prefix('(').and_then(|e| e.strip_suffix(')')) {
        Some(inner) => inner.to_string(),
        None => e,
    };
    Some((v, e))
}

impl Task for CountdownTask {
    type Item = Puzzle;

    fn name(&self) -> &str {
        "countdown"
    }

    fn train(&self, seed: u64, generation: u32, count: usize) -> Result<Vec<Puzzle>, TaskError> {
        let g = fold_in(task_key(seed, TRAIN_TAG)?, generation);
        let count = u32::try_from(count)
            .map_err(|_| TaskError::Config(format!("{count} prompts: at most 2^32 − 1")))?;
        (0..count)
            .map(|i| self.puzzle(fold_in(g, i), Split::Train))
            .collect()
    }

    fn held_out(&self, count: usize) -> Result<Vec<Puzzle>, TaskError> {
        let root = task_key(self.config.eval_seed, HELD_OUT_TAG)?;
        let mut seen = HashSet::new();
        let mut out = Vec::with_capacity(count);
        let mut i: u32 = 0;
        // Duplicated keys are skipped; stop after as many extra draws as wanted items,
        // which only a tiny puzzle space can exhaust.
        let limit = count.saturating_mul(2).saturating_add(1000);
        let mut tries = 0usize;
        while out.len() < count && tries < limit {
            let p = self.puzzle(fold_in(root, i), Split::HeldOut)?;
            i = i.wrapping_add(1);
            tries += 1;
            let mut sorted = p.numbers.clone();
            sorted.sort_unstable();
            if seen.insert((sorted, p.target)) {
                out.push(p);
            }
        }
        Ok(out)
    }

    fn reward(&self) -> &dyn Reward<Puzzle> {
        &CountdownReward
    }
}
