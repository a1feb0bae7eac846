//! Decoding a prompt batch under every member's perturbation, with the rewards on the host:
//! [`PopulationDecoder`].
//!
//! A [`Population`] whose evaluator is [`Decode`], built on the outputs program with a
//! [`DecodeSpec`] (see [`shardes_hlo::decode`] for what
//! the program computes): [`PopulationDecoder::decode`] pads the prompts to the compiled
//! batch (`B` rows right-padded to `P`), uploads only them, and returns each member's
//! completions trimmed to their lengths; [`PopulationDecoder::tell`] takes the host fitness;
//! [`PopulationDecoder::decode_plain`] decodes the unperturbed parameters greedily (held-out
//! evaluation). The parameters never leave the devices. As one process of a run across
//! processes ([`PopulationDecoder::placed`] with a group) it decodes that process's members and
//! places the update across processes ([`PopulationDecoder::tell_in`]).
//!
//! Completions: a row that emits an EOS id ends there, the EOS token included in its
//! completion (and [`Decoded::ended`] set); otherwise it has `max_new` tokens.

#[cfg(feature = "models")]
mod source;

#[cfg(feature = "models")]
pub use source::{load_qwen2, LoadedQwen2};

pub use shardes_hlo::decode::{Bounded, DecodeShape, DecodeSpec, Decoder, PlainRows, Sampling};

use std::sync::OnceLock;

use shardes_hlo::es::strategy::LowRank;
use shardes_hlo::es::{leaf_infos, Program, ShardedES, WithTasks};
use shardes_hlo::params::ParamTree;
use shardes_hlo::prng::Key;
use shardes_runtime::{Client, Executable};
use thiserror::Error;

use crate::population::outputs::{compile_over, run};
use crate::population::{CompileWhen, Core, HostArray, Outputs, Place, PopulationError};
use crate::{Error, OutputsRunner, Population};

/// The population decoding prompts under its members' perturbations, state on the devices.
pub type PopulationDecoder = Population<Decode>;

/// What a [`PopulationDecoder`] decodes.
#[derive(Clone, Debug, PartialEq)]
pub struct DecodeConfig {
    /// Prompts per call (`B`, the compiled rows).
    pub batch: usize,
    /// The longest prompt (`P`, the compiled prompt slots).
    pub prompt_len: usize,
    /// New tokens per prompt (`T`).
    pub max_new: usize,
    /// Ids that end a completion (from the checkpoint's `generation_config.json`).
    pub eos: Vec<u32>,
    /// The id padding prompts and ended rows on the device (never in a completion).
    pub pad: u32,
    /// Greedy or sampled (with the members' sampling keys).
    pub sampling: Sampling,
    /// Fitness columns per member that [`PopulationDecoder::tell`] takes: 1, or one per
    /// prompt (`batch`) for `group_relative` shaping.
    pub groups: usize,
    /// Rows of the evaluation program ([`PopulationDecoder::decode_plain`]); `None`: `batch`.
    /// Held-out sets are larger than a generation's prompts, and a greedy decode of the
    /// unperturbed weights reads every weight once per token whatever its rows: more rows
    /// per call is the evaluation's throughput ([`DecodeConfig::eval_rows_for`]).
    pub eval_batch: Option<usize>,
}

impl DecodeConfig {
    /// A greedy decode of `batch` prompts of at most `prompt_len` tokens, `max_new` new
    /// tokens each, no EOS, pad id 0.
    pub fn greedy(batch: usize, prompt_len: usize, max_new: usize) -> DecodeConfig {
        DecodeConfig {
            batch,
            prompt_len,
            max_new,
            eos: Vec::new(),
            pad: 0,
            sampling: Sampling::Greedy,
            groups: 1,
            eval_batch: None,
        }
    }

    /// The rows an evaluation of `count` prompts should compile for: every prompt in one
    /// call while one call's memory (`bytes_of(rows)`, e.g. the decoder's
    /// [`Decoder::member_bytes`] at those rows) stays within [`shardes_hlo::es::BATCH_BYTES`],
    /// else the fewest equal calls that fit (at least one row).
    pub fn eval_rows_for(count: usize, bytes_of: impl Fn(usize) -> Option<usize>) -> usize {
        let count = count.max(1);
        let fits = |rows: usize| bytes_of(rows).is_none_or(|b| b <= shardes_hlo::es::BATCH_BYTES);
        let calls = (1..=count)
            .find(|&calls| fits(count.div_ceil(calls)))
            .unwrap_or(count);
        count.div_ceil(calls)
    }

    /// The evaluation program's config: greedy, [`DecodeConfig::eval_batch`] rows.
    pub fn evaluation(&self) -> DecodeConfig {
        DecodeConfig {
            batch: self.eval_batch.unwrap_or(self.batch),
            sampling: Sampling::Greedy,
            groups: 1,
            ..self.clone()
        }
    }

    /// The shape the programs are compiled for.
    pub fn shape(&self) -> DecodeShape {
        DecodeShape {
            batch: self.batch,
            prompt_len: self.prompt_len,
            max_new: self.max_new,
        }
    }

    /// The decode spec of `decoder` for this config, rows shared in the plain program.
    pub fn spec<D: Decoder>(&self, decoder: D) -> Result<DecodeSpec<D>, Error> {
        Ok(
            DecodeSpec::new(decoder, self.shape(), self.eos.clone(), self.pad)?
                .with_sampling(self.sampling)?,
        )
    }
}

/// A prompt batch the decoder cannot take.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DecodeError {
    /// More prompts than compiled rows.
    #[error(
        "{got} prompts were given but the decoder was compiled for batch = {batch}; pass at \
         most {batch} prompts per call or raise batch"
    )]
    TooManyPrompts {
        /// Prompts given.
        got: usize,
        /// Compiled rows.
        batch: usize,
    },
    /// A prompt without tokens.
    #[error("prompt {index} is empty; every prompt needs at least one token")]
    EmptyPrompt {
        /// Its position in the call.
        index: usize,
    },
    /// A prompt longer than the compiled prompt slots.
    #[error(
        "prompt {index} has {len} tokens but the decoder was compiled for prompts of at most \
         prompt_len = {prompt_len}; raise prompt_len (prompt_len + max_new must stay within \
         the model's positions) or shorten the prompt"
    )]
    PromptTooLong {
        /// Its position in the call.
        index: usize,
        /// Its tokens.
        len: usize,
        /// The compiled prompt slots.
        prompt_len: usize,
    },
    /// A token id outside the vocabulary.
    #[error("prompt {index} holds token id {token}, outside the vocabulary of {vocab} tokens")]
    TokenOutOfVocab {
        /// Its position in the call.
        index: usize,
        /// The id.
        token: u32,
        /// The vocabulary size.
        vocab: usize,
    },
}

/// What one [`PopulationDecoder::decode`] call produced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decoded {
    /// `tokens[i][j]`: member `i`'s completion of prompt `j` (EOS included when one ended it).
    pub tokens: Vec<Vec<Vec<u32>>>,
    /// `ended[i][j]`: whether that completion ended with an EOS id.
    pub ended: Vec<Vec<bool>>,
    /// Tokens generated in all (the completions' total length).
    pub generated: usize,
}

/// The decode programs of a population: each member's perturbed decode
/// ([`Population::decode`]) and the unperturbed parameters' greedy decode for evaluation
/// ([`Population::decode_plain`], compiled on its first call).
pub struct Decode {
    outputs: Outputs,
    config: DecodeConfig,
    vocab: usize,
    /// The evaluation program, compiled on the first [`Population::decode_plain`].
    plain_program: Program,
    plain: OnceLock<Executable>,
}

impl Population<Decode> {
    /// Compiles the decode and tell programs of `decoder` for `config` (the evaluation
    /// program on the first [`Population::decode_plain`]) and uploads the state at
    /// generation 0.
    pub fn new<D: Decoder + Clone>(
        client: &Client,
        es: &ShardedES,
        decoder: D,
        params: &ParamTree,
        key: Key,
        config: DecodeConfig,
    ) -> Result<PopulationDecoder, Error> {
        let (place, when) = (Place::Alone, CompileWhen::Now);
        Self::placed(client, es, decoder, params, key, 0, config, place, when)
    }

    /// A decoder for evaluation only: greedy completions of `params`
    /// ([`Population::decode_plain`]), the same batch on each of `devices` devices.
    /// Only the evaluation program is compiled (on the first call); the perturbed decode
    /// and the tell of its one-member-per-device population are compiled only if used.
    pub fn for_evaluation<D: Decoder + Clone>(
        client: &Client,
        devices: usize,
        decoder: D,
        params: &ParamTree,
        key: Key,
        config: DecodeConfig,
    ) -> Result<PopulationDecoder, Error> {
        let es = ShardedES::new(Box::new(LowRank { r: 1 }), devices, 1.0, 0.0, devices)?;
        let (place, when) = (Place::Alone, CompileWhen::FirstUse);
        Self::placed(client, &es, decoder, params, key, 0, config, place, when)
    }

    /// The decoder of `decoder` placed by `place` (its programs compiled `when` asked; in
    /// a group, now), with the evaluation program for its devices.
    #[allow(clippy::too_many_arguments)]
    pub fn placed<D: Decoder + Clone>(
        client: &Client,
        es: &ShardedES,
        decoder: D,
        params: &ParamTree,
        key: Key,
        generation: u32,
        config: DecodeConfig,
        place: Place<'_>,
        when: CompileWhen,
    ) -> Result<PopulationDecoder, Error> {
        let spec = config.spec(decoder.clone())?;
        let grouped = WithTasks(&spec, config.groups);
        let outputs =
            OutputsRunner::placed(client, es, &grouped, params, key, generation, place, when)?;
        let vocab = usize::try_from(decoder.vocab()).unwrap_or(0);
        // Evaluation: the unperturbed parameters, one member per device, greedy.
        let devices = outputs.devices();
        let eval_es = ShardedES::new(
            Box::new(LowRank { r: 1 }),
            devices,
            es.sigma(),
            es.lr(),
            devices,
        )?;
        let eval = config.evaluation().spec(decoder)?;
        let plain_program = eval_es.plain_outputs_program(&eval, &leaf_infos(params))?;
        let (core, outputs) = outputs.into_parts();
        let decode = Decode {
            outputs,
            config,
            vocab,
            plain_program,
            plain: OnceLock::new(),
        };
        Ok(Population::from_parts(core, decode))
    }

    /// Every member's completions of `prompts` (at most `batch`, each of 1 to `prompt_len`
    /// tokens, refused otherwise with a [`DecodeError`]): the members of
    /// [`Population::members`], in order.
    pub fn decode(&self, prompts: &[Vec<u32>]) -> Result<Decoded, Error> {
        self.evaluator().decode(self.core(), prompts)
    }

    /// The unperturbed parameters' greedy completions of `prompts` (for evaluation; at most
    /// [`DecodeConfig::eval_batch`] of them), one per prompt, trimmed like
    /// [`Population::decode`]'s. The first call compiles the evaluation program.
    pub fn decode_plain(&self, prompts: &[Vec<u32>]) -> Result<Vec<Vec<u32>>, Error> {
        self.evaluator().decode_plain(self.core(), prompts)
    }

    /// The decode program's raw outputs for `inputs` (the padded `[batch, prompt_len]`
    /// ids and `[batch]` lengths): tokens `[members × batch, max_new]` and lengths.
    pub fn raw_outputs(&self, inputs: &[HostArray]) -> Result<Vec<HostArray>, Error> {
        self.evaluator().outputs.outputs(self.core(), inputs)
    }

    /// What this decoder was compiled for.
    pub fn config(&self) -> &DecodeConfig {
        &self.evaluator().config
    }
}

impl Decode {
    /// What this decoder was compiled for.
    pub fn config(&self) -> &DecodeConfig {
        &self.config
    }

    /// See [`Population::decode`].
    pub(crate) fn decode(&self, core: &Core, prompts: &[Vec<u32>]) -> Result<Decoded, Error> {
        let inputs = self.inputs(&self.config, prompts)?;
        let out = self.outputs.outputs(core, &inputs)?;
        Self::completions(&self.config, &out, core.members().len(), prompts.len())
    }

    /// See [`Population::decode_plain`].
    pub(crate) fn decode_plain(
        &self,
        core: &Core,
        prompts: &[Vec<u32>],
    ) -> Result<Vec<Vec<u32>>, Error> {
        let eval = self.config.evaluation();
        let inputs = self.inputs(&eval, prompts)?;
        let exe = match self.plain.get() {
            Some(exe) => exe,
            None => {
                let exe = compile_over(core, self.outputs.layout(), &self.plain_program)?;
                self.plain.get_or_init(|| exe)
            }
        };
        let out = run(core, exe, &self.plain_program.layout, &inputs)?;
        let mut d = Self::completions(&eval, &out, 1, prompts.len())?;
        Ok(d.tokens.swap_remove(0))
    }

    /// The compiled batch as program inputs: prompts right-padded with the pad id, rows
    /// past the last prompt one pad token long.
    fn inputs(&self, c: &DecodeConfig, prompts: &[Vec<u32>]) -> Result<Vec<HostArray>, Error> {
        if prompts.len() > c.batch {
            return Err(DecodeError::TooManyPrompts {
                got: prompts.len(),
                batch: c.batch,
            }
            .into());
        }
        let mut ids = vec![c.pad as i32; c.batch * c.prompt_len];
        let mut lens = vec![1i32; c.batch];
        for (index, p) in prompts.iter().enumerate() {
            if p.is_empty() {
                return Err(DecodeError::EmptyPrompt { index }.into());
            }
            if p.len() > c.prompt_len {
                return Err(DecodeError::PromptTooLong {
                    index,
                    len: p.len(),
                    prompt_len: c.prompt_len,
                }
                .into());
            }
            if let Some(&token) = p.iter().find(|&&t| t as usize >= self.vocab) {
                return Err(DecodeError::TokenOutOfVocab {
                    index,
                    token,
                    vocab: self.vocab,
                }
                .into());
            }
            for (slot, &t) in ids[index * c.prompt_len..].iter_mut().zip(p) {
                // Below the vocabulary size, which fits i32 (the program's ids).
                *slot = t as i32;
            }
            lens[index] = p.len() as i32;
        }
        Ok(vec![
            HostArray::i32(&[c.batch, c.prompt_len], ids),
            HostArray::i32(&[c.batch], lens),
        ])
    }

    /// The first `prompts` rows of each of `members` members' outputs as completions.
    fn completions(
        c: &DecodeConfig,
        out: &[HostArray],
        members: usize,
        prompts: usize,
    ) -> Result<Decoded, Error> {
        let (Some(tokens), Some(lengths)) = (out[0].as_i32(), out[1].as_i32()) else {
            return Err(PopulationError::MissingResult("the decode program", "i32 tokens").into());
        };
        let mut decoded = Decoded {
            tokens: Vec::with_capacity(members),
            ended: Vec::with_capacity(members),
            generated: 0,
        };
        for i in 0..members {
            let mut rows = Vec::with_capacity(prompts);
            let mut ended = Vec::with_capacity(prompts);
            for j in 0..prompts {
                let row = i * c.batch + j;
                let len = (lengths[row].max(0) as usize).min(c.max_new);
                let seq: Vec<u32> = tokens[row * c.max_new..row * c.max_new + len]
                    .iter()
                    .map(|&t| t as u32)
                    .collect();
                ended.push(seq.last().is_some_and(|t| c.eos.contains(t)));
                decoded.generated += len;
                rows.push(seq);
            }
            decoded.tokens.push(rows);
            decoded.ended.push(ended);
        }
        Ok(decoded)
    }
}

#[cfg(test)]
mod tests {
    use super::DecodeConfig;

    #[test]
    fn an_evaluation_takes_every_prompt_in_one_call_while_it_fits() {
        let gib = 1usize << 30;
        // Unknown size: one call.
        assert_eq!(DecodeConfig::eval_rows_for(128, |_| None), 128);
        // 1 MiB a row: 128 rows fit 4 GiB.
        assert_eq!(DecodeConfig::eval_rows_for(128, |r| Some(r << 20)), 128);
        // 64 MiB a row: 64 rows fit, so two equal calls of 64.
        assert_eq!(DecodeConfig::eval_rows_for(128, |r| Some(r << 26)), 64);
        // 5 GiB a row: even one row is over, so one row a call.
        assert_eq!(DecodeConfig::eval_rows_for(3, |r| Some(r * 5 * gib)), 1);
        // 100 prompts at 50 MiB a row: 81 rows fit, so 2 calls of 50.
        assert_eq!(
            DecodeConfig::eval_rows_for(100, |r| Some((r * 50) << 20)),
            50
        );
        assert_eq!(DecodeConfig::eval_rows_for(0, |_| None), 1);
    }
}
