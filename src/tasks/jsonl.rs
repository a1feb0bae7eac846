//! Users' own question/answer data: a JSONL file of `{"prompt": …, "answer": …}` lines
//! with an exact-match reward.
//!
//! # File format
//!
//! One JSON object per line with a string `"prompt"` and an `"answer"` that is a string or
//! a number (a number is kept as its JSON text, `42` or `1.5`); other keys are kept in
//! [`QaItem::extra`] for a reward program (the built-in reward ignores them).
//! Blank lines are skipped (line numbers still count them), a UTF-8 byte-order mark and
//! `\r\n` line ends are accepted. A file without any item is [`TaskError::EmptyTaskFile`];
//! any other bad line is [`TaskError::MalformedLine`] with the file and the 1-based line.
//!
//! # Reward
//!
//! [`reward`] is 1.0 when the answer extracted from the completion matches the reference
//! answer, else 0.0:
//! - **Extraction** ([`extract_answer`]): the trimmed body of the first closed
//!   `<answer>…</answer>` if there is one (see [`super::answer_tag`]); otherwise the last
//!   number of the completion (a run of digits, with optional thousands commas and
//!   decimal part, and a `-` sign when the `-` does not follow a digit; sentence
//!   punctuation after it is dropped: "… is 1,234." gives `1,234`); otherwise nothing
//!   (reward 0).
//! - **Comparison** ([`answers_match`]): both sides trimmed; when both are numbers
//!   (`[+-]digits[.digits]`, digits optionally grouped by thousands commas) they are
//!   compared by exact decimal value, so `1,000.50` matches `1000.5` and `-0` matches `0`;
//!   otherwise the strings must be equal, case and inner whitespace included.
//!
//! # Splits
//!
//! [`JsonlTask::open`] takes a training file and, optionally, a held-out file. Without a
//! held-out file, the items whose prompt text hashes (a fixed threefry hash) into one class
//! in [`HELD_OUT_MODULUS`] are held out: the split is a function of the prompt text, so no
//! prompt is in both sets, duplicates included. Each generation's training prompts walk
//! through seeded permutations of the training items, one per epoch: generation `g` with
//! `count` prompts takes positions `g·count .. (g+1)·count` of the concatenated epochs,
//! so every item is seen once per epoch and a resumed run reproduces its prompts.

use std::path::Path;

use serde_json::{Map, Value};

use serde::Serialize;

use super::draw::{fold_in_u64, hash_bytes, task_key, Draws};
use super::{answer_tag, Reward, Task, TaskError, TaskItem};
use crate::hlo::prng::Key;

/// Without a held-out file, one prompt in this many is held out.
pub const HELD_OUT_MODULUS: u32 = 10;

const TRAIN_TAG: u32 = 0x6a73_7472; // "jstr"
const SPLIT_KEY: [u32; 2] = [0x6a73_6f6e, 0x6c73_706c]; // "jsonlspl"

/// One question and its reference answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct QaItem {
    /// The prompt text.
    pub prompt: String,
    /// The reference answer.
    pub answer: String,
    /// The line's other keys, as they were: the built-in reward ignores them, a reward
    /// program receives them ([`TaskItem::fields`]).
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl QaItem {
    /// An item with no other keys.
    pub fn new(prompt: impl Into<String>, answer: impl Into<String>) -> QaItem {
        QaItem {
            prompt: prompt.into(),
            answer: answer.into(),
            extra: Map::new(),
        }
    }
}

impl TaskItem for QaItem {
    fn prompt(&self) -> &str {
        &self.prompt
    }

    /// Every key of the item's line: `prompt`, `answer` (as a string, a number's text as
    /// the file wrote it) and the others as they were.
    fn fields(&self) -> Value {
        let mut m = self.extra.clone();
        m.insert("prompt".into(), Value::String(self.prompt.clone()));
        m.insert("answer".into(), Value::String(self.answer.clone()));
        Value::Object(m)
    }
}

/// Reads a JSONL task file (see the module docs for the format and errors).
pub fn read_jsonl(path: &Path) -> Result<Vec<QaItem>, TaskError> {
    let bytes = std::fs::read(path).map_err(|source| TaskError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    parse_jsonl(&bytes, path)
}

/// Parses JSONL task text; `path` names the source in errors.
pub fn parse_jsonl(bytes: &[u8], path: &Path) -> Result<Vec<QaItem>, TaskError> {
    let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
    let mut items = Vec::new();
    for (i, raw) in bytes.split(|&b| b == b'\n').enumerate() {
        let line = i + 1;
        let bad = |reason: String| TaskError::MalformedLine {
            path: path.to_path_buf(),
            line,
            reason,
        };
        let raw = raw.strip_suffix(b"\r").unwrap_or(raw);
        let text = std::str::from_utf8(raw).map_err(|e| bad(format!("not valid UTF-8 ({e})")))?;
        if text.trim().is_empty() {
            continue;
        }
        let value: Value =
            serde_json::from_str(text).map_err(|e| bad(format!("invalid JSON ({e})")))?;
        let Value::Object(mut obj) = value else {
            return Err(bad("not a JSON object".into()));
        };
        let prompt = match obj.get("prompt") {
            Some(Value::String(s)) => s.clone(),
            Some(_) => return Err(bad("\"prompt\" is not a string".into())),
            None => return Err(bad("no \"prompt\" key".into())),
        };
        let answer = match obj.get("answer") {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Number(n)) => n.to_string(),
            Some(_) => return Err(bad("\"answer\" is neither a string nor a number".into())),
            None => return Err(bad("no \"answer\" key".into())),
        };
        obj.remove("prompt");
        obj.remove("answer");
        items.push(QaItem {
            prompt,
            answer,
            extra: obj,
        });
    }
    if items.is_empty() {
        return Err(TaskError::EmptyTaskFile {
            path: path.to_path_buf(),
        });
    }
    Ok(items)
}

/// The answer a completion gives (see the module docs): the trimmed body of the first
/// closed `<answer>` tag, else the last number, else `None`.
pub fn extract_answer(completion: &str) -> Option<&str> {
    if let Some(body) = answer_tag(completion) {
        return Some(body.trim());
    }
    last_number(completion)
}

/// The last number of `text`: digits, commas and dots around at least one digit, stripped
/// of leading and trailing commas and dots, with a `-` just before it unless that `-`
/// follows a digit.
fn last_number(text: &str) -> Option<&str> {
    let b = text.as_bytes();
    let part = |c: u8| c.is_ascii_digit() || c == b',' || c == b'.';
    // The last digit, then the run of number characters around it.
    let last_digit = b.iter().rposition(u8::is_ascii_digit)?;
    let mut start = last_digit;
    while start > 0 && part(b[start - 1]) {
        start -= 1;
    }
    let mut stop = last_digit + 1;
    while stop < b.len() && part(b[stop]) {
        stop += 1;
    }
    // Leading and trailing separators are punctuation, not part of the number (the run
    // holds the digit at `last_digit`, so both loops stop).
    while !b[start].is_ascii_digit() {
        start += 1;
    }
    while !b[stop - 1].is_ascii_digit() {
        stop -= 1;
    }
    if start > 0 && b[start - 1] == b'-' && (start < 2 || !b[start - 2].is_ascii_digit()) {
        start -= 1;
    }
    // All bytes in start..stop are ASCII, so both ends are char boundaries.
    Some(&text[start..stop])
}

/// `s` as a canonical decimal (no sign for zero, no `+`, no grouping commas, no leading
/// zeros, no trailing fractional zeros), or `None` when it is not a number.
fn canonical_number(s: &str) -> Option<String> {
    let (neg, body) = match s.as_bytes().first()? {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, s),
    };
    let (int, frac) = match body.split_once('.') {
        Some((i, f)) => (i, Some(f)),
        None => (body, None),
    };
    let digits = |t: &str| !t.is_empty() && t.bytes().all(|c| c.is_ascii_digit());
    let int = if int.contains(',') {
        let mut groups = int.split(',');
        let first = groups.next()?;
        if !digits(first) || first.len() > 3 {
            return None;
        }
        let rest: Vec<&str> = groups.collect();
        if !rest.iter().all(|g| g.len() == 3 && digits(g)) {
            return None;
        }
        let mut joined = first.to_string();
        rest.iter().for_each(|g| joined.push_str(g));
        joined
    } else if digits(int) {
        int.to_string()
    } else {
        return None;
    };
    let frac = match frac {
        Some(f) if digits(f) => f.trim_end_matches('0'),
        Some(_) => return None,
        None => "",
    };
    let int = int.trim_start_matches('0');
    let int = if int.is_empty() { "0" } else { int };
    let zero = int == "0" && frac.is_empty();
    let mut out = String::new();
    if neg && !zero {
        out.push('-');
    }
    out.push_str(int);
    if !frac.is_empty() {
        out.push('.');
        out.push_str(frac);
    }
    Some(out)
}

/// Whether an extracted answer matches the reference (see the module docs).
pub fn answers_match(extracted: &str, reference: &str) -> bool {
    let (a, b) = (extracted.trim(), reference.trim());
    match (canonical_number(a), canonical_number(b)) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

/// The exact-match reward of `completion` against the reference `answer`: 1.0 or 0.0.
pub fn reward(answer: &str, completion: &str) -> f32 {
    match extract_answer(completion) {
        Some(got) if answers_match(got, answer) => 1.0,
        _ => 0.0,
    }
}

/// The exact-match reward as a [`Reward`] of [`QaItem`]s.
#[derive(Clone, Copy, Debug, Default)]
pub struct ExactMatch;

impl Reward<QaItem> for ExactMatch {
    fn score(&self, item: &QaItem, completion: &str) -> f32 {
        reward(&item.answer, completion)
    }
}

/// Whether a prompt goes to the held-out side when there is no held-out file.
pub fn is_held_out(prompt: &str) -> bool {
    hash_bytes(Key::from_data(SPLIT_KEY), prompt.as_bytes())[0].is_multiple_of(HELD_OUT_MODULUS)
}

/// A question/answer task from JSONL files.
#[derive(Clone, Debug)]
pub struct JsonlTask {
    train: Vec<QaItem>,
    held_out: Vec<QaItem>,
}

impl JsonlTask {
    /// Reads the training file and the held-out file; without a held-out file the training
    /// file is split by [`is_held_out`] (see the module docs).
    pub fn open(train: &Path, held_out: Option<&Path>) -> Result<JsonlTask, TaskError> {
        let items = read_jsonl(train)?;
        let (train_items, held_items) = match held_out {
            Some(p) => (items, read_jsonl(p)?),
            None => {
                let count = items.len();
                let (held, train_items): (Vec<_>, Vec<_>) =
                    items.into_iter().partition(|it| is_held_out(&it.prompt));
                if train_items.is_empty() {
                    return Err(TaskError::NoTrainItems {
                        path: train.to_path_buf(),
                        items: count,
                    });
                }
                (train_items, held)
            }
        };
        Ok(JsonlTask {
            train: train_items,
            held_out: held_items,
        })
    }

    /// A task from items in memory (`train` must not be empty).
    pub fn from_items(train: Vec<QaItem>, held_out: Vec<QaItem>) -> Result<JsonlTask, TaskError> {
        if train.is_empty() {
            return Err(TaskError::Config(
                "a jsonl task needs at least one training item".into(),
            ));
        }
        Ok(JsonlTask { train, held_out })
    }

    /// The training items, in file order.
    pub fn train_items(&self) -> &[QaItem] {
        &self.train
    }

    /// The held-out items, in file order.
    pub fn held_out_items(&self) -> &[QaItem] {
        &self.held_out
    }

    /// Epoch `epoch`'s permutation of the training items under `root`.
    fn permutation(&self, root: Key, epoch: u64) -> Vec<usize> {
        let mut d = Draws::new(fold_in_u64(root, epoch));
        let mut perm: Vec<usize> = (0..self.train.len()).collect();
        for i in (1..perm.len()).rev() {
            // Below i + 1 <= len, so the cast cannot truncate.
            let j = d.below(i as u64 + 1) as usize;
            perm.swap(i, j);
        }
        perm
    }
}

impl Task for JsonlTask {
    type Item = QaItem;

    fn name(&self) -> &str {
        "jsonl"
    }

    fn train(&self, seed: u64, generation: u32, count: usize) -> Result<Vec<QaItem>, TaskError> {
        let root = task_key(seed, TRAIN_TAG)?;
        let n = self.train.len() as u64;
        let start = u64::from(generation)
            .checked_mul(count as u64)
            .ok_or_else(|| TaskError::Config(format!("{count} prompts per generation")))?;
        let mut perm: Option<(u64, Vec<usize>)> = None;
        let mut out = Vec::with_capacity(count);
        for k in 0..count as u64 {
            let p = start + k;
            let epoch = p / n;
            if perm.as_ref().map(|(e, _)| *e) != Some(epoch) {
                perm = Some((epoch, self.permutation(root, epoch)));
            }
            if let Some((_, order)) = &perm {
                // p % n < len.
                out.push(self.train[order[(p % n) as usize]].clone());
            }
        }
        Ok(out)
    }

    fn held_out(&self, count: usize) -> Result<Vec<QaItem>, TaskError> {
        Ok(self.held_out.iter().take(count).cloned().collect())
    }

    fn reward(&self) -> &dyn Reward<QaItem> {
        &ExactMatch
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_numbers() {
        assert_eq!(canonical_number("1,000.50").as_deref(), Some("1000.5"));
        assert_eq!(canonical_number("-0.0").as_deref(), Some("0"));
        assert_eq!(canonical_number("+007").as_deref(), Some("7"));
        assert_eq!(canonical_number("1,00"), None);
        assert_eq!(canonical_number("1.2.3"), None);
        assert_eq!(canonical_number("abc"), None);
        assert_eq!(canonical_number("-"), None);
        assert_eq!(canonical_number("1."), None);
    }

    #[test]
    fn last_numbers() {
        assert_eq!(last_number("so the answer is 1,234."), Some("1,234"));
        assert_eq!(last_number("x = -4"), Some("-4"));
        assert_eq!(last_number("3-4"), Some("4"));
        assert_eq!(last_number("-5"), Some("-5"));
        assert_eq!(last_number("pi is 3.14, e is 2.72!"), Some("2.72"));
        assert_eq!(last_number("no digits"), None);
        assert_eq!(last_number("résumé 12 ünïcode"), Some("12"));
    }
}
