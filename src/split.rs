//! Split mode: fitness from outside the program.
//!
//! The generation is cut in two executables, each compiled once: `ask + apply`
//! ([`SplitTrainer::evaluate`]) returns the population's losses as the model computes
//! them, and `tell` ([`SplitTrainer::tell`]) takes a fitness array from the host, so the
//! rewards can be computed in Rust (from decoded text, a simulator, a human...). The state
//! (parameters, key, generation) stays on the devices as in [`crate::Trainer`]; only the
//! `n` fitness values cross to the devices for `tell`.
//!
//! Feeding `evaluate`'s own output back to `tell` gives the same parameters as the fused
//! [`crate::Trainer`] (the same ask, the same shaping and contraction).

use shardes_hlo::es::{EsError, Layout, Model, ShardedES};
use shardes_hlo::params::{Array, ParamTree};
use shardes_hlo::prng::Key;
use shardes_runtime::half::{bf16, f16};
use shardes_runtime::{gather_rows, Buffer, Client, CompileOptions, Element, Executable};

use crate::Error;

/// A fitness array computed on the host, one value per member (or `n × g` row-major for
/// `g` tasks), lower is better (`tell` descends: negate a reward).
#[derive(Clone, Debug, PartialEq)]
pub enum HostFitness {
    /// Used as is.
    F32(Vec<f32>),
    /// Rounded to f32 (values beyond f32's range become ±inf, NaN stays NaN and ranks worst).
    F64(Vec<f64>),
    /// Refused: in bf16 a population's losses collapse into ties.
    Bf16(Vec<bf16>),
    /// Refused: in f16 a population's losses collapse into ties.
    F16(Vec<f16>),
}

impl HostFitness {
    /// The number of values.
    pub fn len(&self) -> usize {
        match self {
            HostFitness::F32(v) => v.len(),
            HostFitness::F64(v) => v.len(),
            HostFitness::Bf16(v) => v.len(),
            HostFitness::F16(v) => v.len(),
        }
    }

    /// Whether there are no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The values as f32, refusing types narrower than f32 (with the reason and the fix).
    pub fn to_f32(&self) -> Result<Vec<f32>, EsError> {
        match self {
            HostFitness::F32(v) => Ok(v.clone()),
            // Rounding to the program's fitness precision is the point.
            HostFitness::F64(v) => Ok(v.iter().map(|&x| x as f32).collect()),
            HostFitness::Bf16(_) => Err(EsError::NarrowFitness {
                dtype: "bf16".into(),
            }),
            HostFitness::F16(_) => Err(EsError::NarrowFitness {
                dtype: "f16".into(),
            }),
        }
    }
}

/// A split-mode run: `ask + apply` and `tell` compiled once each, state on the devices.
pub struct SplitTrainer {
    client: Client,
    ask_apply: Executable,
    tell: Executable,
    layout: Layout,
    template: ParamTree,
    devices: usize,
    /// `[device][leaf]`.
    params: Vec<Vec<Buffer>>,
    key: Vec<Buffer>,
    generation: Vec<Buffer>,
    /// `[device][batch argument]`.
    batch: Vec<Vec<Buffer>>,
    generation_host: u32,
}

/// `data` on each of the first `devices` devices.
fn replicate<T: Element>(
    client: &Client,
    data: &[T],
    dims: &[usize],
    devices: usize,
) -> Result<Vec<Buffer>, Error> {
    (0..devices)
        .map(|d| Ok(client.buffer_from_host(data, dims, d)?))
        .collect()
}

impl SplitTrainer {
    /// Builds and compiles both programs and uploads the state: `params` and `batch` (one
    /// array per [`Model::batch_types`] entry) are replicated; the state starts at
    /// `generation`.
    pub fn new(
        client: &Client,
        es: &ShardedES,
        model: &dyn Model,
        params: &ParamTree,
        key: Key,
        batch: &[Array],
        generation: u32,
    ) -> Result<SplitTrainer, Error> {
        let devices = es.devices();
        if client.device_count() < devices {
            return Err(Error::Invalid(format!(
                "the ES uses {devices} devices but the client has {}; lower the device count or \
                 create the client with more CPU devices",
                client.device_count()
            )));
        }
        let leaves = shardes_hlo::es::leaf_infos(params);
        let first = es.ask_apply_program(model, &leaves)?;
        let layout = first.layout;
        let second = es.tell_program(&leaves, layout.tasks)?;
        let opts = CompileOptions::new(devices);
        let ask_apply = client.compile(&first.module.to_mlir(), &opts)?;
        let tell = client.compile(&second.module.to_mlir(), &opts)?;
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
        let mut per_device: Vec<Vec<Buffer>> = (0..devices).map(|_| Vec::new()).collect();
        for (_, a) in params.leaves() {
            for (d, b) in replicate(client, a.data(), a.shape(), devices)?
                .into_iter()
                .enumerate()
            {
                per_device[d].push(b);
            }
        }
        let mut batch_dev: Vec<Vec<Buffer>> = (0..devices).map(|_| Vec::new()).collect();
        for a in batch {
            for (d, b) in replicate(client, a.data(), a.shape(), devices)?
                .into_iter()
                .enumerate()
            {
                batch_dev[d].push(b);
            }
        }
        Ok(SplitTrainer {
            client: client.clone(),
            ask_apply,
            tell,
            template: params.clone(),
            devices,
            params: per_device,
            key: replicate(client, &key.data(), &[2], devices)?,
            generation: replicate(client, &[generation], &[], devices)?,
            batch: batch_dev,
            generation_host: generation,
            layout,
        })
    }

    /// Runs `ask + apply` on the current state: the fitness of every member in global
    /// member order (`n`, or `n × g` row-major). The state is unchanged.
    pub fn evaluate(&self) -> Result<Vec<f32>, Error> {
        let args: Vec<Vec<&Buffer>> = (0..self.devices)
            .map(|d| {
                let mut a: Vec<&Buffer> = self.params[d].iter().collect();
                a.push(&self.key[d]);
                a.push(&self.generation[d]);
                a.extend(self.batch[d].iter());
                a
            })
            .collect();
        let outs = self.ask_apply.execute(&args)?;
        let mut shards = Vec::with_capacity(outs.len());
        for mut out in outs {
            shards.push(
                out.pop()
                    .ok_or_else(|| Error::Invalid("ask_apply returned no fitness".into()))?,
            );
        }
        Ok(gather_rows(&shards)?)
    }

    /// Runs `tell` with a host fitness (lower is better) and advances the generation.
    /// bf16/f16 fitness is refused before anything runs; f64 is rounded to f32.
    pub fn tell(&mut self, fitness: &HostFitness) -> Result<(), Error> {
        let values = fitness.to_f32()?;
        let want = self.layout.n * self.layout.tasks;
        if values.len() != want {
            return Err(Error::Invalid(format!(
                "tell got {} fitness values but the population has n = {} members × {} tasks = \
                 {want}; pass one value per member (and task), in member order",
                values.len(),
                self.layout.n,
                self.layout.tasks
            )));
        }
        let mut dims = vec![self.layout.n];
        if self.layout.tasks > 1 {
            dims.push(self.layout.tasks);
        }
        let fit_dev = replicate(&self.client, &values, &dims, self.devices)?;
        let args: Vec<Vec<&Buffer>> = (0..self.devices)
            .map(|d| {
                let mut a: Vec<&Buffer> = self.params[d].iter().collect();
                a.push(&self.key[d]);
                a.push(&self.generation[d]);
                a.push(&fit_dev[d]);
                a
            })
            .collect();
        let outs = self.tell.execute(&args)?;
        let nl = self.layout.leaves.len();
        for (d, mut out) in outs.into_iter().enumerate() {
            let gen = out
                .pop()
                .ok_or_else(|| Error::Invalid("tell returned no generation".into()))?;
            if out.len() != nl {
                return Err(Error::Invalid(format!(
                    "tell returned {} parameter leaves, expected {nl}",
                    out.len()
                )));
            }
            self.params[d] = out;
            self.generation[d] = gen;
        }
        self.generation_host += 1;
        Ok(())
    }

    /// The generation the next `evaluate`/`tell` pair runs.
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

    /// The program layout (`n`, tasks, leaves, batch).
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The `ask + apply` executable.
    pub fn ask_apply_executable(&self) -> &Executable {
        &self.ask_apply
    }

    /// The `tell` executable.
    pub fn tell_executable(&self) -> &Executable {
        &self.tell
    }
}
