//! The layer stacks of a [`Layout`]: a model whose layers are a loop holds each layer leaf
//! name as one `[L, …]` argument ([`Stack`]), and the layout's parameter [`Slot`]s say which
//! argument holds which leaf. [`Layout::views`] and [`Layout::restack`] convert between the
//! slots' values and every leaf's value, so that the tree, checkpoints, the optimizer's
//! state and the sums of a run across processes stay per leaf.

use crate::builder::{TensorType, Value};

use super::super::error::{invalid, EsError};
use super::super::model::LayerLeaves;
use super::super::strategy::LeafInfo;
use super::Layout;

/// One layer leaf name of every layer, held as one `[L, …]` argument: row `l` is layer
/// `l`'s leaf.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stack {
    /// The argument's name, `{prefix}stack.{name}` (e.g. `model.layers.stack.mlp.up_proj.weight`).
    pub name: String,
    /// The leaf positions of layers `0..L`, in order.
    pub positions: Vec<usize>,
    /// One layer's leaf shape (the argument is `[L, ..shape]`).
    pub shape: Vec<i64>,
}

impl Stack {
    /// The argument's type, `f32[L, ..shape]`.
    pub fn ty(&self) -> TensorType {
        let mut shape = vec![self.positions.len() as i64];
        shape.extend_from_slice(&self.shape);
        TensorType::f32(&shape)
    }

    /// Row `l` of the stack's value `v`: layer `l`'s leaf (of `v`'s row shape, which is
    /// the leaf's transpose for a stack of matrices stored `(in, out)`: [`Layout::in_out`]).
    pub fn row(&self, v: &Value, l: usize) -> Result<Value, EsError> {
        let l = l as i64;
        Ok(v.slice_in_dim(l, l + 1, 0)?.reshape(&v.shape()[1..])?)
    }

    /// The stack's value from its layers' leaves `rows` (one per layer, in order).
    pub fn join(&self, rows: &[Value]) -> Result<Value, EsError> {
        let first = rows.first().ok_or_else(|| {
            invalid(
                format!("no rows for stack `{}`", self.name),
                "pass one value per layer".into(),
            )
        })?;
        let mut shape = vec![1];
        shape.extend_from_slice(&self.shape);
        let rows = rows
            .iter()
            .map(|r| r.reshape(&shape))
            .collect::<Result<Vec<_>, _>>()?;
        let rows: Vec<&Value> = rows.iter().collect();
        Ok(first.func().concatenate(&rows, 0)?)
    }
}

/// What one parameter argument holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Slot {
    /// The leaf at this position of [`Layout::leaves`].
    Leaf(usize),
    /// The stack at this position of [`Layout::stacks`].
    Stack(usize),
}

impl Layout {
    /// The same layout with the layer leaves of `layers` (a model's
    /// [`crate::es::Model::layers`]) held as `[L, …]` stacks, one per leaf name. All or
    /// nothing: when a layer lacks one of the names or its shape differs from layer 0's,
    /// every leaf stays its own argument. `None` (layers emitted unrolled) changes
    /// nothing.
    pub fn with_layers(self, layers: Option<&LayerLeaves>) -> Layout {
        let stacks = layers.map(|spec| stacks_of(spec, &self.leaves));
        self.with_stacks(stacks.unwrap_or_default())
    }

    /// The same layout with `stacks` (e.g. another layout's, for a state that programs of
    /// several kinds share). Positions out of range or used twice leave every leaf its
    /// own argument.
    pub fn with_stacks(mut self, stacks: Vec<Stack>) -> Layout {
        let mut owner: Vec<Option<(usize, usize)>> = vec![None; self.leaves.len()];
        let mut fits = true;
        for (s, st) in stacks.iter().enumerate() {
            for (l, &p) in st.positions.iter().enumerate() {
                match owner.get_mut(p) {
                    Some(o @ None) if self.leaves[p].shape == st.shape => *o = Some((s, l)),
                    _ => fits = false,
                }
            }
        }
        if !fits || stacks.is_empty() {
            self.stacks = Vec::new();
            self.slots = (0..self.leaves.len()).map(Slot::Leaf).collect();
            return self;
        }
        self.slots = owner
            .iter()
            .enumerate()
            .filter_map(|(p, o)| match o {
                None => Some(Slot::Leaf(p)),
                Some((s, 0)) => Some(Slot::Stack(*s)),
                Some(_) => None,
            })
            .collect();
        self.stacks = stacks;
        self
    }

    /// The parameter arguments (and results) in order.
    pub fn slots(&self) -> &[Slot] {
        &self.slots
    }

    /// The type of each parameter argument, in [`Layout::slots`] order.
    pub fn slot_types(&self) -> Vec<TensorType> {
        self.slots.iter().map(|s| self.slot_type(*s)).collect()
    }

    pub(super) fn slot_type(&self, slot: Slot) -> TensorType {
        match slot {
            Slot::Leaf(p) => TensorType::f32(&self.leaves[p].shape),
            Slot::Stack(s) => self.stacks[s].ty(),
        }
    }

    pub(super) fn slot_name(&self, slot: Slot) -> &str {
        match slot {
            Slot::Leaf(p) => &self.leaves[p].path,
            Slot::Stack(s) => &self.stacks[s].name,
        }
    }

    /// Refuses `slots` unless it holds one value per parameter argument.
    fn check_slot_values(&self, slots: &[Value]) -> Result<(), EsError> {
        if slots.len() == self.slots.len() {
            return Ok(());
        }
        Err(self.count_error(
            "parameter values",
            slots.len(),
            self.slots.len(),
            "one per parameter argument".into(),
        ))
    }

    /// The parameter arguments' values `slots` with every matrix transposed, `(in, out)`:
    /// a 2-D leaf's argument, and a stack of them (`[L, out, in]`) as `[L, in, out]`.
    /// [`Layout::views`] of the result gives each matrix's transpose.
    pub fn in_out(&self, slots: &[Value]) -> Result<Vec<Value>, EsError> {
        self.check_slot_values(slots)?;
        self.slots
            .iter()
            .zip(slots)
            .map(|(slot, v)| {
                Ok(match *slot {
                    Slot::Leaf(p) if self.leaves[p].shape.len() == 2 => v.transpose(&[1, 0])?,
                    Slot::Stack(s) if self.stacks[s].shape.len() == 2 => v.transpose(&[0, 2, 1])?,
                    _ => v.clone(),
                })
            })
            .collect()
    }

    /// Every leaf's value (in [`Layout::leaves`] order) from the parameter arguments'
    /// values `slots`: a stacked leaf is its row of the stack.
    pub fn views(&self, slots: &[Value]) -> Result<Vec<Value>, EsError> {
        self.check_slot_values(slots)?;
        let mut out: Vec<Option<Value>> = vec![None; self.leaves.len()];
        for (slot, v) in self.slots.iter().zip(slots) {
            match *slot {
                Slot::Leaf(p) => out[p] = Some(v.clone()),
                Slot::Stack(s) => {
                    let st = &self.stacks[s];
                    for (l, &p) in st.positions.iter().enumerate() {
                        out[p] = Some(st.row(v, l)?);
                    }
                }
            }
        }
        out.into_iter().collect::<Option<Vec<_>>>().ok_or_else(|| {
            invalid(
                "a leaf is in no parameter argument".into(),
                "report this: a layout's slots cover every leaf".into(),
            )
        })
    }

    /// Leaf `p`'s value from the parameter arguments' values `slots` (its row of a stack
    /// where it is stacked).
    pub fn leaf_value(&self, slots: &[Value], p: usize) -> Result<Value, EsError> {
        let missing = || {
            invalid(
                format!("no parameter argument holds leaf {p}"),
                "pass one value per parameter argument of the layout".into(),
            )
        };
        for (slot, v) in self.slots.iter().zip(slots) {
            match *slot {
                Slot::Leaf(q) if q == p => return Ok(v.clone()),
                Slot::Stack(s) => {
                    let st = &self.stacks[s];
                    if let Some(l) = st.positions.iter().position(|&q| q == p) {
                        return st.row(v, l);
                    }
                }
                Slot::Leaf(_) => {}
            }
        }
        Err(missing())
    }

    /// The value of stack `s` among the parameter arguments' values `slots`.
    pub fn stack_value<'v>(&self, slots: &'v [Value], s: usize) -> Option<&'v Value> {
        let j = self.slots.iter().position(|&slot| slot == Slot::Stack(s))?;
        slots.get(j)
    }

    /// The parameter arguments' values from every leaf's value `leaves` (in
    /// [`Layout::leaves`] order): a stack is its layers' leaves, concatenated.
    pub fn restack(&self, leaves: Vec<Value>) -> Result<Vec<Value>, EsError> {
        if leaves.len() != self.leaves.len() {
            return Err(self.count_error(
                "leaf values",
                leaves.len(),
                self.leaves.len(),
                "one per leaf".into(),
            ));
        }
        self.slots
            .iter()
            .map(|slot| match *slot {
                Slot::Leaf(p) => Ok(leaves[p].clone()),
                Slot::Stack(s) => {
                    let st = &self.stacks[s];
                    let rows: Vec<Value> =
                        st.positions.iter().map(|&p| leaves[p].clone()).collect();
                    st.join(&rows)
                }
            })
            .collect()
    }
}

/// The stacks of `spec`'s layer leaves among `leaves`: one per name, or none when a layer
/// lacks a name or a layer's leaf has another shape than layer 0's.
fn stacks_of(spec: &LayerLeaves, leaves: &[LeafInfo]) -> Vec<Stack> {
    if spec.count == 0 {
        return Vec::new();
    }
    let at: std::collections::BTreeMap<&str, usize> = leaves
        .iter()
        .enumerate()
        .map(|(i, l)| (l.path.as_str(), i))
        .collect();
    let mut out = Vec::with_capacity(spec.names.len());
    for name in &spec.names {
        let Some(positions) = (0..spec.count)
            .map(|l| at.get(spec.path(l, name).as_str()).copied())
            .collect::<Option<Vec<usize>>>()
        else {
            return Vec::new();
        };
        let shape = leaves[positions[0]].shape.clone();
        if positions.iter().any(|&p| leaves[p].shape != shape) {
            return Vec::new();
        }
        out.push(Stack {
            name: format!("{}stack.{name}", spec.prefix),
            positions,
            shape,
        });
    }
    out
}
