//! The decoder layers as one `while` over the layer index ([`super::Layers::Loop`]).
//!
//! The tree keeps Hugging Face's per-layer leaves (`model.layers.{l}.…`), each with its
//! own index and noise stream. The ES programs hold each layer leaf name as one `[L, …]`
//! argument on the devices ([`crate::es::Layout::with_layers`]): the loop reads layer `i`
//! from a [`LayerStack`], either the ES program's [`LayerSource`], which takes the base
//! weights from the stacks (a matrix by a `dynamic_slice`, which XLA:CPU copies for its
//! dot, the 1-D leaves by a `case`) and draws the layer's noise inside the loop body (low-rank
//! strategies, [`crate::es::Model::layers`]), or, where the program hands the model every
//! leaf on its own (dense noise, unperturbed outputs), a `stablehlo.case` on the layer
//! index handing the body that layer's values (base weights, perturbed leaves). Either way
//! the body reads them through the seams exactly as layer 0 of the unrolled program
//! would. The KV cache, which the loop writes, is stacked too (`[L, …]`).
//!
//! The loop's carry must keep its types: when the hidden state enters shared (an
//! unperturbed embedding) but the layers are perturbed, layer 0 is emitted before the loop
//! (it makes the state per member) and the loop runs layers `1..L`. When the layers'
//! leaves differ in kind (a glob froze some layers but not others) there is no one body
//! for all of them, and the layers are emitted unrolled.

use crate::builder::{DType, TensorType, Value};
use crate::es::model::Leaf;
use crate::es::{EsError, LayerLeaves, LayerSource, ModelParams};
use crate::nn::{Act, Weight};

use super::{convert, convert_weight, rewrap, Qwen2};

/// Every per-layer leaf, by its name under `model.layers.{l}.`, and whether it is a
/// matrix read through the seams (the biases only where the config has them:
/// [`leaves_of`]).
const LEAVES: [(&str, bool); 12] = [
    ("input_layernorm.weight", false),
    ("post_attention_layernorm.weight", false),
    ("self_attn.q_proj.weight", true),
    ("self_attn.q_proj.bias", false),
    ("self_attn.k_proj.weight", true),
    ("self_attn.k_proj.bias", false),
    ("self_attn.v_proj.weight", true),
    ("self_attn.v_proj.bias", false),
    ("self_attn.o_proj.weight", true),
    ("mlp.gate_proj.weight", true),
    ("mlp.up_proj.weight", true),
    ("mlp.down_proj.weight", true),
];

/// The per-layer leaves of a model with (`attention_bias`) or without q/k/v biases.
pub(super) fn leaves_of(attention_bias: bool) -> Vec<(&'static str, bool)> {
    LEAVES
        .into_iter()
        .filter(|(name, _)| attention_bias || !name.ends_with(".bias"))
        .collect()
}

/// How one leaf is held, which says how many values carry it (a shared matrix stored
/// `(in, out)` or not: [`Weight::InOut`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Plain { in_out: bool },
    Members,
    LowRank { in_out: bool },
    Shared,
    PerMember,
}

/// Where the loop reads its layers: the parameters' own per-layer leaves, or the ES
/// program's [`LayerSource`], which draws each layer's noise inside the loop.
pub(super) enum LayerStack<'p> {
    /// Built from the parameters' leaves.
    Built(Stacked),
    /// Handed over by the parameters ([`ModelParams::layer_source`]).
    Given(&'p dyn LayerSource),
}

impl LayerStack<'_> {
    fn source(&self) -> &dyn LayerSource {
        match self {
            LayerStack::Built(s) => s,
            LayerStack::Given(g) => *g,
        }
    }
}

/// Every layer's leaves as flat values, all layers of one kind and type.
pub(super) struct Stacked {
    names: Vec<(&'static str, bool)>,
    kinds: Vec<Kind>,
    types: Vec<TensorType>,
    layers: Vec<Vec<Value>>,
    members: Option<i64>,
}

impl Stacked {
    /// Reads layer `l`'s leaves (recording the reads as the unrolled program does), in
    /// `dtype`: the model's compute dtype, to which the layer body converts every leaf it
    /// reads anyway. Converted here, outside the layer loop, the loop hands its body the
    /// narrow values (a `case` copies the layer it picks) and no layer is converted again
    /// per token: XLA hoists these converts out of a decode's token loop (the same values,
    /// so the same bits).
    fn read(
        p: &ModelParams,
        names: &[(&'static str, bool)],
        l: usize,
        dtype: DType,
    ) -> Result<(Vec<Kind>, Vec<Value>), EsError> {
        let mut kinds = Vec::with_capacity(names.len());
        let mut vals = Vec::new();
        for &(name, matrix) in names {
            let path = format!("model.layers.{l}.{name}");
            if matrix {
                let w = convert_weight(p.weight(&path)?, dtype)?;
                let (w, in_out) = match w {
                    Weight::InOut(w) => (*w, true),
                    w => (w, false),
                };
                match w {
                    Weight::Plain(v) => {
                        kinds.push(Kind::Plain { in_out });
                        vals.push(v);
                    }
                    Weight::Members(v) => {
                        kinds.push(Kind::Members);
                        vals.push(v);
                    }
                    Weight::LowRank { base, a, b, scale } => {
                        kinds.push(Kind::LowRank { in_out });
                        vals.extend([base, a, b, scale]);
                    }
                    Weight::InOut(_) => {
                        return Err(EsError::Invalid {
                            message: format!("{path} is stored (in, out) twice"),
                            fix: "build an (in, out) weight with Weight::in_out".into(),
                        })
                    }
                }
            } else {
                let a = convert(&p.tensor(&path)?, dtype)?;
                kinds.push(match a.members() {
                    Some(_) => Kind::PerMember,
                    None => Kind::Shared,
                });
                vals.push(a.value().clone());
            }
        }
        Ok((kinds, vals))
    }

    /// All `layers` layers, or `None` when they differ in kind or type (no one loop body
    /// fits them all).
    fn new(
        p: &ModelParams,
        names: Vec<(&'static str, bool)>,
        layers: usize,
        dtype: DType,
    ) -> Result<Option<Self>, EsError> {
        let (kinds, first) = Self::read(p, &names, 0, dtype)?;
        let types: Vec<TensorType> = first.iter().map(|v| v.ty().clone()).collect();
        let mut all = vec![first];
        for l in 1..layers {
            let (k, vals) = Self::read(p, &names, l, dtype)?;
            let t: Vec<TensorType> = vals.iter().map(|v| v.ty().clone()).collect();
            if k != kinds || t != types {
                return Ok(None);
            }
            all.push(vals);
        }
        let members = member_count(&kinds, &all[0]);
        Ok(Some(Stacked {
            names,
            kinds,
            types,
            layers: all,
            members,
        }))
    }

    /// Layer `i`'s leaves (`i` an i32 scalar), named as layer 0's.
    fn select(&self, i: &Value) -> Result<ModelParams<'static>, EsError> {
        let f = i.func();
        let branches: Vec<_> = self
            .layers
            .iter()
            .map(|vals| move || Ok::<_, EsError>(vals.clone()))
            .collect();
        let vals = f.case(i, &self.types, branches)?;
        self.params(&vals)
    }

    /// The leaves of one layer from its flat values, under layer 0's names.
    fn params(&self, vals: &[Value]) -> Result<ModelParams<'static>, EsError> {
        let mut it = vals.iter().cloned();
        let mut next = || {
            it.next().ok_or_else(|| EsError::Invalid {
                message: "a qwen2 layer's values ended early".into(),
                fix: "report this: the layer loop lost track of its leaves".into(),
            })
        };
        let mut leaves = Vec::with_capacity(self.names.len());
        for ((name, _), kind) in self.names.iter().zip(&self.kinds) {
            let leaf = match *kind {
                Kind::Plain { in_out } => Leaf::Matrix(Weight::Plain(next()?).in_out_if(in_out)?),
                Kind::Members => Leaf::Matrix(Weight::Members(next()?)),
                Kind::LowRank { in_out } => Leaf::Matrix(
                    Weight::LowRank {
                        base: next()?,
                        a: next()?,
                        b: next()?,
                        scale: next()?,
                    }
                    .in_out_if(in_out)?,
                ),
                Kind::Shared => Leaf::Dense(Act::shared(next()?)),
                Kind::PerMember => Leaf::Dense(Act::per_member(next()?)?),
            };
            leaves.push((format!("model.layers.0.{name}"), leaf));
        }
        Ok(ModelParams::new(leaves))
    }
}

impl LayerSource for Stacked {
    fn layer(&self, i: &Value) -> Result<ModelParams<'static>, EsError> {
        self.select(i)
    }

    fn members(&self) -> Option<i64> {
        self.members
    }
}

/// The member count of any per-member leaf of a layer.
fn member_count(kinds: &[Kind], vals: &[Value]) -> Option<i64> {
    let mut it = vals.iter();
    for k in kinds {
        let first = it.next()?;
        match k {
            Kind::Members | Kind::PerMember => return first.shape().first().copied(),
            Kind::LowRank { .. } => {
                let (_, _, scale) = (it.next()?, it.next()?, it.next()?);
                return scale.shape().first().copied();
            }
            Kind::Plain { .. } | Kind::Shared => {}
        }
    }
    None
}

/// `a` held with `members` (broadcast when `a` is shared and `members` is `Some`).
pub(super) fn with_members(a: &Act, members: Option<i64>) -> Result<Act, EsError> {
    match (a.members(), members) {
        (None, Some(c)) => {
            let mut shape = vec![c];
            shape.extend_from_slice(a.value().shape());
            let dims: Vec<usize> = (1..shape.len()).collect();
            Ok(Act::per_member(a.value().broadcast_in_dim(&shape, &dims)?)?)
        }
        (got, want) if got == want => Ok(a.clone()),
        (got, want) => Err(EsError::Invalid {
            message: format!(
                "a qwen2 layer value is held by {got:?} members where the layer loop carries \
                 {want:?}"
            ),
            fix: "report this: the layer loop's carry changed its members".into(),
        }),
    }
}

/// Layer `i` of a stacked `[L, …]` activation (logical axis 0), as `[…]`.
pub(super) fn layer_of(stack: &Act, i: &Value) -> Result<Act, EsError> {
    let v = stack.value();
    let off = usize::from(stack.members().is_some());
    let zero = v.func().scalar(0i32)?;
    let mut starts = vec![zero; v.rank()];
    starts[off] = i.clone();
    let refs: Vec<&Value> = starts.iter().collect();
    let mut sizes = v.shape().to_vec();
    sizes[off] = 1;
    let s = v.dynamic_slice(&refs, &sizes)?;
    sizes.remove(off);
    rewrap(stack, s.reshape(&sizes)?)
}

/// `stack` with layer `i` (logical axis 0) replaced by `layer`, held as the stack is.
pub(super) fn put_layer(stack: &Act, i: &Value, layer: &Act) -> Result<Act, EsError> {
    let layer = with_members(layer, stack.members())?;
    let v = stack.value();
    let off = usize::from(stack.members().is_some());
    let mut shape = layer.value().shape().to_vec();
    shape.insert(off, 1);
    let zero = v.func().scalar(0i32)?;
    let mut starts = vec![zero; v.rank()];
    starts[off] = i.clone();
    let refs: Vec<&Value> = starts.iter().collect();
    rewrap(
        stack,
        v.dynamic_update_slice(&layer.value().reshape(&shape)?, &refs)?,
    )
}

/// A layer body: layer `l` (read from the given leaves) at layer index `i` on the hidden
/// state and the loop's other carried values.
pub(super) type Body<'a> =
    dyn Fn(&ModelParams, usize, &Value, &Act, Vec<Act>) -> Result<(Act, Vec<Act>), EsError> + 'a;

impl Qwen2 {
    /// The decoder layers' leaves, for the ES programs to draw a layer at a time
    /// ([`crate::es::Model::layers`]), when the layers are a loop.
    pub(super) fn layer_leaves(&self) -> Option<LayerLeaves> {
        (self.layers == super::Layers::Loop).then(|| LayerLeaves {
            prefix: "model.layers.".into(),
            count: self.config.num_hidden_layers,
            names: leaves_of(self.config.attention_bias)
                .iter()
                .map(|(name, _)| name.to_string())
                .collect(),
        })
    }

    /// The layers to loop over, or `None` when they are emitted unrolled (as configured,
    /// or because their leaves differ in kind).
    pub(super) fn layer_stack<'p>(
        &self,
        p: &ModelParams<'p>,
    ) -> Result<Option<LayerStack<'p>>, EsError> {
        match (self.layers, p.layer_source()) {
            (super::Layers::Unrolled, _) => Ok(None),
            (super::Layers::Loop, Some(source)) => Ok(Some(LayerStack::Given(source))),
            (super::Layers::Loop, None) => Ok(Stacked::new(
                p,
                leaves_of(self.config.attention_bias),
                self.config.num_hidden_layers,
                self.compute_dtype,
            )?
            .map(LayerStack::Built)),
        }
    }

    /// The members the loop's carry is held with: those of `x`, or of the layers' leaves.
    pub(super) fn loop_members(stack: &LayerStack, x: &Act) -> Option<i64> {
        x.members().or(stack.source().members())
    }

    /// Runs every layer through `body` as one `while` over the layer index (layer 0 first,
    /// outside the loop, when it makes a shared hidden state per member). `state` is held
    /// with the loop's members and its types do not change.
    pub(super) fn run_layers(
        &self,
        stack: &LayerStack,
        p: &ModelParams,
        x: Act,
        state: Vec<Act>,
        body: &Body<'_>,
    ) -> Result<(Act, Vec<Act>), EsError> {
        let f = x.value().func();
        let layers = self.config.num_hidden_layers;
        let (mut x, mut state, mut from) = (x, state, 0usize);
        if x.members().is_none() && stack.source().members().is_some() {
            let zero = f.scalar(0i32)?;
            (x, state) = match stack {
                LayerStack::Built(_) => body(p, 0, &zero, &x, state)?,
                LayerStack::Given(source) => body(&source.layer(&zero)?, 0, &zero, &x, state)?,
            };
            from = 1;
        }
        if from >= layers {
            return Ok((x, state));
        }
        let (xm, sm): (Option<i64>, Vec<Option<i64>>) =
            (x.members(), state.iter().map(Act::members).collect());
        let mut init: Vec<&Value> = vec![x.value()];
        init.extend(state.iter().map(Act::value));
        let hi = i32::try_from(layers).map_err(|_| EsError::Invalid {
            message: format!("{layers} qwen2 layers do not fit an i32 loop index"),
            fix: "use fewer layers".into(),
        })?;
        let out = f.fori_loop(from as i32, hi, &init, |i, carry| {
            let lp = stack.source().layer(i)?;
            let x = wrap(&carry[0], xm)?;
            let st = carry[1..]
                .iter()
                .zip(&sm)
                .map(|(v, &m)| wrap(v, m))
                .collect::<Result<Vec<_>, _>>()?;
            let (y, st) = body(&lp, 0, i, &x, st)?;
            let mut next = vec![with_members(&y, xm)?.value().clone()];
            for (a, &m) in st.iter().zip(&sm) {
                next.push(with_members(a, m)?.value().clone());
            }
            Ok::<_, EsError>(next)
        })?;
        let mut it = out.into_iter();
        let x = wrap(
            &it.next().ok_or_else(|| EsError::Invalid {
                message: "the qwen2 layer loop returned nothing".into(),
                fix: "report this".into(),
            })?,
            xm,
        )?;
        let state = it
            .zip(&sm)
            .map(|(v, &m)| wrap(&v, m))
            .collect::<Result<Vec<_>, _>>()?;
        Ok((x, state))
    }

    /// The layers of the teacher-forced forward on `x` as a loop, or `None` when they are
    /// emitted unrolled.
    pub(super) fn loop_layers(
        &self,
        p: &ModelParams,
        x: Act,
        layer: &dyn Fn(&ModelParams, usize, &Act) -> Result<Act, EsError>,
    ) -> Result<Option<Act>, EsError> {
        let Some(stack) = self.layer_stack(p)? else {
            return Ok(None);
        };
        let body = |lp: &ModelParams, l: usize, _: &Value, x: &Act, st: Vec<Act>| {
            Ok((layer(lp, l, x)?, st))
        };
        let (x, _) = self.run_layers(&stack, p, x, Vec::new(), &body)?;
        Ok(Some(x))
    }
}

fn wrap(v: &Value, members: Option<i64>) -> Result<Act, EsError> {
    Ok(match members {
        Some(_) => Act::per_member(v.clone())?,
        None => Act::shared(v.clone()),
    })
}
