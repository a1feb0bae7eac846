//! The generation's emission: `ask`, `apply` and `tell` as ops, for the entry points in
//! [`super::program`].
//!
//! Placement:
//! - members are split over the `"pop"` axis; each device evaluates its own `n / D`
//!   members, `member_chunk` at a time in a `while` loop (inside `sdy.manual_computation`,
//!   so the split is exact and the chunk shape does not depend on the device count);
//! - the fitness is gathered (scalars only) and shaped on every device;
//! - `how = B`: each device contracts its own members, then one all-reduce per leaf;
//!   `how = A`: every device regenerates and contracts the whole population.

use crate::builder::{DType, Func, Module, Sharding, TensorType, Value};
use crate::nn::{Act, Weight};
use crate::prng::emit::Keys;

use super::error::{invalid, EsError};
use super::layers::{LayerDraw, LayerGroup};
use super::layout::{Layout, ProgramArgs, ProgramResults};
use super::model::{LayerLeaves, Leaf, Model, ModelParams};
use super::precision;
use super::settings::ShardedES;
use super::sigma::{self, Emission, LeafScale, Perturb};
use super::strategy::{LeafInfo, Noise, Strategy};

mod contract;
mod tell;

/// Direction ids and signs of a block of member ids (`u32[c]`, aligned to the pairing):
/// `dirs = ids[::p] / p` (`u32[c/p]`), `signs` f32[c] (+1, or −1 for odd mirrored members).
pub(super) fn directions(ids: &Value, p: i64) -> Result<(Value, Value), EsError> {
    let f = ids.func();
    let c = ids.shape()[0];
    if p == 1 {
        return Ok((ids.clone(), f.full(1.0f32, &[c])?));
    }
    let dirs = ids
        .reshape(&[c / p, p])?
        .slice_in_dim(0, 1, 1)?
        .reshape(&[c / p])?
        .shift_right_logical(&f.scalar(1u32)?)?;
    let odd = ids.and(&f.scalar(1u32)?)?.convert(DType::F32)?;
    let signs = f.scalar(1.0f32)?.sub(&odd.mul(&f.scalar(2.0f32)?)?)?;
    Ok((dirs, signs))
}

/// Multiplies `x [c, ...]` by `s [c]` along dim 0.
fn scale_rows(x: &Value, s: &Value) -> Result<Value, EsError> {
    Ok(x.mul(&s.broadcast_in_dim(x.shape(), &[0])?)?)
}

/// The chunk's noise, each element computed once.
///
/// XLA:CPU fuses cheap elementwise producers into their consumers, even where the consumer
/// reads each element many times: the noise transform (uniform bits → erf_inv polynomial)
/// was fused into the rank-1 corrections `(x B) Aᵀ` (a broadcast multiply once XLA
/// strength-reduces the r = 1 dot), so every factor element was recomputed once per token.
/// A profile of the quickstart put 40 % of a generation in those fusions.
/// `optimization_barrier` does not help (XLA:CPU expands it before fusion); an "expensive"
/// op does, because XLA never duplicates one into a consumer that reuses its elements.
/// `remainder(z, +inf)` is such an op and the identity on finite `z` (IEEE 754 `fmod`), so
/// the noise keeps its exact bits.
fn materialize(noise: Vec<Noise>) -> Result<Vec<Noise>, EsError> {
    let once =
        |v: &Value| -> Result<Value, EsError> { Ok(v.rem(&v.func().scalar(f32::INFINITY)?)?) };
    noise
        .into_iter()
        .map(|n| {
            Ok(match n {
                Noise::Dense(v) => Noise::Dense(once(&v)?),
                Noise::Factors { a, b } => Noise::Factors {
                    a: once(&a)?,
                    b: once(&b)?,
                },
            })
        })
        .collect()
}

/// The per-leaf stream keys `fold_in(base_key, j)`, as one batch `[L]` (one draw).
pub(super) fn streams(base: &Keys, leaves: &[LeafInfo]) -> Result<Keys, EsError> {
    let f = base.words().0.func();
    let ids = f.iota(TensorType::u32(&[leaves.len() as i64]), 0)?;
    Ok(base.fold_in(&ids)?)
}

/// The shapes of the values each leaf's noise is made of for one direction
/// (`[1, ..leaf shape]` dense, `[1, r, m]` and `[1, r, k]` for factors), probed by drawing
/// one direction in a scratch module that is then dropped: a manual computation declares
/// its results, and a loop its carry, before their bodies are built.
pub(super) fn noise_shapes(
    strategy: &dyn Strategy,
    leaves: &[LeafInfo],
) -> Result<Vec<Vec<Vec<i64>>>, EsError> {
    let probe = Module::new("probe");
    let f = probe.func("probe");
    let key = Keys::from_data(&f.arg("key", TensorType::u32(&[2]))?)?;
    let dirs = f.iota(TensorType::u32(&[1]), 0)?;
    let noise = strategy.noise_all(&streams(&key, leaves)?, leaves, &dirs)?;
    Ok(noise
        .iter()
        .map(|n| n.values().iter().map(|v| v.shape().to_vec()).collect())
        .collect())
}

/// Rebuilds per-leaf noise from the flat values of [`Noise::values`]; `shapes` has one
/// entry per value of each leaf, as [`noise_shapes`] gives them (shapes, or their ranks).
fn noise_from_values<T>(values: &[Value], shapes: &[Vec<T>]) -> Vec<Noise> {
    let mut it = values.iter().cloned();
    shapes
        .iter()
        .filter_map(|r| match r.len() {
            1 => it.next().map(Noise::Dense),
            _ => match (it.next(), it.next()) {
                (Some(a), Some(b)) => Some(Noise::Factors { a, b }),
                _ => None,
            },
        })
        .collect()
}

/// The emission of one program's generation: the settings, the program's layout and the
/// member chunk the entry point resolved for its model ([`ShardedES::member_chunk_for`]),
/// which `apply` evaluates and `tell` sizes its own chunk after.
pub(super) struct Emitter<'a> {
    es: &'a ShardedES,
    layout: &'a Layout,
    chunk: usize,
    /// Per layout leaf: frozen, or its σ ([`ShardedES::leaf_scales`]).
    scales: Vec<LeafScale>,
    /// The leaves that get noise (all but the frozen), with their whole-tree indices.
    active: Vec<LeafInfo>,
    /// The first global member id and the number of members `apply` evaluates and `tell`
    /// contracts (one process's share of the population, [`super::processes`]; by default
    /// all `n` from 0).
    members: (usize, usize),
    /// The model's layers, drawn in its loop over the layer index and contracted in a loop
    /// of `tell`'s own ([`super::layers`]); `None`: every leaf on its own.
    layers: Option<LayerGroup>,
    /// Whether the layers' noise is drawn once per member chunk, into `[L, …]` stacks the
    /// model's loop reads a row of ([`Emitter::drawing_layers_per_chunk`]), rather than
    /// inside the model's loop.
    per_chunk: bool,
    /// Whether the parameter values handed over hold every matrix transposed, `(in, out)`
    /// ([`Emitter::with_matrices_in_out`]).
    in_out: bool,
}

impl<'a> Emitter<'a> {
    /// The emitter of a `layout` program of `es`, evaluating `chunk` members per step.
    pub(super) fn new(
        es: &'a ShardedES,
        layout: &'a Layout,
        chunk: usize,
    ) -> Result<Self, EsError> {
        let scales = es.leaf_scales(&layout.leaves)?;
        let active = sigma::active(&layout.leaves, &scales);
        Ok(Emitter {
            es,
            layout,
            chunk,
            scales,
            active,
            members: (0, es.n),
            layers: None,
            per_chunk: false,
            in_out: false,
        })
    }

    /// The same emitter for a model with these repeated `layers` ([`Model::layers`]): their
    /// noise is drawn a layer at a time inside the model's loop and contracted in a loop
    /// over the layers, the same values through a constant number of ops. Layers no one
    /// loop body fits, and strategies that materialize their noise, stay leaf by leaf.
    ///
    /// So do layers whose matrices get dense (full-rank) noise: a dense draw's consumers
    /// are compiled differently when it is drawn in a loop body (XLA:CPU fuses its
    /// `materialize` into `tell`'s dot there, where the per-leaf program's dot reads the
    /// noise `apply` kept), which moved some updated weights by 1 ulp on the 3-layer test
    /// model under `seed_regenerated`. Low-rank layers give the per-leaf bits.
    pub(super) fn with_layers(mut self, layers: Option<LayerLeaves>) -> Self {
        let group = layers
            .filter(|_| !self.es.strategy.materialized())
            .and_then(|spec| {
                LayerGroup::resolve(&spec, &self.layout.leaves, &self.scales, &self.active)
            });
        self.layers = group.filter(|group| {
            noise_shapes(self.es.strategy.as_ref(), group.active0()).is_ok_and(|shapes| {
                shapes
                    .iter()
                    .zip(group.active0())
                    .all(|(values, leaf)| leaf.shape.len() < 2 || values.len() == 2)
            })
        });
        self
    }

    /// The same emitter drawing its layer group's noise ([`Emitter::with_layers`]) once per
    /// member chunk: a `while` over the layer index draws every layer's noise into `[L, …]`
    /// stacks before the model runs, and the model's loop reads layer `i`'s row. For a
    /// model that runs its layer loop many times per chunk (a decoder: the prefill and then
    /// once per token), which would otherwise draw a layer's noise again on every pass;
    /// the draws still do not grow with depth. The rows hold the values a draw inside the
    /// model's loop gives (the same streams and ops, stored and read back exactly).
    pub(super) fn drawing_layers_per_chunk(mut self) -> Self {
        self.per_chunk = true;
        self
    }

    /// The same emitter for parameter values whose matrices (2-D leaves, and the rows of
    /// `[L, …]` stacks of them) are transposed, `(in, out)` ([`Layout::in_out`]): it hands
    /// the model [`Weight::InOut`] weights, and transposes a matrix back where dense noise
    /// is added to it.
    pub(super) fn with_matrices_in_out(mut self, in_out: bool) -> Self {
        self.in_out = in_out;
        self
    }

    /// Whether the parameter values hold every matrix transposed
    /// ([`Emitter::with_matrices_in_out`]).
    pub(super) fn matrices_in_out(&self) -> bool {
        self.in_out
    }

    /// `w` as the model gets it: [`Weight::InOut`] when the values are stored so.
    fn matrix(&self, w: Weight) -> Result<Leaf, EsError> {
        Ok(Leaf::Matrix(w.in_out_if(self.in_out)?))
    }

    /// Whether `apply` keeps its noise for `tell` ([`ShardedES::keeps_noise`]). Not with
    /// a layer group: the layers' noise is drawn inside the model's loop, which carries
    /// only the model's values, so `tell` regenerates it (the same values; XLA may round a
    /// contraction of regenerated dense noise differently in the last bits than one of
    /// kept noise, as it does for mirrored low rank on one device).
    pub(super) fn keeps_noise(&self) -> bool {
        self.layers.is_none() && self.es.keeps_noise(&self.active)
    }

    /// The same emitter over the `count` members from global id `offset` on.
    pub(super) fn with_members(mut self, offset: usize, count: usize) -> Self {
        self.members = (offset, count);
        self
    }

    /// The member ids `[offset, offset + count)` as `u32[count]` with `sharding`. From 0,
    /// the iota alone, so the programs of one process print as they always did.
    pub(super) fn member_ids(&self, f: &Func, sharding: &Sharding) -> Result<Value, EsError> {
        let (offset, count) = self.members;
        let ids = f.iota(TensorType::u32(&[count as i64]), 0)?;
        let ids = if offset == 0 {
            ids
        } else {
            let offset = u32::try_from(offset).map_err(|_| {
                invalid(
                    format!("member offset {offset} exceeds the program's 32-bit member ids"),
                    "lower es.n".into(),
                )
            })?;
            ids.add(&f.scalar(offset)?)?
        };
        Ok(ids.shard(sharding)?)
    }

    /// The leaves that get noise (all but the frozen ones), in order.
    pub(super) fn active(&self) -> &[LeafInfo] {
        &self.active
    }

    /// The stream keys of the leaves that get noise: [`streams`] of the whole tree, or
    /// with frozen leaves, `fold_in(base_key, j)` of each other leaf's index `j`.
    pub(super) fn streams(&self, base: &Keys) -> Result<Keys, EsError> {
        if self.active.len() == self.layout.leaves.len() {
            return streams(base, &self.active);
        }
        let f = base.words().0.func();
        Ok(base.fold_in(&sigma::leaf_ids(&f, &self.active)?)?)
    }

    /// `steps` generations on the declared `args`: `(params'…, generation + steps,
    /// fitness of the last)`. Each step is exactly one generation's ask/apply/tell, so the
    /// parameters match `steps` single steps.
    pub(super) fn generations(
        &self,
        model: &dyn Model,
        args: &ProgramArgs<Value>,
        steps: i32,
    ) -> Result<ProgramResults<Value>, EsError> {
        let out = if steps == 1 {
            let a = args;
            self.one_generation(
                model,
                &a.key,
                &a.params,
                &a.generation,
                &a.batch,
                &a.opt_state,
            )?
        } else {
            self.generation_loop(model, args, steps)?
        };
        self.layout.split_results(out)
    }

    /// `ask + apply` on the declared `args`: the fitness, split over "pop".
    pub(super) fn ask_apply(
        &self,
        model: &dyn Model,
        args: &ProgramArgs<Value>,
    ) -> Result<ProgramResults<Value>, EsError> {
        let (base_key, _) = self.ask(&args.key, &args.generation)?;
        let (fitness, _) = self.apply(model, &base_key, &args.params, &args.batch, false)?;
        Ok(ProgramResults {
            params: Vec::new(),
            generation: None,
            fitness: Some(fitness),
            opt_state: Vec::new(),
        })
    }

    /// `tell` with the host fitness of the declared `args`: `(params'…, generation + 1)`,
    /// the noise regenerated.
    pub(super) fn tell_host(
        &self,
        args: &ProgramArgs<Value>,
    ) -> Result<ProgramResults<Value>, EsError> {
        let fitness = args.fitness.as_ref().ok_or_else(|| {
            invalid(
                "the tell program was declared without a fitness argument".into(),
                "declare it with a ProgramKind::Tell layout".into(),
            )
        })?;
        let (base_key, next) = self.ask(&args.key, &args.generation)?;
        let weights = self.shape_fitness(fitness)?;
        let (params, opt_state) =
            self.tell(&base_key, &args.params, &weights, None, &args.opt_state)?;
        Ok(ProgramResults {
            params,
            generation: Some(next),
            fitness: None,
            opt_state,
        })
    }

    /// Perturbed parameters of one member chunk for the model: `noise` holds the noise of
    /// the leaves that get noise, in order; frozen leaves are read as plain weights.
    pub(super) fn perturbed(
        &self,
        params: &[Value],
        leaves: &[LeafInfo],
        noise: &[Noise],
        signs: &Value,
    ) -> Result<ModelParams<'static>, EsError> {
        self.perturb_leaves(params, leaves, &self.scales, noise, signs)
    }

    /// [`Emitter::perturbed`] for any `leaves` with their `scales` (one per leaf).
    fn perturb_leaves(
        &self,
        params: &[Value],
        leaves: &[LeafInfo],
        scales: &[LeafScale],
        noise: &[Noise],
        signs: &Value,
    ) -> Result<ModelParams<'static>, EsError> {
        let f = signs.func();
        let p = self.es.strategy.pairing() as i64;
        let sigs = Emission::new(scales).perturb(signs)?;
        let mut noise = noise.iter();
        let mut out = Vec::with_capacity(leaves.len());
        for ((leaf, theta), how) in leaves.iter().zip(params).zip(sigs) {
            let mut next = || -> Result<Noise, EsError> {
                let n = noise.next().ok_or_else(|| {
                    invalid(
                        format!("no noise drawn for leaf {}", leaf.path),
                        "draw one noise per unfrozen leaf".into(),
                    )
                })?;
                Ok(n.repeat(p)?)
            };
            let (noise, sig) = match how {
                Perturb::Frozen => {
                    let plain = if leaf.shape.len() == 2 {
                        self.matrix(Weight::Plain(theta.clone()))?
                    } else {
                        Leaf::Dense(Act::shared(theta.clone()))
                    };
                    out.push((leaf.path.clone(), plain));
                    continue;
                }
                Perturb::Scalar(sig) => (next()?, sig),
                Perturb::Separable { p, q } => {
                    (sigma::separable_noise(next()?, &p, &q)?, signs.clone())
                }
            };
            let entry = match noise {
                Noise::Factors { a, b } => {
                    let r = a.shape()[1];
                    let inv = f.scalar(1.0f32 / (r as f32).sqrt())?;
                    self.matrix(Weight::LowRank {
                        base: theta.clone(),
                        a,
                        b,
                        scale: sig.mul(&inv)?,
                    })?
                }
                Noise::Dense(e) => {
                    let theta = &if self.in_out && leaf.shape.len() == 2 {
                        theta.transpose(&[1, 0])?
                    } else {
                        theta.clone()
                    };
                    let c = e.shape()[0];
                    let mut shape = vec![c];
                    shape.extend_from_slice(theta.shape());
                    let tdims: Vec<usize> = (1..shape.len()).collect();
                    let w = theta
                        .broadcast_in_dim(&shape, &tdims)?
                        .add(&scale_rows(&e, &sig)?)?;
                    if leaf.shape.len() == 2 {
                        Leaf::Matrix(Weight::Members(w))
                    } else {
                        Leaf::Dense(Act::per_member(w)?)
                    }
                }
            };
            out.push((leaf.path.clone(), entry));
        }
        ModelParams::new(out).with_compute_dtype(self.es.compute_dtype())
    }

    /// The loss of a chunk as `f32[c]` or `f32[c, g]`, refusing narrow fitness.
    fn chunk_fitness(&self, loss: Act, c: i64, tasks: usize) -> Result<Value, EsError> {
        match loss.dtype() {
            DType::F32 => {}
            DType::F64 => {}
            d @ (DType::BF16 | DType::F16) => {
                return Err(EsError::NarrowFitness {
                    dtype: d.mlir().to_string(),
                })
            }
            d => {
                return Err(invalid(
                    format!("the model's loss has element type {}", d.mlir()),
                    "return a float32 loss".into(),
                ))
            }
        }
        let logical = loss.logical_shape().to_vec();
        let want: Vec<i64> = if tasks > 1 {
            vec![tasks as i64]
        } else {
            vec![]
        };
        if logical != want {
            return Err(invalid(
                format!(
                    "the model's loss has logical shape {logical:?} but Model::tasks() = {tasks} \
                     expects {want:?}"
                ),
                "return one scalar per member, or [g] task losses with Model::tasks() = g \
                 (for group_relative)"
                    .into(),
            ));
        }
        let mut shape = vec![c];
        shape.extend_from_slice(&logical);
        let v = match loss.members() {
            Some(_) => loss.value().clone(),
            None => {
                let d: Vec<usize> = (1..shape.len()).collect();
                loss.value().broadcast_in_dim(&shape, &d)?
            }
        };
        Ok(if v.dtype() == DType::F64 {
            v.convert(DType::F32)?
        } else {
            v
        })
    }

    /// Noise for a block of directions: regenerated, or sliced from a materialized set;
    /// each element computed once ([`materialize`]). `apply` and `tell` both take their
    /// noise from here, so they see it through the same ops (and XLA compiles it alike).
    pub(super) fn chunk_noise(
        &self,
        streams: &Keys,
        leaves: &[LeafInfo],
        dirs: &Value,
        all: Option<(&[Noise], &Value)>,
    ) -> Result<Vec<Noise>, EsError> {
        let d = dirs.shape()[0];
        match all {
            // Sliced from noise that came through here (and `materialize`) already.
            Some((noise, start)) => noise
                .iter()
                .map(|n| Ok(n.dynamic_rows(start, d)?))
                .collect(),
            // Rounded to the compute dtype once, here, so `apply` and `tell` see one noise.
            None => materialize(precision::round_noise(
                self.es.strategy.noise_all(streams, leaves, dirs)?,
                self.es.compute_dtype(),
            )?),
        }
    }

    /// Hands `model` the perturbed parameters of one member chunk (directions `dirs`,
    /// members' `signs`; `streams` the active leaves' keys under `base`, `all` the
    /// materialized noise and the chunk's first direction): every leaf's noise drawn here,
    /// or with a layer group, the other leaves' drawn here and each layer's where the
    /// model's loop reads it ([`ModelParams::layer_source`]). `model` also gets the noise
    /// drawn here for every active leaf (empty with a layer group), for `apply` to keep.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn on_chunk<T>(
        &self,
        slots: &[Value],
        base: &Keys,
        streams: &Keys,
        dirs: &Value,
        signs: &Value,
        all: Option<(&[Noise], &Value)>,
        model: impl FnOnce(&ModelParams, &[Noise]) -> Result<T, EsError>,
    ) -> Result<T, EsError> {
        let leaves = &self.layout.leaves[..];
        let group = match (&self.layers, all) {
            (Some(group), None) => group,
            _ => {
                let params = self.layout.views(slots)?;
                let noise = self.chunk_noise(streams, &self.active, dirs, all)?;
                return model(&self.perturbed(&params, leaves, &noise, signs)?, &noise);
            }
        };
        let rest: Vec<usize> = (0..leaves.len()).filter(|&p| !group.holds(p)).collect();
        let rest_leaves: Vec<LeafInfo> = rest.iter().map(|&p| leaves[p].clone()).collect();
        let rest_scales: Vec<LeafScale> = rest.iter().map(|&p| self.scales[p].clone()).collect();
        let rest_params: Vec<Value> = rest
            .iter()
            .map(|&p| self.layout.leaf_value(slots, p))
            .collect::<Result<_, _>>()?;
        let rest_active = sigma::active(&rest_leaves, &rest_scales);
        let noise = if rest_active.is_empty() {
            Vec::new()
        } else {
            let keys = base.fold_in(&sigma::leaf_ids(&dirs.func(), &rest_active)?)?;
            self.chunk_noise(&keys, &rest_active, dirs, None)?
        };
        let mp = self.perturb_leaves(&rest_params, &rest_leaves, &rest_scales, &noise, signs)?;
        // Layer `i`'s base leaves: rows of the layout's stacks, or with every leaf its own
        // argument, picked by a `case`.
        let stacks = match group.stacks(self.layout, slots)? {
            Some(stacks) => Some(group.narrow_bases(
                stacks,
                self.es.strategy.as_ref(),
                self.es.compute_dtype(),
            )?),
            None => None,
        };
        let values = match stacks {
            Some(_) => Vec::new(),
            None => group.layer_values(&self.layout.views(slots)?)?,
        };
        // Each layer's noise values, cut from the stacks drawn for the chunk and handed to
        // the model's loop by a `case` on the layer index. Not a `dynamic_slice` of the
        // stacks in the loop body: XLA:CPU fuses that into the low-rank products, which
        // rearranges their loops and moved the prefill logits by a few ulps against the
        // per-leaf program (lowrank(r=2) on 2 devices, the tiny Qwen2); through the `case`
        // they are the same bits. A layer adds its rows' slices (once per chunk) and a
        // branch to each `case`, not a draw.
        let drawn = if self.per_chunk {
            let (stacks, shapes) = self.draw_layers(group, base, dirs)?;
            let rows = (0..group.count() as i64)
                .map(|l| {
                    stacks
                        .iter()
                        .map(|st| Ok(st.slice_in_dim(l, l + 1, 0)?.reshape(&st.shape()[1..])?))
                        .collect::<Result<Vec<_>, EsError>>()
                })
                .collect::<Result<Vec<_>, _>>()?;
            Some((rows, shapes))
        } else {
            None
        };
        let draw = |i: &Value| -> Result<ModelParams<'static>, EsError> {
            let bases = match &stacks {
                Some(stacks) => LayerGroup::rows(stacks, i)?,
                None => LayerGroup::select(&values, i)?,
            };
            let noise = match &drawn {
                Some((rows, shapes)) => noise_from_values(&LayerGroup::select(rows, i)?, shapes),
                None => {
                    let keys = group.streams(base, i)?;
                    self.chunk_noise(&keys, group.active0(), dirs, None)?
                }
            };
            self.perturb_leaves(&bases, group.leaves0(), group.scales0(), &noise, signs)
        };
        let source = LayerDraw {
            draw: &draw,
            members: Some(signs.shape()[0]),
        };
        model(&mp.with_layer_source(&source), &[])
    }

    /// Every layer's noise for the directions `dirs`, drawn in a `while` over the layer
    /// index (layer `i` from its leaves' streams under `base`, through
    /// [`Emitter::chunk_noise`] as a draw inside the model's loop would be) into one
    /// `[L, d, …]` stack per noise value of `group`'s active leaves, with the shapes of one
    /// direction's values ([`noise_shapes`]) to rebuild a layer's [`Noise`] from its rows.
    #[allow(clippy::type_complexity)]
    fn draw_layers(
        &self,
        group: &LayerGroup,
        base: &Keys,
        dirs: &Value,
    ) -> Result<(Vec<Value>, Vec<Vec<Vec<i64>>>), EsError> {
        let f = dirs.func();
        let shapes = noise_shapes(self.es.strategy.as_ref(), group.active0())?;
        let (count, d) = (group.count(), dirs.shape()[0]);
        let hi = i32::try_from(count).map_err(|_| {
            invalid(
                format!("{count} layers do not fit an i32 loop index"),
                "use fewer layers".into(),
            )
        })?;
        let inits = shapes
            .iter()
            .flatten()
            .map(|s| {
                let mut shape = vec![count as i64, d];
                shape.extend_from_slice(&s[1..]);
                f.full(0.0f32, &shape)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let refs: Vec<&Value> = inits.iter().collect();
        let stacks = f.fori_loop(0, hi, &refs, |i, carried| -> Result<_, EsError> {
            let keys = group.streams(base, i)?;
            let noise = self.chunk_noise(&keys, group.active0(), dirs, None)?;
            let zero = f.scalar(0i32)?;
            carried
                .iter()
                .zip(noise.iter().flat_map(Noise::values))
                .map(|(stack, v)| {
                    let mut shape = vec![1];
                    shape.extend_from_slice(v.shape());
                    let mut at = vec![i.clone()];
                    at.resize(stack.rank(), zero.clone());
                    let at: Vec<&Value> = at.iter().collect();
                    Ok(stack.dynamic_update_slice(&v.reshape(&shape)?, &at)?)
                })
                .collect()
        })?;
        Ok((stacks, shapes))
    }

    /// `apply`: every local member's loss. Runs inside the manual computation, on local
    /// values; `ids` are this device's global member ids.
    fn apply_local(
        &self,
        model: &dyn Model,
        ids: &Value,
        base_key: &Value,
        params: &[Value],
        batch: &[Value],
        keep: bool,
    ) -> Result<(Value, Option<Vec<Noise>>), EsError> {
        let (leaves, tasks) = (&self.active[..], self.layout.tasks);
        let f = ids.func();
        let local = ids.shape()[0];
        let c = self.chunk as i64;
        let p = self.es.strategy.pairing() as i64;
        let base = Keys::from_data(base_key)?;
        let streams = self.streams(&base)?;
        let all = if self.es.strategy.materialized() {
            let (dirs, _) = directions(ids, p)?;
            Some(self.chunk_noise(&streams, leaves, &dirs, None)?)
        } else {
            None
        };
        let mut fshape = vec![local];
        if tasks > 1 {
            fshape.push(tasks as i64);
        }
        // With `keep`, the loop also writes each chunk's noise into buffers of every local
        // direction (unless the strategy materialized it already): `apply` evaluates
        // through exactly the ops it uses without them, so the fitness is the same bits.
        let shapes = if keep && all.is_none() {
            noise_shapes(self.es.strategy.as_ref(), leaves)?
        } else {
            Vec::new()
        };
        let mut inits = vec![f.full(0.0f32, &fshape)?];
        for shape in shapes.iter().flatten() {
            let mut s = shape.clone();
            s[0] = local / p;
            inits.push(f.full(0.0f32, &s)?);
        }
        let init_refs: Vec<&Value> = inits.iter().collect();
        let steps = (local / c) as i32;
        let mut out = f.fori_loop(
            0,
            steps,
            &init_refs,
            |i, carried| -> Result<Vec<Value>, EsError> {
                let start = i.mul(&f.scalar(c as i32)?)?;
                let ids_c = ids.dynamic_slice(&[&start], &[c])?;
                let (dirs, signs) = directions(&ids_c, p)?;
                let dstart = i.mul(&f.scalar((c / p) as i32)?)?;
                let kept_here = !shapes.is_empty();
                let (fit, noise) = self.on_chunk(
                    params,
                    &base,
                    &streams,
                    &dirs,
                    &signs,
                    all.as_deref().map(|n| (n, &dstart)),
                    |mp, noise| {
                        let fit = self.chunk_fitness(model.loss(mp, batch)?, c, tasks)?;
                        Ok((
                            fit,
                            if kept_here {
                                noise.to_vec()
                            } else {
                                Vec::new()
                            },
                        ))
                    },
                )?;
                let zero = f.scalar(0i32)?;
                let starts: Vec<&Value> = if tasks > 1 {
                    vec![&start, &zero]
                } else {
                    vec![&start]
                };
                let mut next = vec![carried[0].dynamic_update_slice(&fit, &starts)?];
                if !shapes.is_empty() {
                    for (buf, v) in carried[1..]
                        .iter()
                        .zip(noise.iter().flat_map(Noise::values))
                    {
                        let mut at = vec![dstart.clone()];
                        at.resize(v.rank(), zero.clone());
                        let at: Vec<&Value> = at.iter().collect();
                        next.push(buf.dynamic_update_slice(&v, &at)?);
                    }
                }
                Ok(next)
            },
        )?;
        let kept = match (keep, all) {
            (false, _) => None,
            (true, Some(all)) => Some(all),
            (true, None) => Some(noise_from_values(&out[1..], &shapes)),
        };
        Ok((out.swap_remove(0), kept))
    }

    /// `ask`: the generation's base key `fold_in(key, generation)` (as u32[2]) and the
    /// incremented generation.
    pub(super) fn ask(&self, key: &Value, generation: &Value) -> Result<(Value, Value), EsError> {
        let base = Keys::from_data(key)?.fold_in(generation)?.data()?;
        let next = generation.add(&generation.func().scalar(1u32)?)?;
        Ok((base, next))
    }

    /// `apply` over the whole population: fitness `f32[n]` (or `[n, g]`), split over "pop",
    /// and with `keep`, the noise of every direction (`[n / pairing, ..]` per value, split
    /// over "pop" alike) for `tell`.
    fn apply(
        &self,
        model: &dyn Model,
        base_key: &Value,
        params: &[Value],
        batch: &[Value],
        keep: bool,
    ) -> Result<(Value, Option<Vec<Noise>>), EsError> {
        let f = base_key.func();
        let ids = self.member_ids(&f, &Sharding::split(1, 0)?)?;
        let mut inputs: Vec<&Value> = vec![&ids, base_key];
        inputs.extend(params.iter());
        inputs.extend(batch.iter());
        let mut in_sh = vec![Sharding::split(1, 0)?, Sharding::replicated(1)];
        in_sh.extend(inputs[2..].iter().map(|v| Sharding::replicated(v.rank())));
        let tasks = self.layout.tasks;
        let out_rank = if tasks > 1 { 2 } else { 1 };
        let nl = params.len();
        let ranks: Vec<Vec<usize>> = if keep {
            noise_shapes(self.es.strategy.as_ref(), &self.active)?
                .iter()
                .map(|l| l.iter().map(Vec::len).collect())
                .collect()
        } else {
            Vec::new()
        };
        let mut out_sh = vec![Sharding::split(out_rank, 0)?];
        for r in ranks.iter().flatten() {
            out_sh.push(Sharding::split(*r, 0)?);
        }
        let mut out = f.manual_computation(
            &inputs,
            &in_sh,
            &out_sh,
            |loc| -> Result<Vec<Value>, EsError> {
                let (ids, key) = (&loc[0], &loc[1]);
                let (params, batch) = (&loc[2..2 + nl], &loc[2 + nl..]);
                let (fitness, kept) = self.apply_local(model, ids, key, params, batch, keep)?;
                let mut out = vec![fitness];
                out.extend(kept.iter().flatten().flat_map(Noise::values));
                Ok(out)
            },
        )?;
        let kept = keep.then(|| noise_from_values(&out[1..], &ranks));
        Ok((out.swap_remove(0), kept))
    }

    /// `tell`: shaped weights → new parameters (`θ − lr/(nσ) · u` under sgd; the
    /// optimizer's step otherwise, [`super::optimizer`]) and the optimizer's new state
    /// from `opt`, from the noise `apply` kept (`how = B` only) or regenerated.
    fn tell(
        &self,
        base_key: &Value,
        params: &[Value],
        weights: &Value,
        kept: Option<Vec<Noise>>,
        opt: &[Value],
    ) -> Result<(Vec<Value>, Vec<Value>), EsError> {
        let u = self.contraction(base_key, weights, kept)?;
        self.update(&base_key.func(), params, u, opt)
    }

    /// Fitness → weights on every device.
    pub(super) fn shape_fitness(&self, fitness: &Value) -> Result<Value, EsError> {
        let rep = fitness.shard(&Sharding::replicated(fitness.rank()))?;
        Ok(self.es.shaping.weights(&rep)?)
    }

    /// One generation, ask + apply + tell: `(params'…, generation + 1, fitness, opt'…)`.
    fn one_generation(
        &self,
        model: &dyn Model,
        key: &Value,
        params: &[Value],
        generation: &Value,
        batch: &[Value],
        opt: &[Value],
    ) -> Result<Vec<Value>, EsError> {
        let (base_key, next) = self.ask(key, generation)?;
        let keep = self.keeps_noise();
        let (fitness, kept) = self.apply(model, &base_key, params, batch, keep)?;
        let weights = self.shape_fitness(&fitness)?;
        let (mut out, opt) = self.tell(&base_key, params, &weights, kept, opt)?;
        out.push(next);
        out.push(fitness);
        out.extend(opt);
        Ok(out)
    }

    /// `steps` generations as a `while` loop carrying the parameters, the generation, the
    /// last fitness and the optimizer state.
    fn generation_loop(
        &self,
        model: &dyn Model,
        args: &ProgramArgs<Value>,
        steps: i32,
    ) -> Result<Vec<Value>, EsError> {
        let (key, params, batch) = (&args.key, &args.params, &args.batch);
        let f = key.func();
        let fshape = self.layout.fitness_type().shape;
        let fit0 = f
            .full(0.0f32, &fshape)?
            .shard(&Sharding::split(fshape.len(), 0)?)?;
        let nl = params.len();
        let mut init: Vec<&Value> = params.iter().collect();
        init.push(&args.generation);
        init.push(&fit0);
        init.extend(args.opt_state.iter());
        f.fori_loop(0, steps, &init, |_, c| -> Result<Vec<Value>, EsError> {
            self.one_generation(model, key, &c[..nl], &c[nl], batch, &c[nl + 2..])
        })
    }
}
