//! The programs of a [`ShardedES`]: the generation (ask + apply + tell as one StableHLO
//! module, one or `k` generations per dispatch), split mode's two halves, the inference
//! limit and the no-op baseline.
//!
//! The program follows the spec's "State, ask and member ids", "Evaluation" and "Update"
//! sections; the private `generation` module emits them. Each entry point checks the
//! settings against the leaves and the model, resolves the member chunk for the model
//! ([`ShardedES::member_chunk_for`]), and declares its arguments and emits its results
//! through its [`Layout`].

use crate::builder::{Func, Mesh, Module, Sharding, Value};
use crate::prng::emit::Keys;

use super::error::{invalid, EsError};
use super::generation::Emitter;
use super::layout::{check_leaves, Layout, ProgramArgs, ProgramKind, ProgramResults};
use super::model::Model;
use super::optimizer::Optimizer;
use super::settings::ShardedES;
use super::shaping::NoShaping;
use super::strategy::{LeafInfo, Noise, Strategy};

/// A built program and its layout.
pub struct Program {
    /// The module (print with [`Module::to_mlir`]).
    pub module: Module,
    /// Argument/result positions.
    pub layout: Layout,
}

impl ShardedES {
    /// The `kind` layout for `model`; the fitness columns come from the model (the
    /// shaping's expectation, where it has one, must agree).
    fn layout_for(
        &self,
        kind: ProgramKind,
        model: &dyn Model,
        leaves: &[LeafInfo],
    ) -> Result<Layout, EsError> {
        let tasks = model.tasks();
        self.check_tasks(tasks)?;
        Ok(
            Layout::new(kind, leaves.to_vec(), model.batch_types(), self.n, tasks)
                .with_opt_state(self.optimizer.state_types(leaves))
                .with_layers(model.layers().as_ref()),
        )
    }

    /// The generation program: `(params…, key, generation, batch…) → (params'…,
    /// generation + 1, fitness)`. Params and generation are donated; the key is unchanged.
    pub fn generation_program(
        &self,
        model: &dyn Model,
        leaves: &[LeafInfo],
    ) -> Result<Program, EsError> {
        self.generation_program_multi(model, leaves, 1)
    }

    /// `k` generations in one program: the same arguments and results as
    /// [`ShardedES::generation_program`], with a `while` over generations inside, so one
    /// dispatch advances the state by `k` (generation + k) and returns the fitness of the
    /// last generation. Each iteration is exactly one generation's ask/apply/tell, so the
    /// parameters match `k` single steps. `k = 1` is the single-generation program.
    pub fn generation_program_multi(
        &self,
        model: &dyn Model,
        leaves: &[LeafInfo],
        k: usize,
    ) -> Result<Program, EsError> {
        let steps = i32::try_from(k).ok().filter(|&s| s > 0).ok_or_else(|| {
            invalid(
                format!("{k} generations per dispatch"),
                "use between 1 and 2^31 − 1 generations per dispatch".into(),
            )
        })?;
        check_leaves(leaves)?;
        let chunk = self.member_chunk_for(model)?;
        let layout = self.layout_for(ProgramKind::Generation, model, leaves)?;
        self.build("generation", layout, |_, layout, args| {
            Emitter::new(self, layout, chunk)?
                .with_layers(model.layers())
                .generations(model, args, steps)
        })
    }

    /// The split mode's first half: `(params…, key, generation, batch…) → fitness`, nothing
    /// donated. Pair it with [`ShardedES::tell_program`] for the same model to compute
    /// rewards outside XLA.
    pub fn ask_apply_program(
        &self,
        model: &dyn Model,
        leaves: &[LeafInfo],
    ) -> Result<Program, EsError> {
        check_leaves(leaves)?;
        let chunk = self.member_chunk_for(model)?;
        let layout = self.layout_for(ProgramKind::AskApply, model, leaves)?;
        self.build("ask_apply", layout, |_, layout, args| {
            Emitter::new(self, layout, chunk)?
                .with_layers(model.layers())
                .ask_apply(model, args)
        })
    }

    /// The split mode's second half: `(params…, key, generation, fitness) → (params'…,
    /// generation + 1)` with a host-provided f32 fitness (replicated input); params and
    /// generation are donated.
    ///
    /// `model` is the one [`ShardedES::ask_apply_program`] evaluates: its
    /// [`Model::tasks`] sets the fitness columns, and its [`Model::member_bytes`] the
    /// member chunk `tell` sizes its own chunk after ([`ShardedES::member_chunk_for`]), so
    /// split mode regenerates the noise in the same chunks as the fused generation program
    /// for that model. Its batch and loss are not used.
    pub fn tell_program(&self, model: &dyn Model, leaves: &[LeafInfo]) -> Result<Program, EsError> {
        let tasks = model.tasks();
        self.check_tasks(tasks)?;
        check_leaves(leaves)?;
        let chunk = self.member_chunk_for(model)?;
        let layout = Layout::new(
            ProgramKind::Tell,
            leaves.to_vec(),
            Vec::new(),
            self.n,
            tasks,
        )
        .with_opt_state(self.optimizer.state_types(leaves))
        .with_layers(model.layers().as_ref());
        self.build("tell", layout, |_, layout, args| {
            Emitter::new(self, layout, chunk)?
                .with_layers(model.layers())
                .tell_host(args)
        })
    }

    /// A zero-noise variant for the inference limit: the same member chunking, sharding
    /// and loss through the unperturbed parameters, every member evaluated. Its layout is
    /// the ask_apply program's.
    pub fn inference_program(
        &self,
        model: &dyn Model,
        leaves: &[LeafInfo],
    ) -> Result<Program, EsError> {
        let zero = ShardedES {
            strategy: Box::new(ZeroNoise),
            n: self.n,
            sigma: self.sigma,
            lr: self.lr,
            devices: self.devices,
            shaping: Box::new(NoShaping),
            how: self.how,
            member_chunk: Some(self.member_chunk_for(model)?),
            member_bytes: self.member_bytes,
            device_invariant: self.device_invariant,
            keep_noise_bytes: 0,
            // Never steps: the inference program has no tell.
            optimizer: Optimizer::sgd(),
            leaf_sigma: Default::default(),
            compute_dtype: self.compute_dtype,
        };
        zero.ask_apply_program(model, leaves)
    }

    /// A program with the generation program's arguments, results and donation that
    /// computes nothing: the parameters (and any optimizer state) plus zero (one pass over
    /// them, as a real update has; an identity would be aliased away), generation + 1, and
    /// a zero fitness. Timing it measures a dispatch's host overhead.
    pub fn noop_program(&self, model: &dyn Model, leaves: &[LeafInfo]) -> Result<Program, EsError> {
        check_leaves(leaves)?;
        let layout = self.layout_for(ProgramKind::Generation, model, leaves)?;
        self.build("noop", layout, |f, layout, args| {
            let params = args
                .params
                .iter()
                .zip(layout.slot_types())
                .map(|(p, ty)| Ok(p.add(&f.full(0.0f32, &ty.shape)?)?))
                .collect::<Result<Vec<Value>, EsError>>()?;
            let generation = args.generation.add(&f.scalar(1u32)?)?;
            let ty = layout.fitness_type();
            let fitness = f
                .full(0.0f32, &ty.shape)?
                .shard(&Sharding::split(ty.rank(), 0)?)?;
            let opt_state = args
                .opt_state
                .iter()
                .zip(&layout.opt_state)
                .map(|(v, (_, ty))| Ok(v.add(&f.full(0.0f32, &ty.shape)?)?))
                .collect::<Result<Vec<Value>, EsError>>()?;
            Ok(ProgramResults {
                params,
                generation: Some(generation),
                fitness: Some(fitness),
                opt_state,
            })
        })
    }

    /// Declares `layout`'s arguments in a fresh module `name` over the population mesh,
    /// emits what `body` computes from them as its results, and closes the module.
    fn build(
        &self,
        name: &str,
        layout: Layout,
        body: impl FnOnce(&Func, &Layout, &ProgramArgs<Value>) -> Result<ProgramResults<Value>, EsError>,
    ) -> Result<Program, EsError> {
        build_on(name, self.devices, layout, body)
    }
}

/// Declares `layout`'s arguments in a fresh module `name` over a population mesh of
/// `devices`, emits what `body` computes from them as its results, and closes the module.
pub(super) fn build_on(
    name: &str,
    devices: usize,
    layout: Layout,
    body: impl FnOnce(&Func, &Layout, &ProgramArgs<Value>) -> Result<ProgramResults<Value>, EsError>,
) -> Result<Program, EsError> {
    let mut module = Module::with_mesh(name, Mesh::pop(devices as i64)?);
    let f = module.func("main");
    let args = layout.declare(&f)?;
    let results = body(&f, &layout, &args)?;
    layout.emit(&f, results)?;
    module.add(f.finish()?)?;
    Ok(Program { module, layout })
}

/// Noise that is exactly zero and free, in the per-member layout: the inference baseline.
struct ZeroNoise;

impl Strategy for ZeroNoise {
    fn name(&self) -> String {
        "zero".into()
    }

    fn noise(
        &self,
        _stream: &Keys,
        leaf: &LeafInfo,
        dirs: &Value,
    ) -> crate::builder::Result<Noise> {
        let mut shape = vec![dirs.shape()[0]];
        shape.extend_from_slice(&leaf.shape);
        // Zero, but computed from the member ids: a constant zero lets XLA prove every
        // member's weights equal and evaluate one member for the whole chunk, which is
        // not the inference of n members this program stands for. `id · 0` is not folded
        // for floats (NaN semantics), so each member keeps its own weights.
        let f = dirs.func();
        let z = dirs
            .convert(crate::builder::DType::F32)?
            .mul(&f.scalar(0.0f32)?)?;
        Ok(Noise::Dense(z.broadcast_in_dim(&shape, &[0])?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builder::{DType, TensorType};
    use crate::es::{leaf_infos, EsSpec, CHUNK_BYTES};
    use crate::prng::key;
    use crate::problems::transformer_block::TransformerBlock;

    fn quickstart() -> (TransformerBlock, Vec<LeafInfo>) {
        let tb = TransformerBlock::QUICKSTART;
        let leaves = leaf_infos(&tb.init(key(0).unwrap()).unwrap());
        (tb, leaves)
    }

    /// `src/bench.rs::host_overhead`'s program as it built it by hand (the oracle).
    fn bench_noop(model: &dyn Model, leaves: &[LeafInfo], es: &ShardedES) -> String {
        let devices = es.devices();
        let mut module = Module::with_mesh("noop", Mesh::pop(devices as i64).unwrap());
        let f = module.func("main");
        let mut params = Vec::new();
        for (j, l) in leaves.iter().enumerate() {
            params.push(
                f.arg_donated(
                    &l.path,
                    TensorType::f32(&l.shape),
                    &Sharding::replicated(l.shape.len()),
                    j,
                )
                .unwrap(),
            );
        }
        f.arg_sharded("key", TensorType::u32(&[2]), &Sharding::replicated(1))
            .unwrap();
        let generation = f
            .arg_donated(
                "generation",
                TensorType::scalar(DType::U32),
                &Sharding::replicated(0),
                leaves.len(),
            )
            .unwrap();
        for (name, ty) in model.batch_types() {
            f.arg_sharded(&name, ty.clone(), &Sharding::replicated(ty.rank()))
                .unwrap();
        }
        for (p, l) in params.iter().zip(leaves) {
            let z = p.add(&f.full(0.0f32, &l.shape).unwrap()).unwrap();
            f.output_sharded(&z, &Sharding::replicated(l.shape.len()))
                .unwrap();
        }
        f.output_sharded(
            &generation.add(&f.scalar(1u32).unwrap()).unwrap(),
            &Sharding::replicated(0),
        )
        .unwrap();
        let fit = f
            .full(0.0f32, &[es.n() as i64])
            .unwrap()
            .shard(&Sharding::split(1, 0).unwrap())
            .unwrap();
        f.output_sharded(&fit, &Sharding::split(1, 0).unwrap())
            .unwrap();
        module.add(f.finish().unwrap()).unwrap();
        module.to_mlir()
    }

    #[test]
    fn the_noop_program_prints_what_the_bench_built_by_hand() {
        let (tb, leaves) = quickstart();
        for devices in [1, 8] {
            let es = EsSpec::new(256, 0.01, 0.01).build(devices).unwrap();
            let program = es.noop_program(&tb, &leaves).unwrap();
            assert_eq!(program.module.to_mlir(), bench_noop(&tb, &leaves, &es));
            assert_eq!(program.layout.kind, ProgramKind::Generation);
            assert_eq!(
                program.layout,
                es.generation_program(&tb, &leaves).unwrap().layout
            );
        }
    }

    #[test]
    fn programs_for_a_model_take_its_member_size_unless_one_is_set() {
        let (tb, leaves) = quickstart();
        let es = || EsSpec::new(256, 0.01, 0.01).build(8).unwrap();
        let given = || es().with_member_bytes(tb.member_bytes());
        let text = |r: Result<Program, EsError>| r.unwrap().module.to_mlir();
        assert_eq!(
            text(es().generation_program(&tb, &leaves)),
            text(given().generation_program(&tb, &leaves))
        );
        assert_eq!(
            text(es().generation_program_multi(&tb, &leaves, 2)),
            text(given().generation_program_multi(&tb, &leaves, 2))
        );
        assert_eq!(
            text(es().ask_apply_program(&tb, &leaves)),
            text(given().ask_apply_program(&tb, &leaves))
        );
        assert_eq!(
            text(es().tell_program(&tb, &leaves)),
            text(given().tell_program(&tb, &leaves))
        );
        assert_eq!(
            text(es().inference_program(&tb, &leaves)),
            text(given().inference_program(&tb, &leaves))
        );
        // A size set on the ES wins: a smaller chunk, another program.
        let small = es().with_member_bytes(Some(CHUNK_BYTES * 4));
        assert_ne!(
            text(small.generation_program(&tb, &leaves)),
            text(given().generation_program(&tb, &leaves))
        );
    }

    #[test]
    fn every_program_has_the_layout_of_its_kind() {
        let (tb, leaves) = quickstart();
        let es = EsSpec::new(64, 0.01, 0.01).build(2).unwrap();
        for (program, kind) in [
            (es.generation_program(&tb, &leaves), ProgramKind::Generation),
            (es.ask_apply_program(&tb, &leaves), ProgramKind::AskApply),
            (es.tell_program(&tb, &leaves), ProgramKind::Tell),
            (es.inference_program(&tb, &leaves), ProgramKind::AskApply),
        ] {
            let layout = program.unwrap().layout;
            assert_eq!(layout.kind, kind);
            assert_eq!((layout.n, layout.tasks), (64, 1));
            assert_eq!(layout.leaves, leaves);
            assert_eq!(layout.batch.is_empty(), kind == ProgramKind::Tell);
        }
    }
}
