//! The benchmark engine behind `shardes bench`: generation time against the inference
//! limit, FLOP rate against the measured GEMM peak, host overhead and peak memory.
//!
//! Everything is measured in one process and interleaved: each round times one
//! generation of every variant (e.g. `how = A` and `how = B`) and one inference dispatch,
//! so machine noise (other processes, frequency changes) hits all of them alike. Each
//! timed dispatch ends with the fitness copied to the host, which also synchronises.
//!
//! FLOPs are counted analytically by the model ([`TransformerBlock::generation_flops`]): the
//! optimized HLO the runtime exposes carries shapes but no operands or loop trip counts,
//! so counting its dots would need both. The count is the work the algorithm must do:
//! base products shared by the population once per device (each device needs them for
//! its members; XLA hoists them out of the member-chunk loop, so that is also what the
//! program does), per-member work once per member, the update contraction once (not the
//! `how = A` duplicates).

use std::time::Instant;

use serde::Serialize;
use shardes_hlo::builder::{DotDims, Mesh, Module, Sharding, TensorType};
use shardes_hlo::es::{leaf_infos, EsError, Layout, LeafInfo, Model, Noise, Program, ShardedES};
use shardes_hlo::params::{Array, ParamTree};
use shardes_hlo::prng::emit::Keys;
use shardes_hlo::prng::Key;
use shardes_hlo::problems::transformer_block::TransformerBlock;
use shardes_runtime::{gather_rows, Buffer, Client, CompileOptions, Executable};

use crate::population::{CompileWhen, Place, Start};
use crate::state::DeviceState;
use crate::{Error, SplitTrainer, Trainer};

/// The decode benchmark: ES decode against a plain batched decode.
pub mod decode;

/// What to measure and how long.
#[derive(Clone, Debug)]
pub struct BenchOptions {
    /// Untimed dispatches of every program before timing.
    pub warmup: usize,
    /// Timed rounds (each: one generation per variant, one inference). At least 10 for
    /// a median worth reporting; fewer is allowed for smoke tests.
    pub rounds: usize,
    /// Generations per dispatch of the generation program (1: one per dispatch).
    pub generations_per_dispatch: usize,
    /// Dispatches of the no-op program for the host overhead.
    pub overhead_dispatches: usize,
    /// Per-device `m = k = n` of the peak GEMM (0 skips the peak measurement).
    pub gemm_size: usize,
}

impl Default for BenchOptions {
    fn default() -> Self {
        BenchOptions {
            warmup: 2,
            rounds: 10,
            generations_per_dispatch: 1,
            overhead_dispatches: 200,
            gemm_size: 512,
        }
    }
}

/// FLOPs of one generation and one inference pass, counted analytically.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Flops {
    /// Useful FLOPs of one generation (evaluation + update).
    pub generation: f64,
    /// FLOPs of one inference pass (every member through the base parameters).
    pub inference: f64,
}

/// The noise rank a strategy emits for 2-D leaves: `Some(r)` for low-rank factors,
/// `None` for dense (full-rank) noise.
pub fn noise_rank(es: &ShardedES) -> Result<Option<usize>, Error> {
    let f = shardes_hlo::builder::Func::new("probe");
    let keys = Keys::constant(&f, Key::from_data([0, 0]))?;
    let dirs = f.iota(TensorType::u32(&[1]), 0)?;
    let leaf = shardes_hlo::es::LeafInfo {
        index: 0,
        path: "probe".into(),
        shape: vec![4, 4],
    };
    Ok(match es.strategy().noise(&keys, &leaf, &dirs)? {
        Noise::Factors { a, .. } => Some(a.shape()[1] as usize),
        Noise::Dense(_) => None,
    })
}

impl Flops {
    /// The transformer block's counts:
    /// [`TransformerBlock::generation_flops`] and [`TransformerBlock::inference_flops`] for
    /// `es`'s population, pairing and devices.
    pub fn transformer_block(
        tb: &TransformerBlock,
        es: &ShardedES,
        rank: Option<usize>,
    ) -> Result<Flops, Error> {
        Ok(Flops {
            generation: tb.generation_flops(es.n(), es.strategy().pairing(), es.devices(), rank),
            inference: tb.inference_flops(es.n()),
        })
    }
}

/// Median and spread of a series of timings, milliseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Stats {
    /// Median.
    pub median: f64,
    /// Fastest.
    pub min: f64,
    /// Slowest.
    pub max: f64,
    /// Samples.
    pub samples: usize,
}

impl Stats {
    /// Summarises samples (empty: all zero).
    pub fn of(samples: &[f64]) -> Stats {
        if samples.is_empty() {
            return Stats::default();
        }
        let mut v = samples.to_vec();
        v.sort_by(f64::total_cmp);
        let m = v.len();
        let median = if m % 2 == 1 {
            v[m / 2]
        } else {
            0.5 * (v[m / 2 - 1] + v[m / 2])
        };
        Stats {
            median,
            min: v[0],
            max: v[m - 1],
            samples: m,
        }
    }

    /// `(max − min) / median`, the relative spread.
    pub fn spread(&self) -> f64 {
        if self.median > 0.0 {
            (self.max - self.min) / self.median
        } else {
            0.0
        }
    }
}

/// One variant's measurements (one `how`).
#[derive(Clone, Debug, Serialize)]
pub struct VariantReport {
    /// `A` or `B`.
    pub how: String,
    /// Building and printing the generation program, ms.
    pub emit_ms: f64,
    /// XLA compile of the generation program, ms.
    pub compile_ms: f64,
    /// Generations per dispatch.
    pub generations_per_dispatch: usize,
    /// Milliseconds per generation (a dispatch's time divided by its generations).
    pub generation_ms: Stats,
    /// `generation_ms.median / inference_ms.median`.
    pub ratio_to_inference: f64,
    /// Useful GFLOP/s of the generation (median time).
    pub gflops: f64,
    /// `gflops / gemm_peak_gflops`.
    pub peak_fraction: f64,
    /// The executable's per-device scratch memory (plugin statistics), bytes.
    pub temp_bytes: i64,
}

/// Everything `shardes bench` reports for one configuration.
#[derive(Clone, Debug, Serialize)]
pub struct BenchReport {
    /// Population size.
    pub n: usize,
    /// Devices on the `"pop"` axis.
    pub devices: usize,
    /// Members per evaluation chunk on each device.
    pub member_chunk: usize,
    /// Strategy name.
    pub strategy: String,
    /// Timed rounds.
    pub rounds: usize,
    /// One entry per `how`.
    pub variants: Vec<VariantReport>,
    /// Emission of the inference program, ms.
    pub inference_emit_ms: f64,
    /// Compile of the inference program, ms.
    pub inference_compile_ms: f64,
    /// Milliseconds per inference pass.
    pub inference_ms: Stats,
    /// Milliseconds of `ask + apply` alone: the generation without `tell` and the update,
    /// so a generation's time minus this is what `tell` costs.
    pub apply_ms: Stats,
    /// GFLOP/s of the inference pass.
    pub inference_gflops: f64,
    /// FLOP counts (analytic).
    pub flops: Flops,
    /// The best f32 GEMM rate measured through the same plugin on the same devices.
    pub gemm_peak_gflops: f64,
    /// Host overhead per dispatch (a no-op program with the generation's arguments), ms.
    pub host_overhead_ms: Stats,
    /// Peak resident memory of the process (`VmHWM`), bytes; 0 where unavailable.
    pub peak_rss_bytes: u64,
}

/// The inputs of a benchmark: one model, its parameters and batch, one ES per variant.
pub struct BenchInput<'a> {
    /// The client (with at least `devices` devices).
    pub client: &'a Client,
    /// The ES settings, one per variant (they must agree on everything but `how`).
    pub variants: Vec<&'a ShardedES>,
    /// The model.
    pub model: &'a dyn Model,
    /// Initial parameters.
    pub params: &'a ParamTree,
    /// The ES key.
    pub key: Key,
    /// The batch arrays.
    pub batch: &'a [Array],
    /// FLOP counts, if known.
    pub flops: Option<Flops>,
}

pub use crate::process::peak_rss_bytes;

fn ms_since(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// A compiled program with replicated, non-donated inputs, dispatched repeatedly.
struct Fixed {
    exe: Executable,
    /// The inputs on the devices, in the program's layout.
    state: DeviceState,
}

impl Fixed {
    /// One dispatch; copies the fitness of every device to the host (synchronises).
    fn run(&self) -> Result<(), Error> {
        let layout = &self.state.layout;
        let out = layout.fitness_result().ok_or_else(|| {
            Error::Invalid(format!(
                "the {} program returns no fitness",
                layout.kind.name()
            ))
        })?;
        let args = (0..self.state.devices())
            .map(|d| self.state.args_for(layout, d, None))
            .collect::<Result<Vec<_>, Error>>()?;
        let mut outs = self.exe.execute(&args)?;
        let shards: Vec<Buffer> = outs.iter_mut().map(|o| o.swap_remove(out)).collect();
        gather_rows::<f32>(&shards)?;
        Ok(())
    }
}

/// The inference program (zero noise, same chunking and sharding) with its inputs; returns
/// it with its emission and compile times (ms).
fn inference(input: &BenchInput, es: &ShardedES) -> Result<(Fixed, f64, f64), Error> {
    let (exe, layout, emit, compile) = compiled(input, es, |leaves| {
        es.inference_program(input.model, leaves)
    })?;
    let state = DeviceState::upload(
        input.client,
        es.devices(),
        layout,
        input.params,
        input.key,
        input.batch,
        0,
    )?;
    Ok((Fixed { exe, state }, emit, compile))
}

/// Builds, emits and compiles a program: the executable, its layout, and the emission and
/// compile times (ms).
fn compiled(
    input: &BenchInput,
    es: &ShardedES,
    build: impl FnOnce(&[LeafInfo]) -> Result<Program, EsError>,
) -> Result<(Executable, Layout, f64, f64), Error> {
    let t0 = Instant::now();
    let program = build(&leaf_infos(input.params))?;
    let mlir = program.module.to_mlir();
    let emit = ms_since(t0);
    let t1 = Instant::now();
    let exe = input
        .client
        .compile(&mlir, &CompileOptions::new(es.devices()))?;
    Ok((exe, program.layout, emit, ms_since(t1)))
}

/// The best f32 GEMM rate (GFLOP/s) over `reps` dispatches of a per-device
/// `[m, m] · [m, m]` on every device of the mesh at once.
pub fn gemm_peak_gflops(
    client: &Client,
    devices: usize,
    m: usize,
    reps: usize,
) -> Result<f64, Error> {
    let mi = m as i64;
    let dn = devices as i64;
    let mut module = Module::with_mesh("gemm_peak", Mesh::pop(dn)?);
    let f = module.func("main");
    let a = f.arg_sharded(
        "a",
        TensorType::f32(&[dn * mi, mi]),
        &Sharding::split(2, 0)?,
    )?;
    let b = f.arg_sharded("b", TensorType::f32(&[mi, mi]), &Sharding::replicated(2))?;
    let out = f.manual_computation(
        &[&a, &b],
        &[Sharding::split(2, 0)?, Sharding::replicated(2)],
        &[Sharding::split(1, 0)?],
        |loc| {
            let dims = DotDims {
                lhs_batch: vec![],
                rhs_batch: vec![],
                lhs_contract: vec![1],
                rhs_contract: vec![0],
            };
            // Reduced on the device so only one float per device comes back.
            let y = loc[0].dot_general(&loc[1], &dims)?.reduce_sum(&[0, 1])?;
            Ok::<_, shardes_hlo::builder::HloError>(vec![y.reshape(&[1])?])
        },
    )?;
    f.output_sharded(&out[0], &Sharding::split(1, 0)?)?;
    module.add(f.finish()?)?;
    let exe = client.compile(&module.to_mlir(), &CompileOptions::new(devices))?;
    let av: Vec<f32> = (0..devices * m * m)
        .map(|i| ((i % 7) as f32) * 0.1)
        .collect();
    let bv: Vec<f32> = (0..m * m).map(|i| ((i % 5) as f32) * 0.1).collect();
    let a_shards = client.scatter_rows(&av, &[devices * m, m])?;
    let b_rep = client.replicate(&bv, &[m, m])?;
    let mut args: Vec<Vec<Buffer>> = Vec::new();
    for (x, y) in a_shards.into_iter().zip(b_rep) {
        args.push(vec![x, y]);
    }
    let run = || -> Result<(), Error> {
        let refs: Vec<Vec<&Buffer>> = args.iter().map(|a| a.iter().collect()).collect();
        let mut outs = exe.execute(&refs)?;
        let shards: Vec<Buffer> = outs.iter_mut().map(|o| o.swap_remove(0)).collect();
        gather_rows::<f32>(&shards)?;
        Ok(())
    };
    run()?;
    let flops = 2.0 * (m as f64).powi(3) * devices as f64;
    let mut best = 0.0f64;
    for _ in 0..reps.max(1) {
        let t = Instant::now();
        run()?;
        best = best.max(flops / t.elapsed().as_secs_f64() / 1e9);
    }
    Ok(best)
}

/// Host overhead: a program with the generation's arguments, donation and results that
/// does no work ([`ShardedES::noop_program`]), dispatched back to back on a device state
/// like the trainer's; the time per dispatch is what the host and the runtime cost.
fn host_overhead(input: &BenchInput, es: &ShardedES, dispatches: usize) -> Result<Stats, Error> {
    let (exe, layout, _, _) = compiled(input, es, |leaves| es.noop_program(input.model, leaves))?;
    let mut state = DeviceState::upload(
        input.client,
        es.devices(),
        layout.clone(),
        input.params,
        input.key,
        input.batch,
        0,
    )?;
    let mut samples = Vec::new();
    // Timed in blocks so that one sample is not a single sub-millisecond call.
    let block = 10usize;
    for round in 0..(dispatches / block).max(1) + 1 {
        let t = Instant::now();
        for _ in 0..block {
            let args = (0..state.devices())
                .map(|d| state.args_for(&layout, d, None))
                .collect::<Result<Vec<_>, Error>>()?;
            let outs = exe.execute(&args)?;
            drop(args);
            state.absorb_for(&layout, outs, 1)?;
        }
        // One scalar read synchronises the block.
        state.sync()?;
        if round > 0 {
            samples.push(ms_since(t) / block as f64);
        }
    }
    Ok(Stats::of(&samples))
}

/// Runs the benchmark. `progress(stage, done, total)` is called as it goes.
pub fn run(
    input: &BenchInput,
    options: &BenchOptions,
    progress: &mut dyn FnMut(&str, usize, usize),
) -> Result<BenchReport, Error> {
    let first = *input
        .variants
        .first()
        .ok_or_else(|| Error::Invalid("no ES variant to benchmark; pass at least one".into()))?;
    let devices = first.devices();
    let k = options.generations_per_dispatch.max(1);
    // Every variant's state and the `ask + apply` timing's start where the run would.
    let start = Start {
        key: input.key,
        batch: input.batch,
        generation: 0,
    };
    let mut trainers = Vec::new();
    let mut variants = Vec::new();
    for es in &input.variants {
        progress(&format!("compiling generation (how {})", es.how()), 0, 1);
        let t = Trainer::with_generations_per_dispatch(
            input.client,
            es,
            input.model,
            input.params,
            start,
            k,
        )?;
        let times = t.build_times();
        let temp = t
            .executable()
            .compiled_memory_stats()
            .map(|m| m.temp_size_in_bytes)
            .unwrap_or(0);
        variants.push(VariantReport {
            how: es.how().to_string(),
            emit_ms: times.emit_ms,
            compile_ms: times.compile_ms,
            generations_per_dispatch: k,
            generation_ms: Stats::default(),
            ratio_to_inference: 0.0,
            gflops: 0.0,
            peak_fraction: 0.0,
            temp_bytes: temp,
        });
        trainers.push(t);
    }
    progress("compiling inference", 0, 1);
    let (inf, inference_emit_ms, inference_compile_ms) = inference(input, first)?;
    progress("compiling ask + apply", 0, 1);
    // `ask + apply` alone (the generation without `tell` and the update): the split
    // population's program on the same state, evaluated and never told, so its tell is
    // never compiled.
    let (place, when) = (Place::Alone, CompileWhen::FirstUse);
    let apply = SplitTrainer::placed(
        input.client,
        first,
        input.model,
        input.params,
        start,
        place,
        when,
    )?;
    progress("warm-up", 0, options.warmup);
    for w in 0..options.warmup {
        for t in &mut trainers {
            t.step()?;
        }
        inf.run()?;
        apply.evaluate()?;
        progress("warm-up", w + 1, options.warmup);
    }
    let mut gen_samples: Vec<Vec<f64>> = vec![Vec::new(); trainers.len()];
    let mut inf_samples = Vec::new();
    let mut apply_samples = Vec::new();
    for r in 0..options.rounds {
        for (t, s) in trainers.iter_mut().zip(&mut gen_samples) {
            let t0 = Instant::now();
            t.step()?;
            s.push(ms_since(t0) / k as f64);
        }
        let t0 = Instant::now();
        inf.run()?;
        inf_samples.push(ms_since(t0));
        let t0 = Instant::now();
        apply.evaluate()?;
        apply_samples.push(ms_since(t0));
        progress("timing", r + 1, options.rounds);
    }
    drop(trainers);
    progress("GEMM peak", 0, 1);
    let gemm_peak = if options.gemm_size > 0 {
        gemm_peak_gflops(input.client, devices, options.gemm_size, 5)?
    } else {
        0.0
    };
    progress("host overhead", 0, 1);
    let overhead = host_overhead(input, first, options.overhead_dispatches)?;
    let inference_ms = Stats::of(&inf_samples);
    let flops = input.flops.unwrap_or_default();
    let rate = |f: f64, ms: f64| if ms > 0.0 { f / ms / 1e6 } else { 0.0 };
    for (v, s) in variants.iter_mut().zip(&gen_samples) {
        v.generation_ms = Stats::of(s);
        v.ratio_to_inference = if inference_ms.median > 0.0 {
            v.generation_ms.median / inference_ms.median
        } else {
            0.0
        };
        v.gflops = rate(flops.generation, v.generation_ms.median);
        v.peak_fraction = if gemm_peak > 0.0 {
            v.gflops / gemm_peak
        } else {
            0.0
        };
    }
    Ok(BenchReport {
        n: first.n(),
        devices,
        member_chunk: first.member_chunk()?,
        strategy: first.strategy().name(),
        rounds: options.rounds,
        variants,
        inference_emit_ms,
        inference_compile_ms,
        inference_gflops: rate(flops.inference, inference_ms.median),
        inference_ms,
        apply_ms: Stats::of(&apply_samples),
        flops,
        gemm_peak_gflops: gemm_peak,
        host_overhead_ms: overhead,
        peak_rss_bytes: peak_rss_bytes(),
    })
}
