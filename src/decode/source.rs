//! A decoder model to decode with, from a checkpoint (a Hugging Face directory or a GGUF
//! file, of any family [`crate::family`] reads) or a random Qwen2 size (a preset or custom
//! dimensions, as loss problems take them): the model, its parameters, the run's key and
//! the checkpoint's EOS and pad ids.

use shardes_hlo::builder::DType;
use shardes_hlo::decode::Bounded;
use shardes_hlo::es::ShardedES;
use shardes_hlo::params::ParamTree;
use shardes_hlo::prng::Key;
use shardes_hlo::problems::f32_bytes;
use shardes_hlo::problems::qwen2::{Layers, Qwen2, Qwen2Config};
use shardes_runtime::Client;

use super::{DecodeConfig, PopulationDecoder};
use crate::problem::qwen2::{config_of_size, Qwen2Weights};
use crate::problem::{memory, run_key, ProblemError, Setting};
use crate::Error;

/// A Qwen2 loaded for decoding.
#[derive(Debug, Clone)]
pub struct LoadedQwen2 {
    /// The hyperparameters.
    pub config: Qwen2Config,
    /// The initial parameters.
    pub params: ParamTree,
    /// The run's key, `key(seed)` (a random size draws its parameters from it).
    pub key: Key,
    /// The checkpoint's `max_position_embeddings`, if it says.
    pub max_positions: Option<usize>,
    /// The checkpoint's EOS ids (`generation_config.json`, else `config.json`).
    pub eos: Vec<u32>,
    /// The checkpoint's pad id, if it has one.
    pub pad: Option<u32>,
    /// The forward's dtype (the cache's too).
    pub compute_dtype: DType,
    /// The model's family ([`crate::family::Family::name`]; `qwen2` for a random size).
    pub family: &'static str,
    /// How the decoding programs emit the layers (`problem.layers`; unrolled by default).
    pub layers: Layers,
}

impl LoadedQwen2 {
    /// Random parameters `params` of a qwen2 `config` drawn from `key`: no positions
    /// limit, no EOS or pad ids, the layers unrolled.
    pub fn random(
        config: Qwen2Config,
        params: ParamTree,
        key: Key,
        compute_dtype: DType,
    ) -> LoadedQwen2 {
        LoadedQwen2 {
            config,
            params,
            key,
            max_positions: None,
            eos: Vec::new(),
            pad: None,
            compute_dtype,
            family: "qwen2",
            layers: Layers::Unrolled,
        }
    }

    /// The model as a decoder, bounded by the checkpoint's positions where it has them.
    pub fn decoder(&self, config: &DecodeConfig) -> Bounded<Qwen2> {
        let model = Qwen2::new(self.config.clone(), config.batch, config.prompt_len)
            .with_compute_dtype(self.compute_dtype)
            .with_layers(self.layers);
        Bounded {
            inner: model,
            max_positions: self.max_positions.unwrap_or(usize::MAX),
        }
    }

    /// A greedy [`DecodeConfig`] with the checkpoint's EOS ids and its pad id (else the
    /// first EOS id, as `generate` pads, else 0).
    pub fn decode_config(&self, batch: usize, prompt_len: usize, max_new: usize) -> DecodeConfig {
        DecodeConfig {
            eos: self.eos.clone(),
            pad: self.pad.or(self.eos.first().copied()).unwrap_or(0),
            ..DecodeConfig::greedy(batch, prompt_len, max_new)
        }
    }
}

impl PopulationDecoder {
    /// The population decoder of a loaded Qwen2 at generation 0 (its parameters and key);
    /// resume with [`PopulationDecoder::placed`] and `loaded.decoder(&config)`.
    pub fn from_qwen2(
        client: &Client,
        es: &ShardedES,
        loaded: &LoadedQwen2,
        config: DecodeConfig,
    ) -> Result<PopulationDecoder, Error> {
        let decoder = loaded.decoder(&config);
        Self::new(client, es, decoder, &loaded.params, loaded.key, config)
    }
}

fn checkpoint_error(e: crate::pretrained::ModelError) -> ProblemError {
    ProblemError::Input {
        setting: Setting::Checkpoint,
        message: format!("checkpoint: {e}"),
        fix: "point the checkpoint at a Hugging Face model directory (config.json, \
              generation_config.json and model.safetensors) or a .gguf file"
            .into(),
    }
}

/// Loads `weights` for decoding in `compute_dtype` with `key = key(seed)`: a checkpoint's
/// config, parameters and generation ids, or random parameters of any size
/// [`config_of_size`] reads (drawn from the key with std 0.02, no EOS).
pub fn load_qwen2(
    weights: &Qwen2Weights,
    compute_dtype: DType,
    seed: u64,
) -> Result<LoadedQwen2, ProblemError> {
    let key = run_key(seed)?;
    match weights {
        Qwen2Weights::Checkpoint(path) => {
            let (info, params) = crate::pretrained::load(path).map_err(checkpoint_error)?;
            Ok(LoadedQwen2 {
                config: info.config,
                params,
                key,
                max_positions: info.max_positions,
                eos: info.eos,
                pad: info.pad,
                compute_dtype,
                family: info.family,
                layers: Layers::Unrolled,
            })
        }
        Qwen2Weights::Random(size) => {
            let config = config_of_size(size)?;
            // Custom dimensions can ask for any size: refuse before drawing, as loss problems do.
            let shapes = config.param_shapes();
            let bytes = f32_bytes(shapes.iter().map(|(_, s)| s.as_slice()));
            memory::require(
                bytes,
                || {
                    format!(
                        "random qwen2 {} ({} layers, d {}, vocab {}) with its f32 parameters",
                        shardes_hlo::es::spec::excerpt(size),
                        config.num_hidden_layers,
                        config.hidden_size,
                        config.vocab_size
                    )
                },
                "the model (a smaller size)",
            )?;
            let params = config
                .init(key, 0.02)
                .map_err(ProblemError::host("initialising random qwen2 parameters"))?;
            Ok(LoadedQwen2::random(config, params, key, compute_dtype))
        }
    }
}
