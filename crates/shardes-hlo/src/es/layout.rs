//! [`Layout`], the one owner of a program's argument and result order.
//!
//! | kind | arguments | results | donated |
//! |---|---|---|---|
//! | [`ProgramKind::Generation`] | `params…, key, generation, batch…` | `params'…, generation', fitness` | params, generation |
//! | [`ProgramKind::AskApply`] | `params…, key, generation, batch…` | `fitness` | nothing |
//! | [`ProgramKind::Tell`] | `params…, key, generation, fitness` | `params'…, generation'` | params, generation |
//! | [`ProgramKind::Partial`] | `params…, key, generation, fitness` | `u…` (one row per device) | nothing |
//! | [`ProgramKind::Update`] | `params…, key, generation, u…` | `params'…, generation'` | params, generation |
//!
//! The last two split `tell` at the sum over members for a population run across processes
//! ([`super::processes`]): a partial program returns one process's share of the sum `u`
//! per leaf (in the parameter slots, `[D, ..leaf]` split over `"pop"`: each device's own
//! sum, unreduced), and the update program applies the sum of all shares
//! (taken where the other kinds take the batch, each named `u.<leaf path>`).
//!
//! The inference program has the ask_apply layout and the no-op program the generation
//! layout. The program entry points declare their arguments ([`Layout::declare`]) and emit
//! their results ([`Layout::emit`]) through it; a host builds each device's argument list
//! with [`Layout::args`] and takes its results apart with [`Layout::split_results`].

use crate::builder::{DType, Func, Sharding, TensorType, Value};

use super::error::EsError;
use super::strategy::LeafInfo;

/// Which program a [`Layout`] describes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProgramKind {
    /// One or more whole generations (also the no-op program of the same shape).
    Generation,
    /// Split mode's first half, `ask + apply` (also the inference program).
    AskApply,
    /// Split mode's second half, `tell` with a host fitness.
    Tell,
    /// One process's share of `tell`'s sum over members, with a host fitness.
    Partial,
    /// `θ − lr/(nσ) · u` with a host sum `u`, and the next generation.
    Update,
}

impl ProgramKind {
    /// The name in messages: `generation`, `ask_apply`, `tell`, `partial`, `update`.
    pub fn name(self) -> &'static str {
        match self {
            ProgramKind::Generation => "generation",
            ProgramKind::AskApply => "ask_apply",
            ProgramKind::Tell => "tell",
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
    /// instead; for [`ProgramKind::Update`] the update of each leaf, `u.<path>`).
    pub batch: Vec<(String, TensorType)>,
    /// Population size.
    pub n: usize,
    /// Fitness columns per member (1 unless the model returns several tasks).
    pub tasks: usize,
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
}

impl Layout {
    /// The layout of a `kind` program over `leaves` (in [`crate::es::leaf_infos`] order)
    /// with `batch` inputs, `n` members and `tasks` fitness columns. A tell program takes
    /// no batch, so `batch` is dropped for [`ProgramKind::Tell`] and
    /// [`ProgramKind::Partial`]; an update program takes the update of each leaf in its
    /// place.
    pub fn new(
        kind: ProgramKind,
        leaves: Vec<LeafInfo>,
        batch: Vec<(String, TensorType)>,
        n: usize,
        tasks: usize,
    ) -> Layout {
        let batch = match kind {
            ProgramKind::Tell | ProgramKind::Partial => Vec::new(),
            ProgramKind::Update => leaves
                .iter()
                .map(|l| (format!("u.{}", l.path), TensorType::f32(&l.shape)))
                .collect(),
            _ => batch,
        };
        Layout {
            kind,
            leaves,
            batch,
            n,
            tasks,
        }
    }

    /// Index of the `key` argument (`u32[2]`), right after the parameters.
    pub fn key_arg(&self) -> usize {
        self.leaves.len()
    }

    /// Index of the `generation` argument (u32 scalar).
    pub fn generation_arg(&self) -> usize {
        self.leaves.len() + 1
    }

    /// Index of the first batch argument (none for [`ProgramKind::Tell`] and
    /// [`ProgramKind::Partial`]; for [`ProgramKind::Update`], the first leaf's update).
    pub fn batch_arg(&self) -> Option<usize> {
        (!self.kind.takes_fitness()).then_some(self.leaves.len() + 2)
    }

    /// Index of the fitness argument ([`ProgramKind::Tell`] and [`ProgramKind::Partial`]
    /// only).
    pub fn fitness_arg(&self) -> Option<usize> {
        self.kind.takes_fitness().then_some(self.leaves.len() + 2)
    }

    /// The number of arguments.
    pub fn arg_count(&self) -> usize {
        self.generation_arg() + 1 + self.tail_count()
    }

    /// Index of the `generation` result (none for [`ProgramKind::AskApply`] and
    /// [`ProgramKind::Partial`]).
    pub fn generation_result(&self) -> Option<usize> {
        (!matches!(self.kind, ProgramKind::AskApply | ProgramKind::Partial))
            .then_some(self.leaves.len())
    }

    /// Index of the fitness result (none for [`ProgramKind::Tell`]).
    pub fn fitness_result(&self) -> Option<usize> {
        match self.kind {
            ProgramKind::Generation => Some(self.leaves.len() + 1),
            ProgramKind::AskApply => Some(0),
            ProgramKind::Tell | ProgramKind::Partial | ProgramKind::Update => None,
        }
    }

    /// The number of results.
    pub fn result_count(&self) -> usize {
        self.param_results()
            + [self.generation_result(), self.fitness_result()]
                .iter()
                .flatten()
                .count()
    }

    /// Whether the program consumes the parameter and generation buffers it is given
    /// (donated into the results of the same role).
    pub fn donates(&self) -> bool {
        !matches!(self.kind, ProgramKind::AskApply | ProgramKind::Partial)
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

    /// Parameter results (`L`, or 0 for [`ProgramKind::AskApply`]).
    fn param_results(&self) -> usize {
        if self.kind == ProgramKind::AskApply {
            0
        } else {
            self.leaves.len()
        }
    }

    /// Arguments after `generation`: the batch (an update program's updates), or the one
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
        let l = self.leaves.len();
        match self.kind {
            ProgramKind::Generation => format!("{l} leaves + generation + fitness"),
            ProgramKind::AskApply => "fitness".into(),
            ProgramKind::Tell | ProgramKind::Update => format!("{l} leaves + generation"),
            ProgramKind::Partial => format!("{l} partial updates, one per leaf"),
        }
    }

    /// Declares the arguments of `f` in order, every one replicated: the parameters (f32,
    /// named by their paths) and `generation` donated to their results where the kind
    /// donates, `key`, then the batch or the `fitness`.
    pub fn declare(&self, f: &Func) -> Result<ProgramArgs<Value>, EsError> {
        let mut params = Vec::with_capacity(self.leaves.len());
        for (j, l) in self.leaves.iter().enumerate() {
            let (ty, sh) = (
                TensorType::f32(&l.shape),
                Sharding::replicated(l.shape.len()),
            );
            params.push(if self.donates() {
                f.arg_donated(&l.path, ty, &sh, j)?
            } else {
                f.arg_sharded(&l.path, ty, &sh)?
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
        Ok(ProgramArgs {
            params,
            key,
            generation,
            batch,
            fitness,
        })
    }

    /// Emits `results` as the results of `f`, in order: parameters (a partial program's
    /// rows split over `"pop"` by device) and generation replicated, the fitness split over
    /// `"pop"` by member. Refuses a part the kind does
    /// not return, or one it lacks.
    pub fn emit(&self, f: &Func, results: ProgramResults<Value>) -> Result<(), EsError> {
        self.check_results(&results)?;
        for (p, l) in results.params.iter().zip(&self.leaves) {
            // A partial program's results are one row per device (`[D, ..leaf]`).
            let sh = if self.kind == ProgramKind::Partial {
                Sharding::split(l.shape.len() + 1, 0)?
            } else {
                Sharding::replicated(l.shape.len())
            };
            f.output_sharded(p, &sh)?;
        }
        if let Some(g) = &results.generation {
            f.output_sharded(g, &Sharding::replicated(0))?;
        }
        if let Some(fit) = &results.fitness {
            f.output_sharded(fit, &Sharding::split(self.fitness_dims().len(), 0)?)?;
        }
        Ok(())
    }

    fn check_results<T>(&self, r: &ProgramResults<T>) -> Result<(), EsError> {
        let parts = [
            (
                "parameter results",
                r.params.len(),
                self.param_results(),
                "one per leaf",
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
        ];
        for (what, got, expected, detail) in parts {
            if got != expected {
                return Err(self.count_error(what, got, expected, detail.into()));
            }
        }
        Ok(())
    }

    /// One device's argument list, in order: `params` (one per leaf), `key`, `generation`,
    /// then `tail`, which is the batch (one per [`Layout::batch`] entry) or, for
    /// [`ProgramKind::Tell`], the one fitness. Works on anything a host passes (buffers,
    /// references to them, host arrays).
    pub fn args<T>(
        &self,
        params: impl IntoIterator<Item = T>,
        key: T,
        generation: T,
        tail: impl IntoIterator<Item = T>,
    ) -> Result<Vec<T>, EsError> {
        let mut out: Vec<T> = Vec::with_capacity(self.arg_count());
        out.extend(params);
        if out.len() != self.key_arg() {
            return Err(self.count_error(
                "parameter arguments",
                out.len(),
                self.key_arg(),
                "one per leaf".into(),
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
                ProgramKind::Update => ("update arguments", "one per leaf".into()),
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
        Ok(out)
    }

    /// Takes one device's result list apart by role, refusing a list of the wrong length.
    pub fn split_results<T>(&self, mut results: Vec<T>) -> Result<ProgramResults<T>, EsError> {
        if results.len() != self.result_count() {
            return Err(self.count_error(
                "results",
                results.len(),
                self.result_count(),
                self.describe_results(),
            ));
        }
        // The fitness comes after the generation, so removing it first keeps the
        // generation's index; both are in range after the length check.
        let fitness = self.fitness_result().map(|i| results.remove(i));
        let generation = self.generation_result().map(|i| results.remove(i));
        Ok(ProgramResults {
            params: results,
            generation,
            fitness,
        })
    }
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
mod tests {
    use super::*;
    use crate::builder::{Mesh, Module};

    fn layout(kind: ProgramKind, tasks: usize) -> Layout {
        let leaf = |index: usize, path: &str, shape: &[i64]| LeafInfo {
            index,
            path: path.into(),
            shape: shape.to_vec(),
        };
        Layout::new(
            kind,
            vec![leaf(0, "b", &[7]), leaf(1, "w", &[7, 13])],
            vec![
                ("x".into(), TensorType::f32(&[3, 13])),
                ("y".into(), TensorType::i32(&[3])),
            ],
            16,
            tasks,
        )
    }

    #[test]
    fn positions_follow_the_kind() {
        use ProgramKind::*;
        // (kind, batch_arg, fitness_arg, args, generation_result, fitness_result, results)
        for (kind, batch, fit_arg, args, gen, fit, results) in [
            (Generation, Some(4), None, 6, Some(2), Some(3), 4),
            (AskApply, Some(4), None, 6, None, Some(0), 1),
            (Tell, None, Some(4), 5, Some(2), None, 3),
        ] {
            let l = layout(kind, 1);
            assert_eq!((l.key_arg(), l.generation_arg()), (2, 3), "{kind:?}");
            assert_eq!(
                (l.batch_arg(), l.fitness_arg()),
                (batch, fit_arg),
                "{kind:?}"
            );
            assert_eq!(l.arg_count(), args, "{kind:?}");
            assert_eq!(
                (l.generation_result(), l.fitness_result()),
                (gen, fit),
                "{kind:?}"
            );
            assert_eq!(l.result_count(), results, "{kind:?}");
            assert_eq!(l.donates(), kind != AskApply, "{kind:?}");
        }
        assert!(layout(Tell, 1).batch.is_empty(), "tell takes no batch");
        assert_eq!(layout(Generation, 1).fitness_dims(), [16]);
        assert_eq!(layout(Generation, 3).fitness_dims(), [16, 3]);
        assert_eq!(layout(Tell, 3).fitness_type(), TensorType::f32(&[16, 3]));
        assert_eq!(ProgramKind::AskApply.name(), "ask_apply");
    }

    #[test]
    fn host_argument_lists_are_in_layout_order() {
        let l = layout(ProgramKind::Generation, 1);
        let args = l.args(["b", "w"], "key", "gen", ["x", "y"]).unwrap();
        assert_eq!(args, ["b", "w", "key", "gen", "x", "y"]);
        assert_eq!(args[l.key_arg()], "key");
        assert_eq!(args[l.generation_arg()], "gen");
        assert_eq!(l.batch_arg().map(|i| args[i]), Some("x"));
        let t = layout(ProgramKind::Tell, 1);
        let args = t.args(&[10, 11], &12, &13, [&14]).unwrap();
        assert_eq!(args, [&10, &11, &12, &13, &14]);
        assert_eq!(t.fitness_arg().map(|i| *args[i]), Some(14));
    }

    #[test]
    fn a_wrong_argument_count_names_the_list_and_what_it_holds() {
        let l = layout(ProgramKind::AskApply, 1);
        let e = l.args(["b"], "key", "gen", ["x", "y"]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "the ask_apply program's parameter arguments: got 1, its layout has 2 (one per leaf)"
        );
        let e = l.args(["b", "w"], "key", "gen", ["x"]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "the ask_apply program's batch arguments: got 1, its layout has 2 (x: \
             tensor<3x13xf32>, y: tensor<3xi32>)"
        );
        let e = layout(ProgramKind::Tell, 2)
            .args(["b", "w"], "key", "gen", [])
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "the tell program's fitness arguments: got 0, its layout has 1 (tensor<16x2xf32>)"
        );
    }

    #[test]
    fn results_split_by_role() {
        let g = layout(ProgramKind::Generation, 1)
            .split_results(vec!["b'", "w'", "gen'", "fit"])
            .unwrap();
        assert_eq!(
            g,
            ProgramResults {
                params: vec!["b'", "w'"],
                generation: Some("gen'"),
                fitness: Some("fit"),
            }
        );
        let a = layout(ProgramKind::AskApply, 1)
            .split_results(vec!["fit"])
            .unwrap();
        assert_eq!(
            (a.params.len(), a.generation, a.fitness),
            (0, None, Some("fit"))
        );
        let t = layout(ProgramKind::Tell, 1)
            .split_results(vec!["b'", "w'", "gen'"])
            .unwrap();
        assert_eq!(
            (t.params, t.generation, t.fitness),
            (vec!["b'", "w'"], Some("gen'"), None)
        );
    }

    #[test]
    fn a_wrong_result_count_is_refused() {
        let e = layout(ProgramKind::Generation, 1)
            .split_results(vec![1, 2, 3])
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "the generation program's results: got 3, its layout has 4 (2 leaves + generation \
             + fitness)"
        );
        let e = layout(ProgramKind::Tell, 1)
            .split_results(vec![1, 2, 3, 4])
            .unwrap_err();
        assert!(e
            .to_string()
            .contains("got 4, its layout has 3 (2 leaves + generation)"));
        assert!(layout(ProgramKind::AskApply, 1)
            .split_results(Vec::<u8>::new())
            .is_err());
    }

    /// The printed signature of a function that declares `l`'s arguments and emits `out`.
    fn signature(
        l: &Layout,
        out: impl FnOnce(&ProgramArgs<Value>) -> ProgramResults<Value>,
    ) -> String {
        let mut m = Module::with_mesh("t", Mesh::pop(2).unwrap());
        let f = m.func("main");
        let args = l.declare(&f).unwrap();
        l.emit(&f, out(&args)).unwrap();
        m.add(f.finish().unwrap()).unwrap();
        let text = m.to_mlir();
        let start = text.find("@main(").unwrap();
        text[start..start + text[start..].find(" {\n").unwrap()].to_string()
    }

    #[test]
    fn declared_arguments_and_emitted_results_follow_the_layout() {
        let g = layout(ProgramKind::Generation, 1);
        let sig = signature(&g, |a| ProgramResults {
            params: a.params.clone(),
            generation: Some(a.generation.clone()),
            fitness: Some(a.batch[0].func().full(0.0f32, &[16]).unwrap()),
        });
        let names: Vec<&str> = sig
            .split('%')
            .skip(1)
            .map(|s| &s[..s.find(':').unwrap()])
            .collect();
        assert_eq!(names, ["b", "w", "key", "generation", "x", "y"]);
        // Params into results 0 and 1, the generation into result 2; nothing else donated.
        assert_eq!(sig.matches("tf.aliasing_output").count(), 3, "{sig}");
        assert!(sig.contains("%generation: tensor<ui32> {sdy.sharding = #sdy.sharding<@mesh, []>, tf.aliasing_output = 2 : i32}"), "{sig}");
        assert!(
            sig.ends_with("tensor<16xf32> {sdy.sharding = #sdy.sharding<@mesh, [{\"pop\"}]>})"),
            "{sig}"
        );
        let a = layout(ProgramKind::AskApply, 3);
        let sig = signature(&a, |a| ProgramResults {
            params: Vec::new(),
            generation: None,
            fitness: Some(a.key.func().full(0.0f32, &[16, 3]).unwrap()),
        });
        assert!(!sig.contains("tf.aliasing_output"), "{sig}");
        assert!(sig.contains("-> (tensor<16x3xf32>"), "{sig}");
        let t = layout(ProgramKind::Tell, 1);
        let sig = signature(&t, |a| ProgramResults {
            params: a.params.clone(),
            generation: Some(a.generation.clone()),
            fitness: None,
        });
        assert!(sig.contains("%generation: tensor<ui32> {sdy.sharding = #sdy.sharding<@mesh, []>, tf.aliasing_output = 2 : i32}, %fitness: tensor<16xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}]>})"), "{sig}");
    }

    #[test]
    fn emitting_a_part_the_kind_lacks_is_refused() {
        let l = layout(ProgramKind::AskApply, 1);
        let m = Module::with_mesh("t", Mesh::pop(1).unwrap());
        let f = m.func("main");
        let args = l.declare(&f).unwrap();
        let e = l
            .emit(
                &f,
                ProgramResults {
                    params: Vec::new(),
                    generation: Some(args.generation.clone()),
                    fitness: None,
                },
            )
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "the ask_apply program's generation results: got 1, its layout has 0 (the next \
             generation)"
        );
    }

    #[test]
    fn leaves_out_of_order_are_refused() {
        let mut leaves = layout(ProgramKind::Generation, 1).leaves;
        assert!(check_leaves(&leaves).is_ok());
        leaves.swap(0, 1);
        let e = check_leaves(&leaves).unwrap_err().to_string();
        assert!(
            e.contains("parameter `w`: leaf index 1 at position 0"),
            "{e}"
        );
    }
}
