//! The seams: [`dense`] and [`embed`], the only ways a model reads a 2-D weight.
//!
//! A model is written once, for one member, against [`Act`] (an activation shared by a
//! chunk of members or held per member) and [`Weight`] (a plain matrix, one matrix per
//! member, or a base matrix plus per-member rank-r factors). The seams pick the cheapest
//! contraction for each combination: with a shared input and a low-rank weight the base
//! product `x Wᵀ` is computed once for the whole chunk and only the rank-r correction is
//! per member; the factors are never multiplied out. [`Weight`] has no arithmetic of its
//! own, so a model cannot densify a structured weight by accident.
//!
//! Weights are stored `(out, in)`: `dense(x, W) = x · Wᵀ`, `embed(E, ids) = E[ids]`. A
//! program that reads its shared matrices many times (a decoder's token loop) can transpose
//! them once and hand them over stored `(in, out)` ([`Weight::InOut`]): the seams compute
//! the same values from either layout, and XLA:CPU's dot with few rows runs faster on the
//! second (docs/performance.md, "Decoding: the weights stored (in, out)").
//!
//! Precision: the seams compute in the weight's dtype (an input of another float dtype is
//! rounded to it), and an elementwise op between float activations of different widths
//! promotes to the wider (as JAX does). Under the ES's bf16 compute dtype every weight is
//! bf16 ([`Weight::convert`]), so the contractions run in bf16 while an f32 input, target
//! or residual keeps its precision where it meets them.

use crate::builder::{broadcast_shape, DType, DotDims, HloError, Result, Value};

/// A 2-D weight as the seams see it.
#[derive(Clone, Debug)]
pub enum Weight {
    /// The same `(m, k)` matrix for every member.
    Plain(Value),
    /// One `(m, k)` matrix per member: `[C, m, k]` (full-rank perturbations).
    Members(Value),
    /// `W_i = base + scale_i · A_i B_iᵀ` without ever forming it: `base (m, k)`,
    /// `a [C, r, m]`, `b [C, r, k]`, `scale [C]` (`s σ / √r` per member).
    LowRank {
        /// The shared base matrix `(m, k)`.
        base: Value,
        /// Left factors, `[C, r, m]`.
        a: Value,
        /// Right factors, `[C, r, k]`.
        b: Value,
        /// Per-member scale, `[C]`.
        scale: Value,
    },
    /// A [`Weight::Plain`] or [`Weight::LowRank`] whose shared matrix is stored
    /// transposed, `(k, m)`: the same weight to the seams, which contract the matrix's
    /// first axis instead of its second (and gather an embedding's columns). Made by
    /// [`Weight::in_out`].
    InOut(Box<Weight>),
}

impl Weight {
    /// A [`Weight::InOut`] of `stored`, a plain or low-rank weight whose shared matrix
    /// already holds the transpose, `(k, m)` (factors and scale as for any low-rank
    /// weight). Refuses a per-member weight and one stored `(in, out)` already.
    pub fn in_out(stored: Weight) -> Result<Weight> {
        match stored {
            Weight::Plain(_) | Weight::LowRank { .. } => Ok(Weight::InOut(Box::new(stored))),
            other => Err(seam_err(
                "Weight::in_out",
                format!("{other:?}"),
                "only a plain or low-rank weight's shared matrix is stored (in, out)",
            )),
        }
    }

    /// `self` as [`Weight::in_out`] makes it when `in_out` (its values hold the transpose),
    /// else as it is.
    pub fn in_out_if(self, in_out: bool) -> Result<Weight> {
        if in_out {
            Weight::in_out(self)
        } else {
            Ok(self)
        }
    }

    /// The matrix shape `(m, k)` every member sees.
    pub fn matrix_shape(&self) -> [i64; 2] {
        let s = match self {
            Weight::Plain(w) | Weight::LowRank { base: w, .. } => w.shape(),
            Weight::Members(w) => &w.shape()[1..],
            Weight::InOut(w) => {
                let [k, m] = w.matrix_shape();
                return [m, k];
            }
        };
        [s[0], s[1]]
    }

    /// Members per chunk, if the weight differs between members.
    pub fn members(&self) -> Option<i64> {
        match self {
            Weight::Plain(_) => None,
            Weight::Members(w) => Some(w.shape()[0]),
            Weight::LowRank { scale, .. } => Some(scale.shape()[0]),
            Weight::InOut(w) => w.members(),
        }
    }

    /// The element type the seams compute in (a low-rank weight's base's).
    pub fn dtype(&self) -> DType {
        match self {
            Weight::Plain(w) | Weight::Members(w) | Weight::LowRank { base: w, .. } => w.dtype(),
            Weight::InOut(w) => w.dtype(),
        }
    }

    /// The weight as seam `op` contracts it: the weight stored `(out, in)` and the axis of
    /// its shared matrix that meets the input (1 stored `(out, in)`, 0 stored `(in, out)`).
    /// Refuses an [`Weight::InOut`] that [`Weight::in_out`] would not have made (a
    /// per-member matrix, or one transposed twice, built as a variant by hand).
    fn stored(&self, op: &str) -> Result<(&Weight, usize)> {
        match self {
            Weight::InOut(w) => match **w {
                Weight::Plain(_) | Weight::LowRank { .. } => Ok((w, 0)),
                _ => Err(seam_err(
                    op,
                    "Weight::InOut".into(),
                    "only a plain or low-rank weight is stored (in, out); build it with \
                     Weight::in_out",
                )),
            },
            w => Ok((w, 1)),
        }
    }

    /// The same weight in `dtype`: each value converted on its own (a low-rank weight's
    /// base, factors and scale, never their product). The identity, with no op, when the
    /// weight has that dtype already.
    pub fn convert(&self, dtype: DType) -> Result<Weight> {
        let c = |v: &Value| -> Result<Value> {
            if v.dtype() == dtype {
                Ok(v.clone())
            } else {
                v.convert(dtype)
            }
        };
        Ok(match self {
            Weight::Plain(v) => Weight::Plain(c(v)?),
            Weight::Members(v) => Weight::Members(c(v)?),
            Weight::LowRank { base, a, b, scale } => Weight::LowRank {
                base: c(base)?,
                a: c(a)?,
                b: c(b)?,
                scale: c(scale)?,
            },
            Weight::InOut(w) => Weight::InOut(Box::new(w.convert(dtype)?)),
        })
    }
}

/// An activation: one value shared by every member of a chunk, or one per member
/// (`members = Some(C)`, leading dimension `C`).
///
/// Model code sees the *logical* shape (without the member dimension); every method
/// aligns shared and per-member operands itself.
#[derive(Clone, Debug)]
pub struct Act {
    v: Value,
    members: Option<i64>,
}

fn seam_err(op: &str, types: String, reason: impl Into<String>) -> HloError {
    HloError::InvalidAttribute {
        op: op.into(),
        types,
        reason: reason.into(),
    }
}

/// A scalar constant of `like`'s dtype holding `x` rounded to that dtype.
fn rounded(like: &Value, x: f64) -> Result<Value> {
    let f = like.func();
    match like.dtype() {
        DType::F64 => f.scalar(x),
        // Rounding to the activation's precision is the point.
        DType::F32 => f.scalar(x as f32),
        d if d.is_float() => f.scalar(x as f32)?.convert(d),
        _ => like.const_like(x),
    }
}

/// numpy broadcast of two logical shapes.
fn broadcast_logical(op: &str, a: &[i64], b: &[i64]) -> Result<Vec<i64>> {
    broadcast_shape(a, b).ok_or_else(|| {
        seam_err(
            op,
            format!("{a:?} and {b:?}"),
            "logical shapes are not broadcast-compatible",
        )
    })
}

impl Act {
    /// An activation shared by all members.
    pub fn shared(v: Value) -> Act {
        Act { v, members: None }
    }

    /// A per-member activation; `v`'s leading dimension is the member dimension.
    pub fn per_member(v: Value) -> Result<Act> {
        let c = *v.shape().first().ok_or_else(|| {
            seam_err(
                "Act::per_member",
                v.ty().to_string(),
                "needs a leading member dimension",
            )
        })?;
        Ok(Act {
            v,
            members: Some(c),
        })
    }

    /// The underlying value (with the member dimension first if per member).
    pub fn value(&self) -> &Value {
        &self.v
    }

    /// Members, if the activation differs per member.
    pub fn members(&self) -> Option<i64> {
        self.members
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.v.dtype()
    }

    /// The same activation in `dtype` (the identity, with no op, when it has it already).
    pub fn convert(&self, dtype: DType) -> Result<Act> {
        if self.dtype() == dtype {
            return Ok(self.clone());
        }
        self.map(|v| v.convert(dtype))
    }

    /// `self` and `other` in one float dtype, the wider of the two (JAX's promotion of a
    /// bf16 and an f32 operand); anything else as it is, for the op to check.
    fn promoted(&self, other: &Act) -> Result<(Act, Act)> {
        let (a, b) = (self.dtype(), other.dtype());
        if a == b || !a.is_float() || !b.is_float() || a.bits() == b.bits() {
            return Ok((self.clone(), other.clone()));
        }
        let wide = if a.bits() > b.bits() { a } else { b };
        Ok((self.convert(wide)?, other.convert(wide)?))
    }

    /// The shape one member sees.
    pub fn logical_shape(&self) -> &[i64] {
        match self.members {
            Some(_) => &self.v.shape()[1..],
            None => self.v.shape(),
        }
    }

    fn offset(&self) -> usize {
        usize::from(self.members.is_some())
    }

    /// This activation broadcast to logical shape `shape` with `c` members (`None`: shared).
    fn align(&self, c: Option<i64>, shape: &[i64]) -> Result<Value> {
        let own = self.logical_shape();
        if self.members == c && own == shape {
            return Ok(self.v.clone());
        }
        let lead = usize::from(c.is_some());
        let mut full = Vec::with_capacity(shape.len() + lead);
        full.extend(c);
        full.extend_from_slice(shape);
        // Logical dims align on the right; the member dim (if any) maps to dim 0.
        let skip = shape.len() - own.len();
        let mut dims: Vec<usize> = Vec::new();
        if self.members.is_some() {
            dims.push(0);
        }
        dims.extend((0..own.len()).map(|i| lead + skip + i));
        self.v.broadcast_in_dim(&full, &dims)
    }

    fn common(&self, other: &Act, op: &str) -> Result<(Option<i64>, Vec<i64>)> {
        let c = match (self.members, other.members) {
            (Some(a), Some(b)) if a != b => {
                return Err(seam_err(
                    op,
                    format!("{} and {}", self.v.ty(), other.v.ty()),
                    format!("activations of {a} and {b} members cannot be combined"),
                ))
            }
            (a, b) => a.or(b),
        };
        let shape = broadcast_logical(op, self.logical_shape(), other.logical_shape())?;
        Ok((c, shape))
    }

    /// Applies an elementwise function to the value (member dimension included).
    pub fn map(&self, f: impl FnOnce(&Value) -> Result<Value>) -> Result<Act> {
        let v = f(&self.v)?;
        if v.shape() != self.v.shape() {
            return Err(seam_err(
                "Act::map",
                format!("{} -> {}", self.v.ty(), v.ty()),
                "map must be elementwise (same shape)",
            ));
        }
        Ok(Act {
            v,
            members: self.members,
        })
    }

    /// Combines two activations elementwise with numpy broadcasting of the logical shapes.
    /// Float operands of different widths are promoted to the wider first.
    pub fn zip(&self, other: &Act, f: impl FnOnce(&Value, &Value) -> Result<Value>) -> Result<Act> {
        let (x, y) = self.promoted(other)?;
        let (c, shape) = x.common(&y, "Act::zip")?;
        let a = x.align(c, &shape)?;
        let b = y.align(c, &shape)?;
        Ok(Act {
            v: f(&a, &b)?,
            members: c,
        })
    }

    /// `self + other`.
    pub fn add(&self, other: &Act) -> Result<Act> {
        self.zip(other, |a, b| a.add(b))
    }

    /// `self - other`.
    pub fn sub(&self, other: &Act) -> Result<Act> {
        self.zip(other, |a, b| a.sub(b))
    }

    /// `self * other`.
    pub fn mul(&self, other: &Act) -> Result<Act> {
        self.zip(other, |a, b| a.mul(b))
    }

    /// `self / other`.
    pub fn div(&self, other: &Act) -> Result<Act> {
        self.zip(other, |a, b| a.div(b))
    }

    /// `self * x` for a constant `x`, rounded once to the activation's dtype (like a
    /// Python float meeting a JAX array).
    pub fn scale(&self, x: f64) -> Result<Act> {
        self.map(|v| v.mul(&rounded(v, x)?))
    }

    /// `self + x` for a constant `x`, rounded once to the activation's dtype.
    pub fn add_scalar(&self, x: f64) -> Result<Act> {
        self.map(|v| v.add(&rounded(v, x)?))
    }

    fn last_dim(&self) -> Result<usize> {
        if self.logical_shape().is_empty() {
            return Err(seam_err(
                "Act",
                self.v.ty().to_string(),
                "needs a logical rank >= 1",
            ));
        }
        Ok(self.v.rank() - 1)
    }

    fn keep_last(&self, v: Value) -> Result<Act> {
        let mut shape = self.v.shape().to_vec();
        if let Some(l) = shape.last_mut() {
            *l = 1;
        }
        Ok(Act {
            v: v.reshape(&shape)?,
            members: self.members,
        })
    }

    /// Sum over the last logical axis, keeping it with size 1.
    pub fn sum_last(&self) -> Result<Act> {
        let d = self.last_dim()?;
        self.keep_last(self.v.reduce_sum(&[d])?)
    }

    /// Mean over the last logical axis, keeping it with size 1.
    pub fn mean_last(&self) -> Result<Act> {
        let d = self.last_dim()?;
        self.keep_last(self.v.reduce_mean(&[d])?)
    }

    /// Max over the last logical axis, keeping it with size 1.
    pub fn max_last(&self) -> Result<Act> {
        let d = self.last_dim()?;
        self.keep_last(self.v.reduce_max(&[d])?)
    }

    /// Mean over every logical axis: one scalar per member (logical shape `[]`).
    ///
    /// Reduced in two f32 stages, the last axis first and then the rest: more accurate
    /// than one long accumulation, and it rounds as XLA rounds JAX's `jnp.mean` of the same
    /// array (the quickstart's unperturbed loss is bit-exact this way, one ulp off with a
    /// single reduce).
    pub fn mean_all(&self) -> Result<Act> {
        let staged = if self.logical_shape().len() >= 2 {
            let d = self.v.rank() - 1;
            self.v.reduce_mean(&[d])?
        } else {
            self.v.clone()
        };
        let dims: Vec<usize> = (self.offset()..staged.rank()).collect();
        let v = if dims.is_empty() {
            staged
        } else {
            staged.reduce_mean(&dims)?
        };
        Ok(Act {
            v,
            members: self.members,
        })
    }

    /// Mean over the logical axes `dims` (dropping them).
    pub fn mean_dims(&self, dims: &[usize]) -> Result<Act> {
        let off = self.offset();
        let d: Vec<usize> = dims.iter().map(|x| x + off).collect();
        Ok(Act {
            v: self.v.reduce_mean(&d)?,
            members: self.members,
        })
    }

    /// Softmax over the last logical axis (max-subtracted).
    pub fn softmax_last(&self) -> Result<Act> {
        let m = self.max_last()?;
        let e = self.sub(&m)?.map(|v| v.exp())?;
        e.div(&e.sum_last()?)
    }

    /// Batched matrix product over the last two logical axes: `[.., p, q] × [.., q, r]`
    /// (`transpose_rhs`: `[.., r, q]`), batch axes equal.
    pub fn bmm(&self, other: &Act, transpose_rhs: bool) -> Result<Act> {
        let op = "Act::bmm";
        let (la, lb) = (self.logical_shape(), other.logical_shape());
        if la.len() < 2 || la.len() != lb.len() || la[..la.len() - 2] != lb[..lb.len() - 2] {
            return Err(seam_err(
                op,
                format!("{} and {}", self.v.ty(), other.v.ty()),
                "needs equal logical ranks >= 2 with equal batch axes",
            ));
        }
        let c = match (self.members, other.members) {
            (Some(a), Some(b)) if a != b => {
                return Err(seam_err(
                    op,
                    format!("{} and {}", self.v.ty(), other.v.ty()),
                    "different member counts",
                ))
            }
            (a, b) => a.or(b),
        };
        let a = self.align(c, la)?;
        let b = other.align(c, lb)?;
        let rank = a.rank();
        let batch: Vec<usize> = (0..rank - 2).collect();
        let dims = DotDims {
            lhs_batch: batch.clone(),
            rhs_batch: batch,
            lhs_contract: vec![rank - 1],
            rhs_contract: vec![if transpose_rhs { rank - 1 } else { rank - 2 }],
        };
        Ok(Act {
            v: a.dot_general(&b, &dims)?,
            members: c,
        })
    }
}

/// Flattens the logical leading axes: `[C?, L.., k] -> [C?, T, k]`, returning the logical
/// leading shape `L`.
fn flatten_rows(x: &Act) -> Result<(Value, Vec<i64>)> {
    let l = x.logical_shape();
    let lead = l[..l.len() - 1].to_vec();
    let t: i64 = lead.iter().product();
    let k = l[l.len() - 1];
    let shape: Vec<i64> = match x.members {
        Some(c) => vec![c, t, k],
        None => vec![t, k],
    };
    Ok((x.v.reshape(&shape)?, lead))
}

fn unflatten(v: Value, c: Option<i64>, lead: &[i64], m: i64) -> Result<Act> {
    let mut shape: Vec<i64> = c.into_iter().collect();
    shape.extend_from_slice(lead);
    shape.push(m);
    Ok(Act {
        v: v.reshape(&shape)?,
        members: c,
    })
}

/// `dense(x, W) = x · Wᵀ` for `W` stored `(out, in)`; `x` has logical shape `[.., in]`.
/// Computed in `W`'s dtype: a float `x` of another dtype is rounded to it first.
pub fn dense(x: &Act, w: &Weight) -> Result<Act> {
    let op = "nn::dense";
    let cast;
    let x = if x.dtype() != w.dtype() && x.dtype().is_float() && w.dtype().is_float() {
        cast = x.convert(w.dtype())?;
        &cast
    } else {
        x
    };
    let [m, k] = w.matrix_shape();
    let l = x.logical_shape();
    if l.last() != Some(&k) {
        return Err(seam_err(
            op,
            format!("x {} and W (out={m}, in={k})", x.v.ty()),
            format!("x's last axis must equal W's input size {k}; weights are stored (out, in)"),
        ));
    }
    if let (Some(a), Some(b)) = (x.members, w.members()) {
        if a != b {
            return Err(seam_err(
                op,
                format!("x {} and W with {b} members", x.v.ty()),
                "x and W hold different member counts",
            ));
        }
    }
    let (xf, lead) = flatten_rows(x)?;
    // `i`: the shared matrix's input axis (its first when stored (in, out)).
    let (w, i) = w.stored(op)?;
    match (w, x.members) {
        (Weight::Plain(w), c) => {
            let r = xf.rank();
            let y = xf.dot_general(w, &DotDims::new(&[], &[], &[r - 1], &[i]))?;
            unflatten(y, c, &lead, m)
        }
        (Weight::Members(w), None) => {
            // [T, k] · [C, m, k] -> [T, C, m] -> [C, T, m]
            let y = xf
                .dot_general(w, &DotDims::new(&[], &[], &[1], &[2]))?
                .transpose(&[1, 0, 2])?;
            unflatten(y, w.shape().first().copied(), &lead, m)
        }
        (Weight::Members(w), Some(c)) => {
            let y = xf.dot_general(w, &DotDims::new(&[0], &[0], &[2], &[2]))?;
            unflatten(y, Some(c), &lead, m)
        }
        (Weight::LowRank { base, a, b, scale }, None) => {
            let c = scale.shape()[0];
            let t = xf.shape()[0];
            // The base product is shared by the whole chunk: one GEMM.
            let shared = xf.dot_general(base, &DotDims::new(&[], &[], &[1], &[i]))?;
            // [T, k] · [C, r, k] -> [T, C, r]
            let xb = xf.dot_general(b, &DotDims::new(&[], &[], &[1], &[2]))?;
            // [T, C, r] · [C, r, m] (batch C) -> [C, T, m], then the scale, in the spec's
            // order ((x B) Aᵀ) · sσ/√r so fitness rounds as the reference does.
            let corr = xb.dot_general(a, &DotDims::new(&[1], &[0], &[2], &[1]))?;
            let corr = corr.mul(&scale.broadcast_in_dim(&[c, t, m], &[0])?)?;
            let y = shared.broadcast_in_dim(&[c, t, m], &[1, 2])?.add(&corr)?;
            unflatten(y, Some(c), &lead, m)
        }
        (Weight::LowRank { base, a, b, scale }, Some(c)) => {
            let t = xf.shape()[1];
            let base_out = xf.dot_general(base, &DotDims::new(&[], &[], &[2], &[i]))?;
            let xb = xf.dot_general(b, &DotDims::new(&[0], &[0], &[2], &[2]))?;
            let corr = xb.dot_general(a, &DotDims::new(&[0], &[0], &[2], &[1]))?;
            let corr = corr.mul(&scale.broadcast_in_dim(&[c, t, m], &[0])?)?;
            unflatten(base_out.add(&corr)?, Some(c), &lead, m)
        }
        (Weight::InOut(_), _) => unreachable_in_out(op),
    }
}

/// The arm of a match on a weight [`Weight::stored`] returned, which is never
/// [`Weight::InOut`]: an error rather than a panic all the same.
fn unreachable_in_out<T>(op: &str) -> Result<T> {
    Err(seam_err(
        op,
        "Weight::InOut".into(),
        "a weight stored (in, out) twice; build it with Weight::in_out",
    ))
}

/// `embed(E, ids) = E[ids]` for a table `E` of shape `(vocab, d)`; `ids` are integers of
/// any logical shape, shared by the members or one set per member (tokens a member
/// decoded). Low rank: `E[ids] + (A[ids] Bᵀ) · scale`.
pub fn embed(table: &Weight, ids: &Act) -> Result<Act> {
    let op = "nn::embed";
    if !ids.dtype().is_int() {
        return Err(seam_err(op, ids.v.ty().to_string(), "ids must be integers"));
    }
    if let Some(c) = ids.members {
        return embed_per_member(table, ids, c);
    }
    let [vocab, d] = table.matrix_shape();
    let lead = ids.logical_shape().to_vec();
    let t: i64 = lead.iter().product();
    let flat = ids.v.reshape(&[t])?;
    let (table, i) = table.stored(op)?;
    let rows = |w: &Value, ids: &Value| lookup(w, ids, i);
    match table {
        Weight::Plain(w) => unflatten(rows(w, &flat)?, None, &lead, d),
        Weight::Members(w) => {
            let c = w.shape()[0];
            // Row c·vocab + id of the flattened [C·vocab, d] table.
            let f = w.func();
            let offs = f
                .iota(crate::builder::TensorType::new(flat.dtype(), &[c, t]), 0)?
                .mul(&f.scalar_of(flat.dtype(), vocab as f64)?)?;
            let rows = offs.add(&flat.broadcast_in_dim(&[c, t], &[1])?)?;
            let y = w.reshape(&[c * vocab, d])?.take_rows(&rows)?;
            unflatten(y, Some(c), &lead, d)
        }
        Weight::LowRank { base, a, b, scale } => {
            let c = scale.shape()[0];
            let r = a.shape()[1];
            let shared = rows(base, &flat)?;
            // A[ids]: [C, r, V] -> [V, C, r] -> rows [T, C, r]
            let arows = a.transpose(&[2, 0, 1])?.take_rows(&flat)?;
            let arows = arows.mul(&scale.broadcast_in_dim(&[t, c, r], &[1])?)?;
            let corr = arows.dot_general(b, &DotDims::new(&[1], &[0], &[2], &[1]))?;
            let y = shared.broadcast_in_dim(&[c, t, d], &[1, 2])?.add(&corr)?;
            unflatten(y, Some(c), &lead, d)
        }
        Weight::InOut(_) => unreachable_in_out(op),
    }
}

/// Rows `ids` of a shared table whose rows are along axis `1 - i` (`i` as
/// [`Weight::stored`] gives it): its columns when stored `(in, out)`.
fn lookup(table: &Value, ids: &Value, i: usize) -> Result<Value> {
    if i == 0 {
        table.take_cols(ids)
    } else {
        table.take_rows(ids)
    }
}

/// [`embed`] of per-member ids (`[C, ..]`): member `c` reads rows of its own table.
fn embed_per_member(table: &Weight, ids: &Act, c: i64) -> Result<Act> {
    let op = "nn::embed";
    if let Some(w) = table.members() {
        if w != c {
            return Err(seam_err(
                op,
                format!("ids {} and a table of {w} members", ids.v.ty()),
                "ids and table hold different member counts",
            ));
        }
    }
    let [vocab, d] = table.matrix_shape();
    let lead = ids.logical_shape().to_vec();
    let t: i64 = lead.iter().product();
    let flat = ids.v.reshape(&[c * t])?;
    let f = ids.v.func();
    // Row `c·rows + id` of a table flattened over the members, for ids `[C, T]`.
    let offset = |rows: i64| -> Result<Value> {
        let offs = f
            .iota(crate::builder::TensorType::new(flat.dtype(), &[c, t]), 0)?
            .mul(&f.scalar_of(flat.dtype(), rows as f64)?)?;
        offs.add(&ids.v.reshape(&[c, t])?)?.reshape(&[c * t])
    };
    let (table, i) = table.stored(op)?;
    let rows = |w: &Value, ids: &Value| lookup(w, ids, i);
    let y = match table {
        Weight::Plain(w) => rows(w, &flat)?,
        Weight::Members(w) => w.reshape(&[c * vocab, d])?.take_rows(&offset(vocab)?)?,
        Weight::LowRank { base, a, b, scale } => {
            let r = a.shape()[1];
            let shared = rows(base, &flat)?.reshape(&[c, t, d])?;
            // A[ids] per member: [C, r, V] -> [C, V, r] -> rows [C·T, r] -> [C, T, r]
            let arows = a
                .transpose(&[0, 2, 1])?
                .reshape(&[c * vocab, r])?
                .take_rows(&offset(vocab)?)?
                .reshape(&[c, t, r])?;
            let arows = arows.mul(&scale.broadcast_in_dim(&[c, t, r], &[0])?)?;
            let corr = arows.dot_general(b, &DotDims::new(&[0], &[0], &[2], &[1]))?;
            shared.add(&corr)?
        }
        Weight::InOut(_) => return unreachable_in_out(op),
    };
    unflatten(y, Some(c), &lead, d)
}
