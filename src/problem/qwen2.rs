//! The Qwen2 problem: a checkpoint (or a random preset), its tokenizer and the
//! teacher-forcing batch of every example in a prompt/target JSONL file (feature `models`).

use std::path::PathBuf;

use shardes_hlo::builder::DType;
use shardes_hlo::es::LeafInfo;
use shardes_hlo::params::{Array, ParamTree};
use shardes_hlo::prng::Key;
use shardes_hlo::problems::qwen2::{Layers, Qwen2, Qwen2Config};
use shardes_hlo::problems::{f32_bytes, leaf_infos_of_shapes};

use super::memory::{self, HostBytes};
use super::{run_key, Problem, ProblemError, ProblemShapes, Setting};
use crate::tokenizer::{check_fits, lm_batch, read_examples_with_lines, Tokenizer, TokenizerError};

/// Where a Qwen2 model's parameters come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Qwen2Weights {
    /// A Hugging Face checkpoint directory (`config.json`, `*.safetensors`).
    Checkpoint(PathBuf),
    /// A size ([`config_of_size`]: a preset such as `tiny`, or custom dimensions) with
    /// parameters drawn from the run's key.
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
    /// How the program emits the decoder layers (unrolled by default).
    pub layers: Layers,
}

/// A Qwen2 problem read as far as its shapes: the config, the examples and the batch
/// geometry, every check made, no parameter and no batch array allocated.
struct Plan {
    config: Qwen2Config,
    examples: Vec<(Vec<u32>, Vec<u32>)>,
    batch: usize,
    seq: usize,
    target_tokens: usize,
    origin: String,
    family: &'static str,
    dtype: DType,
    layers: Layers,
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
    /// parameters from it). Refused with [`ProblemError::Memory`] before the parameters are
    /// loaded or drawn when they and the batch would not fit the host's memory.
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

    /// The shapes of [`Self::qwen2`]: the model, its leaves and the host bytes, from
    /// `config.json` and the safetensors headers (or the preset) and the data file, without
    /// reading a weight or drawing a parameter. Every check of [`Self::qwen2`] is made
    /// except the weights' finiteness and the memory check
    /// ([`ProblemShapes::check_host_memory`]).
    pub fn qwen2_shapes(source: &Qwen2Source, seed: u64) -> Result<ProblemShapes, ProblemError> {
        let k = run_key(seed)?;
        plan(source)?.shapes(k)
    }
}

impl Problem {
    /// [`Self::qwen2`] with `layers` decoder layers instead of the source's, the
    /// parameters drawn at random from the run's key for those shapes (a checkpoint's
    /// weights are not read): for benchmarks that measure a per-layer cost on a shallower
    /// model of the same width and data.
    pub fn qwen2_with_layers(
        source: &Qwen2Source,
        seed: u64,
        layers: usize,
    ) -> Result<Problem, ProblemError> {
        let k = run_key(seed)?;
        let mut plan = plan(source)?;
        plan.config.num_hidden_layers = layers;
        plan.config.validate().map_err(ProblemError::host(format!(
            "describing a {layers}-layer qwen2"
        )))?;
        plan.origin = format!("{} at {layers} layers, random weights", plan.origin);
        plan.shapes(k)?.check_host_memory()?;
        let params = plan
            .config
            .init(k, 0.02)
            .map_err(ProblemError::host(format!(
                "initialising a {layers}-layer qwen2"
            )))?;
        Ok(Problem {
            model: Box::new(plan.model()),
            params,
            batch: batch_of(&plan)?,
            key: k,
            summary: plan.summary(),
        })
    }
}

/// The model of [`Problem::qwen2`] alone, from its shapes (nothing is loaded); see
/// [`qwen2_shapes_at_depth`].
pub fn qwen2_model(source: &Qwen2Source, seed: u64) -> Result<Qwen2, ProblemError> {
    run_key(seed)?;
    Ok(plan(source)?.model())
}

/// `model` with `layers` decoder layers and random parameters of its shapes drawn from
/// `key(seed)` (for compile-cost sweeps over depth; [`qwen2_shapes_at_depth`] gives the
/// leaves without drawing them).
pub fn qwen2_at_depth(
    model: &Qwen2,
    layers: usize,
    seed: u64,
) -> Result<(Qwen2, ParamTree), ProblemError> {
    let (deeper, _) = qwen2_shapes_at_depth(model, layers)?;
    let named = deeper.config.param_shapes();
    let leaf = named
        .iter()
        .map(|(_, s)| f32_bytes([s.as_slice()]))
        .max()
        .unwrap_or(0);
    memory::require(
        f32_bytes(named.iter().map(|(_, s)| s.as_slice())).saturating_add(leaf.saturating_mul(2)),
        || format!("a random {layers}-layer qwen2 of this width"),
        "the number of layers",
    )?;
    let params = deeper
        .config
        .init(run_key(seed)?, 0.02)
        .map_err(ProblemError::host(format!(
            "initialising a {layers}-layer qwen2"
        )))?;
    Ok((deeper, params))
}

/// `model` with `layers` decoder layers and the [`LeafInfo`]s of its parameters, nothing
/// allocated (for compile-cost sweeps over depth).
pub fn qwen2_shapes_at_depth(
    model: &Qwen2,
    layers: usize,
) -> Result<(Qwen2, Vec<LeafInfo>), ProblemError> {
    let mut cfg = model.config.clone();
    cfg.num_hidden_layers = layers;
    let describing = || format!("describing a {layers}-layer qwen2");
    cfg.validate().map_err(ProblemError::host(describing()))?;
    let leaves =
        leaf_infos_of_shapes(&cfg.param_shapes()).map_err(ProblemError::host(describing()))?;
    let deeper = Qwen2::new(cfg, model.batch, model.seq)
        .with_compute_dtype(model.compute_dtype)
        .with_layers(model.layers);
    Ok((deeper, leaves))
}

fn checkpoint_error(e: crate::pretrained::ModelError) -> ProblemError {
    ProblemError::input(
        Setting::Checkpoint,
        format!("checkpoint: {e}"),
        "point the checkpoint at a Hugging Face model directory (config.json and \
         model.safetensors or model.safetensors.index.json with its shards) or a .gguf file",
    )
}

/// The dimension keys of a custom random size, `"vocab=4096,d=256,ffn=1024,layers=4,heads=4,kv=2"`.
const DIM_KEYS: &str = "vocab, d, ffn, layers, heads, kv";

/// The config a random model's `size` names, the one parser of every `size` form (loss
/// problems and [`crate::decode::load_qwen2`] both read sizes here): a preset (`tiny`,
/// `0.5b` or `qwen2.5-0.5b`, `1.5b` or `qwen2.5-1.5b`, any case), or the tiny preset with
/// the dimensions a comma-separated `key=value` list sets (`vocab`, `d`, `ffn`, `layers`,
/// `heads`, `kv`), e.g. `"vocab=4096,d=256,ffn=1024,layers=4,heads=4,kv=2"` for a d = 256
/// model. The result is validated; an error names [`Setting::Size`].
pub fn config_of_size(size: &str) -> Result<Qwen2Config, ProblemError> {
    let fix = "use \"tiny\", \"0.5b\" or \"1.5b\", or dimensions such as \
               \"vocab=4096,d=256,ffn=1024,layers=4,heads=4,kv=2\"";
    if !size.contains('=') {
        return Qwen2Config::by_size(size)
            .map_err(|e| ProblemError::input(Setting::Size, format!("size: {e}"), fix));
    }
    let bad = |why: String| {
        ProblemError::input(
            Setting::Size,
            format!("size = \"{}\": {why}", shardes_hlo::es::spec::excerpt(size)),
            fix,
        )
    };
    let mut cfg = Qwen2Config::tiny();
    for part in size.split(',') {
        let (key, value) = part
            .split_once('=')
            .ok_or_else(|| bad(format!("`{}` is not key=value", part.trim())))?;
        let value: usize = value
            .trim()
            .parse()
            .map_err(|_| bad(format!("`{}` is not a positive whole number", value.trim())))?;
        let slot = match key.trim() {
            "vocab" => &mut cfg.vocab_size,
            "d" => &mut cfg.hidden_size,
            "ffn" => &mut cfg.intermediate_size,
            "layers" => &mut cfg.num_hidden_layers,
            "heads" => &mut cfg.num_attention_heads,
            "kv" => &mut cfg.num_key_value_heads,
            other => return Err(bad(format!("unknown dimension `{other}` (use {DIM_KEYS})"))),
        };
        *slot = value;
    }
    cfg.validate().map_err(|e| bad(e.to_string()))?;
    Ok(cfg)
}

/// Reads everything but the weights and checks it: the config (and the checkpoint's
/// headers), the tokenizer, the data against the vocabulary and the model's positions,
/// the batch and the sequence length.
fn plan(source: &Qwen2Source) -> Result<Plan, ProblemError> {
    let (cfg, max_positions, origin, family) = match &source.weights {
        Qwen2Weights::Checkpoint(dir) => {
            let info = crate::pretrained::read_info(dir).map_err(checkpoint_error)?;
            crate::pretrained::check_weights(dir, &info.config).map_err(checkpoint_error)?;
            (
                info.config,
                info.max_positions,
                format!("checkpoint {}", dir.display()),
                info.family,
            )
        }
        Qwen2Weights::Random(size) => {
            let cfg = config_of_size(size)?;
            (
                cfg,
                None,
                format!("random {}", shardes_hlo::es::spec::excerpt(size)),
                "qwen2",
            )
        }
    };
    let checkpoint = match &source.weights {
        Qwen2Weights::Checkpoint(dir) => Some(dir),
        Qwen2Weights::Random(_) => None,
    };
    let tokenizer = match (&source.tokenizer, checkpoint) {
        (Some(path), _) => Some(Tokenizer::from_file(path).map_err(|e| {
            ProblemError::input(
                Setting::Tokenizer,
                format!("tokenizer: {e}"),
                "point the tokenizer at a tokenizer.json of the `tokenizers` library",
            )
        })?),
        // A checkpoint without a tokenizer is fine as long as the data holds ids.
        (None, Some(path)) => crate::pretrained::tokenizer(path).map_err(|e| {
            ProblemError::input(
                Setting::Tokenizer,
                format!("tokenizer: {e}"),
                "set the tokenizer to a tokenizer.json of the `tokenizers` library",
            )
        })?,
        (None, None) => None,
    };
    let data = &source.data;
    let lines = read_examples_with_lines(data, tokenizer.as_ref(), cfg.vocab_size).map_err(
        |e| match e {
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
        },
    )?;
    if let Some(max) = max_positions {
        // The model reads prompt ++ target without its last token: one position each.
        if let Some((line, (p, t))) = lines.iter().find(|(_, (p, t))| p.len() + t.len() - 1 > max) {
            return Err(ProblemError::input(
                Setting::Data,
                format!(
                    "data {}:{line}: the example has {} tokens (prompt {} + target {}), so the \
                     model reads {} positions, more than the checkpoint's \
                     max_position_embeddings = {max}",
                    data.display(),
                    p.len() + t.len(),
                    p.len(),
                    t.len(),
                    p.len() + t.len() - 1
                ),
                format!(
                    "shorten or drop that example: prompt + target may hold at most {} tokens \
                     for this model",
                    max + 1
                ),
            ));
        }
    }
    let examples: Vec<_> = lines.into_iter().map(|(_, e)| e).collect();
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
    let seq_error = |e: TokenizerError| {
        ProblemError::input(
            Setting::Seq,
            format!("seq = {seq}: {e}"),
            "raise seq or leave it unset (the default fits the longest example)",
        )
    };
    check_fits(&examples, seq).map_err(seq_error)?;
    if i32::try_from(seq).is_err() {
        return Err(ProblemError::input(
            Setting::Seq,
            format!("seq = {seq} is beyond the i32 positions of the program"),
            "lower seq or leave it unset (the default fits the longest example)",
        ));
    }
    let target_tokens = examples.iter().map(|(_, t)| t.len()).sum();
    Ok(Plan {
        config: cfg,
        batch: examples.len(),
        examples,
        seq,
        target_tokens,
        origin,
        family,
        dtype: source.compute_dtype,
        layers: source.layers,
    })
}

impl Plan {
    fn model(&self) -> Qwen2 {
        Qwen2::new(self.config.clone(), self.batch, self.seq)
            .with_compute_dtype(self.dtype)
            .with_layers(self.layers)
    }

    fn summary(&self) -> String {
        let cfg = &self.config;
        format!(
            "{} ({}: {} layers, d {}, vocab {}, {}; batch {}, seq {}, {} target tokens)",
            self.family,
            self.origin,
            cfg.num_hidden_layers,
            cfg.hidden_size,
            cfg.vocab_size,
            if self.dtype == DType::BF16 {
                "bf16"
            } else {
                "f32"
            },
            self.batch,
            self.seq,
            // As the sum of the batch's f32 mask prints it.
            self.target_tokens as f32
        )
    }

    fn shapes(&self, key: Key) -> Result<ProblemShapes, ProblemError> {
        let named = self.config.param_shapes();
        let leaves = leaf_infos_of_shapes(&named)
            .map_err(ProblemError::host("describing the qwen2 parameters"))?;
        let cell = [self.batch, self.seq];
        // The ids, targets and mask, once as the host batch and once as the f32 arrays.
        let batch = f32_bytes([cell.as_slice()]).saturating_mul(6);
        let host_bytes = HostBytes {
            params: f32_bytes(named.iter().map(|(_, s)| s.as_slice())),
            largest_leaf: named
                .iter()
                .map(|(_, s)| f32_bytes([s.as_slice()]))
                .max()
                .unwrap_or(0),
            batch,
        };
        Ok(ProblemShapes {
            model: Box::new(self.model()),
            leaves,
            key,
            summary: self.summary(),
            host_bytes,
            memory_what: format!(
                "qwen2 ({}: {} layers, d {}, vocab {}; batch {}, seq {}) with its f32 \
                 parameters and batch",
                self.origin,
                self.config.num_hidden_layers,
                self.config.hidden_size,
                self.config.vocab_size,
                self.batch,
                self.seq
            ),
            memory_lower: "the model (a smaller size or checkpoint) or seq",
        })
    }
}

fn load(source: &Qwen2Source, k: Key) -> Result<Loaded, ProblemError> {
    let plan = plan(source)?;
    plan.shapes(k)?.check_host_memory()?;
    let cfg = &plan.config;
    let params = match &source.weights {
        Qwen2Weights::Checkpoint(dir) => {
            crate::pretrained::load_params(dir, cfg).map_err(checkpoint_error)?
        }
        Qwen2Weights::Random(_) => cfg
            .init(k, 0.02)
            .map_err(ProblemError::host("initialising random qwen2 parameters"))?,
    };
    Ok(Loaded {
        model: plan.model(),
        params,
        summary: plan.summary(),
        batch: batch_of(&plan)?,
    })
}

/// The teacher-forcing batch of the plan's examples: ids, targets and mask as f32 arrays.
fn batch_of(plan: &Plan) -> Result<Vec<Array>, ProblemError> {
    let seq = plan.seq;
    let lm = lm_batch(&plan.examples, seq, 0).map_err(|e| {
        ProblemError::input(
            Setting::Seq,
            format!("seq = {seq}: {e}"),
            "raise seq or leave it unset (the default fits the longest example)",
        )
    })?;
    let whole = |v: &[i32]| -> Vec<f32> { v.iter().map(|&x| x as f32).collect() };
    let shape = vec![lm.batch, lm.seq];
    Ok(vec![
        Array::new(shape.clone(), whole(&lm.ids))?,
        Array::new(shape.clone(), whole(&lm.targets))?,
        Array::new(shape, lm.mask)?,
    ])
}
