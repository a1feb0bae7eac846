//! A model's repeated layers in the ES programs ([`Model::layers`](super::Model::layers)).
//!
//! Every leaf keeps its own argument, index and noise stream: layer `l`'s leaf `j` is
//! drawn from `fold_in(base_key, index)` with its whole-tree index, as when each leaf is
//! drawn on its own, so the noise has the same bits. What changes is where the ops are:
//! `apply` draws and scales one layer's noise inside the model's loop over the layer index
//! ([`LayerDraw`], the model's [`LayerSource`]), the index read from a table by the traced
//! layer number, and `tell` contracts the layers' leaves in a loop over the layer index of
//! its own ([`super::generation`]), so a layer adds no ops to either. The leaves outside the
//! layers are drawn and contracted as before.
//!
//! A group exists only where one loop body fits every layer: each layer has every leaf,
//! with layer 0's shapes and σ (a glob that freezes or scales some layers only leaves the
//! layers to the per-leaf path), and the strategy regenerates its noise per chunk
//! (materialized noise is drawn for every leaf at once anyway).

use std::collections::BTreeMap;

use crate::builder::{DType, TensorType, Value};
use crate::prng::emit::Keys;

use super::error::{invalid, EsError};
use super::generation::noise_shapes;
use super::layout::Layout;
use super::model::{LayerLeaves, LayerSource, ModelParams};
use super::sigma::LeafScale;
use super::strategy::{LeafInfo, Strategy};

/// The model's layers as the emitter sees them: which layout leaves and active leaves each
/// layer's leaves are, and layer 0's leaves, which stand for every layer's in a loop body.
pub(super) struct LayerGroup {
    count: usize,
    /// Per layer, the layout positions of its leaves (in [`LayerLeaves::names`] order).
    pos: Vec<Vec<usize>>,
    /// Per layer, the positions in the emitter's active leaves of its leaves that get noise.
    active_pos: Vec<Vec<usize>>,
    /// Layer 0's leaves and their scales.
    leaves0: Vec<LeafInfo>,
    scales0: Vec<LeafScale>,
    /// Layer 0's leaves that get noise.
    active0: Vec<LeafInfo>,
    /// `[count, active0.len()]`, row-major: the whole-tree index of each layer's active
    /// leaves, their stream ids.
    ids: Vec<u32>,
}

impl LayerGroup {
    /// The group of `spec` among the layout's `leaves` (with their `scales`; `active` the
    /// emitter's leaves that get noise), or `None` when no one loop body fits every layer.
    pub(super) fn resolve(
        spec: &LayerLeaves,
        leaves: &[LeafInfo],
        scales: &[LeafScale],
        active: &[LeafInfo],
    ) -> Option<LayerGroup> {
        if spec.count == 0 || spec.names.is_empty() {
            return None;
        }
        let at: BTreeMap<&str, usize> = leaves
            .iter()
            .enumerate()
            .map(|(i, l)| (l.path.as_str(), i))
            .collect();
        let active_at: BTreeMap<&str, usize> = active
            .iter()
            .enumerate()
            .map(|(i, l)| (l.path.as_str(), i))
            .collect();
        let mut pos = Vec::with_capacity(spec.count);
        for l in 0..spec.count {
            let row = spec
                .names
                .iter()
                .map(|name| at.get(spec.path(l, name).as_str()).copied())
                .collect::<Option<Vec<usize>>>()?;
            pos.push(row);
        }
        let first = &pos[0];
        for row in &pos[1..] {
            for (&p0, &p) in first.iter().zip(row) {
                if leaves[p].shape != leaves[p0].shape || scales[p] != scales[p0] {
                    return None;
                }
            }
        }
        let leaves0: Vec<LeafInfo> = first.iter().map(|&p| leaves[p].clone()).collect();
        let scales0: Vec<LeafScale> = first.iter().map(|&p| scales[p].clone()).collect();
        let active0 = super::sigma::active(&leaves0, &scales0);
        if active0.is_empty() {
            return None;
        }
        let mut active_pos = Vec::with_capacity(spec.count);
        let mut ids = Vec::with_capacity(spec.count * active0.len());
        for row in &pos {
            let mut arow = Vec::with_capacity(active0.len());
            for (&p, s) in row.iter().zip(&scales0) {
                if *s == LeafScale::Frozen {
                    continue;
                }
                arow.push(*active_at.get(leaves[p].path.as_str())?);
                ids.push(u32::try_from(leaves[p].index).ok()?);
            }
            active_pos.push(arow);
        }
        Some(LayerGroup {
            count: spec.count,
            pos,
            active_pos,
            leaves0,
            scales0,
            active0,
            ids,
        })
    }

    /// The number of layers.
    pub(super) fn count(&self) -> usize {
        self.count
    }

    /// Layer 0's leaves, standing for every layer's in a loop body.
    pub(super) fn leaves0(&self) -> &[LeafInfo] {
        &self.leaves0
    }

    /// Layer 0's scales.
    pub(super) fn scales0(&self) -> &[LeafScale] {
        &self.scales0
    }

    /// Layer 0's leaves that get noise.
    pub(super) fn active0(&self) -> &[LeafInfo] {
        &self.active0
    }

    /// Whether layout position `p` is a layer's leaf.
    pub(super) fn holds(&self, p: usize) -> bool {
        self.pos.iter().any(|row| row.contains(&p))
    }

    /// Per layer, the positions in the emitter's active leaves of its leaves that get noise.
    pub(super) fn active_positions(&self) -> &[Vec<usize>] {
        &self.active_pos
    }

    /// Per layer, `params` (one per layout leaf) at its leaves' positions.
    pub(super) fn layer_values(&self, params: &[Value]) -> Result<Vec<Vec<Value>>, EsError> {
        self.pos
            .iter()
            .map(|row| {
                row.iter()
                    .map(|&p| {
                        params.get(p).cloned().ok_or_else(|| {
                            invalid(
                                format!("no parameter for layout leaf {p}"),
                                "pass one parameter per layout leaf".into(),
                            )
                        })
                    })
                    .collect()
            })
            .collect()
    }

    /// The stream keys of layer `i`'s leaves that get noise (`i` an i32 scalar):
    /// `fold_in(base, index)` of each one's whole-tree index, read from a table.
    pub(super) fn streams(&self, base: &Keys, i: &Value) -> Result<Keys, EsError> {
        let f = i.func();
        let a = self.active0.len() as i64;
        let table = f.constant(&[self.count as i64, a], &self.ids)?;
        let zero = f.scalar(0i32)?;
        let row = table.dynamic_slice(&[i, &zero], &[1, a])?.reshape(&[a])?;
        Ok(base.fold_in(&row)?)
    }

    /// The layout's stacks of this group's leaves, in [`LayerLeaves::names`] order, from
    /// the parameter arguments' values `slots`; `None` when the layout holds the layers'
    /// leaves as arguments of their own.
    pub(super) fn stacks(
        &self,
        layout: &Layout,
        slots: &[Value],
    ) -> Result<Option<Vec<Value>>, EsError> {
        let mut out = Vec::with_capacity(self.leaves0.len());
        for j in 0..self.leaves0.len() {
            let column: Vec<usize> = self.pos.iter().map(|row| row[j]).collect();
            let Some(s) = layout.stacks.iter().position(|st| st.positions == column) else {
                return Ok(None);
            };
            let v = layout.stack_value(slots, s).ok_or_else(|| {
                invalid(
                    format!("no parameter value for stack `{}`", layout.stacks[s].name),
                    "pass one value per parameter argument of the layout".into(),
                )
            })?;
            out.push(v.clone());
        }
        Ok(Some(out))
    }

    /// Layer `i`'s leaves (`i` an i32 scalar) as rows of `stacks` (`[L, …]` each, in
    /// [`LayerLeaves::names`] order). A matrix is a `dynamic_slice` of its stack (XLA:CPU
    /// copies the row for its dot, once per member chunk: docs/performance.md, "Qwen2
    /// layers as a loop"); a 1-D leaf is handed over by a `case` on `i`. A 1-D row
    /// sliced dynamically is fused into the elementwise kernels that perturb and apply it,
    /// which rearranges their loops and with them where LLVM forms fused multiply-adds:
    /// the last bits of the losses then move against the unrolled program (measured on
    /// `tests/suite/qwen2_layers.rs`'s models, unpaired low rank on one device: 1 ulp), where
    /// through the `case` they are the same bits.
    pub(super) fn rows(stacks: &[Value], i: &Value) -> Result<Vec<Value>, EsError> {
        let f = i.func();
        let zero = f.scalar(0i32)?;
        let small: Vec<usize> = (0..stacks.len())
            .filter(|&j| stacks[j].rank() < 3)
            .collect();
        let mut out: Vec<Option<Value>> = vec![None; stacks.len()];
        for (j, st) in stacks.iter().enumerate() {
            if small.contains(&j) {
                continue;
            }
            let shape = &st.shape()[1..];
            let mut at = vec![i.clone()];
            at.resize(st.rank(), zero.clone());
            let at: Vec<&Value> = at.iter().collect();
            let mut sizes = vec![1];
            sizes.extend_from_slice(shape);
            out[j] = Some(st.dynamic_slice(&at, &sizes)?.reshape(shape)?);
        }
        if !small.is_empty() {
            let layers = stacks[small[0]].shape()[0];
            let types: Vec<TensorType> = small
                .iter()
                .map(|&j| TensorType::f32(&stacks[j].shape()[1..]))
                .collect();
            let branches: Vec<_> = (0..layers)
                .map(|l| {
                    let small = &small;
                    move || -> Result<Vec<Value>, EsError> {
                        small
                            .iter()
                            .map(|&j| {
                                let st = &stacks[j];
                                Ok(st.slice_in_dim(l, l + 1, 0)?.reshape(&st.shape()[1..])?)
                            })
                            .collect()
                    }
                })
                .collect();
            for (&j, v) in small.iter().zip(f.case(i, &types, branches)?) {
                out[j] = Some(v);
            }
        }
        Ok(out.into_iter().flatten().collect())
    }

    /// `stacks` (in [`LayerGroup::leaves0`] order) with every matrix that reaches the model
    /// as it is stored (frozen, or the base of a low-rank perturbation) converted to the
    /// compute dtype `dtype`, once, before the model's loops. The model converts each
    /// matrix it reads to that dtype anyway; converted here, a decode's layer loop copies
    /// the narrow row it cuts for a layer, not the f32 one and then its conversion, every
    /// token. The same values, so the same bits. Matrices that get dense noise stay in f32
    /// (the noise is added to the f32 base), as do the 1-D leaves.
    pub(super) fn narrow_bases(
        &self,
        stacks: Vec<Value>,
        strategy: &dyn Strategy,
        dtype: DType,
    ) -> Result<Vec<Value>, EsError> {
        if dtype == DType::F32 {
            return Ok(stacks);
        }
        let shapes = noise_shapes(strategy, &self.active0)?;
        stacks
            .into_iter()
            .zip(self.leaves0.iter().zip(&self.scales0))
            .map(|(st, (leaf, scale))| {
                let as_stored = *scale == LeafScale::Frozen
                    || self
                        .active0
                        .iter()
                        .position(|a| a.path == leaf.path)
                        .is_some_and(|k| shapes[k].len() == 2);
                Ok(if leaf.shape.len() == 2 && as_stored {
                    st.convert(dtype)?
                } else {
                    st
                })
            })
            .collect()
    }

    /// The layer leaves `values` (per layer, in [`LayerLeaves::names`] order) of layer
    /// `i` (an i32 scalar), selected by a `case`.
    pub(super) fn select(values: &[Vec<Value>], i: &Value) -> Result<Vec<Value>, EsError> {
        let f = i.func();
        let first = values.first().ok_or_else(|| {
            invalid(
                "a layer group without layers".into(),
                "report this: a group has at least one layer".into(),
            )
        })?;
        let types: Vec<TensorType> = first.iter().map(|v| v.ty().clone()).collect();
        let branches: Vec<_> = values
            .iter()
            .map(|vals| move || Ok::<_, EsError>(vals.clone()))
            .collect();
        f.case(i, &types, branches)
    }
}

/// One chunk's layers for the model, drawn a layer at a time by `draw` (layer `i`'s base
/// leaves selected by a `case`, its noise drawn from its leaves' streams and scaled for
/// the chunk's members, as the emitter perturbs any leaf).
pub(super) struct LayerDraw<'e> {
    /// Layer `i`'s perturbed leaves, named as layer 0's.
    pub(super) draw: &'e dyn Fn(&Value) -> Result<ModelParams<'static>, EsError>,
    /// The chunk's members.
    pub(super) members: Option<i64>,
}

impl LayerSource for LayerDraw<'_> {
    fn layer(&self, i: &Value) -> Result<ModelParams<'static>, EsError> {
        (self.draw)(i)
    }

    fn members(&self) -> Option<i64> {
        self.members
    }
}
