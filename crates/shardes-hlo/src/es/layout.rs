//! [`Layout`], the one owner of a program's argument and result order.
//!
//! | kind | arguments | results | donated |
//! |---|---|---|---|
//! | [`ProgramKind::Generation`] | `params…, key, generation, batch…, opt…` | `params'…, generation', fitness, opt'…` | params, generation, opt |
//! | [`ProgramKind::AskApply`] | `params…, key, generation, batch…` | `fitness` | nothing |
//! | [`ProgramKind::Tell`] | `params…, key, generation, fitness, opt…` | `params'…, generation', opt'…` | params, generation, opt |
//! | [`ProgramKind::Outputs`] | `params…, key, generation, inputs…` | `outputs…` (each `[n, …]`) | nothing |
//! | [`ProgramKind::Partial`] | `params…, key, generation, fitness` | `u…` (one row per device) | nothing |
//! | [`ProgramKind::Update`] | `params…, key, generation, u…, opt…` | `params'…, generation', opt'…` | params, generation, opt |
//!
//! The last two split `tell` at the sum over members for a population run across processes
//! ([`super::processes`]): a partial program returns one process's share of the sum `u`
//! of every leaf that gets noise ([`Layout::sums`]; `[D, ..leaf]` split over `"pop"`: each
//! device's own sum, unreduced), and the update program applies the sum of all shares
//! (taken where the other kinds take the batch, each named `u.<leaf path>`).
//! `opt…` is the optimizer's state ([`Layout::opt_state`]; none for `sgd`, so an sgd
//! program has exactly the arguments and results it had before optimizers existed). It
//! comes last on both sides so that every other position is the same with or without it.
//! The inference program has the ask_apply layout and the no-op program the generation
//! layout. The program entry points declare their arguments ([`Layout::declare`]) and emit
//! their results ([`Layout::emit`]) through it; a host builds each device's argument list
//! with [`Layout::args`] and takes its results apart with [`Layout::split_results`].
//!
//! `params…` are the layout's parameter *slots* ([`Layout::slots`]): one per leaf, except
//! that a model whose layers are a loop ([`Layout::with_layers`]) has each layer leaf name
//! held as one `[L, …]` argument (a [`Stack`]) in the place of its layer-0 leaf, so that a
//! layer's weights are read by a `dynamic_slice` of the stacks and a leaf name's update is
//! one kernel for every layer. The tree, checkpoints, the optimizer's state and the sums
//! of a run across processes stay per leaf: [`Layout::views`] gives the emitter every
//! leaf's value from the slots and [`Layout::restack`] the slots from every leaf's value.

use crate::builder::{DType, Func, Sharding, TensorType, Value};

use super::error::{invalid, EsError};
use super::strategy::LeafInfo;

mod stacks;

pub use stacks::{Slot, Stack};

/// Which program a [`Layout`] describes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProgramKind {
    /// One or more whole generations (also the no-op program of the same shape).
    Generation,
    /// Split mode's first half, `ask + apply` (also the inference program).
    AskApply,
    /// Split mode's second half, `tell` with a host fitness.
    Tell,
    /// Per-member outputs instead of a loss ([`crate::es::MemberOutputs`]): the inputs
    /// take the batch's place, and the results are the outputs ([`Layout::outputs`]).
    Outputs,
    /// One process's share of `tell`'s sum over members, with a host fitness.
    Partial,
    /// The update with a host sum `u` of every leaf that gets noise, and the next
    /// generation.
    Update,
}

impl ProgramKind {
    /// The name in messages: `generation`, `ask_apply`, `tell`, `outputs`, `partial`,
    /// `update`.
    pub fn name(self) -> &'static str {
        match self {
            ProgramKind::Generation => "generation",
            ProgramKind::AskApply => "ask_apply",
            ProgramKind::Tell => "tell",
            ProgramKind::Outputs => "outputs",
            ProgramKind::Partial => "partial",
            ProgramKind::Update => "update",
        }
    }

    /// Whether the program takes a host fitness after `generation`.
    fn takes_fitness(self) -> bool {
        matches!(self, ProgramKind::Tell | ProgramKind::Partial)
    }
}

/// Argument and result positions of a program.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// The program this layout describes.
    pub kind: ProgramKind,
    /// The parameter leaves, in order (arguments `0..L`, and results `0..L` where the
    /// program returns parameters).
    pub leaves: Vec<LeafInfo>,
    /// Names and types of the batch arguments (after `key` and `generation`; empty for
    /// [`ProgramKind::Tell`] and [`ProgramKind::Partial`], which take the fitness there
    /// instead; for [`ProgramKind::Update`] the sum of each of [`Layout::sums`],
    /// `u.<path>`).
    pub batch: Vec<(String, TensorType)>,
    /// Population size.
    pub n: usize,
    /// Fitness columns per member (1 unless the model returns several tasks).
    pub tasks: usize,
    /// Names and per-member types (without the member axis) of the results of a
    /// [`ProgramKind::Outputs`] program ([`Layout::with_outputs`]); empty for the others.
    pub outputs: Vec<(String, TensorType)>,
    /// Names and types of the optimizer's state ([`crate::es::Optimizer::state_types`];
    /// empty for `sgd`). Programs that donate the state take it after their other
    /// arguments and return it after their other results; the others ignore it.
    pub opt_state: Vec<(String, TensorType)>,
    /// The leaves whose sum over members a [`ProgramKind::Partial`] program returns and a
    /// [`ProgramKind::Update`] program takes: those that get noise ([`Layout::with_sums`];
    /// all leaves by default); empty for the other kinds.
    pub sums: Vec<LeafInfo>,
    /// The layer leaves held as `[L, …]` arguments ([`Layout::with_layers`]); empty
    /// unless the model's layers are a loop.
    pub stacks: Vec<Stack>,
    /// The parameter arguments (and results) in order: [`Slot::Leaf`] for each leaf outside
    /// the stacks, [`Slot::Stack`] where a stack's layer-0 leaf would be.
    slots: Vec<Slot>,
}

/// A program's arguments by role, in the order of [`Layout::args`].
#[derive(Clone, Debug, PartialEq)]
pub struct ProgramArgs<T> {
    /// One per leaf.
    pub params: Vec<T>,
    /// The run's key (`u32[2]`).
    pub key: T,
    /// The generation (u32 scalar).
    pub generation: T,
    /// The batch (empty for [`ProgramKind::Tell`]).
    pub batch: Vec<T>,
    /// The host fitness ([`ProgramKind::Tell`] only).
    pub fitness: Option<T>,
    /// The optimizer's state, one per [`Layout::opt_state`] entry (empty where the kind
    /// takes none).
    pub opt_state: Vec<T>,
}

/// A program's results by role ([`Layout::emit`], [`Layout::split_results`]).
#[derive(Clone, Debug, PartialEq)]
pub struct ProgramResults<T> {
    /// The new parameters, one per leaf (empty for [`ProgramKind::AskApply`]).
    pub params: Vec<T>,
    /// The next generation (none for [`ProgramKind::AskApply`]).
    pub generation: Option<T>,
    /// The fitness (none for [`ProgramKind::Tell`]).
    pub fitness: Option<T>,
    /// The optimizer's next state, one per [`Layout::opt_state`] entry (empty where the
    /// kind returns none).
    pub opt_state: Vec<T>,
}

impl Layout {
    /// The layout of a `kind` program over `leaves` (in [`crate::es::leaf_infos`] order)
    /// with `batch` inputs, `n` members and `tasks` fitness columns. A tell program takes
    /// no batch, so `batch` is dropped for [`ProgramKind::Tell`].
    pub fn new(
        kind: ProgramKind,
        leaves: Vec<LeafInfo>,
        batch: Vec<(String, TensorType)>,
        n: usize,
        tasks: usize,
    ) -> Layout {
        let sums = match kind {
            ProgramKind::Partial | ProgramKind::Update => leaves.clone(),
            _ => Vec::new(),
        };
        let batch = match kind {
            ProgramKind::Tell | ProgramKind::Partial => Vec::new(),
            ProgramKind::Update => sum_types(&sums),
            _ => batch,
        };
        let slots = (0..leaves.len()).map(Slot::Leaf).collect();
        Layout {
            kind,
            leaves,
            batch,
            n,
            tasks,
            outputs: Vec::new(),
            opt_state: Vec::new(),
            sums,
            stacks: Vec::new(),
            slots,
        }
    }

    /// A partial or update layout over the sums of `leaves` only (those that get noise,
    /// in leaf order); other kinds are returned as they are.
    pub fn with_sums(mut self, leaves: &[LeafInfo]) -> Layout {
        if matches!(self.kind, ProgramKind::Partial | ProgramKind::Update) {
            self.sums = leaves.to_vec();
            if self.kind == ProgramKind::Update {
                self.batch = sum_types(&self.sums);
            }
        }
        self
    }

    /// The same layout with the optimizer's state `types` ([`Layout::opt_state`]).
    pub fn with_opt_state(mut self, types: Vec<(String, TensorType)>) -> Layout {
        self.opt_state = types;
        self
    }

    /// How many optimizer state arguments (and results) the program has: all of
    /// [`Layout::opt_state`] where it donates the state, else none.
    pub fn opt_count(&self) -> usize {
        if self.donates() {
            self.opt_state.len()
        } else {
            0
        }
    }

    /// Index of the first optimizer state argument (none without any).
    pub fn opt_arg(&self) -> Option<usize> {
        (self.opt_count() > 0).then(|| self.generation_arg() + 1 + self.tail_count())
    }

    /// Index of the first optimizer state result (none without any).
    pub fn opt_result(&self) -> Option<usize> {
        (self.opt_count() > 0).then(|| self.result_count() - self.opt_count())
    }

    /// This layout with the per-member `outputs` (names and types without the member
    /// axis) of a [`ProgramKind::Outputs`] program.
    pub fn with_outputs(mut self, outputs: Vec<(String, TensorType)>) -> Layout {
        self.outputs = outputs;
        self
    }

    /// The outputs' global types, `[n, …per-member shape]`, in result order.
    pub fn output_types(&self) -> Vec<TensorType> {
        self.outputs
            .iter()
            .map(|(_, t)| {
                let mut shape = vec![self.n as i64];
                shape.extend_from_slice(&t.shape);
                TensorType::new(t.dtype, &shape)
            })
            .collect()
    }

    /// Index of the `key` argument (`u32[2]`), right after the parameters.
    pub fn key_arg(&self) -> usize {
        self.slots.len()
    }

    /// Index of the `generation` argument (u32 scalar).
    pub fn generation_arg(&self) -> usize {
        self.slots.len() + 1
    }

    /// Index of the first batch argument (none for [`ProgramKind::Tell`] and
    /// [`ProgramKind::Partial`]; for [`ProgramKind::Update`], the first sum).
    pub fn batch_arg(&self) -> Option<usize> {
        (!self.kind.takes_fitness()).then_some(self.slots.len() + 2)
    }

    /// Index of the fitness argument ([`ProgramKind::Tell`] and [`ProgramKind::Partial`]
    /// only).
    pub fn fitness_arg(&self) -> Option<usize> {
        self.kind.takes_fitness().then_some(self.slots.len() + 2)
    }

    /// The number of arguments.
    pub fn arg_count(&self) -> usize {
        self.generation_arg() + 1 + self.tail_count() + self.opt_count()
    }

    /// Index of the `generation` result (none for [`ProgramKind::AskApply`] and
    /// [`ProgramKind::Outputs`]).
    pub fn generation_result(&self) -> Option<usize> {
        self.returns_state().then_some(self.slots.len())
    }

    /// Whether the program returns new parameters and generation.
    fn returns_state(&self) -> bool {
        matches!(
            self.kind,
            ProgramKind::Generation | ProgramKind::Tell | ProgramKind::Update
        )
    }

    /// Index of the fitness result (none for [`ProgramKind::Tell`]).
    pub fn fitness_result(&self) -> Option<usize> {
        match self.kind {
            ProgramKind::Generation => Some(self.slots.len() + 1),
            ProgramKind::AskApply => Some(0),
            ProgramKind::Tell
            | ProgramKind::Outputs
            | ProgramKind::Partial
            | ProgramKind::Update => None,
        }
    }

    /// The number of results.
    pub fn result_count(&self) -> usize {
        self.param_results()
            + [self.generation_result(), self.fitness_result()]
                .iter()
                .flatten()
                .count()
            + self.outputs.len()
            + self.opt_count()
    }

    /// Whether the program consumes the parameter and generation buffers it is given
    /// (donated into the results of the same role).
    pub fn donates(&self) -> bool {
        self.returns_state()
    }

    /// The fitness dimensions: `[n]`, or `[n, tasks]` for several tasks.
    pub fn fitness_dims(&self) -> Vec<usize> {
        let mut dims = vec![self.n];
        if self.tasks > 1 {
            dims.push(self.tasks);
        }
        dims
    }

    /// The fitness type: `f32[n]`, or `f32[n, tasks]` for several tasks.
    pub fn fitness_type(&self) -> TensorType {
        let dims: Vec<i64> = self.fitness_dims().iter().map(|&d| d as i64).collect();
        TensorType::f32(&dims)
    }

    /// Parameter results (`L`, or 0 for [`ProgramKind::AskApply`] and
    /// [`ProgramKind::Outputs`]; a partial program's sums take their place).
    fn param_results(&self) -> usize {
        if self.returns_state() {
            self.slots.len()
        } else if self.kind == ProgramKind::Partial {
            self.sums.len()
        } else {
            0
        }
    }

    /// Arguments after `generation`: the batch (an update program's sums), or the one
    /// fitness of a tell or partial program.
    fn tail_count(&self) -> usize {
        if self.kind.takes_fitness() {
            1
        } else {
            self.batch.len()
        }
    }

    fn count_error(&self, what: &str, got: usize, expected: usize, detail: String) -> EsError {
        EsError::Layout {
            program: self.kind.name().into(),
            what: what.into(),
            got,
            expected,
            detail,
        }
    }

    fn describe_results(&self) -> String {
        let l = self.slots.len();
        let main = match self.kind {
            ProgramKind::Generation => format!("{l} parameters + generation + fitness"),
            ProgramKind::AskApply => "fitness".into(),
            ProgramKind::Tell | ProgramKind::Update => format!("{l} parameters + generation"),
            ProgramKind::Partial => format!("{} sums, one per leaf with noise", self.sums.len()),
            ProgramKind::Outputs => self
                .outputs
                .iter()
                .map(|(n, _)| n.as_str())
                .collect::<Vec<_>>()
                .join(" + "),
        };
        match self.opt_count() {
            0 => main,
            k => format!("{main} + {k} optimizer state"),
        }
    }

    fn describe_opt_state(&self) -> String {
        self.opt_state
            .iter()
            .map(|(n, t)| format!("{n}: {t}"))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Declares the arguments of `f` in order, every one replicated: the parameter
    /// slots (f32, named by their leaf paths or stack names) and `generation` donated to
    /// their results where the kind donates, `key`, then the batch or the `fitness`, then
    /// the optimizer state (donated).
    pub fn declare(&self, f: &Func) -> Result<ProgramArgs<Value>, EsError> {
        let mut params = Vec::with_capacity(self.slots.len());
        for (j, slot) in self.slots.iter().enumerate() {
            let ty = self.slot_type(*slot);
            let sh = Sharding::replicated(ty.rank());
            let name = self.slot_name(*slot);
            params.push(if self.donates() {
                f.arg_donated(name, ty, &sh, j)?
            } else {
                f.arg_sharded(name, ty, &sh)?
            });
        }
        let key = f.arg_sharded("key", TensorType::u32(&[2]), &Sharding::replicated(1))?;
        let (ty, sh) = (TensorType::scalar(DType::U32), Sharding::replicated(0));
        let generation = match self.generation_result() {
            Some(out) if self.donates() => f.arg_donated("generation", ty, &sh, out)?,
            _ => f.arg_sharded("generation", ty, &sh)?,
        };
        let mut batch = Vec::with_capacity(self.batch.len());
        for (name, ty) in &self.batch {
            batch.push(f.arg_sharded(name, ty.clone(), &Sharding::replicated(ty.rank()))?);
        }
        let fitness = match self.fitness_arg() {
            Some(_) => {
                let ty = self.fitness_type();
                let sh = Sharding::replicated(ty.rank());
                Some(f.arg_sharded("fitness", ty, &sh)?)
            }
            None => None,
        };
        let mut opt_state = Vec::with_capacity(self.opt_count());
        if let Some(first) = self.opt_result() {
            for (i, (name, ty)) in self.opt_state.iter().enumerate() {
                let sh = Sharding::replicated(ty.rank());
                opt_state.push(f.arg_donated(name, ty.clone(), &sh, first + i)?);
            }
        }
        Ok(ProgramArgs {
            params,
            key,
            generation,
            batch,
            fitness,
            opt_state,
        })
    }

    /// Emits `results` as the results of `f`, in order: parameters (a partial program's
    /// sums, split over `"pop"` by device) and generation replicated, the fitness split
    /// over `"pop"` by member. Refuses a part the kind does not return, or one it lacks.
    pub fn emit(&self, f: &Func, results: ProgramResults<Value>) -> Result<(), EsError> {
        self.check_results(&results)?;
        if self.kind == ProgramKind::Partial {
            for (u, l) in results.params.iter().zip(&self.sums) {
                f.output_sharded(u, &Sharding::split(l.shape.len() + 1, 0)?)?;
            }
        } else {
            for (p, ty) in results.params.iter().zip(self.slot_types()) {
                f.output_sharded(p, &Sharding::replicated(ty.rank()))?;
            }
        }
        if let Some(g) = &results.generation {
            f.output_sharded(g, &Sharding::replicated(0))?;
        }
        if let Some(fit) = &results.fitness {
            f.output_sharded(fit, &Sharding::split(self.fitness_dims().len(), 0)?)?;
        }
        for v in &results.opt_state {
            f.output_sharded(v, &Sharding::replicated(v.rank()))?;
        }
        Ok(())
    }

    fn check_results<T>(&self, r: &ProgramResults<T>) -> Result<(), EsError> {
        let parts = [
            (
                "parameter results",
                r.params.len(),
                self.param_results(),
                "one per parameter argument",
            ),
            (
                "generation results",
                usize::from(r.generation.is_some()),
                usize::from(self.generation_result().is_some()),
                "the next generation",
            ),
            (
                "fitness results",
                usize::from(r.fitness.is_some()),
                usize::from(self.fitness_result().is_some()),
                "the fitness",
            ),
            (
                "optimizer state results",
                r.opt_state.len(),
                self.opt_count(),
                "one per optimizer state tensor",
            ),
        ];
        for (what, got, expected, detail) in parts {
            if got != expected {
                return Err(self.count_error(what, got, expected, detail.into()));
            }
        }
        Ok(())
    }

    /// One device's argument list, in order: `params` (one per [`Layout::slots`] entry),
    /// `key`, `generation`,
    /// then `tail`, which is the batch (one per [`Layout::batch`] entry) or, for
    /// [`ProgramKind::Tell`], the one fitness. Works on anything a host passes (buffers,
    /// references to them, host arrays). A layout with optimizer state takes
    /// [`Layout::args_with_state`].
    pub fn args<T>(
        &self,
        params: impl IntoIterator<Item = T>,
        key: T,
        generation: T,
        tail: impl IntoIterator<Item = T>,
    ) -> Result<Vec<T>, EsError> {
        self.args_with_state(params, key, generation, tail, std::iter::empty())
    }

    /// [`Layout::args`] followed by the optimizer state (one per [`Layout::opt_state`]
    /// entry where the kind takes it, else none).
    pub fn args_with_state<T>(
        &self,
        params: impl IntoIterator<Item = T>,
        key: T,
        generation: T,
        tail: impl IntoIterator<Item = T>,
        opt_state: impl IntoIterator<Item = T>,
    ) -> Result<Vec<T>, EsError> {
        let mut out: Vec<T> = Vec::with_capacity(self.arg_count());
        out.extend(params);
        if out.len() != self.key_arg() {
            return Err(self.count_error(
                "parameter arguments",
                out.len(),
                self.key_arg(),
                "one per leaf or layer stack".into(),
            ));
        }
        out.push(key);
        out.push(generation);
        out.extend(tail);
        let got = out.len() - (self.generation_arg() + 1);
        if got != self.tail_count() {
            let (what, detail) = match self.kind {
                ProgramKind::Tell | ProgramKind::Partial => {
                    ("fitness arguments", format!("{}", self.fitness_type()))
                }
                ProgramKind::Update => ("update arguments", "one per leaf with noise".into()),
                _ => (
                    "batch arguments",
                    if self.batch.is_empty() {
                        "none".into()
                    } else {
                        self.batch
                            .iter()
                            .map(|(n, t)| format!("{n}: {t}"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    },
                ),
            };
            return Err(self.count_error(what, got, self.tail_count(), detail));
        }
        let before = out.len();
        out.extend(opt_state);
        if out.len() - before != self.opt_count() {
            return Err(self.count_error(
                "optimizer state arguments",
                out.len() - before,
                self.opt_count(),
                self.describe_opt_state(),
            ));
        }
        Ok(out)
    }

    /// Takes one device's result list apart by role, refusing a list of the wrong length
    /// (and an outputs program's list, which [`Layout::split_outputs`] takes).
    pub fn split_results<T>(&self, mut results: Vec<T>) -> Result<ProgramResults<T>, EsError> {
        if self.kind == ProgramKind::Outputs {
            return Err(invalid(
                "the results of an outputs program were split as a state".into(),
                "take them with Layout::split_outputs".into(),
            ));
        }
        if results.len() != self.result_count() {
            return Err(self.count_error(
                "results",
                results.len(),
                self.result_count(),
                self.describe_results(),
            ));
        }
        // The optimizer state is last and the fitness comes after the generation, so
        // removing them in this order keeps the indices; all are in range after the length
        // check.
        let opt_state = results.split_off(results.len() - self.opt_count());
        let fitness = self.fitness_result().map(|i| results.remove(i));
        let generation = self.generation_result().map(|i| results.remove(i));
        Ok(ProgramResults {
            params: results,
            generation,
            fitness,
            opt_state,
        })
    }
}

impl Layout {
    /// Emits the per-member `outputs` (`[n, …]` each, in [`Layout::outputs`] order) as the
    /// results of `f`, each split over `"pop"` by member, refusing a list of the wrong
    /// length or a value of another type.
    pub fn emit_outputs(&self, f: &Func, outputs: &[Value]) -> Result<(), EsError> {
        let types = self.output_types();
        if outputs.len() != types.len() {
            return Err(self.count_error(
                "output results",
                outputs.len(),
                types.len(),
                self.describe_results(),
            ));
        }
        for (v, t) in outputs.iter().zip(&types) {
            if v.ty() != t {
                return Err(invalid(
                    format!(
                        "an output of the {} program is {} where its layout has {t}",
                        self.kind.name(),
                        v.ty()
                    ),
                    "return each output with the type of MemberOutputs::output_types (per member)"
                        .into(),
                ));
            }
            f.output_sharded(v, &Sharding::split(t.rank(), 0)?)?;
        }
        Ok(())
    }

    /// One device's results of an outputs program, one per [`Layout::outputs`] entry
    /// (this device's rows of each), refusing a list of the wrong length.
    pub fn split_outputs<T>(&self, results: Vec<T>) -> Result<Vec<T>, EsError> {
        if self.kind != ProgramKind::Outputs || results.len() != self.outputs.len() {
            return Err(self.count_error(
                "output results",
                results.len(),
                self.outputs.len(),
                self.describe_results(),
            ));
        }
        Ok(results)
    }
}

/// The sum arguments of an update program over `sums`: `u.<path>`, f32 of the leaf's shape.
fn sum_types(sums: &[LeafInfo]) -> Vec<(String, TensorType)> {
    sums.iter()
        .map(|l| (format!("u.{}", l.path), TensorType::f32(&l.shape)))
        .collect()
}

/// Refuses leaves out of [`crate::es::leaf_infos`] order: a leaf's index is its argument
/// position.
pub(super) fn check_leaves(leaves: &[LeafInfo]) -> Result<(), EsError> {
    for (j, l) in leaves.iter().enumerate() {
        if l.index != j {
            return Err(EsError::Param {
                path: l.path.clone(),
                reason: format!("leaf index {} at position {j}; use leaf_infos()", l.index),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
