//! A Hugging Face directory's byte-level BPE tokenizer as GGUF `tokenizer.*` keys, the way
//! llama.cpp's converter writes one (`tokenizer.ggml.model = gpt2`): the tokens by id
//! (ids no token holds, up to the model's vocabulary size, as `[PAD{id}]`), their types
//! (added special tokens control, other added tokens user-defined), the merges as
//! `"left right"`, the pre-tokenizer's llama.cpp name, the special ids, `add_bos_token`
//! and the chat template.
//!
//! The pre-tokenizer's name is read off `tokenizer.json`: split rules equal to one of
//! [`crate::gguf_tokenizer::PRE_TOKENIZERS`]' (what a GGUF source's export writes) name
//! it; otherwise single digits split off before byte-level (SmolLM2's) is `smollm`, a
//! plain byte-level one `gpt-2`, and a Qwen2 model's own split rule `qwen2`. A tokenizer
//! that is not byte-level BPE, or whose rules match none of these, gives `None`: the file
//! is written without a vocabulary rather than with one that splits text differently.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;

use super::{ExportError, TokenIds};
use crate::family::GgufKeys;
use crate::gguf::MetaValue;
use crate::gguf_tokenizer::PRE_TOKENIZERS;

const TYPE_NORMAL: i32 = 1;
const TYPE_CONTROL: i32 = 3;
const TYPE_USER_DEFINED: i32 = 4;

/// The `tokenizer.*` keys of the directory `dir`'s `tokenizer.json`, or `None` (with the
/// reason) when it is missing or not a byte-level BPE tokenizer llama.cpp would split the
/// same way.
pub(super) fn tokenizer_keys(
    dir: &Path,
    family: &str,
    vocab_size: usize,
    ids: &TokenIds,
) -> Result<Result<GgufKeys, String>, ExportError> {
    let path = dir.join("tokenizer.json");
    let Ok(text) = std::fs::read_to_string(&path) else {
        return Ok(Err(format!("{} has no tokenizer.json", dir.display())));
    };
    let fail = |message: String| ExportError::Tokenizer {
        path: path.clone(),
        message,
        fix: "check that tokenizer.json is the one the model came with",
    };
    let t: Value = serde_json::from_str(&text).map_err(|e| fail(format!("invalid JSON ({e})")))?;
    let model = &t["model"];
    if model["type"] != "BPE" || !mentions_byte_level(&t) {
        return Ok(Err(
            "its tokenizer.json is not byte-level BPE (llama.cpp's `gpt2` tokenizer)".into(),
        ));
    }
    let Some(pre) = pre_name(&t["pre_tokenizer"], family) else {
        return Ok(Err(
            "its tokenizer.json splits text by rules llama.cpp has no name for".into(),
        ));
    };
    let mut by_id: BTreeMap<usize, (String, i32)> = BTreeMap::new();
    let vocab = model["vocab"]
        .as_object()
        .ok_or_else(|| fail("model.vocab is not an object".into()))?;
    for (token, id) in vocab {
        let id = id
            .as_u64()
            .ok_or_else(|| fail(format!("token {token:?} has no integer id")))?;
        by_id.insert(id as usize, (token.clone(), TYPE_NORMAL));
    }
    for added in t["added_tokens"].as_array().into_iter().flatten() {
        let (Some(id), Some(content)) = (added["id"].as_u64(), added["content"].as_str()) else {
            return Err(fail(format!("added token {added} has no id or content")));
        };
        let ty = if added["special"].as_bool() == Some(true) {
            TYPE_CONTROL
        } else {
            TYPE_USER_DEFINED
        };
        by_id.insert(id as usize, (content.to_string(), ty));
    }
    let n = by_id
        .keys()
        .next_back()
        .map_or(0, |&last| last + 1)
        .max(vocab_size);
    let mut tokens = Vec::with_capacity(n);
    let mut types = Vec::with_capacity(n);
    for id in 0..n {
        let (token, ty) = by_id
            .remove(&id)
            .unwrap_or_else(|| (format!("[PAD{id}]"), TYPE_USER_DEFINED));
        tokens.push(MetaValue::String(token));
        types.push(MetaValue::I32(ty));
    }
    let mut merges = Vec::new();
    for m in model["merges"].as_array().into_iter().flatten() {
        let pair = match m {
            Value::String(s) => s.clone(),
            Value::Array(p) if p.len() == 2 => format!(
                "{} {}",
                p[0].as_str().unwrap_or_default(),
                p[1].as_str().unwrap_or_default()
            ),
            other => return Err(fail(format!("merge {other} is neither \"a b\" nor [a, b]"))),
        };
        merges.push(MetaValue::String(pair));
    }
    let mut keys = vec![
        (
            "tokenizer.ggml.model".to_string(),
            MetaValue::String("gpt2".into()),
        ),
        (
            "tokenizer.ggml.pre".to_string(),
            MetaValue::String(pre.into()),
        ),
        (
            "tokenizer.ggml.tokens".to_string(),
            MetaValue::Array(tokens),
        ),
        (
            "tokenizer.ggml.token_type".to_string(),
            MetaValue::Array(types),
        ),
        (
            "tokenizer.ggml.merges".to_string(),
            MetaValue::Array(merges),
        ),
    ];
    let config: Value = std::fs::read_to_string(dir.join("tokenizer_config.json"))
        .ok()
        .and_then(|s| serde_json::from_str(&s).ok())
        .unwrap_or(Value::Null);
    let mut id = |key: &str, v: Option<u32>| {
        if let Some(v) = v {
            keys.push((format!("tokenizer.ggml.{key}"), MetaValue::U32(v)));
        }
    };
    id("bos_token_id", ids.bos);
    id("eos_token_id", ids.eos.first().copied());
    id("padding_token_id", ids.pad);
    if let Some(add) = config["add_bos_token"].as_bool() {
        keys.push(("tokenizer.ggml.add_bos_token".into(), MetaValue::Bool(add)));
    }
    let template = match &config["chat_template"] {
        Value::String(s) => Some(s.clone()),
        _ => std::fs::read_to_string(dir.join("chat_template.jinja")).ok(),
    };
    if let Some(t) = template {
        keys.push(("tokenizer.chat_template".into(), MetaValue::String(t)));
    }
    Ok(Ok(keys))
}

/// Whether a `ByteLevel` step appears anywhere in the tokenizer (pre-tokenizer or decoder).
fn mentions_byte_level(v: &Value) -> bool {
    match v {
        Value::Object(m) => {
            m.get("type").and_then(Value::as_str) == Some("ByteLevel")
                || m.values().any(mentions_byte_level)
        }
        Value::Array(a) => a.iter().any(mentions_byte_level),
        _ => false,
    }
}

/// llama.cpp's name of the pre-tokenizer `pre` (see the module documentation).
fn pre_name(pre: &Value, family: &str) -> Option<&'static str> {
    let steps: Vec<&Value> = match pre["type"].as_str() {
        Some("Sequence") => pre["pretokenizers"].as_array()?.iter().collect(),
        Some(_) => vec![pre],
        None => return None,
    };
    let regexes: Vec<&str> = steps
        .iter()
        .filter(|s| s["type"] == "Split")
        .filter_map(|s| s["pattern"]["Regex"].as_str())
        .collect();
    let kinds: Vec<&str> = steps.iter().filter_map(|s| s["type"].as_str()).collect();
    if !regexes.is_empty() && regexes.len() + 1 == steps.len() {
        if let Some(rule) = PRE_TOKENIZERS
            .iter()
            .find(|r| r.regexes == regexes.as_slice())
        {
            return rule.names.first().copied();
        }
        if family == "qwen2" && regexes.len() == 1 {
            return Some("qwen2");
        }
        return None;
    }
    // A byte-level step that does not split (`use_regex: false`) leaves text whole, which
    // no llama.cpp rule does.
    let splits = steps.last().is_some_and(|s| s["use_regex"] != false);
    match kinds.as_slice() {
        ["ByteLevel"] if splits => Some("gpt-2"),
        ["Digits", "ByteLevel"] if splits && steps[0]["individual_digits"] == true => {
            Some("smollm")
        }
        _ => None,
    }
}
