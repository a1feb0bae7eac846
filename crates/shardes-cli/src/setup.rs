//! From a [`Config`] to everything a run needs: the ES, the [`Problem`] and a PJRT client.
//!
//! Shared by `shardes run`, `hlo`, `check`, `bench` and `diag`, so every subcommand sees
//! exactly the same program for the same config. The problem itself (checkpoints,
//! tokenizers, data, the key) is the library's ([`shardes::problem`]); this file maps the
//! config onto it and the library's errors onto config errors naming the key.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use shardes::hlo::builder::DType;
use shardes::hlo::es::{Model, ShardedES};
use shardes::hlo::problems::qwen2::Layers;
use shardes::problem::ProblemShapes;
use shardes::problem::Setting;
use shardes::runtime::plugin::{CPU, NAMED};
use shardes::runtime::{Client, ClientOptions, Plugin, RuntimeError};
use shardes::{Problem, ProblemError, Qwen2Source, Qwen2Weights};

use shardes::host_control::{HostControl, MjcfControl};
use shardes::mjcf::MjcfError;
use shardes::mujoco::MujocoError;

use crate::config::{
    control, control_mjcf, es_error, quadratic, transformer_block, Config, ConfigError,
    ProblemConfig, WeightsKey,
};

/// Everything a run needs: the ES, the [`Problem`] and a client to run it on.
pub struct Setup {
    /// The config this was built from (with any command-line plugin override applied).
    pub config: Config,
    /// The ES settings (with the model's member bytes).
    pub es: ShardedES,
    /// The model, initial parameters, batch and key.
    pub problem: Problem,
    /// The PJRT client (plugin from the config, or the provisioned CPU plugin).
    pub client: Client,
    /// For a `[task]` run: the decoding model's config, EOS and pad ids and positions (its
    /// parameters are [`Setup::problem`]'s).
    pub decode: Option<shardes::decode::LoadedQwen2>,
    /// The loaded MuJoCo model of a `control` problem with `mjcf` (its episodes run on
    /// the host: `shardes::host_control`).
    pub host: Option<HostControl>,
}

/// The ES of `config` (strategy, n, sigma, lr, shaping, placement, chunk, noise budget):
/// [`EsSpec::build`](shardes::hlo::es::EsSpec::build), whose errors name the `[es]` key.
/// The model's member bytes come with the program ([`ShardedES::member_chunk_for`]).
pub fn es(config: &Config) -> anyhow::Result<ShardedES> {
    let es = config
        .es
        .build(config.devices)
        .map_err(es_error)?
        // es.compute_dtype, or a qwen2 problem's compute_dtype.
        .with_compute_dtype(config.compute_dtype()?)
        .map_err(es_error)?;
    Ok(crate::config::sigma::with_separable(es, &config.es)?)
}

/// The library's description of a config's `[problem]`: what [`Problem`] is built from, in
/// full ([`Described::problem`]) or by shape ([`Described::shapes`]).
pub enum Described {
    /// `transformer_block`.
    TransformerBlock(shardes::hlo::problems::transformer_block::TransformerBlock),
    /// `qwen2`.
    Qwen2(Qwen2Source),
    /// `control`.
    Control(shardes::hlo::problems::control::Control),
    /// `quadratic`.
    Quadratic(shardes::hlo::problems::quadratic::Quadratic),
    /// `control` with `mjcf`, for `n` members (the model is loaded by
    /// [`Described::problem`]).
    Mjcf(MjcfControl, usize),
}

impl Described {
    /// The description of `config`'s problem (config errors name the key).
    pub fn of(config: &Config) -> anyhow::Result<Described> {
        if config.task.is_some() {
            // Its programs are the decoding and tell programs, built by `shardes run`.
            return Err(ConfigError::new(
                "this subcommand shows a problem's loss program, and a [task] config has none \
                 (it decodes and scores on the host)",
                "run it with `shardes run`, print completions with `shardes generate`, or \
                 measure decoding with `shardes bench benches/decode_tiny.toml`",
            )
            .into());
        }
        Ok(match &config.problem {
            ProblemConfig::TransformerBlock {
                d_model,
                batch,
                seq,
            } => Described::TransformerBlock(transformer_block(*d_model, *batch, *seq)),
            ProblemConfig::Qwen2 { .. } => Described::Qwen2(Qwen2Source {
                compute_dtype: config.compute_dtype()?,
                ..qwen2_source(&config.problem)?
            }),
            ProblemConfig::Control { .. } => {
                match control_mjcf(&config.problem, config.es.shaping)? {
                    Some(m) => Described::Mjcf(m, config.es.n),
                    None => Described::Control(control(&config.problem, config.es.shaping)?),
                }
            }
            ProblemConfig::Quadratic { .. } => Described::Quadratic(quadratic(&config.problem)?),
        })
    }

    /// The problem with its parameters and batch, `key = key(seed)`.
    pub fn problem(self, seed: u64) -> anyhow::Result<Problem> {
        match self {
            Described::TransformerBlock(tb) => Problem::transformer_block(tb, seed),
            Described::Qwen2(q) => Problem::qwen2(&q, seed),
            Described::Control(c) => Problem::control(c, seed),
            Described::Quadratic(q) => Problem::quadratic(q, seed),
            Described::Mjcf(m, n) => Problem::mjcf(&load_mjcf(m)?, n, seed),
        }
        .map_err(problem_error)
    }

    /// The problem by shape alone (nothing allocated; an MJCF model is loaded, which its
    /// observation and action sizes need).
    pub fn shapes(self, seed: u64) -> anyhow::Result<ProblemShapes> {
        match self {
            Described::TransformerBlock(tb) => Problem::transformer_block_shapes(tb, seed),
            Described::Qwen2(q) => Problem::qwen2_shapes(&q, seed),
            Described::Control(c) => Problem::control_shapes(c, seed),
            Described::Quadratic(q) => Problem::quadratic_shapes(q, seed),
            Described::Mjcf(m, n) => Problem::mjcf_shapes(&load_mjcf(m)?, n, seed),
        }
        .map_err(problem_error)
    }
}

/// Loads the MuJoCo model of an `mjcf` problem: a model MuJoCo refuses, or one that breaks
/// the conventions, is the config's `problem.mjcf` to fix (exit 2, MuJoCo's message); a
/// library that cannot be found or opened is a failure with its own fix.
pub fn load_mjcf(m: MjcfControl) -> anyhow::Result<HostControl> {
    let path = m.mjcf().to_path_buf();
    m.load(None).map_err(|e| match e {
        MjcfError::Mujoco(MujocoError::Load { message, .. }) => ConfigError::new(
            format!(
                "problem.mjcf = \"{}\": MuJoCo cannot load it: {message}",
                path.display()
            ),
            "point problem.mjcf at an MJCF model file MuJoCo 4.0 loads (e.g. \
             examples/mujoco/cartpole.xml)",
        )
        .into(),
        e @ MjcfError::Convention { .. } => ConfigError::new(
            format!("problem.mjcf: {e}"),
            "the conventions are in the README's \"MuJoCo models\" section",
        )
        .into(),
        other => anyhow::Error::new(other).context("opening the MuJoCo library"),
    })
}

/// The loaded MJCF model of `config`'s problem, if it has one.
pub fn host_control(config: &Config) -> anyhow::Result<Option<HostControl>> {
    control_mjcf(&config.problem, config.es.shaping)?
        .map(load_mjcf)
        .transpose()
}

/// The ES and the problem of `config` (no client, no I/O besides reading the problem's
/// files), and the loaded MuJoCo model of an `mjcf` problem.
pub fn problem(config: &Config) -> anyhow::Result<(ShardedES, Problem, Option<HostControl>)> {
    let es = es(config)?;
    let host = host_control(config)?;
    let problem = match &host {
        Some(h) => Problem::mjcf(h, config.es.n, config.run.seed).map_err(problem_error)?,
        None => Described::of(config)?.problem(config.run.seed)?,
    };
    let leaves = shardes::hlo::es::leaf_infos(&problem.params);
    crate::config::sigma::check_leaves(&es, &leaves)?;
    // The programs would derive it from the model too; set here, the ES's own reports
    // (member chunk, kept noise) agree with them.
    let es = es.with_member_bytes(problem.model.member_bytes());
    Ok((es, problem, host))
}

/// The ES of `config` for `model` (its member bytes size the member chunks).
pub fn es_for(config: &Config, model: &dyn Model) -> anyhow::Result<ShardedES> {
    Ok(es(config)?.with_member_bytes(model.member_bytes()))
}

/// The library's description of a `qwen2` `[problem]`.
pub fn qwen2_source(problem: &ProblemConfig) -> anyhow::Result<Qwen2Source> {
    let ProblemConfig::Qwen2 {
        batch,
        seq,
        data,
        tokenizer,
        compute_dtype,
        ..
    } = problem
    else {
        anyhow::bail!("problem `{}` is not qwen2", problem.name());
    };
    let weights = weights(problem)?;
    let data = data.clone().ok_or_else(|| {
        ConfigError::new(
            "problem \"qwen2\" needs problem.data",
            "add data = \"FILE.jsonl\"",
        )
    })?;
    Ok(Qwen2Source {
        weights,
        tokenizer: tokenizer.clone(),
        data,
        batch: *batch,
        seq: *seq,
        compute_dtype: match compute_dtype.as_deref() {
            Some("bf16") => DType::BF16,
            _ => DType::F32,
        },
        layers: layers_of(problem)?,
    })
}

/// `problem.layers` of a qwen2 problem (unrolled when unset); the config refused other
/// names already.
pub fn layers_of(problem: &ProblemConfig) -> anyhow::Result<Layers> {
    let ProblemConfig::Qwen2 { layers, .. } = problem else {
        return Ok(Layers::Unrolled);
    };
    Ok(layers
        .as_deref()
        .map_or(Ok(Layers::Unrolled), Layers::parse)
        .map_err(|e| {
            ConfigError::new(
                format!("problem.layers: {e}"),
                "use \"loop\" or \"unrolled\"",
            )
        })?)
}

/// The weights a qwen2 `[problem]` names, a named model resolved (provisioned into the
/// user cache on its first use, checked by its checksum on every use) to its file.
pub fn weights(problem: &ProblemConfig) -> anyhow::Result<Qwen2Weights> {
    Ok(match problem.weights_key()? {
        WeightsKey::Checkpoint(path) => Qwen2Weights::Checkpoint(path),
        WeightsKey::Size(size) => Qwen2Weights::Random(size),
        WeightsKey::Model(spec) => {
            let resolved = shardes::models::resolve_model_noted(&spec).map_err(|e| {
                ConfigError::new(
                    format!("problem.model = \"{spec}\": {e}"),
                    "use a model name `shardes models` lists, a .gguf file or a Hugging Face \
                     directory",
                )
            })?;
            if let Some(note) = resolved.note() {
                eprintln!("note: {note}");
            }
            Qwen2Weights::Checkpoint(resolved.source.path().to_path_buf())
        }
    })
}

/// Every `problem.size` a qwen2 config accepts, a loss (`data`) or a `[task]` config
/// alike: the named presets and the dimensions form over the tiny preset (both parsed by
/// `shardes::problem::qwen2::config_of_size`).
pub const SIZE_FORMS: &str = "use size = \"tiny\", \"0.5b\" (or \"qwen2.5-0.5b\") or \"1.5b\" \
     (or \"qwen2.5-1.5b\"), or dimensions over the tiny preset as comma-separated key=value \
     pairs of vocab, d, ffn, layers, heads and kv, e.g. size = \
     \"vocab=4096,d=256,ffn=1024,layers=4,heads=4,kv=2\"; or set problem.checkpoint instead";

/// A problem error as the config error naming its key (`run.seed`, `problem.data`, …) and
/// the fix in config terms; errors that are not the user's input stay as they are.
pub fn config_error(e: ProblemError) -> anyhow::Error {
    let ProblemError::Input {
        setting,
        message,
        fix,
    } = e
    else {
        return e.into();
    };
    let table = if setting == Setting::Seed {
        "run"
    } else {
        "problem"
    };
    let hint = match setting {
        Setting::Checkpoint => {
            "point problem.checkpoint at a Hugging Face model directory (config.json and \
             model.safetensors or model.safetensors.index.json with its shards)"
        }
        Setting::Size => SIZE_FORMS,
        Setting::Tokenizer => {
            "point problem.tokenizer at a tokenizer.json of the `tokenizers` library"
        }
        Setting::Batch => {
            "remove problem.batch (the batch is every example in the data file) or make \
             the two agree"
        }
        Setting::Seq => "raise problem.seq or remove it (the default fits the longest example)",
        // The library's own fixes say it in terms that fit the config already.
        Setting::Seed | Setting::Data => fix.as_str(),
    };
    ConfigError::new(format!("{table}.{message}"), hint).into()
}

/// A client for `config`: see [`client_for`].
pub fn client(config: &Config) -> anyhow::Result<Client> {
    client_for(config.plugin.as_deref(), config.devices)
}

/// A client on `plugin` asking for `devices` simulated CPU devices where that applies.
///
/// `plugin` is `None` or `"cpu"` (the default discovery and the provisioned CPU plugin),
/// another pinned plugin by name (`"cpu-jax"`, a newer CPU plugin with simulated devices
/// like the default's; `"cuda"` or `"tpu"`, whose devices are real, so `devices` is not
/// passed), found or provisioned as in `shardes::runtime::plugin::PinnedPlugin::locate`,
/// or the path of any PJRT plugin library.
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
                ConfigError::new(
                    format!("plugin = \"{}\": {e}", n.name),
                    format!(
                        "the {} plugin needs {}; or set plugin to the path of a PJRT plugin .so",
                        n.name, n.needs
                    ),
                )
            })?;
            let loaded = Plugin::load(&path)
                .with_context(|| format!("loading the PJRT plugin {}", path.display()))?;
            let options = ClientOptions {
                cpu_device_count: n.simulated_devices.then_some(devices),
            };
            Client::new(loaded, options).with_context(|| {
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
            let hint = "check the path (relative paths start at the current directory), or use \
                        plugin = \"cpu\", \"cpu-jax\", \"cuda\" or \"tpu\"";
            if !path.exists() {
                return Err(ConfigError::new(
                    format!("plugin `{}` does not exist", path.display()),
                    hint,
                )
                .into());
            }
            // The runtime checks the file before opening it (a directory, a truncated or
            // foreign file, no GetPjrtApi): each is the user's path to fix.
            let loaded: Arc<Plugin> = Plugin::load(path)
                .map_err(|e| ConfigError::new(format!("plugin `{}`: {e}", path.display()), hint))?;
            // Simulated devices are a CPU-plugin option; a plugin with real devices may
            // refuse it, so ask again without it — unless the count itself was refused.
            Client::new(
                Arc::clone(&loaded),
                ClientOptions {
                    cpu_device_count: Some(devices),
                },
            )
            .or_else(|e| match e {
                RuntimeError::TooManyDevices { .. } => Err(e),
                _ => Client::new(loaded, ClientOptions::default()),
            })
            .with_context(|| format!("creating a PJRT client on {}", path.display()))
        }
    }
}

/// Turns a config into everything a run needs: [`problem`] (or, for a `[task]` config,
/// the model to decode with) plus [`client`].
pub fn build(config: &Config) -> anyhow::Result<Setup> {
    let (es, problem, decode, host) = match &config.task {
        Some(_) => {
            let (problem, loaded) = decoding_problem(config)?;
            let es = self::es(config)?;
            let leaves = shardes::hlo::es::leaf_infos(&problem.params);
            crate::config::sigma::check_leaves(&es, &leaves)?;
            (es, problem, Some(loaded), None)
        }
        None => {
            let (es, problem, host) = problem(config)?;
            (es, problem, None, host)
        }
    };
    let client = client(config)?;
    Ok(Setup {
        config: config.clone(),
        es,
        problem,
        client,
        decode,
        host,
    })
}

/// A `[task]` config's model: the parameters (as a [`Problem`] with no batch, so the run's
/// checkpoint, resume and finiteness checks treat them as any problem's) and the rest of
/// the loaded checkpoint (config, EOS and pad ids, positions) for the decoding programs.
pub fn decoding_problem(
    config: &Config,
) -> anyhow::Result<(Problem, shardes::decode::LoadedQwen2)> {
    if !matches!(config.problem, ProblemConfig::Qwen2 { .. }) {
        anyhow::bail!("a [task] needs a qwen2 problem");
    }
    let weights = weights(&config.problem)?;
    // es.compute_dtype, or the problem's compute_dtype.
    let dtype = config.compute_dtype()?;
    let mut loaded =
        shardes::decode::load_qwen2(&weights, dtype, config.run.seed).map_err(problem_error)?;
    loaded.layers = layers_of(&config.problem)?;
    let params = std::mem::replace(
        &mut loaded.params,
        shardes::hlo::params::ParamTree::map(
            Vec::<(String, shardes::hlo::params::ParamTree)>::new(),
        ),
    );
    let c = &loaded.config;
    let summary = format!(
        "{} ({}, {} layers, d {}, vocab {}) decoding",
        loaded.family,
        match &weights {
            Qwen2Weights::Checkpoint(d) => d.display().to_string(),
            Qwen2Weights::Random(s) => format!("random {s}"),
        },
        c.num_hidden_layers,
        c.hidden_size,
        c.vocab_size
    );
    let model = shardes::hlo::problems::qwen2::Qwen2::new(c.clone(), 1, 1)
        .with_compute_dtype(dtype)
        .with_layers(loaded.layers);
    Ok((
        Problem {
            model: Box::new(model),
            params,
            batch: Vec::new(),
            key: loaded.key,
            summary,
        },
        loaded,
    ))
}

/// A problem error as [`config_error`] words it, and a memory error as the config
/// error naming the settings to lower (exit 2: the user's config is too large).
pub fn problem_error(e: ProblemError) -> anyhow::Error {
    match e {
        ProblemError::Memory(m) => ConfigError::new(
            format!("problem: {m}"),
            format!(
                "lower {} in [problem] to fit the {} available",
                m.lower,
                shardes::problem::memory::human(m.available)
            ),
        )
        .into(),
        other => config_error(other),
    }
}

/// Greedy decoding of `params` for `dc` on the config's devices (`shardes generate` and
/// `shardes eval`): only the evaluation program is compiled.
pub fn evaluator(
    config: &Config,
    loaded: &shardes::decode::LoadedQwen2,
    params: &shardes::hlo::params::ParamTree,
    key: shardes::hlo::prng::Key,
    dc: shardes::decode::DecodeConfig,
) -> anyhow::Result<shardes::PopulationDecoder> {
    let client = client(config)?;
    shardes::PopulationDecoder::for_evaluation(
        &client,
        config.devices,
        loaded.decoder(&dc),
        params,
        key,
        dc,
    )
    .context("building the decoding program")
}
