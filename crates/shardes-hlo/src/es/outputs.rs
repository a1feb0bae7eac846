//! Per-member outputs instead of a loss: the [`MemberOutputs`] trait and the outputs
//! program ([`ShardedES::outputs_program`], and its unperturbed twin
//! [`ShardedES::plain_outputs_program`]).
//!
//! The program has the [`ProgramKind::Outputs`] layout: `(params…, key, generation,
//! inputs…) → outputs…`, each output `[n, …]` split over `"pop"` by member, nothing
//! donated. It evaluates members exactly as `apply` does (member ids sharded into a manual
//! computation, a `while` loop over chunks of `member_chunk` members, the chunk's noise
//! drawn once and read through the seams), so a low-rank member never holds a perturbed
//! matrix, and hands each chunk its members' ids and sampling keys ([`MemberInfo`]).
//!
//! Sampling keys (documented in `docs/design.md`): with `base_key = fold_in(key,
//! generation)` as in `ask`, `sample_base = fold_in(base_key, SAMPLE_TAG)` with
//! [`SAMPLE_TAG`] `= 2^32 − 1`, a fold-in datum no leaf index reaches (leaf streams are
//! `fold_in(base_key, j)` for `j < L`, and `L < 2^32 − 1` is checked), and member `i`'s key
//! is `fold_in(sample_base, i)`. No noise stream changes, and a run resumed at a
//! generation draws the same keys.

use std::ops::Range;

use crate::builder::{DType, Func, Mesh, Module, Sharding, TensorType, Value};
use crate::nn::Act;
use crate::prng::emit::Keys;

use super::error::{invalid, EsError};
use super::generation::{directions, Emitter};
use super::layout::{check_leaves, Layout, ProgramArgs, ProgramKind};
use super::model::{ChunkPolicy, LayerLeaves, Model, ModelParams};
use super::processes::Part;
use super::program::Program;
use super::settings::ShardedES;
use super::strategy::LeafInfo;

/// The fold-in datum of the sampling keys: `sample_base = fold_in(base_key, SAMPLE_TAG)`.
/// Leaf streams use the data `0..L`, so this one is outside their range.
pub const SAMPLE_TAG: u32 = u32::MAX;

/// What a chunk of members is, for [`MemberOutputs::outputs`].
#[derive(Clone, Debug)]
pub struct MemberInfo {
    /// The chunk's global member ids, `u32[c]`.
    pub ids: Value,
    /// Each member's sampling key (a batch of shape `[c]`):
    /// `fold_in(fold_in(fold_in(key, generation), SAMPLE_TAG), id)`.
    pub keys: Keys,
    /// Whether the parameters are perturbed ([`ShardedES::outputs_program`]) or the plain
    /// parameters every member shares ([`ShardedES::plain_outputs_program`]).
    pub perturbed: bool,
}

impl MemberInfo {
    /// Members in the chunk.
    pub fn chunk(&self) -> i64 {
        self.ids.shape()[0]
    }
}

/// A model whose population evaluation returns per-member tensors (tokens, actions, …)
/// instead of a loss, for rewards computed outside the program.
pub trait MemberOutputs {
    /// Names and types of the inputs (replicated on every device).
    fn input_types(&self) -> Vec<(String, TensorType)>;

    /// Names and per-member types of the outputs (logical, without the member axis; any
    /// dtype). The program returns each as `[n, …]`.
    fn output_types(&self) -> Vec<(String, TensorType)>;

    /// The outputs of a chunk of members, one [`Act`] per [`MemberOutputs::output_types`]
    /// entry with that logical type: per member (leading dimension `member.chunk()`) or
    /// shared (then every member of the chunk gets it). Read 2-D weights through
    /// [`ModelParams::weight`] and the seams.
    fn outputs(
        &self,
        params: &ModelParams,
        inputs: &[Value],
        member: &MemberInfo,
    ) -> Result<Vec<Act>, EsError>;

    /// Bytes of one member's largest activation, if known: the outputs program sizes its
    /// default member chunk with it, as [`Model::member_bytes`] does.
    fn member_bytes(&self) -> Option<usize> {
        None
    }

    /// Whether the model reads its matrices many times per call (a decoder, once per
    /// token): the program then transposes every matrix once, before its member chunks,
    /// and hands the model [`crate::nn::Weight::InOut`] weights, which the seams read
    /// with the same values and XLA:CPU's dots with few rows read faster.
    fn matrices_in_out(&self) -> bool {
        false
    }

    /// How the default member chunk is sized, as [`Model::chunk_policy`].
    fn chunk_policy(&self) -> ChunkPolicy {
        ChunkPolicy::Cache
    }

    /// Fitness columns per member that the paired tell program takes (1, or `g` groups for
    /// `group_relative`, e.g. one per prompt of a reward run), as [`Model::tasks`].
    fn tasks(&self) -> usize {
        1
    }

    /// The model's repeated layers, when it reads them in a loop over the layer index
    /// ([`Model::layers`]): the outputs program draws their noise once per member chunk in
    /// a loop over the layer index and hands the model each layer's leaves through
    /// [`ModelParams::layer_source`] (low-rank strategies; the others draw every leaf on
    /// its own), and the paired tell program contracts them in a loop.
    fn layers(&self) -> Option<LayerLeaves> {
        None
    }
}

/// `model` with `tasks` fitness columns per member for its tell program (the outputs are
/// `model`'s own).
pub struct WithTasks<'a>(pub &'a dyn MemberOutputs, pub usize);

impl MemberOutputs for WithTasks<'_> {
    fn input_types(&self) -> Vec<(String, TensorType)> {
        self.0.input_types()
    }

    fn output_types(&self) -> Vec<(String, TensorType)> {
        self.0.output_types()
    }

    fn outputs(
        &self,
        params: &ModelParams,
        inputs: &[Value],
        member: &MemberInfo,
    ) -> Result<Vec<Act>, EsError> {
        self.0.outputs(params, inputs, member)
    }

    fn member_bytes(&self) -> Option<usize> {
        self.0.member_bytes()
    }

    fn matrices_in_out(&self) -> bool {
        self.0.matrices_in_out()
    }

    fn chunk_policy(&self) -> ChunkPolicy {
        self.0.chunk_policy()
    }

    fn tasks(&self) -> usize {
        self.1
    }

    fn layers(&self) -> Option<LayerLeaves> {
        self.0.layers()
    }
}

/// A [`MemberOutputs`] seen as a [`Model`] with its inputs as the batch and its member
/// size, for what sizes itself after a model: the member chunk
/// ([`ShardedES::member_chunk_for`]) and the tell program paired with an outputs program
/// ([`ShardedES::tell_program`]). Its loss is an error.
pub struct AsModel<'a>(pub &'a dyn MemberOutputs);

impl Model for AsModel<'_> {
    fn batch_types(&self) -> Vec<(String, TensorType)> {
        self.0.input_types()
    }

    fn loss(&self, _: &ModelParams, _: &[Value]) -> Result<Act, EsError> {
        Err(invalid(
            "a MemberOutputs model has no loss".into(),
            "build its outputs program (ShardedES::outputs_program) and compute the fitness \
             on the host"
                .into(),
        ))
    }

    fn member_bytes(&self) -> Option<usize> {
        self.0.member_bytes()
    }

    fn chunk_policy(&self) -> ChunkPolicy {
        self.0.chunk_policy()
    }

    fn tasks(&self) -> usize {
        self.0.tasks()
    }

    fn layers(&self) -> Option<LayerLeaves> {
        self.0.layers()
    }
}

impl ShardedES {
    /// The outputs program of `model`: every member's outputs under its perturbation,
    /// `(params…, key, generation, inputs…) → outputs…` (each `[n, …]`, split over
    /// `"pop"`), nothing donated. Pair it with [`ShardedES::tell_program`] for
    /// [`AsModel`]`(model)` to tell a host fitness.
    pub fn outputs_program(
        &self,
        model: &dyn MemberOutputs,
        leaves: &[LeafInfo],
    ) -> Result<Program, EsError> {
        self.outputs_with(model, leaves, true)
    }

    /// The same program with the unperturbed parameters (every 2-D leaf a plain weight,
    /// [`MemberInfo::perturbed`] false): the same layout, chunks, member ids and sampling
    /// keys, for evaluation and as the baseline of [`ShardedES::outputs_program`].
    pub fn plain_outputs_program(
        &self,
        model: &dyn MemberOutputs,
        leaves: &[LeafInfo],
    ) -> Result<Program, EsError> {
        self.outputs_with(model, leaves, false)
    }

    /// Process `part`'s outputs program in a run across processes: the layout of
    /// [`ShardedES::outputs_program`] with `n / P` members, the outputs of the global
    /// members [`Part::members`] in order, on this process's devices
    /// ([`ShardedES::local_devices`]). Member ids, sampling keys and the member chunk are
    /// those of one process with every process's devices, so each member's outputs are the
    /// bits that program computes for it. One process's program is `outputs_program`'s.
    pub fn part_outputs_program(
        &self,
        model: &dyn MemberOutputs,
        leaves: &[LeafInfo],
        part: Part,
    ) -> Result<Program, EsError> {
        let devices = self.local_devices(part)?;
        self.outputs_on(model, leaves, true, part.members(self.n), devices)
    }

    fn outputs_with(
        &self,
        model: &dyn MemberOutputs,
        leaves: &[LeafInfo],
        perturbed: bool,
    ) -> Result<Program, EsError> {
        self.outputs_on(model, leaves, perturbed, 0..self.n, self.devices)
    }

    /// The outputs program of the `members` (global ids) on `devices` devices.
    fn outputs_on(
        &self,
        model: &dyn MemberOutputs,
        leaves: &[LeafInfo],
        perturbed: bool,
        members: Range<usize>,
        devices: usize,
    ) -> Result<Program, EsError> {
        check_leaves(leaves)?;
        if leaves.len() >= SAMPLE_TAG as usize {
            return Err(invalid(
                format!("{} leaves", leaves.len()),
                "use fewer than 2^32 − 1 leaves (the sampling keys' tag is 2^32 − 1)".into(),
            ));
        }
        let chunk = self.member_chunk_for(&AsModel(model))?;
        let layout = Layout::new(
            ProgramKind::Outputs,
            leaves.to_vec(),
            model.input_types(),
            members.len(),
            1,
        )
        .with_outputs(model.output_types())
        .with_layers(model.layers().as_ref());
        let name = if perturbed {
            "outputs"
        } else {
            "plain_outputs"
        };
        let mut module = Module::with_mesh(name, Mesh::pop(devices as i64)?);
        let f = module.func("main");
        let args = layout.declare(&f)?;
        // A decoder reads its layers once per generated token, so noise drawn inside its
        // layer loop would be drawn again for every token: the layers' noise is drawn once
        // per chunk, in a loop over the layer index of its own (so a layer adds no ops),
        // and the model's loop reads its layer's rows. Strategies the emitter keeps leaf by
        // leaf (dense or materialized noise) draw every leaf once per chunk, unrolled.
        let emitter = Emitter::new(self, &layout, chunk)?
            .with_members(members.start, members.len())
            .with_layers(model.layers())
            .drawing_layers_per_chunk()
            .with_matrices_in_out(model.matrices_in_out());
        let outs = OutputsEmitter {
            es: self,
            emitter: &emitter,
            layout: &layout,
            chunk: chunk as i64,
            perturbed,
        }
        .emit(model, &f, &args)?;
        layout.emit_outputs(&f, &outs)?;
        module.add(f.finish()?)?;
        Ok(Program { module, layout })
    }
}

/// The outputs program's emission over the generation's [`Emitter`].
struct OutputsEmitter<'a> {
    es: &'a ShardedES,
    emitter: &'a Emitter<'a>,
    layout: &'a Layout,
    chunk: i64,
    perturbed: bool,
}

impl OutputsEmitter<'_> {
    /// The outputs of all members, `[n, …]` each, split over "pop".
    fn emit(
        &self,
        model: &dyn MemberOutputs,
        f: &Func,
        args: &ProgramArgs<Value>,
    ) -> Result<Vec<Value>, EsError> {
        let (base_key, _) = self.emitter.ask(&args.key, &args.generation)?;
        // This program's members' global ids (all `n` from 0 on one process).
        let ids = self.emitter.member_ids(f, &Sharding::split(1, 0)?)?;
        let mut inputs: Vec<&Value> = vec![&ids, &base_key];
        inputs.extend(args.params.iter());
        inputs.extend(args.batch.iter());
        let mut in_sh = vec![Sharding::split(1, 0)?, Sharding::replicated(1)];
        in_sh.extend(inputs[2..].iter().map(|v| Sharding::replicated(v.rank())));
        let out_sh = self
            .layout
            .output_types()
            .iter()
            .map(|t| Sharding::split(t.rank(), 0))
            .collect::<Result<Vec<_>, _>>()?;
        let nl = args.params.len();
        f.manual_computation(
            &inputs,
            &in_sh,
            &out_sh,
            |loc| -> Result<Vec<Value>, EsError> {
                let (params, batch) = (&loc[2..2 + nl], &loc[2 + nl..]);
                self.local(model, &loc[0], &loc[1], params, batch)
            },
        )
    }

    /// The local members' outputs, `member_chunk` at a time. Runs inside the manual
    /// computation; `ids` are this device's global member ids.
    fn local(
        &self,
        model: &dyn MemberOutputs,
        ids: &Value,
        base_key: &Value,
        params: &[Value],
        inputs: &[Value],
    ) -> Result<Vec<Value>, EsError> {
        let leaves = &self.layout.leaves[..];
        // Frozen leaves get no noise: draws and streams are the noised leaves' only.
        let active = self.emitter.active();
        let f = ids.func();
        let local = ids.shape()[0];
        let c = self.chunk;
        let p = self.es.strategy.pairing() as i64;
        let base = Keys::from_data(base_key)?;
        let streams = self.emitter.streams(&base)?;
        let sample = base.fold_in_const(SAMPLE_TAG)?;
        let all = if self.perturbed && self.es.strategy.materialized() {
            let (dirs, _) = directions(ids, p)?;
            Some(self.emitter.chunk_noise(&streams, active, &dirs, None)?)
        } else {
            None
        };
        // The matrices transposed once, before the chunks ([`MemberOutputs::matrices_in_out`]).
        let in_out = self.emitter.matrices_in_out();
        let stored;
        let params = if in_out {
            stored = self.layout.in_out(params)?;
            &stored[..]
        } else {
            params
        };
        let types = self.layout.outputs.clone();
        let mut inits = Vec::with_capacity(types.len());
        for (_, t) in &types {
            let mut shape = vec![local];
            shape.extend_from_slice(&t.shape);
            inits.push(zeros(&f, t.dtype, &shape)?);
        }
        let init_refs: Vec<&Value> = inits.iter().collect();
        f.fori_loop(
            0,
            (local / c) as i32,
            &init_refs,
            |i, carried| -> Result<Vec<Value>, EsError> {
                let start = i.mul(&f.scalar(c as i32)?)?;
                let ids_c = ids.dynamic_slice(&[&start], &[c])?;
                // Emitted after the parameters, as it always was.
                let info = || -> Result<MemberInfo, EsError> {
                    Ok(MemberInfo {
                        keys: sample.fold_in(&ids_c)?,
                        ids: ids_c.clone(),
                        perturbed: self.perturbed,
                    })
                };
                let outs = if self.perturbed {
                    let (dirs, signs) = directions(&ids_c, p)?;
                    let dstart = i.mul(&f.scalar((c / p) as i32)?)?;
                    self.emitter.on_chunk(
                        params,
                        &base,
                        &streams,
                        &dirs,
                        &signs,
                        all.as_deref().map(|n| (n, &dstart)),
                        |mp, _| model.outputs(mp, inputs, &info()?),
                    )?
                } else {
                    let mp = ModelParams::plain(
                        leaves
                            .iter()
                            .zip(self.layout.views(params)?)
                            .map(|(l, v)| (l.path.clone(), v))
                            .collect(),
                    );
                    let mp = if in_out { mp.matrices_in_out()? } else { mp };
                    let mp = mp.with_compute_dtype(self.es.compute_dtype())?;
                    model.outputs(&mp, inputs, &info()?)?
                };
                if outs.len() != types.len() {
                    return Err(invalid(
                        format!(
                            "the model returned {} outputs where its output_types has {}",
                            outs.len(),
                            types.len()
                        ),
                        "return one Act per MemberOutputs::output_types entry".into(),
                    ));
                }
                let zero = f.scalar(0i32)?;
                outs.iter()
                    .zip(&types)
                    .zip(carried)
                    .map(|((out, (name, t)), buf)| {
                        let v = per_member(out, name, t, c)?;
                        let mut at = vec![start.clone()];
                        at.resize(v.rank(), zero.clone());
                        let at: Vec<&Value> = at.iter().collect();
                        Ok(buf.dynamic_update_slice(&v, &at)?)
                    })
                    .collect()
            },
        )
    }
}

/// Zeros of any dtype.
fn zeros(f: &Func, dtype: DType, shape: &[i64]) -> Result<Value, EsError> {
    Ok(f.full(0.0f32, shape)?.convert(dtype)?)
}

/// `out` as `[c, …]`, checked against the declared per-member type `t`.
fn per_member(out: &Act, name: &str, t: &TensorType, c: i64) -> Result<Value, EsError> {
    let wrong = |what: String| {
        invalid(
            format!("output `{name}` {what}, where output_types declares {t} per member"),
            "return the declared type, per member (leading member axis) or shared".into(),
        )
    };
    if out.dtype() != t.dtype || out.logical_shape() != t.shape.as_slice() {
        return Err(wrong(format!(
            "has type {} (logical shape {:?})",
            out.value().ty(),
            out.logical_shape()
        )));
    }
    match out.members() {
        Some(m) if m == c => Ok(out.value().clone()),
        Some(m) => Err(wrong(format!("holds {m} members in a chunk of {c}"))),
        None => {
            let mut shape = vec![c];
            shape.extend_from_slice(&t.shape);
            let dims: Vec<usize> = (1..shape.len()).collect();
            Ok(out.value().broadcast_in_dim(&shape, &dims)?)
        }
    }
}
