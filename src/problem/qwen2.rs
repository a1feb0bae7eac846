//! The Qwen2 problem: a checkpoint (or a random preset), its tokenizer and the
//! teacher-forcing batch of every example in a prompt/target JSONL file (feature `models`).

use std::path::PathBuf;

use shardes_hlo::builder::DType;
use shardes_hlo::params::{Array, ParamTree};
use shardes_hlo::prng::Key;
use shardes_hlo::problems::qwen2::{Qwen2, Qwen2Config};

use super::{run_key, Problem, ProblemError, Setting};
use crate::tokenizer::{lm_batch, read_examples, Tokenizer, TokenizerError};

/// Where a Qwen2 model's parameters come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Qwen2Weights {
    /// A Hugging Face checkpoint directory (`config.json`, `*.safetensors`).
    Checkpoint(PathBuf),
    /// A preset (`tiny`, `0.5b`, `1.5b`) with parameters drawn from the run's key.
    Random(String),
}

/// A description of a Qwen2 problem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Qwen2Source {
    /// The parameters.
    pub weights: Qwen2Weights,
    /// A `tokenizer.json`; unset, the checkpoint's own if it has one.
    pub tokenizer: Option<PathBuf>,
    /// A JSONL file, one example per line: `{"prompt": "...", "target": "..."}` (needs a
    /// tokenizer) or `{"prompt_ids": [...], "target_ids": [...]}`.
    pub data: PathBuf,
    /// Sequences per batch: must equal the number of examples when set.
    pub batch: Option<usize>,
    /// Tokens per sequence; unset, the longest example's prompt + target − 1.
    pub seq: Option<usize>,
    /// The forward's dtype (`F32` or `BF16`); the master and the fitness stay f32.
    pub compute_dtype: DType,
}

/// A loaded Qwen2 problem with its model still typed.
struct Loaded {
    model: Qwen2,
    params: ParamTree,
    batch: Vec<Array>,
    summary: String,
}

impl Problem {
    /// The Qwen2 problem of `source` with `key = key(seed)` (random presets draw their
    /// parameters from it).
    pub fn qwen2(source: &Qwen2Source, seed: u64) -> Result<Problem, ProblemError> {
        let k = run_key(seed)?;
        let q = load(source, k)?;
        Ok(Problem {
            model: Box::new(q.model),
            params: q.params,
            batch: q.batch,
            key: k,
            summary: q.summary,
        })
    }
}

/// The model of [`Problem::qwen2`] alone (it loads the whole problem to learn the batch
/// geometry); see [`qwen2_at_depth`].
pub fn qwen2_model(source: &Qwen2Source, seed: u64) -> Result<Qwen2, ProblemError> {
    Ok(load(source, run_key(seed)?)?.model)
}

/// `model` with `layers` decoder layers and random parameters of its shapes drawn from
/// `key(seed)` (for compile-cost sweeps over depth).
pub fn qwen2_at_depth(
    model: &Qwen2,
    layers: usize,
    seed: u64,
) -> Result<(Qwen2, ParamTree), ProblemError> {
    let mut cfg = model.config.clone();
    cfg.num_hidden_layers = layers;
    let params = cfg
        .init(run_key(seed)?, 0.02)
        .map_err(ProblemError::host(format!(
            "initialising a {layers}-layer qwen2"
        )))?;
    let deeper = Qwen2::new(cfg, model.batch, model.seq).with_compute_dtype(model.compute_dtype);
    Ok((deeper, params))
}

fn load(source: &Qwen2Source, k: Key) -> Result<Loaded, ProblemError> {
    let (cfg, params, origin) = match &source.weights {
        Qwen2Weights::Checkpoint(dir) => {
            let (cfg, params) = crate::hf::load_checkpoint(dir).map_err(|e| {
                ProblemError::input(
                    Setting::Checkpoint,
                    format!("checkpoint: {e}"),
                    "point the checkpoint at a Hugging Face Qwen2 directory (config.json and \
                     model.safetensors or model.safetensors.index.json with its shards)",
                )
            })?;
            (cfg, params, format!("checkpoint {}", dir.display()))
        }
        Qwen2Weights::Random(size) => {
            let cfg = Qwen2Config::by_size(size).map_err(|e| {
                ProblemError::input(
                    Setting::Size,
                    format!("size: {e}"),
                    "use \"tiny\", \"0.5b\" or \"1.5b\"",
                )
            })?;
            let params = cfg
                .init(k, 0.02)
                .map_err(ProblemError::host("initialising random qwen2 parameters"))?;
            (cfg, params, format!("random {size}"))
        }
    };
    let checkpoint = match &source.weights {
        Qwen2Weights::Checkpoint(dir) => Some(dir),
        Qwen2Weights::Random(_) => None,
    };
    let tokenizer_path = source
        .tokenizer
        .clone()
        .or_else(|| checkpoint.map(|d| d.join("tokenizer.json")));
    let tokenizer = match &tokenizer_path {
        // A checkpoint without a tokenizer.json is fine as long as the data holds ids.
        Some(path) if source.tokenizer.is_some() || path.is_file() => {
            Some(Tokenizer::from_file(path).map_err(|e| {
                ProblemError::input(
                    Setting::Tokenizer,
                    format!("tokenizer: {e}"),
                    "point the tokenizer at a tokenizer.json of the `tokenizers` library",
                )
            })?)
        }
        _ => None,
    };
    let data = &source.data;
    let examples =
        read_examples(data, tokenizer.as_ref(), cfg.vocab_size).map_err(|e| match e {
            TokenizerError::Data {
                path,
                line,
                message,
                fix,
            } => ProblemError::input(
                Setting::Data,
                format!("data {}:{line}: {message}", path.display()),
                fix,
            ),
            other => ProblemError::input(
                Setting::Data,
                format!("data: {other}"),
                "check the data file against the tokenizer",
            ),
        })?;
    if let Some(b) = source.batch {
        if b != examples.len() {
            return Err(ProblemError::input(
                Setting::Batch,
                format!(
                    "batch = {b} but {} holds {} examples",
                    data.display(),
                    examples.len()
                ),
                "leave the batch unset (it is every example in the data file) or make the two \
                 agree",
            ));
        }
    }
    let longest = examples
        .iter()
        .map(|(p, t)| p.len() + t.len() - 1)
        .max()
        .unwrap_or(1);
    let seq = source.seq.unwrap_or(longest);
    let lm = lm_batch(&examples, seq, 0).map_err(|e| {
        ProblemError::input(
            Setting::Seq,
            format!("seq = {seq}: {e}"),
            "raise seq or leave it unset (the default fits the longest example)",
        )
    })?;
    let dtype = source.compute_dtype;
    let whole = |v: &[i32]| -> Vec<f32> { v.iter().map(|&x| x as f32).collect() };
    let shape = vec![lm.batch, lm.seq];
    let batch = vec![
        Array::new(shape.clone(), whole(&lm.ids))?,
        Array::new(shape.clone(), whole(&lm.targets))?,
        Array::new(shape, lm.mask.clone())?,
    ];
    let summary = format!(
        "qwen2 ({origin}: {} layers, d {}, vocab {}, {}; batch {}, seq {}, {} target tokens)",
        cfg.num_hidden_layers,
        cfg.hidden_size,
        cfg.vocab_size,
        if dtype == DType::BF16 { "bf16" } else { "f32" },
        lm.batch,
        lm.seq,
        lm.mask.iter().sum::<f32>()
    );
    Ok(Loaded {
        model: Qwen2::new(cfg, lm.batch, lm.seq).with_compute_dtype(dtype),
        params,
        batch,
        summary,
    })
}
