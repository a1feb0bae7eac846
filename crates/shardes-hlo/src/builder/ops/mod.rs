//! Every op of the builder, one short method each, grouped by family:
//!
//! - `elementwise.rs`: unary and binary arithmetic, comparisons, `select`, `clamp`,
//!   conversions;
//! - `shape.rs`: constants and `iota`, broadcasts, reshape, transpose, slices (static and
//!   dynamic), `concatenate`, `pad`;
//! - `contraction.rs`: `dot_general`, `matmul`, `matmul_nt`;
//! - `reduction.rs`: `reduce` and its shorthands, `argmax`, `sort`;
//! - `gather_scatter.rs`: row gathers and scatters;
//! - `control.rs`: `while`, counted loops, `func.call`, `optimization_barrier`.
//!
//! This file holds what they share: the operand checks, the error constructors, the
//! attribute types [`Cmp`] and [`DotDims`] and the scalar combiner of reduction regions.
//!
//! Elementwise binary ops follow numpy broadcasting (shapes aligned on the right, size-1
//! dimensions stretch) through `broadcast_in_dim`; element types must match exactly.

use crate::builder::error::{HloError, Result};
use crate::builder::func::{types_of, Value, P};
use crate::builder::types::{join_types, DType, TensorType};

mod contraction;
mod control;
mod elementwise;
mod gather_scatter;
mod reduction;
mod shape;

/// Checks that a region body returned values of exactly the `expected` types.
pub(super) fn check_region_result(op: &str, ret: &[Value], expected: &[TensorType]) -> Result<()> {
    let got: Vec<TensorType> = ret.iter().map(|v| v.ty.clone()).collect();
    if got != expected {
        return Err(HloError::RegionResult {
            op: op.into(),
            got: join_types(&got),
            expected: join_types(expected),
        });
    }
    Ok(())
}

pub(super) fn dtype_err(op: &str, vals: &[&Value], reason: impl Into<String>) -> HloError {
    HloError::DTypeMismatch {
        op: op.into(),
        types: types_of(vals),
        reason: reason.into(),
    }
}

pub(super) fn shape_err(op: &str, vals: &[&Value], reason: impl Into<String>) -> HloError {
    HloError::ShapeMismatch {
        op: op.into(),
        types: types_of(vals),
        reason: reason.into(),
    }
}

pub(super) fn attr_err(op: &str, vals: &[&Value], reason: impl Into<String>) -> HloError {
    HloError::InvalidAttribute {
        op: op.into(),
        types: types_of(vals),
        reason: reason.into(),
    }
}

/// Which element types an op accepts.
#[derive(Clone, Copy, Debug)]
pub(super) enum Kind {
    Float,
    Int,
    IntOrBool,
    SignedOrFloat,
    Numeric,
    Any,
}

impl Kind {
    fn accepts(self, d: DType) -> bool {
        match self {
            Kind::Float => d.is_float(),
            Kind::Int => d.is_int(),
            Kind::IntOrBool => d.is_int() || d == DType::I1,
            Kind::SignedOrFloat => d.is_float() || d.is_signed_int(),
            Kind::Numeric => d != DType::I1,
            Kind::Any => true,
        }
    }
    fn describe(self) -> &'static str {
        match self {
            Kind::Float => "a float type (f32, f64, bf16, f16)",
            Kind::Int => "an integer type (i32, i64, ui32, ui8)",
            Kind::IntOrBool => "an integer or boolean type",
            Kind::SignedOrFloat => "a float or signed integer type",
            Kind::Numeric => "a numeric type (not i1)",
            Kind::Any => "any type",
        }
    }
}

pub(super) fn check_kind(op: &str, v: &Value, kind: Kind) -> Result<()> {
    if kind.accepts(v.dtype()) {
        Ok(())
    } else {
        Err(dtype_err(
            op,
            &[v],
            format!(
                "{} is not supported; `{op}` needs {}; convert the operand first",
                v.dtype(),
                kind.describe()
            ),
        ))
    }
}

pub(super) fn check_dims(op: &str, v: &Value, dims: &[usize], what: &str) -> Result<()> {
    let mut seen = vec![false; v.rank()];
    for &d in dims {
        if d >= v.rank() {
            return Err(attr_err(
                op,
                &[v],
                format!(
                    "{what} {d} is out of range for rank {}; use dimensions below {}",
                    v.rank(),
                    v.rank()
                ),
            ));
        }
        if seen[d] {
            return Err(attr_err(
                op,
                &[v],
                format!("{what} {d} is listed twice; list each dimension once"),
            ));
        }
        seen[d] = true;
    }
    Ok(())
}

pub(super) fn check_shape(op: &str, shape: &[i64]) -> Result<()> {
    if let Some(d) = shape.iter().find(|&&d| d < 0) {
        return Err(HloError::InvalidAttribute {
            op: op.into(),
            types: format!("{shape:?}"),
            reason: format!("dimension {d} is negative; shapes must be static and non-negative"),
        });
    }
    Ok(())
}

pub(super) fn list(xs: &[i64]) -> String {
    xs.iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

pub(super) fn ulist(xs: &[usize]) -> String {
    xs.iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The numpy broadcast of two shapes, or `None` if incompatible.
pub(crate) fn broadcast_shape(a: &[i64], b: &[i64]) -> Option<Vec<i64>> {
    let n = a.len().max(b.len());
    let mut out = vec![0; n];
    for i in 0..n {
        let da = if i + a.len() >= n {
            a[i + a.len() - n]
        } else {
            1
        };
        let db = if i + b.len() >= n {
            b[i + b.len() - n]
        } else {
            1
        };
        out[i] = if da == db || db == 1 {
            da
        } else if da == 1 {
            db
        } else {
            return None;
        };
    }
    Some(out)
}

/// Comparison direction for [`Value::compare`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cmp {
    /// `==`
    Eq,
    /// `!=`
    Ne,
    /// `<`
    Lt,
    /// `<=`
    Le,
    /// `>`
    Gt,
    /// `>=`
    Ge,
}

impl Cmp {
    pub(super) fn mlir(self) -> &'static str {
        match self {
            Cmp::Eq => "EQ",
            Cmp::Ne => "NE",
            Cmp::Lt => "LT",
            Cmp::Le => "LE",
            Cmp::Gt => "GT",
            Cmp::Ge => "GE",
        }
    }
}

/// Dimension numbers of [`Value::dot_general`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DotDims {
    /// Batch dimensions of the left operand.
    pub lhs_batch: Vec<usize>,
    /// Batch dimensions of the right operand (same sizes, same order).
    pub rhs_batch: Vec<usize>,
    /// Contracting dimensions of the left operand.
    pub lhs_contract: Vec<usize>,
    /// Contracting dimensions of the right operand (same sizes, same order).
    pub rhs_contract: Vec<usize>,
}

impl DotDims {
    /// Dimension numbers from batch (`lb`, `rb`) and contracting (`lc`, `rc`) dimensions.
    pub fn new(lb: &[usize], rb: &[usize], lc: &[usize], rc: &[usize]) -> DotDims {
        DotDims {
            lhs_batch: lb.to_vec(),
            rhs_batch: rb.to_vec(),
            lhs_contract: lc.to_vec(),
            rhs_contract: rc.to_vec(),
        }
    }
}

/// `stablehlo.{mlir} a, b` on two scalars of one type: the body of a reduction or
/// collective region.
pub(crate) fn combiner(op: &str, mlir: &str, a: &Value, b: &Value) -> Result<Value> {
    let p = P::new()
        .t(format!("stablehlo.{mlir} "))
        .v(a)
        .t(", ")
        .v(b)
        .t(format!(" : {}", a.ty));
    a.func().emit1(op, &[a, b], p, a.ty.clone())
}
