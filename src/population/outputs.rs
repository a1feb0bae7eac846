//! [`Outputs`]: a program returning per-member outputs, scored by the caller
//! ([`crate::OutputsRunner`] is its population).
//!
//! The generation is cut as in [`super::Losses`], with the outputs program
//! ([`ShardedES::outputs_program`]) in place of `ask + apply`: each call of
//! [`Population::outputs`] uploads only its inputs (a prompt batch, say), runs every
//! member under its perturbation and brings back the outputs (`[n, …]` each, in member
//! order); the host scores them and hands the fitness to [`Population::tell`]. The
//! parameters, the key and the generation never leave the devices.

use std::time::Instant;

use shardes_hlo::builder::{DType, TensorType};
use shardes_hlo::es::{
    leaf_infos, AsModel, Layout, MemberOutputs, Program, ProgramKind, ShardedES,
};
use shardes_hlo::params::ParamTree;
use shardes_hlo::prng::Key;
use shardes_runtime::{gather_rows, Buffer, Client, CompileOptions, Element, Executable};

use super::{
    placement, BuildTimes, CompileWhen, Core, OnDemand, Place, Population, PopulationError,
};
use crate::state::{replicate, DeviceState};
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
        d => return Err(PopulationError::OutputType(d.mlir().to_string()).into()),
    };
    Ok(HostArray { dims, data })
}

/// The outputs program of a population, compiled now or on first use.
pub struct Outputs {
    program: OnDemand,
    /// The outputs program's layout.
    layout: Layout,
}

impl Outputs {
    /// Runs the outputs program on `core`'s state with `inputs`; see
    /// [`Population::outputs`].
    pub(crate) fn outputs(
        &self,
        core: &Core,
        inputs: &[HostArray],
    ) -> Result<Vec<HostArray>, Error> {
        run(core, self.program.get(&core.client)?, &self.layout, inputs)
    }

    /// The outputs program's layout (`n`, leaves, inputs, outputs).
    pub fn layout(&self) -> &Layout {
        &self.layout
    }
}

/// Runs `exe`, an outputs program of `layout` over `core`'s state, with `inputs`: each
/// output as `[members, …]` in member order.
pub(crate) fn run(
    core: &Core,
    exe: &Executable,
    layout: &Layout,
    inputs: &[HostArray],
) -> Result<Vec<HostArray>, Error> {
    let uploaded = upload(core, layout, inputs)?;
    let outs = core.execute(exe, layout, &uploaded)?;
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

/// `inputs` checked against `layout` and replicated on `core`'s devices:
/// `[device][input]`.
fn upload(core: &Core, layout: &Layout, inputs: &[HostArray]) -> Result<Vec<Vec<Buffer>>, Error> {
    let devices = core.devices();
    if inputs.len() != layout.batch.len() {
        return Err(PopulationError::InputCount {
            want: layout.batch.len(),
            types: layout
                .batch
                .iter()
                .map(|(n, t)| format!("{n}: {t}"))
                .collect::<Vec<_>>()
                .join(", "),
            got: inputs.len(),
        }
        .into());
    }
    let mut out: Vec<Vec<Buffer>> = (0..devices).map(|_| Vec::new()).collect();
    for ((name, ty), a) in layout.batch.iter().zip(inputs) {
        let want: Vec<usize> = ty.shape.iter().map(|&d| d as usize).collect();
        if a.dims != want || a.dtype() != ty.dtype || a.len() != want.iter().product::<usize>() {
            return Err(PopulationError::InputType {
                name: name.clone(),
                got: format!("{}{:?} with {} values", a.dtype().mlir(), a.dims, a.len()),
                want: ty.to_string(),
            }
            .into());
        }
        let client = &core.client;
        let bufs = match &a.data {
            HostData::F32(v) => replicate(client, v, &a.dims, devices)?,
            HostData::I32(v) => replicate(client, v, &a.dims, devices)?,
            HostData::U32(v) => replicate(client, v, &a.dims, devices)?,
        };
        for (d, b) in bufs.into_iter().enumerate() {
            out[d].push(b);
        }
    }
    Ok(out)
}

impl Population<Outputs> {
    /// Builds and compiles the outputs and tell programs of `model` and uploads the state
    /// (`params` replicated) at `generation` (0 to start; a checkpoint's to resume): the
    /// next [`Population::outputs`]/[`Population::tell`] pair runs it.
    pub fn with_state(
        client: &Client,
        es: &ShardedES,
        model: &dyn MemberOutputs,
        params: &ParamTree,
        key: Key,
        generation: u32,
    ) -> Result<Population<Outputs>, Error> {
        let (place, when) = (Place::Alone, CompileWhen::Now);
        Self::placed(client, es, model, params, key, generation, place, when)
    }

    /// The outputs population of `model` placed by `place`.
    #[allow(clippy::too_many_arguments)]
    pub fn placed(
        client: &Client,
        es: &ShardedES,
        model: &dyn MemberOutputs,
        params: &ParamTree,
        key: Key,
        generation: u32,
        place: Place<'_>,
        when: CompileWhen,
    ) -> Result<Population<Outputs>, Error> {
        let devices = place.devices(client, es)?;
        let t0 = Instant::now();
        let leaves = leaf_infos(params);
        let first = match place {
            Place::Alone => es.outputs_program(model, &leaves)?,
            Place::Group(dist, _) => es.part_outputs_program(model, &leaves, dist.part())?,
        };
        let program = OnDemand::new(&first, devices);
        let emit_ms = t0.elapsed().as_secs_f64() * 1e3;
        let t1 = Instant::now();
        // Across processes everything compiles at once, as every process must.
        let when = match place {
            Place::Alone => when,
            Place::Group(..) => CompileWhen::Now,
        };
        if when == CompileWhen::Now {
            program.get(client)?;
        }
        // Sized after the same model, so tell regenerates the noise in the chunks the
        // outputs program drew it in.
        let placement = placement(client, es, place, &AsModel(model), &leaves, devices, when)?;
        let compile_ms = t1.elapsed().as_secs_f64() * 1e3;
        // The state alone: the inputs come with each call. The optimizer's state (none
        // under sgd) lives beside the parameters and only tell reads and updates it.
        let opt = es.optimizer().state_types(&leaves);
        let state_layout = Layout::new(ProgramKind::Outputs, leaves, Vec::new(), es.n(), 1)
            .with_opt_state(opt)
            .with_stacks(first.layout.stacks.clone());
        let state =
            DeviceState::upload(client, devices, state_layout, params, key, &[], generation)?;
        let times = BuildTimes {
            emit_ms,
            compile_ms,
        };
        let core = Core::new(client, state, placement, es.n(), model.tasks(), times);
        let outputs = Outputs {
            program,
            layout: first.layout,
        };
        Ok(Population::from_parts(core, outputs))
    }

    /// Runs the outputs program on the current state with `inputs` (one per
    /// [`MemberOutputs::input_types`] entry, uploaded to every device): each output as
    /// `[m, …]` for the `m` members of [`Population::members`] (all `n` on one process)
    /// in member order. The state is unchanged.
    pub fn outputs(&self, inputs: &[HostArray]) -> Result<Vec<HostArray>, Error> {
        self.evaluator().outputs(self.core(), inputs)
    }

    /// Compiles another program over this population's state (an outputs program of the
    /// same leaves, e.g. [`ShardedES::plain_outputs_program`] for evaluation) for
    /// [`Population::run`].
    pub fn compile(&self, program: &Program) -> Result<Executable, Error> {
        compile_over(self.core(), &self.evaluator().layout, program)
    }

    /// Runs `exe`, an outputs program of `layout` compiled by [`Population::compile`], on
    /// the current state with `inputs`: each output as `[layout.n, …]`.
    pub fn run(
        &self,
        exe: &Executable,
        layout: &Layout,
        inputs: &[HostArray],
    ) -> Result<Vec<HostArray>, Error> {
        run(self.core(), exe, layout, inputs)
    }

    /// The outputs program's layout (`n`, leaves, inputs, outputs).
    pub fn layout(&self) -> &Layout {
        &self.evaluator().layout
    }
}

/// Compiles `program` to run over `core`'s state, refusing one that does not fit it (not
/// an outputs program of the same leaves as `layout`, or of another device count).
pub(crate) fn compile_over(
    core: &Core,
    layout: &Layout,
    program: &Program,
) -> Result<Executable, Error> {
    if program.layout.kind != ProgramKind::Outputs
        || program.layout.leaves != layout.leaves
        || program.layout.stacks != layout.stacks
    {
        return Err(PopulationError::ForeignProgram.into());
    }
    let devices = program
        .module
        .mesh()
        .map(|m| m.size() as usize)
        .unwrap_or(1);
    if devices != core.devices() {
        return Err(PopulationError::DeviceCount {
            program: devices,
            state: core.devices(),
        }
        .into());
    }
    Ok(core
        .client
        .compile(&program.module.to_mlir(), &CompileOptions::new(devices))?)
}
