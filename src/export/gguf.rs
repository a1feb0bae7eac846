//! The GGUF file of an export: the family's hyperparameter keys
//! ([`crate::family::gguf_hparams`]), the source's own `general.*` and `tokenizer.*` keys
//! (a GGUF source's, copied as they are; a directory's byte-level BPE tokenizer converted
//! by [`super::vocab`]), and the tensors under llama.cpp's names in
//! llama.cpp's order (`token_embd`, each block, `output_norm`, `output`), q/k rows
//! permuted for the families whose converter permutes them.
//!
//! Matrices take the requested type; 1-D tensors (norms, biases) stay F32, as llama.cpp's
//! converter keeps them, and a matrix whose rows are not whole Q8_0 blocks is written F16
//! (noted in [`Written::notes`]).

use std::borrow::Cow;
use std::fs::File;
use std::io::BufWriter;
use std::path::Path;
use std::str::FromStr;

use shardes_hlo::params::ParamTree;

use super::{token_ids, vocab, ExportError, Source, Staging, Written};
use crate::family;
use crate::gguf::{write_gguf, GgmlType, GgufFile, MetaValue, TensorOut};
use crate::pretrained::{Format, ModelError};

/// How the matrices of a GGUF export are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GgufType {
    /// 32-bit floats (the parameters bit for bit).
    F32,
    /// IEEE half.
    F16,
    /// Blocks of 32 8-bit steps with an f16 scale.
    Q8_0,
}

impl GgufType {
    /// The ggml type.
    pub fn ggml(&self) -> GgmlType {
        match self {
            GgufType::F32 => GgmlType::F32,
            GgufType::F16 => GgmlType::F16,
            GgufType::Q8_0 => GgmlType::Q8_0,
        }
    }

    /// llama.cpp's `general.file_type` (`LLAMA_FTYPE_ALL_F32`, `MOSTLY_F16`, `MOSTLY_Q8_0`).
    fn file_type(&self) -> u32 {
        match self {
            GgufType::F32 => 0,
            GgufType::F16 => 1,
            GgufType::Q8_0 => 7,
        }
    }
}

impl FromStr for GgufType {
    type Err = String;

    fn from_str(s: &str) -> Result<GgufType, String> {
        match s.to_ascii_uppercase().as_str() {
            "F32" => Ok(GgufType::F32),
            "F16" => Ok(GgufType::F16),
            "Q8_0" | "Q8" => Ok(GgufType::Q8_0),
            _ => Err(format!("unknown GGUF type `{s}`: use f32, f16 or q8_0")),
        }
    }
}

/// One tensor as it will be written: its GGUF name, shape, type and (q/k: permuted) values.
struct Planned<'a> {
    name: String,
    shape: Vec<usize>,
    ty: GgmlType,
    data: Cow<'a, [f32]>,
}

/// Keys of a GGUF source that are not copied: the ones this export writes itself.
const OWN_KEYS: &[&str] = &[
    "general.architecture",
    "general.file_type",
    "general.quantization_version",
    "general.alignment",
];

/// Where a tensor goes in llama.cpp's order: the embedding, the blocks by layer, the
/// final norm, the head.
fn order(name: &str) -> (usize, usize) {
    match name {
        "token_embd.weight" => (0, 0),
        "output_norm.weight" => (2, 0),
        "output.weight" => (3, 0),
        _ => {
            let layer = name
                .strip_prefix("blk.")
                .and_then(|r| r.split('.').next())
                .and_then(|l| l.parse().ok())
                .unwrap_or(usize::MAX);
            (1, layer)
        }
    }
}

/// Writes `params` (checked against `source` by [`super::read_params`]) with `source`'s
/// settings and tokenizer metadata as the GGUF file `out`, matrices as `ty`, atomically;
/// an existing `out` is replaced only with `force`.
pub fn to_gguf(
    source: &Source,
    params: &ParamTree,
    out: &Path,
    ty: GgufType,
    force: bool,
) -> Result<Written, ExportError> {
    let config = &source.info.config;
    let unsupported = |u: family::Unsupported| ExportError::Unsupported {
        format: "GGUF",
        field: u.field,
        value: u.value,
        fix: "export a Hugging Face directory instead (--hf)",
    };
    // Everything that can be refused is refused before the temporary is made.
    let hparams = family::gguf_hparams(source.family, config, source.info.max_positions)
        .map_err(unsupported)?;
    let mut notes = Vec::new();
    let mut tensors: Vec<Planned<'_>> = Vec::new();
    for (path, a) in params.leaves() {
        let name = family::gguf_tensor_of_leaf(&path).ok_or_else(|| ExportError::Unsupported {
            format: "GGUF",
            field: path.clone(),
            value: "a leaf with no llama.cpp tensor name".into(),
            fix: "report this: the family table lacks a tensor name",
        })?;
        let shape = a.shape().to_vec();
        let mut data = Cow::Borrowed(a.data());
        if source.family.gguf_permutes_qk {
            if let Some(heads) = family::permuted_heads(&path, config) {
                let cols = shape.get(1).copied().unwrap_or(1);
                data = Cow::Owned(family::permute_rows(a.data(), shape[0], cols, heads));
            }
        }
        let row = shape.last().copied().unwrap_or(1);
        let t = match (shape.len(), ty) {
            (0 | 1, _) => GgmlType::F32,
            (_, GgufType::Q8_0) if !row.is_multiple_of(32) => {
                notes.push(format!(
                    "{name} is F16: its rows of {row} are not whole Q8_0 blocks of 32"
                ));
                GgmlType::F16
            }
            (_, t) => t.ggml(),
        };
        tensors.push(Planned {
            name,
            shape,
            ty: t,
            data,
        });
    }
    tensors.sort_by_key(|p| order(&p.name));

    let mut metadata: Vec<(String, MetaValue)> = Vec::new();
    let mut rest = hparams.into_iter();
    // `general.architecture` first, as llama.cpp writes it.
    metadata.extend(rest.next());
    metadata.push(("general.file_type".into(), MetaValue::U32(ty.file_type())));
    metadata.push(("general.quantization_version".into(), MetaValue::U32(2)));
    let mut tokenizer_keys = Vec::new();
    match source.format {
        Format::Gguf => {
            let file = GgufFile::open(&source.path).map_err(ModelError::File)?;
            for (k, v) in file.metadata() {
                if OWN_KEYS.contains(&k.as_str()) {
                    continue;
                }
                if k.starts_with("general.") {
                    metadata.push((k.clone(), v.clone()));
                } else if k.starts_with("tokenizer.") {
                    tokenizer_keys.push((k.clone(), v.clone()));
                }
            }
        }
        Format::HfDir => {
            let name = source
                .path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| "model".into());
            metadata.push(("general.name".into(), MetaValue::String(name)));
            let ids = token_ids(source)?;
            match vocab::tokenizer_keys(&source.path, source.family.name, config.vocab_size, &ids)?
            {
                Ok(keys) => tokenizer_keys.extend(keys),
                Err(why) => {
                    // The token ids at least, so the file's EOS still ends generations.
                    let mut id = |key: &str, v: Option<u32>| {
                        if let Some(v) = v {
                            tokenizer_keys
                                .push((format!("tokenizer.ggml.{key}"), MetaValue::U32(v)));
                        }
                    };
                    id("bos_token_id", ids.bos);
                    id("eos_token_id", ids.eos.first().copied());
                    id("padding_token_id", ids.pad);
                    notes.push(format!(
                        "no tokenizer vocabulary was written: {why}; the file loads in \
                         shardes, and {} stays the tokenizer's reference",
                        source.path.display()
                    ));
                }
            }
        }
    }
    metadata.extend(rest);
    metadata.extend(tokenizer_keys);

    let staging = Staging::new(out, force, false)?;
    let views: Vec<TensorOut<'_>> = tensors
        .iter()
        .map(|p| TensorOut {
            name: &p.name,
            shape: &p.shape,
            ty: p.ty,
            data: &p.data,
        })
        .collect();
    let write_err = |cause| ExportError::Write {
        path: out.to_path_buf(),
        cause,
    };
    let file = File::create(&staging.tmp).map_err(write_err)?;
    let mut w = BufWriter::with_capacity(1 << 20, file);
    let bytes = write_gguf(&mut w, &metadata, &views).map_err(|source| ExportError::Gguf {
        path: out.to_path_buf(),
        source,
    })?;
    let file = w.into_inner().map_err(|e| write_err(e.into_error()))?;
    file.sync_all().map_err(write_err)?;
    drop(file);
    staging.commit()?;
    Ok(Written {
        path: out.to_path_buf(),
        files: vec![(out.to_path_buf(), bytes)],
        tensors: tensors.len(),
        dtype: ty.ggml().name().to_string(),
        bytes,
        notes,
    })
}
