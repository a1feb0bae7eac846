//! The device-resident run loop: compile the generation once, keep the state on the
//! devices, step.
//!
//! Parameters, key and generation live in device buffers between generations; each step
//! donates the parameters and the generation to the program and takes its outputs as the
//! new state, so nothing parameter-sized crosses to the host unless [`Trainer::params`] is
//! called. Each step returns the population's fitness (n floats).

use std::time::Instant;

use shardes_hlo::es::{Layout, Model, ShardedES};
use shardes_hlo::params::{Array, ParamTree};
use shardes_hlo::prng::Key;
use shardes_runtime::{gather_rows, Buffer, Client, CompileOptions, Executable};

use crate::Error;

/// Host-side timings of building the trainer.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BuildTimes {
    /// Building and printing the StableHLO program, milliseconds.
    pub emit_ms: f64,
    /// XLA compilation, milliseconds.
    pub compile_ms: f64,
}

/// A compiled generation with its state on the devices.
pub struct Trainer {
    client: Client,
    exe: Executable,
    mlir: String,
    layout: Layout,
    template: ParamTree,
    /// `[device][leaf]`.
    params: Vec<Vec<Buffer>>,
    key: Vec<Buffer>,
    generation: Vec<Buffer>,
    /// `[device][batch argument]`.
    batch: Vec<Vec<Buffer>>,
    generation_host: u32,
    /// Generations each dispatch runs.
    per_dispatch: u32,
    times: BuildTimes,
}

fn dims(a: &Array) -> Vec<usize> {
    a.shape().to_vec()
}

impl Trainer {
    /// Builds, compiles and uploads: `params` and `batch` (one array per
    /// [`Model::batch_types`] entry, in order) are replicated on every device;
    /// the state starts at `generation`.
    pub fn new(
        client: &Client,
        es: &ShardedES,
        model: &dyn Model,
        params: &ParamTree,
        key: Key,
        batch: &[Array],
        generation: u32,
    ) -> Result<Trainer, Error> {
        Self::with_generations_per_dispatch(client, es, model, params, key, batch, generation, 1)
    }

    /// Like [`Trainer::new`], but each dispatch runs `per_dispatch` generations inside one
    /// executable ([`ShardedES::generation_program_multi`]): [`Trainer::step`] then advances
    /// `per_dispatch` generations and returns the last one's fitness. The parameters are
    /// those of as many single steps; only the host round trips between generations go.
    #[allow(clippy::too_many_arguments)]
    pub fn with_generations_per_dispatch(
        client: &Client,
        es: &ShardedES,
        model: &dyn Model,
        params: &ParamTree,
        key: Key,
        batch: &[Array],
        generation: u32,
        per_dispatch: usize,
    ) -> Result<Trainer, Error> {
        let per_dispatch_u32 = u32::try_from(per_dispatch)
            .ok()
            .filter(|&k| k > 0)
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "{per_dispatch} generations per dispatch; use between 1 and 2^32 − 1"
                ))
            })?;
        let devices = es.devices();
        if client.device_count() < devices {
            return Err(Error::Invalid(format!(
                "the ES uses {devices} devices but the client has {}; lower the device count or \
                 create the client with more CPU devices",
                client.device_count()
            )));
        }
        let t0 = Instant::now();
        let leaves = shardes_hlo::es::leaf_infos(params);
        let program = es.generation_program_multi(model, &leaves, per_dispatch)?;
        let mlir = program.module.to_mlir();
        let emit_ms = t0.elapsed().as_secs_f64() * 1e3;
        let t1 = Instant::now();
        let exe = client.compile(&mlir, &CompileOptions::new(devices))?;
        let compile_ms = t1.elapsed().as_secs_f64() * 1e3;
        let layout = program.layout;
        if batch.len() != layout.batch.len() {
            return Err(Error::Invalid(format!(
                "the model takes {} batch arrays ({}) but {} were given",
                layout.batch.len(),
                layout
                    .batch
                    .iter()
                    .map(|(n, t)| format!("{n}: {t}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                batch.len()
            )));
        }
        for ((name, ty), a) in layout.batch.iter().zip(batch) {
            let want: Vec<usize> = ty.shape.iter().map(|&d| d as usize).collect();
            if a.shape() != want.as_slice() {
                return Err(Error::Invalid(format!(
                    "batch array `{name}` has shape {:?} but the model expects {ty}",
                    a.shape()
                )));
            }
        }
        let mut per_leaf = Vec::new();
        for (_, a) in params.leaves() {
            per_leaf.push(client.replicate(a.data(), &dims(a))?);
        }
        let params_dev = transpose(per_leaf, devices);
        let key_dev = client.replicate(&key.data(), &[2])?;
        let gen_dev = client.replicate(&[generation], &[])?;
        let mut per_batch = Vec::new();
        for a in batch {
            per_batch.push(client.replicate(a.data(), &dims(a))?);
        }
        let batch_dev = transpose(per_batch, devices);
        Ok(Trainer {
            client: client.clone(),
            exe,
            mlir,
            layout,
            template: params.clone(),
            params: params_dev,
            key: key_dev,
            generation: gen_dev,
            batch: batch_dev,
            generation_host: generation,
            per_dispatch: per_dispatch_u32,
            times: BuildTimes {
                emit_ms,
                compile_ms,
            },
        })
    }

    /// Runs one generation; returns the fitness of every member in global member order
    /// (`n` values, or `n × g` row-major for several tasks).
    pub fn step(&mut self) -> Result<Vec<f32>, Error> {
        let outs = self.dispatch()?;
        self.absorb(outs)
    }

    /// Executes the program on the current state (the state buffers are donated).
    fn dispatch(&self) -> Result<Vec<Vec<Buffer>>, Error> {
        let args: Vec<Vec<&Buffer>> = (0..self.params.len())
            .map(|d| {
                let mut a: Vec<&Buffer> = self.params[d].iter().collect();
                a.push(&self.key[d]);
                a.push(&self.generation[d]);
                a.extend(self.batch[d].iter());
                a
            })
            .collect();
        Ok(self.exe.execute(&args)?)
    }

    fn absorb(&mut self, outs: Vec<Vec<Buffer>>) -> Result<Vec<f32>, Error> {
        let nl = self.layout.leaves.len();
        let mut fitness_shards = Vec::with_capacity(outs.len());
        for (d, mut out) in outs.into_iter().enumerate() {
            let fit = out
                .pop()
                .ok_or_else(|| Error::Invalid("program returned no fitness".into()))?;
            let gen = out
                .pop()
                .ok_or_else(|| Error::Invalid("program returned no generation".into()))?;
            if out.len() != nl {
                return Err(Error::Invalid(format!(
                    "program returned {} parameter leaves, expected {nl}",
                    out.len()
                )));
            }
            self.params[d] = out;
            self.generation[d] = gen;
            fitness_shards.push(fit);
        }
        self.generation_host += self.per_dispatch;
        Ok(gather_rows(&fitness_shards)?)
    }

    /// Runs `k` generations (a multiple of [`Trainer::generations_per_dispatch`]) and
    /// returns the last one's fitness.
    pub fn step_many(&mut self, k: usize) -> Result<Vec<f32>, Error> {
        let per = self.per_dispatch as usize;
        if k == 0 || !k.is_multiple_of(per) {
            return Err(Error::Invalid(format!(
                "step_many({k}): this trainer runs {per} generations per dispatch; ask for a \
                 positive multiple of {per}"
            )));
        }
        let mut fitness = Vec::new();
        for _ in 0..k / per {
            fitness = self.step()?;
        }
        Ok(fitness)
    }

    /// Generations each [`Trainer::step`] runs.
    pub fn generations_per_dispatch(&self) -> usize {
        self.per_dispatch as usize
    }

    /// The generation the next step will run.
    pub fn generation(&self) -> u32 {
        self.generation_host
    }

    /// Copies the parameters back to the host (from device 0; every device holds the same).
    pub fn params(&self) -> Result<ParamTree, Error> {
        let mut leaves = Vec::with_capacity(self.params[0].len());
        for (b, l) in self.params[0].iter().zip(&self.layout.leaves) {
            let shape: Vec<usize> = l.shape.iter().map(|&d| d as usize).collect();
            leaves.push(Array::new(shape, b.to_host::<f32>()?)?);
        }
        Ok(ParamTree::from_leaves(&self.template, leaves)?)
    }

    /// The generation program's MLIR text.
    pub fn mlir(&self) -> &str {
        &self.mlir
    }

    /// The compiled executable (for `optimized_hlo()` and memory statistics).
    pub fn executable(&self) -> &Executable {
        &self.exe
    }

    /// Emission and compile times.
    pub fn build_times(&self) -> BuildTimes {
        self.times
    }

    /// The program layout.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The client the state lives on.
    pub fn client(&self) -> &Client {
        &self.client
    }
}

/// `[leaf][device]` → `[device][leaf]`.
fn transpose(per_item: Vec<Vec<Buffer>>, devices: usize) -> Vec<Vec<Buffer>> {
    let mut out: Vec<Vec<Buffer>> = (0..devices).map(|_| Vec::new()).collect();
    for item in per_item {
        for (d, b) in item.into_iter().enumerate().take(devices) {
            out[d].push(b);
        }
    }
    out
}
