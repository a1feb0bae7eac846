//! Reductions (`reduce` with a body closure, sums, extrema, means, `argmax`) and `sort`.

use super::{
    attr_err, check_dims, check_kind, check_region_result, combiner, dtype_err, shape_err, ulist,
    Cmp, Kind,
};
use crate::builder::error::{HloError, Result};
use crate::builder::func::{Func, RegionSpec, Value, P};
use crate::builder::types::{fn_type, DType, TensorType};

impl Func {
    /// Generic multi-operand `reduce` over `dims`. The body receives the accumulators
    /// followed by the elements (rank-0 values) and returns the new accumulators; its
    /// error (of any type an [`HloError`] converts into) is returned as is.
    pub fn reduce<F, E>(
        &self,
        operands: &[&Value],
        inits: &[&Value],
        dims: &[usize],
        body: F,
    ) -> Result<Vec<Value>, E>
    where
        F: FnOnce(&[Value]) -> Result<Vec<Value>, E>,
        E: From<HloError>,
    {
        let all: Vec<&Value> = operands.iter().chain(inits).copied().collect();
        let first = operands
            .first()
            .ok_or_else(|| attr_err("reduce", &all, "no operands; pass at least one"))?;
        if operands.len() != inits.len() {
            return Err(attr_err("reduce", &all, "pass exactly one init value per operand").into());
        }
        for (v, i) in operands.iter().zip(inits) {
            if v.shape() != first.shape() {
                return Err(
                    shape_err("reduce", &all, "all operands must have the same shape").into(),
                );
            }
            if i.rank() != 0 || i.dtype() != v.dtype() {
                return Err(dtype_err(
                    "reduce",
                    &all,
                    "each init must be a rank-0 value of its operand's element type",
                )
                .into());
            }
        }
        check_dims("reduce", first, dims, "dimension")?;
        let scal: Vec<TensorType> = operands
            .iter()
            .map(|v| TensorType::scalar(v.dtype()))
            .collect();
        let arg_types: Vec<TensorType> = scal.iter().chain(&scal).cloned().collect();
        let spec = RegionSpec::body(true);
        let (block, ret) = self.region("reduce", spec, &arg_types, body)?;
        check_region_result("reduce", &ret, &scal)?;
        let keep: Vec<i64> = (0..first.rank())
            .filter(|d| !dims.contains(d))
            .map(|d| first.shape()[d])
            .collect();
        let results: Vec<TensorType> = operands
            .iter()
            .map(|v| TensorType::new(v.dtype(), &keep))
            .collect();
        let in_types: Vec<TensorType> = all.iter().map(|v| v.ty.clone()).collect();
        let p = P::new()
            .t("\"stablehlo.reduce\"(")
            .vs(&all)
            .t(format!(
                ") <{{dimensions = array<i64: {}>}}> (",
                ulist(dims)
            ))
            .region(block)
            .t(format!(") : {}", fn_type(&in_types, &results)));
        Ok(self.emit("reduce", &all, p, &results)?)
    }

    /// Multi-operand `sort` along `dim`. The comparator receives `(lhs_0, rhs_0, lhs_1,
    /// rhs_1, ...)` as rank-0 values and returns an `i1` "lhs goes first"; its error (of
    /// any type an [`HloError`] converts into) is returned as is.
    pub fn sort<F, E>(
        &self,
        operands: &[&Value],
        dim: usize,
        stable: bool,
        comparator: F,
    ) -> Result<Vec<Value>, E>
    where
        F: FnOnce(&[Value]) -> Result<Value, E>,
        E: From<HloError>,
    {
        let first = operands
            .first()
            .ok_or_else(|| attr_err("sort", operands, "no operands; pass at least one"))?;
        if operands.iter().any(|v| v.shape() != first.shape()) {
            return Err(
                shape_err("sort", operands, "all operands must have the same shape").into(),
            );
        }
        check_dims("sort", first, &[dim], "dimension")?;
        let arg_types: Vec<TensorType> = operands
            .iter()
            .flat_map(|v| [TensorType::scalar(v.dtype()), TensorType::scalar(v.dtype())])
            .collect();
        let spec = RegionSpec::body(true);
        let (block, ret) = self.region("sort", spec, &arg_types, |args| {
            comparator(args).map(|v| vec![v])
        })?;
        check_region_result("sort", &ret, &[TensorType::scalar(DType::I1)])?;
        let tys: Vec<TensorType> = operands.iter().map(|v| v.ty.clone()).collect();
        let p = P::new()
            .t("\"stablehlo.sort\"(")
            .vs(operands)
            .t(format!(
                ") <{{dimension = {dim} : i64, is_stable = {stable}}}> ("
            ))
            .region(block)
            .t(format!(") : {}", fn_type(&tys, &tys)));
        Ok(self.emit("sort", operands, p, &tys)?)
    }

    /// Stable ascending sort of all `operands` by the first one along `dim`. Float keys
    /// are ordered as JAX does: `-0.0` equals `0.0`, NaNs go last.
    pub fn sort_ascending(&self, operands: &[&Value], dim: usize) -> Result<Vec<Value>> {
        let key_dtype = operands.first().map(|v| v.dtype()).unwrap_or(DType::F32);
        let f = self.clone();
        self.sort(operands, dim, true, move |args| {
            if key_dtype.is_float() {
                let canon = |x: &Value| -> Result<Value> {
                    let zero = f.scalar_of(key_dtype, 0.0)?;
                    let nan = f.scalar_of(key_dtype, f64::NAN)?;
                    let z = x.eq(&zero)?.select(&zero, x)?;
                    x.ne(x)?.select(&nan, &z)
                };
                let a = canon(&args[0])?;
                let b = canon(&args[1])?;
                a.compare_typed(&b, Cmp::Lt, "TOTALORDER")
            } else {
                args[0].lt(&args[1])
            }
        })
    }
}

impl Value {
    fn reduce_with(
        &self,
        op: &str,
        dims: &[usize],
        init: f64,
        mlir: &'static str,
    ) -> Result<Value> {
        check_kind(op, self, Kind::Numeric)?;
        check_dims(op, self, dims, "dimension")?;
        let f = self.func();
        let init = if init.is_infinite() && !self.dtype().is_float() {
            // Integers have no infinity: use the extreme representable value instead.
            let (lo, hi) = match self.dtype() {
                DType::I32 => (i32::MIN as f64, i32::MAX as f64),
                DType::I64 => (i64::MIN as f64, i64::MAX as f64),
                DType::U32 => (0.0, u32::MAX as f64),
                _ => (0.0, u8::MAX as f64),
            };
            f.scalar_of(self.dtype(), if init < 0.0 { lo } else { hi })?
        } else {
            f.scalar_of(self.dtype(), init)?
        };
        let out = f.reduce(&[self], &[&init], dims, |a| {
            combiner(op, mlir, &a[0], &a[1]).map(|v| vec![v])
        })?;
        out.into_iter()
            .next()
            .ok_or_else(|| attr_err(op, &[self], "internal: reduce produced no result"))
    }

    /// Sum over `dims`.
    pub fn reduce_sum(&self, dims: &[usize]) -> Result<Value> {
        self.reduce_with("reduce_sum", dims, 0.0, "add")
    }

    /// Maximum over `dims` (`-inf`, or the type's minimum, for empty reductions).
    pub fn reduce_max(&self, dims: &[usize]) -> Result<Value> {
        self.reduce_with("reduce_max", dims, f64::NEG_INFINITY, "maximum")
    }

    /// Minimum over `dims`.
    pub fn reduce_min(&self, dims: &[usize]) -> Result<Value> {
        self.reduce_with("reduce_min", dims, f64::INFINITY, "minimum")
    }

    /// Mean over `dims` (floats only): the sum times `1/count` rounded to the dtype.
    pub fn reduce_mean(&self, dims: &[usize]) -> Result<Value> {
        check_kind("reduce_mean", self, Kind::Float)?;
        check_dims("reduce_mean", self, dims, "dimension")?;
        let n: i64 = dims.iter().map(|&d| self.shape()[d]).product();
        let s = self.reduce_sum(dims)?;
        let inv = match self.dtype() {
            DType::F64 => self.func().scalar(1.0 / n as f64)?,
            d => self.func().scalar(1.0f32 / n as f32)?.convert(d)?,
        };
        s.mul(&inv)
    }

    /// Index (i32) of the maximum along `dim`; NaN counts as the maximum and ties pick the
    /// first index, as in `jnp.argmax`.
    pub fn argmax(&self, dim: usize) -> Result<Value> {
        let op = "argmax";
        check_kind(op, self, Kind::Numeric)?;
        check_dims(op, self, &[dim], "dimension")?;
        let f = self.func();
        let idx = f.iota(self.ty.with_dtype(DType::I32), dim)?;
        let init = self.reduce_init_min()?;
        let zero = f.scalar(0i32)?;
        let is_float = self.dtype().is_float();
        let out = f.reduce(&[self, &idx], &[&init, &zero], &[dim], |a| -> Result<_> {
            let (xa, ia, xb, ib) = (&a[0], &a[1], &a[2], &a[3]);
            let mut pick_a = xa.gt(xb)?;
            if is_float {
                pick_a = pick_a.or(&xa.ne(xa)?)?;
            }
            let tie = xa.eq(xb)?.and(&ia.lt(ib)?)?;
            let pick_ia = pick_a.or(&tie)?;
            Ok(vec![pick_a.select(xa, xb)?, pick_ia.select(ia, ib)?])
        })?;
        out.into_iter()
            .nth(1)
            .ok_or_else(|| attr_err(op, &[self], "internal: reduce produced no index"))
    }

    fn reduce_init_min(&self) -> Result<Value> {
        let f = self.func();
        match self.dtype() {
            DType::I32 => f.scalar(i32::MIN),
            DType::I64 => f.scalar(i64::MIN),
            DType::U32 => f.scalar(0u32),
            DType::U8 => f.scalar(0u8),
            d => f.scalar_of(d, f64::NEG_INFINITY),
        }
    }
}
