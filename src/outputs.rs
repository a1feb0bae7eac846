//! Per-member outputs with the rewards on the host: [`OutputsRunner`].
//!
//! The generation is cut as in [`crate::SplitTrainer`], with the outputs program
//! ([`ShardedES::outputs_program`]) in place of `ask + apply`: each call of
//! [`OutputsRunner::outputs`] uploads only its inputs (a prompt batch, say), runs every
//! member under its perturbation and brings back the outputs (`[n, …]` each, in member
//! order); the host scores them and hands the fitness to [`OutputsRunner::tell`]. The
//! parameters, the key and the generation never leave the devices.

use std::ops::Range;
use std::sync::{Arc, Mutex, OnceLock};

use shardes_hlo::builder::{DType, TensorType};
use shardes_hlo::es::{
    leaf_infos, AsModel, How, Layout, MemberOutputs, Part, Program, ProgramKind, ShardedES,
};
use shardes_hlo::params::{Array, ParamTree};
use shardes_hlo::prng::Key;
use shardes_runtime::{gather_rows, Buffer, Client, CompileOptions, Element, Executable};

use crate::distributed::update::{exclusive, HostsTell, Process};
use crate::distributed::Distributed;
use crate::split::{run_tell, HostFitness};
use crate::state::{check_devices, replicate, DeviceState};
use crate::Error;

/// The values of a [`HostArray`].
#[derive(Clone, Debug, PartialEq)]
pub enum HostData {
    /// f32 values.
    F32(Vec<f32>),
    /// i32 values (token ids, lengths).
    I32(Vec<i32>),
    /// u32 values.
    U32(Vec<u32>),
}

/// A host array of a program's input or output: its dimensions and row-major values.
#[derive(Clone, Debug, PartialEq)]
pub struct HostArray {
    /// The dimensions.
    pub dims: Vec<usize>,
    /// The values (`dims.iter().product()` of them).
    pub data: HostData,
}

impl HostArray {
    /// An i32 array.
    pub fn i32(dims: &[usize], data: Vec<i32>) -> HostArray {
        HostArray {
            dims: dims.to_vec(),
            data: HostData::I32(data),
        }
    }

    /// An f32 array.
    pub fn f32(dims: &[usize], data: Vec<f32>) -> HostArray {
        HostArray {
            dims: dims.to_vec(),
            data: HostData::F32(data),
        }
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        match self.data {
            HostData::F32(_) => DType::F32,
            HostData::I32(_) => DType::I32,
            HostData::U32(_) => DType::U32,
        }
    }

    /// The values if this is an i32 array.
    pub fn as_i32(&self) -> Option<&[i32]> {
        match &self.data {
            HostData::I32(v) => Some(v),
            _ => None,
        }
    }

    /// The values if this is an f32 array.
    pub fn as_f32(&self) -> Option<&[f32]> {
        match &self.data {
            HostData::F32(v) => Some(v),
            _ => None,
        }
    }

    fn len(&self) -> usize {
        match &self.data {
            HostData::F32(v) => v.len(),
            HostData::I32(v) => v.len(),
            HostData::U32(v) => v.len(),
        }
    }
}

/// Refuses a fitness that is not one value per member and column.
fn check_fitness(values: &[f32], n: usize, tasks: usize) -> Result<(), Error> {
    if values.len() != n * tasks {
        return Err(Error::Invalid(format!(
            "tell got {} fitness values but the population has n = {n} members × {tasks} \
             columns; pass one value per member and column, in member order",
            values.len(),
        )));
    }
    Ok(())
}

/// Each device's rows of one output gathered in member order.
fn gather(shards: &[Buffer], ty: &TensorType) -> Result<HostArray, Error> {
    let dims: Vec<usize> = ty.shape.iter().map(|&d| d as usize).collect();
    fn rows<T: Element>(shards: &[Buffer]) -> Result<Vec<T>, Error> {
        Ok(gather_rows::<T>(shards)?)
    }
    let data = match ty.dtype {
        DType::F32 => HostData::F32(rows(shards)?),
        DType::I32 => HostData::I32(rows(shards)?),
        DType::U32 => HostData::U32(rows(shards)?),
        d => {
            return Err(Error::Invalid(format!(
                "an output of element type {} cannot be brought back; return f32, i32 or u32 \
                 outputs",
                d.mlir()
            )))
        }
    };
    Ok(HostArray { dims, data })
}

/// How an [`OutputsRunner`] tells: the whole population on this process, or as one
/// process of several.
#[allow(clippy::large_enum_variant)] // one per runner: boxing buys nothing
enum Teller {
    /// One process: the tell program.
    Local { exe: OnDemand, layout: Layout },
    /// One process of several: the update placed by `how_hosts`.
    Hosts {
        tell: HostsTell,
        part: Part,
        how: How,
        devices_lock: Option<Arc<Mutex<()>>>,
    },
}

/// A program's text and its executable, compiled on first use: a runner that only
/// evaluates (greedy decoding of the unperturbed parameters) never pays for the perturbed
/// program's or the tell's compile.
struct OnDemand {
    mlir: String,
    devices: usize,
    exe: OnceLock<Executable>,
}

impl OnDemand {
    fn new(program: &Program, devices: usize) -> OnDemand {
        OnDemand {
            mlir: program.module.to_mlir(),
            devices,
            exe: OnceLock::new(),
        }
    }

    /// The executable, compiled now if it was not yet.
    fn get(&self, client: &Client) -> Result<&Executable, Error> {
        if let Some(exe) = self.exe.get() {
            return Ok(exe);
        }
        let exe = client.compile(&self.mlir, &CompileOptions::new(self.devices))?;
        Ok(self.exe.get_or_init(|| exe))
    }
}

/// When a runner compiles its outputs and tell programs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompileWhen {
    /// While it is built (a training run: compile errors and times come first).
    Now,
    /// On first use (an evaluator that may only run [`OutputsRunner::compile`]d programs).
    FirstUse,
}

/// A run whose population returns outputs: the outputs program and the tell program
/// compiled once each, the state on the devices.
///
/// On one process of a run across processes ([`OutputsRunner::for_process`]) the outputs
/// program evaluates this process's members only ([`OutputsRunner::members`]) and the
/// update is placed across processes by `how_hosts` ([`OutputsRunner::tell_in`]), as
/// [`crate::distributed::ProcessTrainer`] places it.
pub struct OutputsRunner {
    client: Client,
    outputs: OnDemand,
    /// The outputs program's layout.
    layout: Layout,
    teller: Teller,
    state: DeviceState,
    /// The whole population (all processes').
    n: usize,
    /// The global ids of the members the outputs program evaluates.
    members: Range<usize>,
}

impl OutputsRunner {
    /// Builds and compiles the outputs and tell programs of `model` and uploads the
    /// state (`params` replicated) at generation 0.
    pub fn new(
        client: &Client,
        es: &ShardedES,
        model: &dyn MemberOutputs,
        params: &ParamTree,
        key: Key,
    ) -> Result<OutputsRunner, Error> {
        Self::with_state(client, es, model, params, key, 0)
    }

    /// [`OutputsRunner::new`] from a saved state: `params` and the `generation` the next
    /// [`OutputsRunner::outputs`]/[`OutputsRunner::tell`] pair runs (for resuming).
    pub fn with_state(
        client: &Client,
        es: &ShardedES,
        model: &dyn MemberOutputs,
        params: &ParamTree,
        key: Key,
        generation: u32,
    ) -> Result<OutputsRunner, Error> {
        Self::compiled(client, es, model, params, key, generation, CompileWhen::Now)
    }

    /// [`OutputsRunner::with_state`], compiling the outputs and tell programs `when` asked.
    pub fn compiled(
        client: &Client,
        es: &ShardedES,
        model: &dyn MemberOutputs,
        params: &ParamTree,
        key: Key,
        generation: u32,
        when: CompileWhen,
    ) -> Result<OutputsRunner, Error> {
        let devices = es.devices();
        check_devices(client, devices)?;
        let leaves = leaf_infos(params);
        let first = es.outputs_program(model, &leaves)?;
        // Sized after the same model, so tell regenerates the noise in the chunks the
        // outputs program drew it in.
        let second = es.tell_program(&AsModel(model), &leaves)?;
        let outputs = OnDemand::new(&first, devices);
        let exe = OnDemand::new(&second, devices);
        if when == CompileWhen::Now {
            outputs.get(client)?;
            exe.get(client)?;
        }
        let teller = Teller::Local {
            exe,
            layout: second.layout,
        };
        Self::finish(
            client,
            es,
            first.layout,
            outputs,
            teller,
            params,
            key,
            generation,
        )
    }

    /// [`OutputsRunner::with_state`] as process `dist.part()` of a run across processes:
    /// `es` is the whole run's (its devices every process's), the outputs program
    /// evaluates this process's members ([`ShardedES::part_outputs_program`]) on its own
    /// devices, and the update is placed across processes by `how_hosts`. Every process
    /// builds it with the same settings and state, and calls [`OutputsRunner::tell_in`]
    /// together.
    #[allow(clippy::too_many_arguments)]
    pub fn for_process(
        client: &Client,
        es: &ShardedES,
        model: &dyn MemberOutputs,
        params: &ParamTree,
        key: Key,
        generation: u32,
        dist: &Distributed,
        how_hosts: How,
    ) -> Result<OutputsRunner, Error> {
        let part = dist.part();
        let devices = es.local_devices(part)?;
        check_devices(client, devices)?;
        let leaves = leaf_infos(params);
        let first = es.part_outputs_program(model, &leaves, part)?;
        let programs = HostsTell::programs(es, &AsModel(model), &leaves, part, how_hosts)?;
        let opts = CompileOptions::new(devices);
        let outputs = OnDemand::new(&first, devices);
        outputs.get(client)?;
        let exes = programs
            .iter()
            .map(|p| client.compile(&p.module.to_mlir(), &opts))
            .collect::<Result<Vec<_>, _>>()?;
        let teller = Teller::Hosts {
            tell: HostsTell::from_compiled(how_hosts, programs, exes)?,
            part,
            how: es.how(),
            devices_lock: dist.device_lock(),
        };
        Self::finish(
            client,
            es,
            first.layout,
            outputs,
            teller,
            params,
            key,
            generation,
        )
    }

    /// The runner of compiled programs, the state uploaded on the outputs program's
    /// devices.
    #[allow(clippy::too_many_arguments)]
    fn finish(
        client: &Client,
        es: &ShardedES,
        layout: Layout,
        outputs: OnDemand,
        teller: Teller,
        params: &ParamTree,
        key: Key,
        generation: u32,
    ) -> Result<OutputsRunner, Error> {
        let members = match &teller {
            Teller::Local { .. } => 0..es.n(),
            Teller::Hosts { part, .. } => part.members(es.n()),
        };
        let devices = match &teller {
            Teller::Local { .. } => es.devices(),
            Teller::Hosts { part, .. } => es.local_devices(*part)?,
        };
        let leaves = layout.leaves.clone();
        // The state alone: the inputs come with each call. The optimizer's state (none
        // under sgd) lives beside the parameters and only tell reads and updates it.
        let opt = es.optimizer().state_types(&leaves);
        let state_layout = Layout::new(ProgramKind::Outputs, leaves, Vec::new(), es.n(), 1)
            .with_opt_state(opt)
            .with_stacks(layout.stacks.clone());
        let state =
            DeviceState::upload(client, devices, state_layout, params, key, &[], generation)?;
        Ok(OutputsRunner {
            client: client.clone(),
            outputs,
            layout,
            teller,
            state,
            n: es.n(),
            members,
        })
    }

    /// Runs the outputs program on the current state with `inputs` (one per
    /// [`MemberOutputs::input_types`] entry, uploaded to every device): each output as
    /// `[m, …]` for the `m` members of [`OutputsRunner::members`] (all `n` on one process)
    /// in member order. The state is unchanged.
    pub fn outputs(&self, inputs: &[HostArray]) -> Result<Vec<HostArray>, Error> {
        self.run(self.outputs.get(&self.client)?, &self.layout, inputs)
    }

    /// Compiles another program over this runner's state (an outputs program of the same
    /// leaves, e.g. [`ShardedES::plain_outputs_program`] for evaluation) for
    /// [`OutputsRunner::run`].
    pub fn compile(&self, program: &Program) -> Result<Executable, Error> {
        if program.layout.kind != ProgramKind::Outputs
            || program.layout.leaves != self.layout.leaves
            || program.layout.stacks != self.layout.stacks
        {
            return Err(Error::Invalid(
                "only an outputs program of this runner's leaves runs over its state; build \
                 it with ShardedES::outputs_program or plain_outputs_program for the same \
                 parameters"
                    .into(),
            ));
        }
        let devices = program
            .module
            .mesh()
            .map(|m| m.size() as usize)
            .unwrap_or(1);
        if devices != self.state.devices() {
            return Err(Error::Invalid(format!(
                "the program runs on {devices} devices but the state is on {}; build it with \
                 an ES of the same device count",
                self.state.devices()
            )));
        }
        Ok(self
            .client
            .compile(&program.module.to_mlir(), &CompileOptions::new(devices))?)
    }

    /// Runs `exe`, an outputs program of `layout` compiled by [`OutputsRunner::compile`],
    /// on the current state with `inputs`: each output as `[layout.n, …]`.
    pub fn run(
        &self,
        exe: &Executable,
        layout: &Layout,
        inputs: &[HostArray],
    ) -> Result<Vec<HostArray>, Error> {
        let devices = self.state.devices();
        let uploaded = self.upload(layout, inputs)?;
        let _devices = exclusive(self.devices_lock());
        let args: Vec<Vec<&Buffer>> = (0..devices)
            .map(|d| self.state.args_with(layout, d, uploaded[d].iter()))
            .collect::<Result<_, _>>()?;
        let outs = exe.execute(&args)?;
        let mut per_output: Vec<Vec<Buffer>> = layout.outputs.iter().map(|_| Vec::new()).collect();
        for out in outs {
            for (j, b) in layout.split_outputs(out)?.into_iter().enumerate() {
                per_output[j].push(b);
            }
        }
        per_output
            .iter()
            .zip(layout.output_types())
            .map(|(shards, ty)| gather(shards, &ty))
            .collect()
    }

    /// `inputs` checked against `layout` and replicated: `[device][input]`.
    fn upload(&self, layout: &Layout, inputs: &[HostArray]) -> Result<Vec<Vec<Buffer>>, Error> {
        let devices = self.state.devices();
        if inputs.len() != layout.batch.len() {
            return Err(Error::Invalid(format!(
                "the outputs program takes {} inputs ({}) but {} were given",
                layout.batch.len(),
                layout
                    .batch
                    .iter()
                    .map(|(n, t)| format!("{n}: {t}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                inputs.len()
            )));
        }
        let mut out: Vec<Vec<Buffer>> = (0..devices).map(|_| Vec::new()).collect();
        for ((name, ty), a) in layout.batch.iter().zip(inputs) {
            let want: Vec<usize> = ty.shape.iter().map(|&d| d as usize).collect();
            if a.dims != want || a.dtype() != ty.dtype || a.len() != want.iter().product::<usize>()
            {
                return Err(Error::Invalid(format!(
                    "input `{name}` is {}{:?} with {} values but the program expects {ty}",
                    a.dtype().mlir(),
                    a.dims,
                    a.len()
                )));
            }
            let bufs = match &a.data {
                HostData::F32(v) => replicate(&self.client, v, &a.dims, devices)?,
                HostData::I32(v) => replicate(&self.client, v, &a.dims, devices)?,
                HostData::U32(v) => replicate(&self.client, v, &a.dims, devices)?,
            };
            for (d, b) in bufs.into_iter().enumerate() {
                out[d].push(b);
            }
        }
        Ok(out)
    }

    /// Runs `tell` with a host fitness (one value per member, lower is better: negate a
    /// reward) and advances the generation. bf16/f16 fitness is refused before anything
    /// runs; f64 is rounded to f32. A runner of one process of several refuses: it tells
    /// with [`OutputsRunner::tell_in`].
    pub fn tell(&mut self, fitness: &HostFitness) -> Result<(), Error> {
        let values = fitness.to_f32()?;
        let Teller::Local { exe, layout } = &self.teller else {
            return Err(Error::Invalid(
                "this runner is one process of several: tell with tell_in and the group, on \
                 every process together"
                    .into(),
            ));
        };
        check_fitness(&values, layout.n, layout.tasks)?;
        let exe = exe.get(&self.client)?;
        run_tell(&self.client, exe, layout, &mut self.state, &values)
    }

    /// [`OutputsRunner::tell`] as one process of `dist` with every member's fitness (the
    /// same on every process, `n × columns` in member order): the update placed across
    /// processes, a collective under `how_hosts = B`. A one-process runner takes a group
    /// of one process only.
    pub fn tell_in(&mut self, dist: &Distributed, fitness: &HostFitness) -> Result<(), Error> {
        let Teller::Hosts {
            tell,
            part,
            how,
            devices_lock,
        } = &self.teller
        else {
            if dist.size() != 1 {
                return Err(Error::Invalid(format!(
                    "this runner evaluates the whole population in one process, but this is \
                     one of {} processes; build it with OutputsRunner::for_process",
                    dist.size()
                )));
            }
            return self.tell(fitness);
        };
        if dist.part() != *part {
            return Err(Error::Invalid(format!(
                "this runner is process {} of {} but was told as process {} of {}; build it \
                 with the group it is told with",
                part.rank,
                part.processes,
                dist.rank(),
                dist.size()
            )));
        }
        let values = fitness.to_f32()?;
        check_fitness(&values, self.n, self.layout_tasks())?;
        let process = Process {
            client: &self.client,
            part: *part,
            how: *how,
            devices_lock,
            barriers: false,
        };
        tell.run(&process, &mut self.state, dist, &values)?;
        Ok(())
    }

    /// Fitness columns per member the update takes.
    fn layout_tasks(&self) -> usize {
        match &self.teller {
            Teller::Local { layout, .. } => layout.tasks,
            Teller::Hosts { tell, .. } => tell.tasks(),
        }
    }

    /// The group's device lock where the processes share one address space.
    fn devices_lock(&self) -> &Option<Arc<Mutex<()>>> {
        const NONE: &Option<Arc<Mutex<()>>> = &None;
        match &self.teller {
            Teller::Local { .. } => NONE,
            Teller::Hosts { devices_lock, .. } => devices_lock,
        }
    }

    /// The global ids of the members [`OutputsRunner::outputs`] evaluates, in order (all
    /// `n` on one process).
    pub fn members(&self) -> Range<usize> {
        self.members.clone()
    }

    /// The whole population's size (every process's members).
    pub fn n(&self) -> usize {
        self.n
    }

    /// The devices holding this process's state.
    pub fn devices(&self) -> usize {
        self.state.devices()
    }

    /// The generation the next `outputs`/`tell` pair runs.
    pub fn generation(&self) -> u32 {
        self.state.generation_host
    }

    /// Copies the parameters back to the host (from device 0; every device holds the same).
    pub fn params(&self) -> Result<ParamTree, Error> {
        self.state.params()
    }

    /// Copies the optimizer's state back to the host (empty under sgd); see
    /// [`crate::Trainer::optimizer_state`].
    pub fn optimizer_state(&self) -> Result<Vec<(String, Array)>, Error> {
        self.state.opt_state()
    }

    /// Replaces the optimizer's state on every device (e.g. a checkpoint's); see
    /// [`crate::Trainer::set_optimizer_state`].
    pub fn set_optimizer_state(&mut self, tensors: &[(String, Array)]) -> Result<(), Error> {
        self.state.set_opt_state(&self.client, tensors)
    }

    /// The outputs program's layout (`n`, leaves, inputs, outputs).
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The client the state lives on.
    pub fn client(&self) -> &Client {
        &self.client
    }
}
