//! The decode benchmark behind `shardes bench` on a decode config: tokens per second of
//! the ES decode (every member's perturbation, [`ShardedES::outputs_program`]) against a
//! plain batched greedy decode of the same `n × B` sequences through the unperturbed
//! weights (the same program with
//! [`PlainRows::Tiled`](crate::hlo::decode::PlainRows::Tiled), zero noise:
//! [`ShardedES::plain_outputs_program`]), timed side by side in one process.
//!
//! Each round times one call of each, interleaved (machine noise hits both alike), and,
//! to split the time, the same two programs compiled for one new token (prefill and the
//! first token alone). No EOS id is set, so every call generates `n × B × T` tokens.
//! Then, unless `gemm_size` is 0, the f32 GEMM peak of the same devices
//! ([`crate::bench::gemm_peak_gflops`]), the yardstick for the per-token step's FLOP rate.

use std::time::Instant;

use serde::Serialize;
use shardes_hlo::decode::{DecodeSpec, Decoder, PlainRows};
use shardes_hlo::es::{leaf_infos, Layout, ShardedES};
use shardes_hlo::params::ParamTree;
use shardes_hlo::prng::Key;
use shardes_runtime::{Client, Executable};

use super::{peak_rss_bytes, Stats};
use crate::decode::DecodeConfig;
use crate::Error;
use crate::{HostArray, OutputsRunner};

/// What a decode benchmark runs.
pub struct DecodeBenchInput<'a, D> {
    /// The client.
    pub client: &'a Client,
    /// The ES settings.
    pub es: &'a ShardedES,
    /// The model.
    pub decoder: D,
    /// Its parameters.
    pub params: &'a ParamTree,
    /// The ES key.
    pub key: Key,
    /// Rows, prompt slots, new tokens (EOS ids are ignored: every row runs to `T`).
    pub config: DecodeConfig,
    /// The prompt batch (`B` rows of token ids, each `1..=P` long).
    pub prompts: Vec<Vec<u32>>,
    /// Per-device size of the square f32 GEMM that measures the peak (0: skip).
    pub gemm_size: usize,
}

/// Timings of one program.
#[derive(Clone, Debug, Default, Serialize)]
pub struct DecodeTimes {
    /// Building and printing the program, ms.
    pub emit_ms: f64,
    /// XLA compile, ms.
    pub compile_ms: f64,
    /// One call (`n × B × T` tokens), ms.
    pub call_ms: Stats,
    /// The same program for one new token (prefill + first token), ms.
    pub prefill_ms: Stats,
    /// Generated tokens per second (median call).
    pub tokens_per_s: f64,
    /// One new token's step, ms: (median call − median prefill) / (T − 1); 0 when T = 1.
    pub step_ms: f64,
}

/// Everything the decode benchmark reports.
#[derive(Clone, Debug, Serialize)]
pub struct DecodeBenchReport {
    /// Strategy name.
    pub strategy: String,
    /// Population size.
    pub n: usize,
    /// Devices.
    pub devices: usize,
    /// Members per chunk.
    pub member_chunk: usize,
    /// Rows per member.
    pub batch: usize,
    /// Prompt slots.
    pub prompt_len: usize,
    /// New tokens per row.
    pub max_new: usize,
    /// Timed rounds.
    pub rounds: usize,
    /// Tokens one call generates (`n × B × T`).
    pub tokens_per_call: usize,
    /// The ES decode.
    pub es: DecodeTimes,
    /// The plain batched decode of the same sequences.
    pub plain: DecodeTimes,
    /// `plain.tokens_per_s / es.tokens_per_s` (the ES decode's slowdown; 1 is free).
    pub ratio: f64,
    /// The best f32 GEMM rate on the devices, GFLOP/s ([`super::gemm_peak_gflops`]);
    /// 0 when skipped.
    pub gemm_peak_gflops: f64,
    /// Peak resident memory of the process (`VmHWM`), bytes; 0 where unavailable.
    pub peak_rss_bytes: u64,
}

fn ms_since(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// A compiled outputs program over the runner's state.
struct Compiled {
    exe: Executable,
    layout: Layout,
    emit_ms: f64,
    compile_ms: f64,
}

impl Compiled {
    fn new<D: Decoder>(
        runner: &OutputsRunner,
        es: &ShardedES,
        spec: &DecodeSpec<D>,
        params: &ParamTree,
        perturbed: bool,
    ) -> Result<Compiled, Error> {
        let t0 = Instant::now();
        let leaves = leaf_infos(params);
        let program = if perturbed {
            es.outputs_program(spec, &leaves)?
        } else {
            es.plain_outputs_program(spec, &leaves)?
        };
        program.module.to_mlir();
        let emit_ms = ms_since(t0);
        let t1 = Instant::now();
        let exe = runner.compile(&program)?;
        Ok(Compiled {
            exe,
            layout: program.layout,
            emit_ms,
            compile_ms: ms_since(t1),
        })
    }

    /// One call, the tokens brought back (synchronises).
    fn run(&self, runner: &OutputsRunner, inputs: &[HostArray]) -> Result<f64, Error> {
        let t0 = Instant::now();
        runner.run(&self.exe, &self.layout, inputs)?;
        Ok(ms_since(t0))
    }
}

/// Runs the decode benchmark: `warmup` untimed rounds, then `rounds` timed ones.
pub fn run_decode<D: Decoder + Clone>(
    input: &DecodeBenchInput<'_, D>,
    warmup: usize,
    rounds: usize,
    progress: &mut dyn FnMut(&str, usize, usize),
) -> Result<DecodeBenchReport, Error> {
    let c = DecodeConfig {
        eos: Vec::new(),
        ..input.config.clone()
    };
    let full = c.spec(input.decoder.clone())?.with_plain(PlainRows::Tiled);
    let one = DecodeConfig {
        max_new: 1,
        ..c.clone()
    }
    .spec(input.decoder.clone())?
    .with_plain(PlainRows::Tiled);
    progress("compiling the ES decode", 0, 4);
    let runner =
        OutputsRunner::with_state(input.client, input.es, &full, input.params, input.key, 0)?;
    let es_full = Compiled::new(&runner, input.es, &full, input.params, true)?;
    progress("compiling the plain decode", 1, 4);
    let plain_full = Compiled::new(&runner, input.es, &full, input.params, false)?;
    progress("compiling the prefills", 2, 4);
    let es_one = Compiled::new(&runner, input.es, &one, input.params, true)?;
    let plain_one = Compiled::new(&runner, input.es, &one, input.params, false)?;
    let inputs = prompt_inputs(&c, &input.prompts)?;
    for w in 0..warmup {
        for p in [&es_full, &plain_full, &es_one, &plain_one] {
            p.run(&runner, &inputs)?;
        }
        progress("warm-up", w + 1, warmup);
    }
    let mut samples: [Vec<f64>; 4] = Default::default();
    for r in 0..rounds {
        for (p, s) in [&es_full, &plain_full, &es_one, &plain_one]
            .iter()
            .zip(samples.iter_mut())
        {
            s.push(p.run(&runner, &inputs)?);
        }
        progress("timing", r + 1, rounds);
    }
    let n = input.es.n();
    let tokens = n * c.batch * c.max_new;
    let times = |p: &Compiled, call: &[f64], prefill: &[f64]| {
        let call_ms = Stats::of(call);
        let prefill_ms = Stats::of(prefill);
        let step_ms = if c.max_new > 1 {
            (call_ms.median - prefill_ms.median) / (c.max_new - 1) as f64
        } else {
            0.0
        };
        DecodeTimes {
            emit_ms: p.emit_ms,
            compile_ms: p.compile_ms,
            tokens_per_s: if call_ms.median > 0.0 {
                tokens as f64 / (call_ms.median / 1e3)
            } else {
                0.0
            },
            call_ms,
            prefill_ms,
            step_ms,
        }
    };
    progress("GEMM peak", 0, 1);
    let gemm_peak_gflops = if input.gemm_size > 0 {
        super::gemm_peak_gflops(input.client, input.es.devices(), input.gemm_size, 5)?
    } else {
        0.0
    };
    let es = times(&es_full, &samples[0], &samples[2]);
    let plain = times(&plain_full, &samples[1], &samples[3]);
    let ratio = if es.tokens_per_s > 0.0 {
        plain.tokens_per_s / es.tokens_per_s
    } else {
        0.0
    };
    Ok(DecodeBenchReport {
        strategy: input.es.strategy().name(),
        n,
        devices: input.es.devices(),
        member_chunk: input
            .es
            .member_chunk_for(&shardes_hlo::es::AsModel(&full))?,
        batch: c.batch,
        prompt_len: c.prompt_len,
        max_new: c.max_new,
        rounds,
        tokens_per_call: tokens,
        es,
        plain,
        ratio,
        gemm_peak_gflops,
        peak_rss_bytes: peak_rss_bytes(),
    })
}

/// The prompts as the program's inputs (right-padded with the pad id).
fn prompt_inputs(c: &DecodeConfig, prompts: &[Vec<u32>]) -> Result<Vec<HostArray>, Error> {
    if prompts.len() != c.batch
        || prompts
            .iter()
            .any(|p| p.is_empty() || p.len() > c.prompt_len)
    {
        return Err(Error::Invalid(format!(
            "the decode benchmark takes batch = {} prompts of 1 to prompt_len = {} tokens",
            c.batch, c.prompt_len
        )));
    }
    let mut ids = vec![c.pad as i32; c.batch * c.prompt_len];
    let mut lens = Vec::with_capacity(c.batch);
    for (j, p) in prompts.iter().enumerate() {
        for (k, &t) in p.iter().enumerate() {
            // Token ids are below the vocabulary size, which fits i32.
            ids[j * c.prompt_len + k] = t as i32;
        }
        lens.push(p.len() as i32);
    }
    Ok(vec![
        HostArray::i32(&[c.batch, c.prompt_len], ids),
        HostArray::i32(&[c.batch], lens),
    ])
}
