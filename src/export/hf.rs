//! The Hugging Face directory of an export: `config.json` (the family's keys),
//! `model.safetensors` (f32 or bf16, Hugging Face tensor names), `generation_config.json`
//! and the tokenizer files. A directory source's tokenizer files are copied as they are; a
//! GGUF source's tokenizer is rebuilt from its metadata
//! ([`crate::gguf_tokenizer::build`], the tokenizer shardes itself uses) and written as
//! `tokenizer.json` plus a `tokenizer_config.json` with the chat template and the special
//! tokens' strings.

use std::path::Path;
use std::str::FromStr;

use half::bf16;
use safetensors::tensor::{Dtype, TensorView};
use serde_json::json;
use shardes_hlo::params::ParamTree;

use super::{token_ids, write_synced, ExportError, Source, Staging, TokenIds, Written};
use crate::family::{self, HfExtras};
use crate::gguf_tokenizer::{self, GgufVocab};
use crate::pretrained::{Format, ModelError};

/// How `model.safetensors` stores the weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HfDtype {
    /// 32-bit floats: the parameters bit for bit.
    F32,
    /// bfloat16 (rounded to nearest even, as PyTorch's `.to(torch.bfloat16)`).
    BF16,
}

impl HfDtype {
    /// The name as the CLI takes it (`f32`, `bf16`).
    pub fn name(&self) -> &'static str {
        match self {
            HfDtype::F32 => "f32",
            HfDtype::BF16 => "bf16",
        }
    }

    fn torch(&self) -> &'static str {
        match self {
            HfDtype::F32 => "float32",
            HfDtype::BF16 => "bfloat16",
        }
    }
}

impl FromStr for HfDtype {
    type Err = String;

    fn from_str(s: &str) -> Result<HfDtype, String> {
        match s.to_ascii_lowercase().as_str() {
            "f32" | "float32" => Ok(HfDtype::F32),
            "bf16" | "bfloat16" => Ok(HfDtype::BF16),
            _ => Err(format!("unknown dtype `{s}`: use f32 or bf16")),
        }
    }
}

/// The tokenizer files a directory source may hold, copied as they are.
const TOKENIZER_FILES: &[&str] = &[
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
];

/// Writes `params` (checked against `source` by [`super::read_params`]) with `source`'s
/// settings and tokenizer as the Hugging Face directory `out`, atomically; an existing
/// `out` is replaced only with `force`.
pub fn to_hf(
    source: &Source,
    params: &ParamTree,
    out: &Path,
    dtype: HfDtype,
    force: bool,
) -> Result<Written, ExportError> {
    let staging = Staging::new(out, force, true)?;
    let tmp = staging.tmp.clone();
    let ids = token_ids(source)?;
    let mut files = Vec::new();
    let mut notes = Vec::new();
    let mut write = |name: &str, bytes: &[u8]| -> Result<(), ExportError> {
        let n = write_synced(&tmp.join(name), bytes)?;
        files.push((out.join(name), n));
        Ok(())
    };
    let config = family::hf_config_json(
        source.family,
        &source.info.config,
        &HfExtras {
            max_positions: source.info.max_positions,
            bos: ids.bos,
            eos: ids.eos.clone(),
            pad: ids.pad,
            torch_dtype: dtype.torch(),
        },
    );
    write("config.json", &pretty(&config))?;
    write("generation_config.json", &pretty(&generation_config(&ids)))?;
    write("model.safetensors", &safetensors_bytes(out, params, dtype)?)?;
    match source.format {
        Format::HfDir => {
            let mut any = false;
            for name in TOKENIZER_FILES {
                let from = source.path.join(name);
                if from.is_file() {
                    let bytes = std::fs::read(&from).map_err(|cause| {
                        ModelError::Hf(crate::hf::HfError::Read {
                            path: from.clone(),
                            cause,
                        })
                    })?;
                    write(name, &bytes)?;
                    any = true;
                }
            }
            if !any {
                notes.push(format!(
                    "{} has no tokenizer files; none were written",
                    source.path.display()
                ));
            }
        }
        Format::Gguf => match gguf_tokenizer_files(source)? {
            Some(files) => {
                write("tokenizer.json", &files.tokenizer)?;
                write("tokenizer_config.json", &files.config)?;
            }
            None => notes.push(format!(
                "the tokenizer of {} is not byte-level BPE (tokenizer.ggml.model = gpt2), which \
                 is the one shardes rebuilds; no tokenizer files were written",
                source.path.display()
            )),
        },
    }
    staging.commit()?;
    let bytes = files.iter().map(|(_, n)| n).sum();
    Ok(Written {
        path: out.to_path_buf(),
        files,
        tensors: params.num_leaves(),
        dtype: dtype.name().to_string(),
        bytes,
        notes,
    })
}

fn pretty(v: &serde_json::Value) -> Vec<u8> {
    let mut s = serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string());
    s.push('\n');
    s.into_bytes()
}

/// `generation_config.json`: the BOS, EOS and pad ids (greedy is transformers' default).
fn generation_config(ids: &TokenIds) -> serde_json::Value {
    let mut g = serde_json::Map::new();
    if let Some(b) = ids.bos {
        g.insert("bos_token_id".into(), json!(b));
    }
    if !ids.eos.is_empty() {
        g.insert("eos_token_id".into(), family::ids_json(&ids.eos));
    }
    if let Some(p) = ids.pad {
        g.insert("pad_token_id".into(), json!(p));
    }
    serde_json::Value::Object(g)
}

/// The safetensors bytes of `params` (one tensor per leaf, named by its path) in `dtype`,
/// with the `format: pt` metadata transformers looks for.
fn safetensors_bytes(
    out: &Path,
    params: &ParamTree,
    dtype: HfDtype,
) -> Result<Vec<u8>, ExportError> {
    let leaves = params.leaves();
    let data: Vec<Vec<u8>> = leaves
        .iter()
        .map(|(_, a)| match dtype {
            HfDtype::F32 => a.data().iter().flat_map(|x| x.to_le_bytes()).collect(),
            HfDtype::BF16 => a
                .data()
                .iter()
                .flat_map(|&x| bf16::from_f32(x).to_le_bytes())
                .collect(),
        })
        .collect();
    let st = match dtype {
        HfDtype::F32 => Dtype::F32,
        HfDtype::BF16 => Dtype::BF16,
    };
    let fail = |message: String| ExportError::Write {
        path: out.join("model.safetensors"),
        cause: std::io::Error::other(message),
    };
    let mut views = Vec::with_capacity(leaves.len());
    for ((name, a), bytes) in leaves.iter().zip(&data) {
        let view = TensorView::new(st, a.shape().to_vec(), bytes)
            .map_err(|e| fail(crate::io::describe_safetensors_error(&e)))?;
        views.push((name.clone(), view));
    }
    let metadata = Some(
        [("format".to_string(), "pt".to_string())]
            .into_iter()
            .collect(),
    );
    safetensors::serialize(views, &metadata)
        .map_err(|e| fail(crate::io::describe_safetensors_error(&e)))
}

/// The bytes of `tokenizer.json` and `tokenizer_config.json`.
struct TokenizerFiles {
    tokenizer: Vec<u8>,
    config: Vec<u8>,
}

/// `tokenizer.json` and `tokenizer_config.json` rebuilt from a GGUF source's metadata, or
/// `None` when its tokenizer is not one shardes rebuilds.
fn gguf_tokenizer_files(source: &Source) -> Result<Option<TokenizerFiles>, ExportError> {
    let file = crate::gguf::GgufFile::open(&source.path).map_err(ModelError::File)?;
    let fail = |message: String| ExportError::Tokenizer {
        path: source.path.clone(),
        message,
        fix: "export a GGUF file instead (--gguf), which keeps the tokenizer metadata as it is",
    };
    let vocab = GgufVocab::from_gguf(&file).map_err(|e| fail(e.to_string()))?;
    if vocab.model != "gpt2" {
        return Ok(None);
    }
    let tokenizer = gguf_tokenizer::build(&vocab).map_err(|e| fail(e.to_string()))?;
    let mut json = tokenizer.to_string(true).map_err(|e| fail(e.to_string()))?;
    json.push('\n');
    Ok(Some(TokenizerFiles {
        tokenizer: json.into_bytes(),
        config: pretty(&tokenizer_config(&vocab, source.info.max_positions)),
    }))
}

/// `tokenizer_config.json` of a GGUF vocabulary: the special tokens' strings, whether BOS
/// and EOS are added, the chat template.
fn tokenizer_config(v: &GgufVocab, max_positions: Option<usize>) -> serde_json::Value {
    let token = |id: Option<u32>| {
        id.and_then(|i| v.tokens.get(i as usize))
            .map_or(serde_json::Value::Null, |t| json!(t))
    };
    let mut c = serde_json::Map::new();
    c.insert("tokenizer_class".into(), json!("PreTrainedTokenizerFast"));
    c.insert("bos_token".into(), token(v.bos));
    c.insert("eos_token".into(), token(v.eos));
    c.insert("unk_token".into(), token(v.unk));
    c.insert("pad_token".into(), token(v.pad));
    c.insert("add_bos_token".into(), json!(v.add_bos));
    c.insert("add_eos_token".into(), json!(v.add_eos));
    c.insert("clean_up_tokenization_spaces".into(), json!(false));
    if let Some(p) = max_positions {
        c.insert("model_max_length".into(), json!(p));
    }
    if let Some(t) = &v.chat_template {
        c.insert("chat_template".into(), json!(t));
    }
    serde_json::Value::Object(c)
}
