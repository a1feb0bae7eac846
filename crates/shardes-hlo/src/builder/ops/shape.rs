//! Constants and `iota`, and the ops that move elements without computing on them:
//! broadcasts, reshape, transpose, slices, `concatenate`, `pad`.

use super::{attr_err, check_dims, check_shape, dtype_err, list, shape_err, ulist};
use crate::builder::error::{HloError, Result};
use crate::builder::func::{Func, Value, P};
use crate::builder::types::{dense_literal, fn_type, DType, Element, TensorType};

/// Constants, iota and concatenation.
impl Func {
    /// A dense constant of `shape` from row-major `data` (exact: floats that cannot be
    /// printed as round-tripping decimals are printed as hex bytes).
    pub fn constant<T: Element>(&self, shape: &[i64], data: &[T]) -> Result<Value> {
        check_shape("constant", shape)?;
        let ty = TensorType::new(T::DTYPE, shape);
        if ty.num_elements() != data.len() as i64 {
            return Err(HloError::Constant {
                ty: ty.to_string(),
                reason: format!(
                    "{} elements given but the shape holds {}; pass exactly one value per element",
                    data.len(),
                    ty.num_elements()
                ),
            });
        }
        let lit = dense_literal(shape, data);
        self.emit1(
            "constant",
            &[],
            P::new().t(format!("stablehlo.constant dense<{lit}> : {ty}")),
            ty,
        )
    }

    /// A rank-0 constant.
    pub fn scalar<T: Element>(&self, x: T) -> Result<Value> {
        self.constant(&[], &[x])
    }

    /// A constant of `shape` with every element `x` (printed as a splat).
    pub fn full<T: Element>(&self, x: T, shape: &[i64]) -> Result<Value> {
        check_shape("constant", shape)?;
        let ty = TensorType::new(T::DTYPE, shape);
        let lit = x.literal().unwrap_or_else(|| x.hex_bits());
        self.emit1(
            "constant",
            &[],
            P::new().t(format!("stablehlo.constant dense<{lit}> : {ty}")),
            ty,
        )
    }

    /// A rank-0 constant of `dtype` holding `x`, which must be exactly representable.
    pub fn scalar_of(&self, dtype: DType, x: f64) -> Result<Value> {
        fn conv<T: Element>(f: &Func, x: f64) -> Result<Value> {
            let v = T::from_f64(x).ok_or_else(|| HloError::Constant {
                ty: TensorType::scalar(T::DTYPE).to_string(),
                reason: format!(
                    "{x} is not exactly representable; round it first or pick a wider type"
                ),
            })?;
            f.scalar(v)
        }
        match dtype {
            DType::F32 => conv::<f32>(self, x),
            DType::F64 => conv::<f64>(self, x),
            DType::BF16 => conv::<half::bf16>(self, x),
            DType::F16 => conv::<half::f16>(self, x),
            DType::I32 => conv::<i32>(self, x),
            DType::I64 => conv::<i64>(self, x),
            DType::U32 => conv::<u32>(self, x),
            DType::U8 => conv::<u8>(self, x),
            DType::I1 => conv::<bool>(self, x),
        }
    }

    /// `iota`: element value = its index along `dim`.
    pub fn iota(&self, ty: TensorType, dim: usize) -> Result<Value> {
        check_shape("iota", &ty.shape)?;
        if dim >= ty.rank() || ty.dtype == DType::I1 {
            return Err(HloError::InvalidAttribute {
                op: "iota".into(),
                types: ty.to_string(),
                reason: format!(
                    "dimension {dim} must be below the rank {} and the type numeric",
                    ty.rank()
                ),
            });
        }
        self.emit1(
            "iota",
            &[],
            P::new().t(format!("stablehlo.iota dim = {dim} : {ty}")),
            ty,
        )
    }

    /// Concatenates values of equal type except along `dim`.
    pub fn concatenate(&self, vals: &[&Value], dim: usize) -> Result<Value> {
        let first = vals.first().ok_or_else(|| HloError::InvalidAttribute {
            op: "concatenate".into(),
            types: String::new(),
            reason: "no operands; pass at least one value".into(),
        })?;
        check_dims("concatenate", first, &[dim], "dimension")?;
        let mut shape = first.shape().to_vec();
        shape[dim] = 0;
        for v in vals {
            if v.dtype() != first.dtype() {
                return Err(dtype_err(
                    "concatenate",
                    vals,
                    "all operands must have the same element type",
                ));
            }
            let same = v.rank() == first.rank()
                && (0..v.rank()).all(|d| d == dim || v.shape()[d] == first.shape()[d]);
            if !same {
                return Err(shape_err(
                    "concatenate",
                    vals,
                    format!("operands must agree on every dimension except {dim}"),
                ));
            }
            shape[dim] += v.shape()[dim];
        }
        let ty = TensorType::new(first.dtype(), &shape);
        let p = P::new().t("stablehlo.concatenate ").vs(vals).t(format!(
            ", dim = {dim} : {}",
            fn_type(
                &vals.iter().map(|v| v.ty.clone()).collect::<Vec<_>>(),
                std::slice::from_ref(&ty)
            )
        ));
        self.emit1("concatenate", vals, p, ty)
    }
}

impl Value {
    /// A rank-0 constant of this value's element type (for `x.mul(&x.const_like(0.5)?)`).
    pub fn const_like(&self, x: f64) -> Result<Value> {
        self.func().scalar_of(self.dtype(), x)
    }

    /// `broadcast_in_dim`: operand dimension `i` becomes result dimension `dims[i]`
    /// (operand size 1 stretches).
    pub fn broadcast_in_dim(&self, shape: &[i64], dims: &[usize]) -> Result<Value> {
        let op = "broadcast_in_dim";
        check_shape(op, shape)?;
        if dims.len() != self.rank() {
            return Err(attr_err(op, &[self], format!("{} dims given for a rank-{} operand; give one result dimension per operand dimension", dims.len(), self.rank())));
        }
        let mut seen = vec![false; shape.len()];
        for (i, &d) in dims.iter().enumerate() {
            if d >= shape.len() || seen[d] {
                return Err(attr_err(
                    op,
                    &[self],
                    format!(
                        "dims {dims:?} must be distinct and below the result rank {}",
                        shape.len()
                    ),
                ));
            }
            seen[d] = true;
            if self.shape()[i] != 1 && self.shape()[i] != shape[d] {
                return Err(shape_err(op, &[self], format!("operand dimension {i} (size {}) cannot become result dimension {d} of size {} (needs equal size or 1)", self.shape()[i], shape[d])));
            }
        }
        let out = TensorType::new(self.dtype(), shape);
        let p = P::new().t("stablehlo.broadcast_in_dim ").v(self).t(format!(
            ", dims = [{}] : ({}) -> {out}",
            ulist(dims),
            self.ty
        ));
        self.func().emit1(op, &[self], p, out)
    }

    /// numpy-style `broadcast_to`: trailing dimensions aligned, size-1 dimensions stretch.
    pub fn broadcast_to(&self, shape: &[i64]) -> Result<Value> {
        if shape.len() < self.rank() {
            return Err(shape_err(
                "broadcast_to",
                &[self],
                format!("target shape {shape:?} has lower rank than the operand"),
            ));
        }
        let off = shape.len() - self.rank();
        let dims: Vec<usize> = (off..shape.len()).collect();
        self.broadcast_in_dim(shape, &dims)
    }

    /// Reshape to `shape` (same number of elements, row-major).
    pub fn reshape(&self, shape: &[i64]) -> Result<Value> {
        check_shape("reshape", shape)?;
        let out = TensorType::new(self.dtype(), shape);
        if out.num_elements() != self.ty.num_elements() {
            return Err(shape_err(
                "reshape",
                &[self],
                format!(
                    "cannot reshape {} elements into {out}",
                    self.ty.num_elements()
                ),
            ));
        }
        let p = P::new()
            .t("stablehlo.reshape ")
            .v(self)
            .t(format!(" : ({}) -> {out}", self.ty));
        self.func().emit1("reshape", &[self], p, out)
    }

    /// Transpose: result dimension `i` is operand dimension `perm[i]`.
    pub fn transpose(&self, perm: &[usize]) -> Result<Value> {
        if perm.len() != self.rank() {
            return Err(attr_err(
                "transpose",
                &[self],
                format!("permutation {perm:?} must have {} entries", self.rank()),
            ));
        }
        check_dims("transpose", self, perm, "permutation entry")?;
        let shape: Vec<i64> = perm.iter().map(|&d| self.shape()[d]).collect();
        let out = TensorType::new(self.dtype(), &shape);
        let p = P::new().t("stablehlo.transpose ").v(self).t(format!(
            ", dims = [{}] : ({}) -> {out}",
            ulist(perm),
            self.ty
        ));
        self.func().emit1("transpose", &[self], p, out)
    }

    /// Static strided slice `[start, limit)` with `strides` (all >= 1).
    pub fn slice(&self, start: &[i64], limit: &[i64], strides: &[i64]) -> Result<Value> {
        let op = "slice";
        let r = self.rank();
        if start.len() != r || limit.len() != r || strides.len() != r {
            return Err(attr_err(
                op,
                &[self],
                format!("start, limit and strides need {r} entries each"),
            ));
        }
        let mut shape = Vec::with_capacity(r);
        let mut parts = Vec::with_capacity(r);
        for d in 0..r {
            let (s, l, k) = (start[d], limit[d], strides[d]);
            if s < 0 || s > l || l > self.shape()[d] || k < 1 {
                return Err(attr_err(op, &[self], format!("dimension {d}: need 0 <= start ({s}) <= limit ({l}) <= size ({}) and stride ({k}) >= 1", self.shape()[d])));
            }
            shape.push((l - s + k - 1) / k);
            parts.push(if k == 1 {
                format!("{s}:{l}")
            } else {
                format!("{s}:{l}:{k}")
            });
        }
        let out = TensorType::new(self.dtype(), &shape);
        let p = P::new().t("stablehlo.slice ").v(self).t(format!(
            " [{}] : ({}) -> {out}",
            parts.join(", "),
            self.ty
        ));
        self.func().emit1(op, &[self], p, out)
    }

    /// Slice `[start, limit)` of one dimension, everything else kept.
    pub fn slice_in_dim(&self, start: i64, limit: i64, dim: usize) -> Result<Value> {
        check_dims("slice", self, &[dim], "dimension")?;
        let mut s = vec![0; self.rank()];
        let mut l = self.shape().to_vec();
        s[dim] = start;
        l[dim] = limit;
        self.slice(&s, &l, &vec![1; self.rank()])
    }

    fn check_starts(&self, op: &str, starts: &[&Value]) -> Result<()> {
        if starts.len() != self.rank() {
            return Err(attr_err(
                op,
                &[self],
                format!(
                    "{} start indices given; pass one rank-0 integer per dimension ({})",
                    starts.len(),
                    self.rank()
                ),
            ));
        }
        if let Some(f) = starts.first() {
            if starts
                .iter()
                .any(|s| s.rank() != 0 || !s.dtype().is_int() || s.dtype() != f.dtype())
            {
                return Err(dtype_err(
                    op,
                    starts,
                    "start indices must be rank-0 integers of one type",
                ));
            }
        }
        Ok(())
    }

    /// `dynamic_slice` of `sizes` at runtime `starts` (clamped into range by XLA).
    pub fn dynamic_slice(&self, starts: &[&Value], sizes: &[i64]) -> Result<Value> {
        let op = "dynamic_slice";
        self.check_starts(op, starts)?;
        if sizes.len() != self.rank()
            || sizes
                .iter()
                .zip(self.shape())
                .any(|(&s, &d)| s < 0 || s > d)
        {
            return Err(attr_err(
                op,
                &[self],
                format!(
                    "sizes {sizes:?} must have one entry per dimension, each within the operand"
                ),
            ));
        }
        let out = TensorType::new(self.dtype(), sizes);
        let mut all = vec![self];
        all.extend_from_slice(starts);
        let tys: Vec<TensorType> = all.iter().map(|v| v.ty.clone()).collect();
        let p = P::new().t("stablehlo.dynamic_slice ").vs(&all).t(format!(
            ", sizes = [{}] : {}",
            list(sizes),
            fn_type(&tys, std::slice::from_ref(&out))
        ));
        self.func().emit1(op, &all, p, out)
    }

    /// `dynamic_update_slice`: writes `update` at runtime `starts`.
    pub fn dynamic_update_slice(&self, update: &Value, starts: &[&Value]) -> Result<Value> {
        let op = "dynamic_update_slice";
        self.check_starts(op, starts)?;
        if update.dtype() != self.dtype() {
            return Err(dtype_err(
                op,
                &[self, update],
                "the update needs the operand's element type",
            ));
        }
        if update.rank() != self.rank()
            || update.shape().iter().zip(self.shape()).any(|(u, d)| u > d)
        {
            return Err(shape_err(
                op,
                &[self, update],
                "the update must have the operand's rank and fit inside it",
            ));
        }
        let mut all = vec![self, update];
        all.extend_from_slice(starts);
        let tys: Vec<TensorType> = all.iter().map(|v| v.ty.clone()).collect();
        let p = P::new()
            .t("stablehlo.dynamic_update_slice ")
            .vs(&all)
            .t(format!(
                " : {}",
                fn_type(&tys, std::slice::from_ref(&self.ty))
            ));
        self.func().emit1(op, &all, p, self.ty.clone())
    }

    /// Pads with the rank-0 `value`: `low`/`high` edge padding and `interior` padding per dimension.
    pub fn pad(&self, value: &Value, low: &[i64], high: &[i64], interior: &[i64]) -> Result<Value> {
        let op = "pad";
        let r = self.rank();
        if value.rank() != 0 || value.dtype() != self.dtype() {
            return Err(dtype_err(
                op,
                &[self, value],
                "the padding value must be a rank-0 value of the operand's element type",
            ));
        }
        if low.len() != r || high.len() != r || interior.len() != r {
            return Err(attr_err(
                op,
                &[self, value],
                format!("low, high and interior need {r} entries each"),
            ));
        }
        let mut shape = Vec::with_capacity(r);
        for d in 0..r {
            let n = self.shape()[d];
            let s = low[d] + high[d] + n + (n - 1).max(0) * interior[d];
            if interior[d] < 0 || s < 0 {
                return Err(attr_err(op, &[self, value], format!("dimension {d}: interior padding must be >= 0 and the result size ({s}) non-negative")));
            }
            shape.push(s);
        }
        let out = TensorType::new(self.dtype(), &shape);
        let p = P::new()
            .t("stablehlo.pad ")
            .v(self)
            .t(", ")
            .v(value)
            .t(format!(
                ", low = [{}], high = [{}], interior = [{}] : ({}, {}) -> {out}",
                list(low),
                list(high),
                list(interior),
                self.ty,
                value.ty
            ));
        self.func().emit1(op, &[self, value], p, out)
    }
}
