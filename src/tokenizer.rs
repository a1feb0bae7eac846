//! Tokenizers from a checkpoint's `tokenizer.json` (through the `tokenizers` crate) and
//! teacher-forcing batches built from prompt/target token pairs.

use std::path::{Path, PathBuf};

use thiserror::Error;

/// Errors of tokenization and batch assembly.
#[derive(Debug, Error)]
pub enum TokenizerError {
    /// `tokenizer.json` could not be read or parsed.
    #[error(
        "cannot load tokenizer {}: {message}; point at the checkpoint's tokenizer.json \
         (the `tokenizers` JSON format)",
        path.display()
    )]
    Load {
        /// The file.
        path: PathBuf,
        /// The library's message.
        message: String,
    },
    /// Encoding or decoding failed.
    #[error("tokenizer failed to {what}: {message}")]
    Codec {
        /// `encode` or `decode`.
        what: &'static str,
        /// The library's message.
        message: String,
    },
    /// An example does not fit the batch geometry.
    #[error(
        "example {index} has {len} tokens (prompt + target) but sequences hold {seq} + 1; \
         raise `seq` or shorten the example"
    )]
    TooLong {
        /// The example's position.
        index: usize,
        /// Its token count.
        len: usize,
        /// The sequence length.
        seq: usize,
    },
    /// A line of a prompt/target JSONL file is malformed.
    #[error("{}:{line}: {message}; {fix}", path.display())]
    Data {
        /// The file.
        path: PathBuf,
        /// 1-based line number (0: the file as a whole).
        line: usize,
        /// What is wrong.
        message: String,
        /// How to fix it.
        fix: String,
    },
    /// `batch × seq` does not fit in memory's address range.
    #[error("a batch of {batch} sequences of {seq} tokens is too large to address; lower `seq`")]
    TooLarge {
        /// Sequences.
        batch: usize,
        /// Tokens per sequence.
        seq: usize,
    },
    /// A GGUF file's tokenizer could not be read or built from its metadata.
    #[error(
        "cannot build a tokenizer from the GGUF file {}: {message}",
        path.display()
    )]
    Gguf {
        /// The file.
        path: PathBuf,
        /// What went wrong (the message names the key or token and the fix).
        message: String,
    },
    /// A token id does not fit an i32 program input.
    #[error("token id {id} does not fit in i32; the vocabulary is too large")]
    IdRange {
        /// The offending id.
        id: u32,
    },
}

/// A loaded tokenizer.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
}

impl Tokenizer {
    /// Loads a `tokenizer.json`.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Tokenizer, TokenizerError> {
        let path = path.as_ref();
        let inner = tokenizers::Tokenizer::from_file(path).map_err(|e| TokenizerError::Load {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        Ok(Tokenizer { inner })
    }

    /// Wraps a tokenizer built elsewhere (by [`crate::gguf_tokenizer::build`], say).
    pub fn from_tokenizers(inner: tokenizers::Tokenizer) -> Tokenizer {
        Tokenizer { inner }
    }

    /// Builds the tokenizer of a llama.cpp GGUF file from its `tokenizer.*` metadata, with
    /// the split rules its `tokenizer.ggml.pre` names (see [`crate::gguf_tokenizer`]).
    pub fn from_gguf(path: impl AsRef<Path>) -> Result<Tokenizer, TokenizerError> {
        let path = path.as_ref();
        let fail = |message: String| TokenizerError::Gguf {
            path: path.to_path_buf(),
            message,
        };
        let file = crate::gguf::GgufFile::open(path).map_err(|e| fail(e.to_string()))?;
        let vocab =
            crate::gguf_tokenizer::GgufVocab::from_gguf(&file).map_err(|e| fail(e.to_string()))?;
        let inner = crate::gguf_tokenizer::build(&vocab).map_err(|e| fail(e.to_string()))?;
        Ok(Tokenizer::from_tokenizers(inner))
    }

    /// Loads `dir/tokenizer.json`.
    pub fn from_checkpoint(dir: impl AsRef<Path>) -> Result<Tokenizer, TokenizerError> {
        Self::from_file(dir.as_ref().join("tokenizer.json"))
    }

    /// Token ids of `text` (with the tokenizer's special tokens when `add_special_tokens`).
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, TokenizerError> {
        let enc =
            self.inner
                .encode(text, add_special_tokens)
                .map_err(|e| TokenizerError::Codec {
                    what: "encode",
                    message: e.to_string(),
                })?;
        Ok(enc.get_ids().to_vec())
    }

    /// The text of `ids`.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, TokenizerError> {
        self.inner
            .decode(ids, skip_special_tokens)
            .map_err(|e| TokenizerError::Codec {
                what: "decode",
                message: e.to_string(),
            })
    }

    /// The id of one token, if it is in the vocabulary.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The vocabulary size including added tokens.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }
}

/// A `(prompt, target)` pair of token ids.
pub type Example = (Vec<u32>, Vec<u32>);

/// One line of a prompt/target JSONL file: text (tokenized on load) or token ids.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ExampleLine {
    prompt: Option<String>,
    target: Option<String>,
    prompt_ids: Option<Vec<u32>>,
    target_ids: Option<Vec<u32>>,
}

/// Reads `(prompt, target)` token pairs from a JSONL file, one example per line, either
/// `{"prompt": "...", "target": "..."}` (encoded with `tokenizer`, no special tokens added)
/// or `{"prompt_ids": [...], "target_ids": [...]}`. Blank lines are skipped. Every id must be
/// below `vocab_size`, and every example needs a non-empty prompt and target.
pub fn read_examples(
    path: impl AsRef<Path>,
    tokenizer: Option<&Tokenizer>,
    vocab_size: usize,
) -> Result<Vec<Example>, TokenizerError> {
    Ok(read_examples_with_lines(path, tokenizer, vocab_size)?
        .into_iter()
        .map(|(_, e)| e)
        .collect())
}

/// [`read_examples`] with each example's 1-based line number, for errors about an example
/// found later (one too long for the model).
pub fn read_examples_with_lines(
    path: impl AsRef<Path>,
    tokenizer: Option<&Tokenizer>,
    vocab_size: usize,
) -> Result<Vec<(usize, Example)>, TokenizerError> {
    let path = path.as_ref();
    let err = |line: usize, message: String, fix: &str| TokenizerError::Data {
        path: path.to_path_buf(),
        line,
        message,
        fix: fix.to_string(),
    };
    let text = std::fs::read_to_string(path).map_err(|e| {
        err(
            0,
            format!("cannot read the data file: {e}"),
            "check problem.data (relative paths start at the current directory)",
        )
    })?;
    let mut out = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        if raw.trim().is_empty() {
            continue;
        }
        let ex: ExampleLine = serde_json::from_str(raw).map_err(|e| {
            err(
                line,
                format!("not a JSON example: {e}"),
                "write one {\"prompt\": \"...\", \"target\": \"...\"} or \
                 {\"prompt_ids\": [...], \"target_ids\": [...]} object per line",
            )
        })?;
        let encode = |text: Option<String>, ids: Option<Vec<u32>>, what: &str| match (text, ids) {
            (Some(_), Some(_)) => Err(err(
                line,
                format!("both `{what}` and `{what}_ids` are given"),
                "keep one of the two",
            )),
            (None, Some(ids)) => Ok(ids),
            (Some(text), None) => match tokenizer {
                Some(t) => t.encode(&text, false),
                None => Err(err(
                    line,
                    format!("`{what}` is text but there is no tokenizer"),
                    "set problem.tokenizer (or load a checkpoint with a tokenizer.json), \
                         or give token ids as `prompt_ids`/`target_ids`",
                )),
            },
            (None, None) => Err(err(
                line,
                format!("missing `{what}`"),
                "every line needs a prompt and a target",
            )),
        };
        let prompt = encode(ex.prompt, ex.prompt_ids, "prompt")?;
        let target = encode(ex.target, ex.target_ids, "target")?;
        if prompt.is_empty() || target.is_empty() {
            return Err(err(
                line,
                format!(
                    "the example has {} prompt and {} target tokens",
                    prompt.len(),
                    target.len()
                ),
                "give every example at least one prompt and one target token",
            ));
        }
        if let Some(&id) = prompt
            .iter()
            .chain(&target)
            .find(|&&id| id as usize >= vocab_size)
        {
            return Err(err(
                line,
                format!("token id {id} is outside the model's vocabulary of {vocab_size}"),
                "use the model's own tokenizer, or ids below vocab_size",
            ));
        }
        out.push((line, (prompt, target)));
    }
    if out.is_empty() {
        return Err(err(
            0,
            "the data file has no examples".into(),
            "add at least one JSON line",
        ));
    }
    Ok(out)
}

/// A teacher-forcing batch, row-major `[batch, seq]`: the inputs of the qwen2 loss.
#[derive(Debug, Clone, PartialEq)]
pub struct LmBatch {
    /// Sequences.
    pub batch: usize,
    /// Tokens per sequence.
    pub seq: usize,
    /// Input tokens (padding where the example ended).
    pub ids: Vec<i32>,
    /// The token that should follow each position.
    pub targets: Vec<i32>,
    /// 1 where the target is part of an example's target text, else 0.
    pub mask: Vec<f32>,
}

fn id32(id: u32) -> Result<i32, TokenizerError> {
    i32::try_from(id).map_err(|_| TokenizerError::IdRange { id })
}

/// Checks that every pair fits a row of `seq` tokens (`prompt ++ target` holds at most
/// `seq + 1` tokens), as [`lm_batch`] does, without building the batch.
pub fn check_fits(pairs: &[(Vec<u32>, Vec<u32>)], seq: usize) -> Result<(), TokenizerError> {
    for (index, (prompt, target)) in pairs.iter().enumerate() {
        let len = prompt.len() + target.len();
        if len > seq.saturating_add(1) {
            return Err(TokenizerError::TooLong { index, len, seq });
        }
    }
    Ok(())
}

/// Builds a batch from `(prompt, target)` token pairs: each row holds `prompt ++ target`
/// shifted by one, and only positions predicting a target token are counted.
pub fn lm_batch(
    pairs: &[(Vec<u32>, Vec<u32>)],
    seq: usize,
    pad_id: u32,
) -> Result<LmBatch, TokenizerError> {
    let pad = id32(pad_id)?;
    check_fits(pairs, seq)?;
    let n = pairs.len();
    let cells = n
        .checked_mul(seq)
        .ok_or(TokenizerError::TooLarge { batch: n, seq })?;
    let mut ids = vec![pad; cells];
    let mut targets = vec![pad; cells];
    let mut mask = vec![0.0f32; cells];
    for (row, (prompt, target)) in pairs.iter().enumerate() {
        // check_fits above: full.len() <= seq + 1.
        let full: Vec<u32> = prompt.iter().chain(target).copied().collect();
        for t in 0..full.len().saturating_sub(1) {
            ids[row * seq + t] = id32(full[t])?;
            targets[row * seq + t] = id32(full[t + 1])?;
            if t + 1 >= prompt.len() {
                mask[row * seq + t] = 1.0;
            }
        }
    }
    Ok(LmBatch {
        batch: n,
        seq,
        ids,
        targets,
        mask,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lm_batch_shifts_and_masks_targets_only() {
        let b = lm_batch(&[(vec![5, 6], vec![7, 8]), (vec![1], vec![2])], 4, 0).expect("fits");
        assert_eq!(b.ids, [5, 6, 7, 0, 1, 0, 0, 0]);
        assert_eq!(b.targets, [6, 7, 8, 0, 2, 0, 0, 0]);
        assert_eq!(b.mask, [0.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0]);
        let e = lm_batch(&[(vec![1, 2, 3], vec![4, 5])], 3, 0).expect_err("5 > 3 + 1");
        assert!(e.to_string().contains("raise `seq`"), "{e}");
    }
}
