//! Tokenizers and chat templates from a GGUF file's metadata.
//!
//! llama.cpp stores a model's tokenizer as `tokenizer.*` metadata keys rather than as a
//! `tokenizer.json`: the model kind (`tokenizer.ggml.model`), the name of the
//! pre-tokenizer (`tokenizer.ggml.pre`), the tokens with their types, the BPE merges, the
//! special-token ids and flags, and the chat template. [`GgufVocab`] holds those keys and
//! [`build`] turns them into a `tokenizers::Tokenizer` that splits text the way llama.cpp
//! does:
//!
//! - `tokenizer.ggml.model = gpt2` (byte-level BPE) is supported. The SentencePiece kind
//!   (`llama`) and the others are refused: their llama.cpp algorithms (score-driven
//!   merges, WordPiece, Unigram) have no exact `tokenizers` counterpart here.
//! - The pre-tokenizer is the list of split rules llama.cpp's `llama-vocab.cpp` attaches to
//!   the name in `tokenizer.ggml.pre` ([`PRE_TOKENIZERS`] lists the names known here). Each
//!   rule splits every piece left by the previous one into its matches and the text between
//!   them; the pieces are then byte-encoded the GPT-2 way. `smollm` (SmolLM/SmolLM2) first
//!   isolates every number character, then applies the GPT-2 split: `"x  12"` is
//!   `x`, `ĠĠ`, `1`, `2`. transformers' GGUF loader ignores the name and splits the GPT-2
//!   way only, so it differs from llama.cpp (and from the original Hugging Face tokenizer)
//!   when two or more whitespace characters, or a non-ASCII numeral, precede a number.
//! - Tokens of type control (3), user-defined (4) and unknown (2) become added special
//!   tokens, matched in the text before splitting (as llama.cpp does with special-token
//!   parsing on), so `<|im_start|>` encodes as one id whatever surrounds it; decoding with
//!   `skip_special_tokens` drops them.
//! - A post-processor adds the BOS/EOS ids when `tokenizer.ggml.add_bos_token` /
//!   `add_eos_token` say so (encode with `add_special_tokens = true`).
//!
//! [`chat_template`] compiles `tokenizer.chat_template` with the special tokens' strings
//! (a [`ChatTemplate`], rendered as `transformers`' `apply_chat_template` renders it).
//!
//! Decoding is the byte-level inverse with no clean-up of spaces before punctuation (as
//! llama.cpp does for `smollm`, `qwen2`, `command-r`, ...; for names where llama.cpp
//! cleans up, our text keeps the spaces, which is also what byte-level BPE encoded).

use std::collections::HashMap;

use thiserror::Error;
use tokenizers::decoders::byte_level::ByteLevel;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::processors::template::{SpecialToken, TemplateProcessing};
use tokenizers::{
    AddedToken, DecoderWrapper, PostProcessorWrapper, PreTokenizerWrapper, SplitDelimiterBehavior,
};

use crate::gguf::{GgufError, GgufFile};
use crate::tasks::chat::{ChatTemplate, SpecialTokens};
use crate::tasks::TaskError;

/// llama.cpp's token types (`tokenizer.ggml.token_type`) that make a token special.
const TYPE_UNKNOWN: i32 = 2;
const TYPE_CONTROL: i32 = 3;
const TYPE_USER_DEFINED: i32 = 4;

/// Errors building a tokenizer or a chat template from GGUF metadata. Each names the key,
/// token or merge at fault and what to do about it.
#[derive(Debug, Error)]
pub enum GgufTokenizerError {
    /// A tokenizer key is missing or of another type (the message names the file and key).
    #[error(transparent)]
    Gguf(#[from] GgufError),
    /// `tokenizer.ggml.model` names a tokenizer kind this module does not build.
    #[error(
        "the GGUF tokenizer model `{model}` (tokenizer.ggml.model) is not supported; only \
         `gpt2` (byte-level BPE) is: use the checkpoint's tokenizer.json for this model"
    )]
    UnsupportedModel {
        /// The kind named by the file.
        model: String,
    },
    /// `tokenizer.ggml.pre` names a pre-tokenizer this module does not know.
    #[error(
        "unknown pre-tokenizer `{pre}` (tokenizer.ggml.pre); known: {known}; add its split \
         rules from llama.cpp's llama-vocab.cpp to shardes::gguf_tokenizer::PRE_TOKENIZERS, \
         or use the checkpoint's tokenizer.json"
    )]
    UnknownPre {
        /// The name in the file.
        pre: String,
        /// The names this module knows, comma-separated.
        known: String,
    },
    /// The token and token-type arrays differ in length.
    #[error(
        "the GGUF vocabulary has {tokens} tokens (tokenizer.ggml.tokens) but {types} token \
         types (tokenizer.ggml.token_type); both arrays must have one entry per token, the \
         file is damaged or was edited inconsistently"
    )]
    TypeCount {
        /// Length of `tokenizer.ggml.tokens`.
        tokens: usize,
        /// Length of `tokenizer.ggml.token_type`.
        types: usize,
    },
    /// The vocabulary is empty.
    #[error("the GGUF vocabulary (tokenizer.ggml.tokens) is empty; the file has no tokenizer")]
    EmptyVocab,
    /// A token appears twice.
    #[error(
        "token {token:?} appears twice in the GGUF vocabulary (ids {first} and {second}); \
         a token must map to one id (llama.cpp refuses such a file too), convert the model \
         again"
    )]
    DuplicateToken {
        /// The token text.
        token: String,
        /// Its first id.
        first: u32,
        /// Its second id.
        second: u32,
    },
    /// The vocabulary has more tokens than ids fit.
    #[error("the GGUF vocabulary has {count} tokens; token ids must fit in u32")]
    TooManyTokens {
        /// The number of tokens.
        count: usize,
    },
    /// A special-token id is not in the vocabulary.
    #[error(
        "the {which} token id {id} (tokenizer.ggml.{which}_token_id) is outside the \
         vocabulary of {vocab} tokens; fix the key (ids run from 0 to {vocab} - 1) or \
         convert the model again"
    )]
    SpecialId {
        /// `bos`, `eos`, `padding` or `unknown`.
        which: &'static str,
        /// The id in the file.
        id: u64,
        /// The vocabulary size.
        vocab: usize,
    },
    /// A BOS/EOS token must be added but none is named.
    #[error(
        "tokenizer.ggml.add_{which}_token is true but the file names no {which} token \
         (tokenizer.ggml.{which}_token_id); set the id or turn the flag off"
    )]
    MissingSpecial {
        /// `bos` or `eos`.
        which: &'static str,
    },
    /// A merge is malformed or names a token that is not in the vocabulary.
    #[error(
        "BPE merge {index} {merge:?} (tokenizer.ggml.merges) {problem}; every merge is \
         \"left right\" with left, right and their concatenation in the vocabulary, the \
         file is damaged or its merges belong to another vocabulary"
    )]
    BadMerge {
        /// The merge's position (its rank).
        index: usize,
        /// The merge as written.
        merge: String,
        /// What is wrong with it.
        problem: String,
    },
    /// The `tokenizers` library refused a part of the tokenizer.
    #[error("cannot build the tokenizer's {part}: {message}")]
    Build {
        /// `BPE model`, `pre-tokenizer`, `post-processor`.
        part: &'static str,
        /// The library's message.
        message: String,
    },
    /// `tokenizer.chat_template` does not compile.
    #[error("the GGUF chat template (tokenizer.chat_template) is unusable: {0}")]
    Template(#[source] TaskError),
}

/// The tokenizer keys of a GGUF file (`tokenizer.ggml.*` and `tokenizer.chat_template`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GgufVocab {
    /// `tokenizer.ggml.model`: the tokenizer kind (`gpt2` is byte-level BPE).
    pub model: String,
    /// `tokenizer.ggml.pre`: the pre-tokenizer's name (`None`: llama.cpp's `default`).
    pub pre: Option<String>,
    /// `tokenizer.ggml.tokens`: the token strings, by id (byte-level BPE tokens are
    /// written in GPT-2's byte alphabet, `Ġ` for a space).
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.token_type`: one llama.cpp token type per token (1 normal,
    /// 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte).
    pub token_types: Vec<i32>,
    /// `tokenizer.ggml.merges`: BPE merges, `"left right"`, highest priority first.
    pub merges: Vec<String>,
    /// `tokenizer.ggml.bos_token_id`.
    pub bos: Option<u32>,
    /// `tokenizer.ggml.eos_token_id`.
    pub eos: Option<u32>,
    /// `tokenizer.ggml.padding_token_id`.
    pub pad: Option<u32>,
    /// `tokenizer.ggml.unknown_token_id` (unused by byte-level BPE, which never needs it).
    pub unk: Option<u32>,
    /// `tokenizer.ggml.add_bos_token`: prepend BOS when encoding with special tokens.
    pub add_bos: bool,
    /// `tokenizer.ggml.add_eos_token`: append EOS when encoding with special tokens.
    pub add_eos: bool,
    /// `tokenizer.chat_template`: the Jinja chat template.
    pub chat_template: Option<String>,
}

/// One pre-tokenizer of llama.cpp: the names it goes by and its split rules.
#[derive(Debug)]
pub struct PreRule {
    /// The `tokenizer.ggml.pre` names that select it.
    pub names: &'static [&'static str],
    /// The regular expressions, applied one after the other; each splits every piece into
    /// its matches and the text between them.
    pub regexes: &'static [&'static str],
    /// Whether a piece that is itself a token skips the merges (llama.cpp's
    /// `ignore_merges`, set for the Llama 3 family).
    pub ignore_merges: bool,
    /// Whether BOS is added when the file has no `tokenizer.ggml.add_bos_token`
    /// (llama.cpp's default for the name).
    pub add_bos: bool,
}

// llama.cpp writes the GPT-2 rule without its final `|\s+`, but that string selects its
// hand-written GPT-2 splitter, which ends with that alternative; it is spelled out here.
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
// llama.cpp's case-insensitive contractions are spelled out too (its own adaptation of
// `(?i:'s|'t|...)`).
const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The pre-tokenizers known here, with their split rules as llama.cpp's `llama-vocab.cpp`
/// defines them (`llm_tokenizer_bpe`'s `regex_exprs` and the name table of
/// `llama_vocab::impl::load`).
pub const PRE_TOKENIZERS: &[PreRule] = &[
    // A missing `tokenizer.ggml.pre` means `default` too.
    PreRule {
        names: &["default"],
        regexes: &[r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"],
        ignore_merges: false,
        add_bos: false,
    },
    // `gpt2` is not a llama.cpp name (it writes `gpt-2`); it is accepted as the obvious
    // spelling of the same rule.
    PreRule {
        names: &["gpt-2", "gpt2", "phi-2", "mpt", "olmo", "jais", "gigachat"],
        regexes: &[GPT2],
        ignore_merges: false,
        add_bos: false,
    },
    PreRule {
        names: &[
            "smollm",
            "starcoder",
            "refact",
            "command-r",
            "codeshell",
            "exaone",
            "minerva-7b",
        ],
        regexes: &[r"\p{N}", GPT2],
        ignore_merges: false,
        add_bos: false,
    },
    PreRule {
        names: &["llama3", "llama-v3", "llama-bpe", "falcon3"],
        regexes: &[LLAMA3],
        ignore_merges: true,
        add_bos: true,
    },
    PreRule {
        names: &["dbrx", "smaug-bpe"],
        regexes: &[LLAMA3],
        ignore_merges: false,
        add_bos: false,
    },
    PreRule {
        names: &["qwen2", "deepseek-r1-qwen", "stablelm2", "megrez"],
        regexes: &[QWEN2],
        ignore_merges: false,
        add_bos: false,
    },
    PreRule {
        names: &["falcon"],
        regexes: &[r"[\p{P}\$\+<=>\^~\|`]+", GPT2, r"[0-9][0-9][0-9]"],
        ignore_merges: false,
        add_bos: false,
    },
];

/// The rule `pre` names (`None` or empty: `default`, as llama.cpp falls back to).
pub fn pre_rule(pre: Option<&str>) -> Result<&'static PreRule, GgufTokenizerError> {
    let name = pre.filter(|p| !p.is_empty()).unwrap_or("default");
    PRE_TOKENIZERS
        .iter()
        .find(|p| p.names.contains(&name))
        .ok_or_else(|| GgufTokenizerError::UnknownPre {
            pre: name.to_string(),
            known: PRE_TOKENIZERS
                .iter()
                .flat_map(|p| p.names.iter().copied())
                .collect::<Vec<_>>()
                .join(", "),
        })
}

impl GgufVocab {
    /// The tokenizer keys of `file`. `tokenizer.ggml.model` and `tokenizer.ggml.tokens`
    /// are required, and `tokenizer.ggml.merges` for `gpt2`; the others are optional, as
    /// llama.cpp reads them: no token types means every token is normal, no
    /// `add_bos_token` means the pre-tokenizer's default (true for the Llama 3 family),
    /// no `add_eos_token` means false. An empty token is renamed `[EMPTY_<id>]`, as
    /// llama.cpp renames it. Nothing is checked against the vocabulary here; [`build`]
    /// does that.
    pub fn from_gguf(file: &GgufFile) -> Result<GgufVocab, GgufTokenizerError> {
        let has = |key: &str| file.get(key).is_some();
        let model = file.get_str("tokenizer.ggml.model")?.to_string();
        let pre = match has("tokenizer.ggml.pre") {
            true => Some(file.get_str("tokenizer.ggml.pre")?.to_string()),
            false => None,
        };
        let tokens: Vec<String> = file
            .get_str_array("tokenizer.ggml.tokens")?
            .into_iter()
            .enumerate()
            .map(|(i, t)| match t.is_empty() {
                true => format!("[EMPTY_{i}]"),
                false => t.to_string(),
            })
            .collect();
        let token_types = match has("tokenizer.ggml.token_type") {
            // A type outside i32 is no type llama.cpp knows: undefined (0), as it reads it.
            true => file
                .get_i64_array("tokenizer.ggml.token_type")?
                .into_iter()
                .map(|t| i32::try_from(t).unwrap_or(0))
                .collect(),
            false => vec![1; tokens.len()],
        };
        let merges = match model == "gpt2" || has("tokenizer.ggml.merges") {
            true => file
                .get_str_array("tokenizer.ggml.merges")?
                .into_iter()
                .map(str::to_string)
                .collect(),
            false => Vec::new(),
        };
        let id =
            |key: &'static str, which: &'static str| -> Result<Option<u32>, GgufTokenizerError> {
                if !has(key) {
                    return Ok(None);
                }
                let id = file.get_u64(key)?;
                u32::try_from(id)
                    .map(Some)
                    .map_err(|_| GgufTokenizerError::SpecialId {
                        which,
                        id,
                        vocab: tokens.len(),
                    })
            };
        let flag = |key: &str, default: bool| -> Result<bool, GgufTokenizerError> {
            match has(key) {
                true => Ok(file.get_bool(key)?),
                false => Ok(default),
            }
        };
        let default_bos = pre_rule(pre.as_deref()).is_ok_and(|p| p.add_bos);
        let chat_template = match has("tokenizer.chat_template") {
            true => Some(file.get_str("tokenizer.chat_template")?.to_string()),
            false => None,
        };
        Ok(GgufVocab {
            bos: id("tokenizer.ggml.bos_token_id", "bos")?,
            eos: id("tokenizer.ggml.eos_token_id", "eos")?,
            pad: id("tokenizer.ggml.padding_token_id", "padding")?,
            unk: id("tokenizer.ggml.unknown_token_id", "unknown")?,
            add_bos: flag("tokenizer.ggml.add_bos_token", default_bos)?,
            add_eos: flag("tokenizer.ggml.add_eos_token", false)?,
            model,
            pre,
            tokens,
            token_types,
            merges,
            chat_template,
        })
    }

    /// Checks what [`build`] relies on: a non-empty vocabulary without duplicates, one type
    /// per token, special ids inside the vocabulary and named when they must be added.
    /// Returns the token-to-id map.
    fn check(&self) -> Result<HashMap<&str, u32>, GgufTokenizerError> {
        let n = self.tokens.len();
        if n == 0 {
            return Err(GgufTokenizerError::EmptyVocab);
        }
        if u32::try_from(n).is_err() {
            return Err(GgufTokenizerError::TooManyTokens { count: n });
        }
        if self.token_types.len() != n {
            return Err(GgufTokenizerError::TypeCount {
                tokens: n,
                types: self.token_types.len(),
            });
        }
        let mut ids = HashMap::with_capacity(n);
        for (id, token) in (0u32..).zip(&self.tokens) {
            if let Some(first) = ids.insert(token.as_str(), id) {
                return Err(GgufTokenizerError::DuplicateToken {
                    token: token.clone(),
                    first,
                    second: id,
                });
            }
        }
        for (which, id) in [
            ("bos", self.bos),
            ("eos", self.eos),
            ("padding", self.pad),
            ("unknown", self.unk),
        ] {
            if let Some(id) = id.filter(|&id| id as usize >= n) {
                return Err(GgufTokenizerError::SpecialId {
                    which,
                    id: id.into(),
                    vocab: n,
                });
            }
        }
        if self.add_bos && self.bos.is_none() {
            return Err(GgufTokenizerError::MissingSpecial { which: "bos" });
        }
        if self.add_eos && self.eos.is_none() {
            return Err(GgufTokenizerError::MissingSpecial { which: "eos" });
        }
        Ok(ids)
    }

    /// The text of token `id`, if the vocabulary has it.
    fn token(&self, id: Option<u32>) -> Option<&str> {
        id.and_then(|id| self.tokens.get(id as usize))
            .map(String::as_str)
    }
}

/// Splits a merge as llama.cpp does: at the first space after the first byte (so a left
/// side that is itself a space, in a vocabulary that is not byte-level, still parses).
fn split_merge(merge: &str) -> Option<(&str, &str)> {
    // Bytes, not chars: byte 1 may sit inside the first character. A space is ASCII, so
    // the cut is always on a character boundary.
    let cut = merge.bytes().skip(1).position(|b| b == b' ')? + 1;
    Some((&merge[..cut], &merge[cut + 1..]))
}

/// The BPE merges of `v`, each checked against the vocabulary.
fn merges(
    v: &GgufVocab,
    ids: &HashMap<&str, u32>,
) -> Result<Vec<(String, String)>, GgufTokenizerError> {
    let mut out = Vec::with_capacity(v.merges.len());
    for (index, merge) in v.merges.iter().enumerate() {
        let bad = |problem: String| GgufTokenizerError::BadMerge {
            index,
            merge: merge.clone(),
            problem,
        };
        let (left, right) = split_merge(merge)
            .filter(|(l, r)| !l.is_empty() && !r.is_empty())
            .ok_or_else(|| bad("is not two tokens separated by a space".into()))?;
        let joined = format!("{left}{right}");
        for token in [left, right, joined.as_str()] {
            if !ids.contains_key(token) {
                return Err(bad(format!(
                    "names the token {token:?}, which is not in the vocabulary"
                )));
            }
        }
        out.push((left.to_string(), right.to_string()));
    }
    Ok(out)
}

/// The `tokenizers` pre-tokenizer of `rule`: its splits, then the GPT-2 byte encoding.
fn pre_tokenizer_of(rule: &PreRule) -> Result<PreTokenizerWrapper, GgufTokenizerError> {
    let mut steps = Vec::with_capacity(rule.regexes.len() + 1);
    for regex in rule.regexes {
        // Isolated: a match and the text around it each become a piece, as llama.cpp's
        // `unicode_regex_split` keeps both.
        let split = Split::new(
            SplitPattern::Regex((*regex).to_string()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(|e| GgufTokenizerError::Build {
            part: "pre-tokenizer",
            message: format!("split rule {regex:?}: {e}"),
        })?;
        steps.push(PreTokenizerWrapper::Split(split));
    }
    // The splitting is done above; ByteLevel only maps bytes to GPT-2's alphabet.
    steps.push(PreTokenizerWrapper::ByteLevel(ByteLevel::new(
        false, true, false,
    )));
    Ok(PreTokenizerWrapper::Sequence(Sequence::new(steps)))
}

/// A post-processor adding BOS and/or EOS around each sequence, or `None` when neither is
/// added. `check` has made sure the added ones exist.
fn post_processor(v: &GgufVocab) -> Result<Option<PostProcessorWrapper>, GgufTokenizerError> {
    let fail = |message: String| GgufTokenizerError::Build {
        part: "post-processor",
        message,
    };
    let mut specials = Vec::new();
    let mut piece =
        |which: &str, add: bool, id: Option<u32>| -> Result<Option<String>, GgufTokenizerError> {
            match (add, id, v.token(id)) {
                (true, Some(id), Some(text)) => {
                    // The template names special tokens by a key of its own, so token texts
                    // with spaces or colons (which the template syntax splits on) still work.
                    specials.push(
                        SpecialToken::new(which.to_string(), vec![id], vec![text.to_string()])
                            .map_err(|e| fail(e.to_string()))?,
                    );
                    Ok(Some(which.to_string()))
                }
                _ => Ok(None),
            }
        };
    let bos = piece("bos", v.add_bos, v.bos)?;
    let eos = piece("eos", v.add_eos, v.eos)?;
    if bos.is_none() && eos.is_none() {
        return Ok(None);
    }
    let wrap = |seq: &str| -> Vec<String> {
        let type_id = if seq == "$B" { ":1" } else { ":0" };
        bos.iter()
            .map(|b| format!("{b}{type_id}"))
            .chain([format!("{seq}{type_id}")])
            .chain(eos.iter().map(|e| format!("{e}{type_id}")))
            .collect()
    };
    let pair: Vec<String> = wrap("$A").into_iter().chain(wrap("$B")).collect();
    let template = TemplateProcessing::builder()
        .try_single(wrap("$A"))
        .map_err(fail)?
        .try_pair(pair)
        .map_err(fail)?
        .special_tokens(specials)
        .build()
        .map_err(|e| fail(e.to_string()))?;
    Ok(Some(PostProcessorWrapper::Template(template)))
}

/// A `tokenizers` tokenizer for the GGUF vocabulary `v`, splitting text as llama.cpp does
/// for `v.pre` (see the module documentation).
pub fn build(v: &GgufVocab) -> Result<tokenizers::Tokenizer, GgufTokenizerError> {
    if v.model != "gpt2" {
        return Err(GgufTokenizerError::UnsupportedModel {
            model: v.model.clone(),
        });
    }
    let rule = pre_rule(v.pre.as_deref())?;
    let ids = v.check()?;
    let merges = merges(v, &ids)?;
    let vocab: Vocab = ids.iter().map(|(&t, &id)| (t.to_string(), id)).collect();
    // No unknown token: a byte-level vocabulary has a token for each of the 256 byte
    // characters; a character missing from one is dropped, as llama.cpp drops it.
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .ignore_merges(rule.ignore_merges)
        .build()
        .map_err(|e| GgufTokenizerError::Build {
            part: "BPE model",
            message: e.to_string(),
        })?;
    let mut tokenizer = tokenizers::Tokenizer::new(bpe);
    tokenizer.with_pre_tokenizer(Some(pre_tokenizer_of(rule)?));
    tokenizer.with_decoder(Some(DecoderWrapper::ByteLevel(ByteLevel::default())));
    tokenizer.with_post_processor(post_processor(v)?);
    // llama.cpp matches control, user-defined and unknown tokens in the text before
    // splitting it; as added special tokens they keep their vocabulary ids.
    let specials: Vec<AddedToken> = v
        .tokens
        .iter()
        .zip(&v.token_types)
        .filter(|(_, &ty)| matches!(ty, TYPE_UNKNOWN | TYPE_CONTROL | TYPE_USER_DEFINED))
        .map(|(t, _)| AddedToken::from(t.clone(), true))
        .collect();
    tokenizer.add_special_tokens(&specials);
    Ok(tokenizer)
}

/// The chat template of `v` (`None` when the file has none), with the BOS, EOS, unknown
/// and padding tokens' strings as the template's special tokens.
pub fn chat_template(v: &GgufVocab) -> Result<Option<ChatTemplate>, GgufTokenizerError> {
    let Some(source) = &v.chat_template else {
        return Ok(None);
    };
    let owned = |id: Option<u32>| v.token(id).map(str::to_string);
    let tokens = SpecialTokens {
        bos: owned(v.bos),
        eos: owned(v.eos),
        unk: owned(v.unk),
        pad: owned(v.pad),
    };
    ChatTemplate::new(source, tokens)
        .map(Some)
        .map_err(GgufTokenizerError::Template)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TYPE_NORMAL: i32 = 1;

    /// A byte-level vocabulary of `a`, `b`, `ab`, space and digits, with one control token.
    fn tiny() -> GgufVocab {
        let tokens: Vec<String> = ["<s>", "a", "b", "ab", "Ġ", "ĠĠ", "1", "2", "Ġa"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let mut token_types = vec![TYPE_NORMAL; tokens.len()];
        token_types[0] = TYPE_CONTROL;
        GgufVocab {
            model: "gpt2".into(),
            pre: Some("smollm".into()),
            tokens,
            token_types,
            merges: vec!["a b".into(), "Ġ Ġ".into(), "Ġ a".into()],
            bos: Some(0),
            eos: Some(0),
            ..GgufVocab::default()
        }
    }

    #[test]
    fn split_merge_cuts_at_the_first_space_after_the_first_byte() {
        assert_eq!(split_merge("a b"), Some(("a", "b")));
        assert_eq!(split_merge("Ġ Ġ"), Some(("Ġ", "Ġ")));
        assert_eq!(split_merge("  x"), Some((" ", "x")));
        assert_eq!(split_merge("ab"), None);
        assert_eq!(split_merge(""), None);
    }

    #[test]
    fn tiny_vocab_splits_digits_and_merges() {
        let t = build(&tiny()).expect("builds");
        let ids = |s: &str| t.encode(s, false).expect("encodes").get_ids().to_vec();
        assert_eq!(ids("ab"), [3]);
        assert_eq!(ids("a  12"), [1, 5, 6, 7]);
        assert_eq!(ids("<s>ab a"), [0, 3, 8]);
        let mut v = tiny();
        v.add_bos = true;
        let t = build(&v).expect("builds");
        assert_eq!(t.encode("ab", true).expect("encodes").get_ids(), [0, 3]);
        assert_eq!(t.encode("ab", false).expect("encodes").get_ids(), [3]);
    }

    /// The pieces `pre` splits `text` into, byte-encoded.
    fn splits(pre: &str, text: &str) -> Vec<String> {
        use tokenizers::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer};
        let rule = pre_rule(Some(pre)).expect("known");
        let mut s = PreTokenizedString::from(text);
        pre_tokenizer_of(rule)
            .expect("compiles")
            .pre_tokenize(&mut s)
            .expect("splits");
        s.get_splits(OffsetReferential::Original, OffsetType::Byte)
            .into_iter()
            .map(|(piece, _, _)| piece.to_string())
            .collect()
    }

    #[test]
    fn rules_split_as_llama_cpp() {
        // Digits one by one, then GPT-2: the trailing run of spaces stays whole.
        assert_eq!(splits("smollm", "x  12"), ["x", "ĠĠ", "1", "2"]);
        assert_eq!(splits("starcoder", "ab 34"), ["ab", "Ġ", "3", "4"]);
        // GPT-2: the last space goes with the number.
        assert_eq!(splits("gpt2", "x  12"), ["x", "Ġ", "Ġ12"]);
        assert_eq!(splits("gpt-2", "it's"), ["it", "'s"]);
        // Llama 3: numbers in threes, a letter run takes one non-letter before it.
        assert_eq!(splits("llama3", "12345 abc"), ["123", "45", "Ġabc"]);
        assert_eq!(splits("llama-bpe", "IT'S"), ["IT", "'S"]);
        // Qwen2: single digits.
        assert_eq!(splits("qwen2", "x 123"), ["x", "Ġ", "1", "2", "3"]);
        // default: punctuation runs first, digits in threes last.
        assert_eq!(splits("default", "a+b"), ["a", "+", "b"]);
        assert_eq!(splits("default", "1234567"), ["123", "456", "7"]);
    }

    #[test]
    fn llama3_ignores_merges_for_whole_tokens() {
        let rule = pre_rule(Some("llama3")).expect("known");
        assert!(rule.ignore_merges && rule.add_bos);
        let rule = pre_rule(Some("smollm")).expect("known");
        assert!(!rule.ignore_merges && !rule.add_bos);
    }

    #[test]
    fn unknown_pre_lists_the_known_names() {
        let e = pre_rule(Some("nope")).expect_err("unknown");
        let msg = e.to_string();
        for name in ["smollm", "gpt2", "default", "llama3", "llama-bpe", "qwen2"] {
            assert!(msg.contains(name), "{msg}");
        }
        assert_eq!(
            pre_rule(None).expect("default").names,
            ["default"].as_slice()
        );
    }

    #[test]
    fn every_rule_compiles() {
        for rule in PRE_TOKENIZERS {
            pre_tokenizer_of(rule).expect("compiles");
        }
    }
}
