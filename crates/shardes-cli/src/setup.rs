//! From a [`Config`] to everything a run needs: the ES, the model, the initial parameters,
//! the key, the batch and a PJRT client.
//!
//! Shared by `shardes run`, `hlo`, `check` and `bench`, so every subcommand sees exactly the
//! same program for the same config. The derivation follows the spec:
//! `key = key(seed)`, `params = init(key)`, `batch = make_batch(fold_in(key, 1))`, and the
//! trainer takes `key` (the ES state is the key; the generation is folded in on the device).

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use shardes::hlo::builder::DType;
use shardes::hlo::es::strategy::from_spec;
use shardes::hlo::es::{shaping, How, Model, ShardedES};
use shardes::hlo::params::{Array, ParamTree};
use shardes::hlo::prng::{fold_in, key, Key};
use shardes::hlo::problems::qwen2::{Qwen2, Qwen2Config};
use shardes::hlo::problems::transformer_block::TransformerBlock;
use shardes::runtime::plugin::{CPU, NAMED};
use shardes::runtime::{Client, ClientOptions, Plugin};
use shardes::tokenizer::{lm_batch, read_examples, Tokenizer, TokenizerError};

use crate::config::{Config, ConfigError, PROBLEMS, SHAPINGS};

/// The device-independent part of a run: what the generation program is built from.
pub struct Problem {
    /// The ES settings (strategy, n, sigma, lr, shaping, placement, chunk, devices).
    pub es: ShardedES,
    /// The model whose loss is the fitness.
    pub model: Box<dyn Model>,
    /// Initial parameters, `init(key)`.
    pub params: ParamTree,
    /// The run's key, `key(seed)`.
    pub key: Key,
    /// The batch arrays in [`Model::batch_types`] order.
    pub batch: Vec<Array>,
    /// One line describing the model and batch, for run headers.
    pub summary: String,
}

/// Everything a run needs: the [`Problem`] and a client to run it on.
pub struct Setup {
    /// The config this was built from (with any command-line plugin override applied).
    pub config: Config,
    /// The ES settings.
    pub es: ShardedES,
    /// The model whose loss is the fitness.
    pub model: Box<dyn Model>,
    /// Initial parameters, `init(key)`.
    pub params: ParamTree,
    /// The run's key, `key(seed)`.
    pub key: Key,
    /// The batch arrays in [`Model::batch_types`] order.
    pub batch: Vec<Array>,
    /// One line describing the model and batch, for run headers.
    pub summary: String,
    /// The PJRT client (plugin from the config, or the provisioned CPU plugin).
    pub client: Client,
}

fn user(message: impl Into<String>, hint: impl Into<String>) -> ConfigError {
    ConfigError {
        message: message.into(),
        hint: hint.into(),
    }
}

/// Builds the ES, model, parameters, key and batch of `config` (no client, no I/O besides
/// host computation).
pub fn problem(config: &Config) -> anyhow::Result<Problem> {
    let spec = config.strategy()?;
    let shaping = shaping::by_name(&config.es.shaping).ok_or_else(|| {
        user(
            format!("es.shaping: unknown shaping \"{}\"", config.es.shaping),
            format!("valid shapings: {}", SHAPINGS.join(", ")),
        )
    })?;
    let how = match config.es.how.as_str() {
        "A" | "a" => How::A,
        "B" | "b" => How::B,
        other => {
            return Err(user(
                format!("es.how: unknown placement \"{other}\""),
                "use \"B\" or \"A\"",
            )
            .into())
        }
    };
    // The config validated n, sigma and lr already; an error here would be a mismatch between
    // the two validations, which is still the user's value to change.
    let es = ShardedES::new(
        from_spec(&spec),
        config.es.n,
        config.es.sigma,
        config.es.lr,
        config.devices,
    )
    .map_err(|e| user(format!("es: {e}"), "change the [es] value it names"))?
    .with_shaping(shaping)
    .with_how(how)
    .with_member_chunk(config.es.member_chunk)
    .with_keep_noise_bytes(config.es.keep_noise_bytes());
    let k = key(config.run.seed).map_err(|e| {
        user(
            format!("run.seed = {}: {e}", config.run.seed),
            "use a seed below 2^63",
        )
    })?;
    let (model, params, batch, summary): (Box<dyn Model>, ParamTree, Vec<Array>, String) =
        match config.problem.name.as_str() {
            "transformer_block" => {
                let tb = TransformerBlock {
                    d_model: config.problem.d_model(),
                    batch: config.problem.batch(),
                    seq: config.problem.seq(),
                };
                let params = tb
                    .init(k)
                    .context("initialising transformer_block parameters")?;
                let b = tb
                    .make_batch(fold_in(k, 1))
                    .context("drawing the transformer_block batch")?;
                let summary = format!(
                    "transformer_block (d_model {}, batch {}, seq {})",
                    tb.d_model, tb.batch, tb.seq
                );
                (Box::new(tb), params, vec![b.x, b.target], summary)
            }
            "qwen2" => {
                let q = qwen2(config, k)?;
                (Box::new(q.model), q.params, q.batch, q.summary)
            }
            other => {
                return Err(user(
                    format!("problem.name: unknown problem \"{other}\""),
                    format!("known problems: {}", PROBLEMS.join(", ")),
                )
                .into())
            }
        };
    let es = es.with_member_bytes(model.member_bytes());
    Ok(Problem {
        es,
        model,
        params,
        key: k,
        batch,
        summary,
    })
}

/// The qwen2 model of `config` (checkpoint or preset, batch geometry, compute dtype),
/// loaded once; see [`qwen2_at_depth`].
pub fn qwen2_model(config: &Config) -> anyhow::Result<Qwen2> {
    let k = key(config.run.seed).context("run.seed")?;
    Ok(qwen2(config, k)?.model)
}

/// `model` with `layers` decoder layers and random parameters of its shapes drawn from
/// `key(seed)` (for compile-cost sweeps over depth).
pub fn qwen2_at_depth(
    model: &Qwen2,
    layers: usize,
    seed: u64,
) -> anyhow::Result<(Qwen2, ParamTree)> {
    let mut cfg = model.config.clone();
    cfg.num_hidden_layers = layers;
    let params = cfg
        .init(key(seed).context("run.seed")?, 0.02)
        .with_context(|| format!("initialising a {layers}-layer qwen2"))?;
    let deeper = Qwen2::new(cfg, model.batch, model.seq).with_compute_dtype(model.compute_dtype);
    Ok((deeper, params))
}

struct Qwen2Problem {
    model: Qwen2,
    params: ParamTree,
    batch: Vec<Array>,
    summary: String,
}

/// The qwen2 problem of `config`: a checkpoint (or a random preset), its tokenizer and the
/// teacher-forcing batch of every example in `problem.data`.
fn qwen2(config: &Config, k: Key) -> anyhow::Result<Qwen2Problem> {
    let pc = &config.problem;
    let (cfg, params, origin) = match (&pc.checkpoint, &pc.size) {
        (Some(dir), _) => {
            let (cfg, params) = shardes::hf::load_checkpoint(dir).map_err(|e| {
                user(
                    format!("problem.checkpoint: {e}"),
                    "point problem.checkpoint at a Hugging Face Qwen2 directory (config.json and \
                     model.safetensors or model.safetensors.index.json with its shards)",
                )
            })?;
            (cfg, params, format!("checkpoint {}", dir.display()))
        }
        (None, Some(size)) => {
            let cfg = Qwen2Config::by_size(size).map_err(|e| {
                user(
                    format!("problem.size: {e}"),
                    "use size = \"tiny\", \"0.5b\" or \"1.5b\"",
                )
            })?;
            let params = cfg
                .init(k, 0.02)
                .context("initialising random qwen2 parameters")?;
            (cfg, params, format!("random {size}"))
        }
        (None, None) => {
            return Err(user(
                "problem \"qwen2\" needs problem.checkpoint or problem.size",
                "add checkpoint = \"DIR\" or size = \"tiny\"",
            )
            .into())
        }
    };
    let tokenizer_path = pc
        .tokenizer
        .clone()
        .or_else(|| pc.checkpoint.as_ref().map(|d| d.join("tokenizer.json")));
    let tokenizer = match &tokenizer_path {
        // A checkpoint without a tokenizer.json is fine as long as the data holds ids.
        Some(path) if pc.tokenizer.is_some() || path.is_file() => {
            Some(Tokenizer::from_file(path).map_err(|e| {
                user(
                    format!("problem.tokenizer: {e}"),
                    "point problem.tokenizer at a tokenizer.json of the `tokenizers` library",
                )
            })?)
        }
        _ => None,
    };
    let data = pc.data.as_ref().ok_or_else(|| {
        user(
            "problem \"qwen2\" needs problem.data",
            "add data = \"FILE.jsonl\"",
        )
    })?;
    let examples =
        read_examples(data, tokenizer.as_ref(), cfg.vocab_size).map_err(|e| match e {
            TokenizerError::Data {
                path,
                line,
                message,
                fix,
            } => user(
                format!("problem.data {}:{line}: {message}", path.display()),
                fix,
            ),
            other => user(
                format!("problem.data: {other}"),
                "check the data file against the tokenizer",
            ),
        })?;
    if let Some(b) = pc.batch {
        if b != examples.len() {
            return Err(user(
                format!(
                    "problem.batch = {b} but {} holds {} examples",
                    data.display(),
                    examples.len()
                ),
                "remove problem.batch (the batch is every example in the data file) or make \
                 the two agree",
            )
            .into());
        }
    }
    let longest = examples
        .iter()
        .map(|(p, t)| p.len() + t.len() - 1)
        .max()
        .unwrap_or(1);
    let seq = pc.seq.unwrap_or(longest);
    let lm = lm_batch(&examples, seq, 0).map_err(|e| {
        user(
            format!("problem.seq = {seq}: {e}"),
            "raise problem.seq or remove it (the default fits the longest example)",
        )
    })?;
    let dtype = match pc.compute_dtype.as_deref() {
        Some("bf16") => DType::BF16,
        _ => DType::F32,
    };
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
    Ok(Qwen2Problem {
        model: Qwen2::new(cfg, lm.batch, lm.seq).with_compute_dtype(dtype),
        params,
        batch,
        summary,
    })
}

/// A client for `config`: see [`client_for`].
pub fn client(config: &Config) -> anyhow::Result<Client> {
    client_for(config.plugin.as_deref(), config.devices)
}

/// A client on `plugin` asking for `devices` simulated CPU devices where that applies.
///
/// `plugin` is `None` or `"cpu"` (the default discovery and the provisioned CPU plugin),
/// `"cuda"` or `"tpu"` (the pinned accelerator plugins, found or provisioned as in
/// `shardes::runtime::plugin::PinnedPlugin::locate`; their devices are real, so `devices`
/// is not passed), or the path of any PJRT plugin library.
pub fn client_for(plugin: Option<&str>, devices: usize) -> anyhow::Result<Client> {
    let named = plugin.and_then(|p| NAMED.iter().find(|n| n.name.eq_ignore_ascii_case(p)));
    match (plugin, named) {
        (None, _) => {
            Client::cpu(devices).context("creating a CPU client on the default PJRT plugin")
        }
        (Some(_), Some(n)) if n.name == CPU.name => {
            Client::cpu(devices).context("creating a CPU client on the default PJRT plugin")
        }
        (Some(_), Some(n)) => {
            let path = n.locate().map_err(|e| {
                user(
                    format!("plugin = \"{}\": {e}", n.name),
                    format!(
                        "the {} plugin needs {}; or set plugin to the path of a PJRT plugin .so",
                        n.name, n.needs
                    ),
                )
            })?;
            let loaded = Plugin::load(&path)
                .with_context(|| format!("loading the PJRT plugin {}", path.display()))?;
            Client::new(loaded, ClientOptions::default()).with_context(|| {
                format!(
                    "creating a {} client on {} (it needs {})",
                    n.name,
                    path.display(),
                    n.needs
                )
            })
        }
        (Some(p), None) => {
            let path = Path::new(p);
            if !path.is_file() {
                return Err(user(
                    format!("plugin `{}` does not exist", path.display()),
                    "check the path (relative paths start at the current directory), or use \
                     plugin = \"cpu\", \"cuda\" or \"tpu\"",
                )
                .into());
            }
            let loaded: Arc<Plugin> = Plugin::load(path)
                .with_context(|| format!("loading the PJRT plugin {}", path.display()))?;
            // Simulated devices are a CPU-plugin option; a plugin with real devices may
            // refuse it, so ask again without it.
            Client::new(
                Arc::clone(&loaded),
                ClientOptions {
                    cpu_device_count: Some(devices),
                },
            )
            .or_else(|_| Client::new(loaded, ClientOptions::default()))
            .with_context(|| format!("creating a PJRT client on {}", path.display()))
        }
    }
}

/// Turns a config into everything a run needs: [`problem`] plus [`client`].
pub fn build(config: &Config) -> anyhow::Result<Setup> {
    let p = problem(config)?;
    let client = client(config)?;
    Ok(Setup {
        config: config.clone(),
        es: p.es,
        model: p.model,
        params: p.params,
        key: p.key,
        batch: p.batch,
        summary: p.summary,
        client,
    })
}
