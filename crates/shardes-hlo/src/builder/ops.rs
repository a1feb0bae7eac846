//! Every op of the builder, one short function each.
//!
//! Elementwise binary ops follow numpy broadcasting (shapes aligned on the right, size-1
//! dimensions stretch) through `broadcast_in_dim`; element types must match exactly.

use super::error::{HloError, Result};
use super::func::{fn_type, join_types, types_of, Callee, Func, RegionSpec, Value, P};
use super::types::{dense_literal, DType, Element, TensorType};

fn dtype_err(op: &str, vals: &[&Value], reason: impl Into<String>) -> HloError {
    HloError::DTypeMismatch {
        op: op.into(),
        types: types_of(vals),
        reason: reason.into(),
    }
}

fn shape_err(op: &str, vals: &[&Value], reason: impl Into<String>) -> HloError {
    HloError::ShapeMismatch {
        op: op.into(),
        types: types_of(vals),
        reason: reason.into(),
    }
}

fn attr_err(op: &str, vals: &[&Value], reason: impl Into<String>) -> HloError {
    HloError::InvalidAttribute {
        op: op.into(),
        types: types_of(vals),
        reason: reason.into(),
    }
}

/// Which element types an op accepts.
#[derive(Clone, Copy, Debug)]
enum Kind {
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

fn check_kind(op: &str, v: &Value, kind: Kind) -> Result<()> {
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

fn check_dims(op: &str, v: &Value, dims: &[usize], what: &str) -> Result<()> {
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

fn check_shape(op: &str, shape: &[i64]) -> Result<()> {
    if let Some(d) = shape.iter().find(|&&d| d < 0) {
        return Err(HloError::InvalidAttribute {
            op: op.into(),
            types: format!("{shape:?}"),
            reason: format!("dimension {d} is negative; shapes must be static and non-negative"),
        });
    }
    Ok(())
}

fn list(xs: &[i64]) -> String {
    xs.iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

fn ulist(xs: &[usize]) -> String {
    xs.iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The numpy broadcast of two shapes, or `None` if incompatible.
fn broadcast_shape(a: &[i64], b: &[i64]) -> Option<Vec<i64>> {
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
    fn mlir(self) -> &'static str {
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

/// Constants and iota.
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

    /// `func.call` of a function in the same module (add the callee to the module first).
    pub fn call(&self, callee: &Callee, args: &[&Value]) -> Result<Vec<Value>> {
        let op = format!("call @{}", callee.name);
        let got: Vec<TensorType> = args.iter().map(|v| v.ty.clone()).collect();
        if got != callee.args {
            return Err(shape_err(
                &op,
                args,
                format!("@{} takes ({})", callee.name, join_types(&callee.args)),
            ));
        }
        let p = P::new()
            .t(format!("func.call @{}(", callee.name))
            .vs(args)
            .t(format!(") : {}", fn_type(&callee.args, &callee.results)));
        let out = self.emit(&op, args, p, &callee.results)?;
        self.record_call(callee);
        Ok(out)
    }

    /// Generic multi-operand `reduce` over `dims`. The body receives the accumulators
    /// followed by the elements (rank-0 values) and returns the new accumulators.
    pub fn reduce<F>(
        &self,
        operands: &[&Value],
        inits: &[&Value],
        dims: &[usize],
        body: F,
    ) -> Result<Vec<Value>>
    where
        F: FnOnce(&[Value]) -> Result<Vec<Value>>,
    {
        let all: Vec<&Value> = operands.iter().chain(inits).copied().collect();
        let first = operands
            .first()
            .ok_or_else(|| attr_err("reduce", &all, "no operands; pass at least one"))?;
        if operands.len() != inits.len() {
            return Err(attr_err(
                "reduce",
                &all,
                "pass exactly one init value per operand",
            ));
        }
        for (v, i) in operands.iter().zip(inits) {
            if v.shape() != first.shape() {
                return Err(shape_err(
                    "reduce",
                    &all,
                    "all operands must have the same shape",
                ));
            }
            if i.rank() != 0 || i.dtype() != v.dtype() {
                return Err(dtype_err(
                    "reduce",
                    &all,
                    "each init must be a rank-0 value of its operand's element type",
                ));
            }
        }
        check_dims("reduce", first, dims, "dimension")?;
        let scal: Vec<TensorType> = operands
            .iter()
            .map(|v| TensorType::scalar(v.dtype()))
            .collect();
        let arg_types: Vec<TensorType> = scal.iter().chain(&scal).cloned().collect();
        let spec = RegionSpec {
            isolated: true,
            manual: None,
            header: true,
            terminator: "stablehlo.return",
        };
        let (block, ret) = self.region("reduce", spec, &arg_types, body)?;
        let ret_types: Vec<TensorType> = ret.iter().map(|v| v.ty.clone()).collect();
        if ret_types != scal {
            return Err(HloError::RegionResult {
                op: "reduce".into(),
                got: join_types(&ret_types),
                expected: join_types(&scal),
            });
        }
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
        self.emit("reduce", &all, p, &results)
    }

    /// Multi-operand `sort` along `dim`. The comparator receives `(lhs_0, rhs_0, lhs_1,
    /// rhs_1, ...)` as rank-0 values and returns an `i1` "lhs goes first".
    pub fn sort<F>(
        &self,
        operands: &[&Value],
        dim: usize,
        stable: bool,
        comparator: F,
    ) -> Result<Vec<Value>>
    where
        F: FnOnce(&[Value]) -> Result<Value>,
    {
        let first = operands
            .first()
            .ok_or_else(|| attr_err("sort", operands, "no operands; pass at least one"))?;
        if operands.iter().any(|v| v.shape() != first.shape()) {
            return Err(shape_err(
                "sort",
                operands,
                "all operands must have the same shape",
            ));
        }
        check_dims("sort", first, &[dim], "dimension")?;
        let arg_types: Vec<TensorType> = operands
            .iter()
            .flat_map(|v| [TensorType::scalar(v.dtype()), TensorType::scalar(v.dtype())])
            .collect();
        let spec = RegionSpec {
            isolated: true,
            manual: None,
            header: true,
            terminator: "stablehlo.return",
        };
        let (block, ret) = self.region("sort", spec, &arg_types, |args| {
            comparator(args).map(|v| vec![v])
        })?;
        let pred = TensorType::scalar(DType::I1);
        if ret.len() != 1 || ret[0].ty != pred {
            let got: Vec<TensorType> = ret.iter().map(|v| v.ty.clone()).collect();
            return Err(HloError::RegionResult {
                op: "sort".into(),
                got: join_types(&got),
                expected: pred.to_string(),
            });
        }
        let tys: Vec<TensorType> = operands.iter().map(|v| v.ty.clone()).collect();
        let p = P::new()
            .t("\"stablehlo.sort\"(")
            .vs(operands)
            .t(format!(
                ") <{{dimension = {dim} : i64, is_stable = {stable}}}> ("
            ))
            .region(block)
            .t(format!(") : {}", fn_type(&tys, &tys)));
        self.emit("sort", operands, p, &tys)
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

    /// `while` over a carried tuple: `cond` maps the carry to an `i1` scalar, `body` maps
    /// it to the next carry (same types). Both may use values from the enclosing blocks.
    pub fn while_loop<C, B>(&self, init: &[&Value], cond: C, body: B) -> Result<Vec<Value>>
    where
        C: FnOnce(&[Value]) -> Result<Value>,
        B: FnOnce(&[Value]) -> Result<Vec<Value>>,
    {
        let tys: Vec<TensorType> = init.iter().map(|v| v.ty.clone()).collect();
        for v in init {
            self.check_use("while", v)?;
        }
        let spec = || RegionSpec {
            isolated: false,
            manual: None,
            header: true,
            terminator: "stablehlo.return",
        };
        let (cb, cr) = self.region("while", spec(), &tys, |c| cond(c).map(|v| vec![v]))?;
        let pred = TensorType::scalar(DType::I1);
        if cr.len() != 1 || cr[0].ty != pred {
            let got: Vec<TensorType> = cr.iter().map(|v| v.ty.clone()).collect();
            return Err(HloError::RegionResult {
                op: "while (cond)".into(),
                got: join_types(&got),
                expected: pred.to_string(),
            });
        }
        let (bb, br) = self.region("while", spec(), &tys, body)?;
        let got: Vec<TensorType> = br.iter().map(|v| v.ty.clone()).collect();
        if got != tys {
            return Err(HloError::RegionResult {
                op: "while (body)".into(),
                got: join_types(&got),
                expected: join_types(&tys),
            });
        }
        let p = P::new()
            .t("\"stablehlo.while\"(")
            .vs(init)
            .t(") (")
            .region(cb)
            .t(", ")
            .region(bb)
            .t(format!(") : {}", fn_type(&tys, &tys)));
        self.emit("while", init, p, &tys)
    }

    /// A counted loop: runs `body(i, carry)` for `i` in `lo..hi` (an `i32` scalar) and
    /// returns the final carry.
    pub fn fori_loop<B>(&self, lo: i32, hi: i32, init: &[&Value], body: B) -> Result<Vec<Value>>
    where
        B: FnOnce(&Value, &[Value]) -> Result<Vec<Value>>,
    {
        let i0 = self.scalar(lo)?;
        let mut all: Vec<&Value> = vec![&i0];
        all.extend_from_slice(init);
        let f = self.clone();
        let g = self.clone();
        let mut out = self.while_loop(
            &all,
            move |c| c[0].lt(&f.scalar(hi)?),
            move |c| {
                let next = c[0].add(&g.scalar(1i32)?)?;
                let mut rest = body(&c[0], &c[1..])?;
                rest.insert(0, next);
                Ok(rest)
            },
        )?;
        out.remove(0);
        Ok(out)
    }

    /// `optimization_barrier` over several values (returns them unchanged).
    pub fn optimization_barrier(&self, vals: &[&Value]) -> Result<Vec<Value>> {
        let tys: Vec<TensorType> = vals.iter().map(|v| v.ty.clone()).collect();
        let p = P::new()
            .t("stablehlo.optimization_barrier ")
            .vs(vals)
            .t(format!(" : {}", join_types(&tys)));
        self.emit("optimization_barrier", vals, p, &tys)
    }
}

macro_rules! unary_ops {
    ($($(#[$doc:meta])* $name:ident => $mlir:literal, $kind:expr;)*) => {
        impl Value {
            $(
                $(#[$doc])*
                pub fn $name(&self) -> Result<Value> {
                    self.unary(stringify!($name), $mlir, $kind)
                }
            )*
        }
    };
}

unary_ops! {
    /// `-x`.
    neg => "negate", Kind::Numeric;
    /// `|x|`.
    abs => "abs", Kind::SignedOrFloat;
    /// `e^x`.
    exp => "exponential", Kind::Float;
    /// Natural log.
    log => "log", Kind::Float;
    /// `log(1 + x)`.
    log1p => "log_plus_one", Kind::Float;
    /// Square root.
    sqrt => "sqrt", Kind::Float;
    /// `1 / sqrt(x)`.
    rsqrt => "rsqrt", Kind::Float;
    /// Hyperbolic tangent.
    tanh => "tanh", Kind::Float;
    /// `1 / (1 + e^-x)`.
    logistic => "logistic", Kind::Float;
    /// Round toward -inf.
    floor => "floor", Kind::Float;
    /// Round toward +inf.
    ceil => "ceil", Kind::Float;
    /// Sign (-1, 0, 1; NaN stays NaN).
    sign => "sign", Kind::SignedOrFloat;
    /// Cosine.
    cos => "cosine", Kind::Float;
    /// Sine.
    sin => "sine", Kind::Float;
    /// Bitwise (or logical) not.
    not => "not", Kind::IntOrBool;
}

macro_rules! binary_ops {
    ($($(#[$doc:meta])* $name:ident => $mlir:literal, $kind:expr;)*) => {
        impl Value {
            $(
                $(#[$doc])*
                pub fn $name(&self, rhs: &Value) -> Result<Value> {
                    self.binary(stringify!($name), $mlir, $kind, rhs)
                }
            )*
        }
    };
}

binary_ops! {
    /// `x + y` (integers wrap).
    add => "add", Kind::Any;
    /// `x - y`.
    sub => "subtract", Kind::Numeric;
    /// `x * y`.
    mul => "multiply", Kind::Any;
    /// `x / y` (integers truncate).
    div => "divide", Kind::Numeric;
    /// Remainder with the sign of the dividend (C `fmod`).
    rem => "remainder", Kind::Numeric;
    /// Elementwise maximum (NaN propagates).
    max => "maximum", Kind::Any;
    /// Elementwise minimum (NaN propagates).
    min => "minimum", Kind::Any;
    /// `x ^ y`.
    pow => "power", Kind::Numeric;
    /// Bitwise / logical and.
    and => "and", Kind::IntOrBool;
    /// Bitwise / logical or.
    or => "or", Kind::IntOrBool;
    /// Bitwise / logical xor.
    xor => "xor", Kind::IntOrBool;
    /// Shift left (shifts >= bit width give 0).
    shift_left => "shift_left", Kind::Int;
    /// Logical shift right.
    shift_right_logical => "shift_right_logical", Kind::Int;
    /// Arithmetic shift right.
    shift_right_arithmetic => "shift_right_arithmetic", Kind::Int;
}

impl Value {
    fn unary(&self, op: &str, mlir: &str, kind: Kind) -> Result<Value> {
        check_kind(op, self, kind)?;
        let p = P::new()
            .t(format!("stablehlo.{mlir} "))
            .v(self)
            .t(format!(" : {}", self.ty));
        self.func().emit1(op, &[self], p, self.ty.clone())
    }

    /// Broadcasts `self` and `rhs` to their common numpy shape.
    fn broadcast_pair(&self, op: &str, rhs: &Value) -> Result<(Value, Value)> {
        if self.shape() == rhs.shape() {
            return Ok((self.clone(), rhs.clone()));
        }
        let shape = broadcast_shape(self.shape(), rhs.shape()).ok_or_else(|| {
            shape_err(op, &[self, rhs], "shapes are not broadcast-compatible (numpy rules: align on the right, each dimension equal or 1)")
        })?;
        let a = if self.shape() == shape.as_slice() {
            self.clone()
        } else {
            self.broadcast_to(&shape)?
        };
        let b = if rhs.shape() == shape.as_slice() {
            rhs.clone()
        } else {
            rhs.broadcast_to(&shape)?
        };
        Ok((a, b))
    }

    fn binary(&self, op: &str, mlir: &str, kind: Kind, rhs: &Value) -> Result<Value> {
        if self.dtype() != rhs.dtype() {
            return Err(dtype_err(
                op,
                &[self, rhs],
                "both operands need the same element type; insert a `convert`",
            ));
        }
        check_kind(op, self, kind)?;
        let (a, b) = self.broadcast_pair(op, rhs)?;
        let p = P::new()
            .t(format!("stablehlo.{mlir} "))
            .v(&a)
            .t(", ")
            .v(&b)
            .t(format!(" : {}", a.ty));
        self.func().emit1(op, &[&a, &b], p, a.ty.clone())
    }

    /// A rank-0 constant of this value's element type (for `x.mul(&x.const_like(0.5)?)`).
    pub fn const_like(&self, x: f64) -> Result<Value> {
        self.func().scalar_of(self.dtype(), x)
    }

    /// `chlo.erf_inv`, the inverse error function (XLA's f32 approximation).
    pub fn erf_inv(&self) -> Result<Value> {
        check_kind("erf_inv", self, Kind::Float)?;
        let p = P::new()
            .t("chlo.erf_inv ")
            .v(self)
            .t(format!(" : {} -> {}", self.ty, self.ty));
        self.func().emit1("erf_inv", &[self], p, self.ty.clone())
    }

    /// True where the value is neither infinite nor NaN.
    pub fn is_finite(&self) -> Result<Value> {
        check_kind("is_finite", self, Kind::Float)?;
        let out = self.ty.with_dtype(DType::I1);
        let p = P::new()
            .t("stablehlo.is_finite ")
            .v(self)
            .t(format!(" : ({}) -> {out}", self.ty));
        self.func().emit1("is_finite", &[self], p, out)
    }

    /// Elementwise comparison; the comparison type follows the dtype (FLOAT, SIGNED, UNSIGNED).
    pub fn compare(&self, rhs: &Value, dir: Cmp) -> Result<Value> {
        let ct = if self.dtype().is_float() {
            "FLOAT"
        } else if self.dtype().is_signed_int() {
            "SIGNED"
        } else {
            "UNSIGNED"
        };
        self.compare_typed(rhs, dir, ct)
    }

    /// Comparison with an explicit comparison type (`FLOAT`, `TOTALORDER`, `SIGNED`, `UNSIGNED`).
    pub fn compare_typed(&self, rhs: &Value, dir: Cmp, compare_type: &str) -> Result<Value> {
        let op = "compare";
        if self.dtype() != rhs.dtype() {
            return Err(dtype_err(
                op,
                &[self, rhs],
                "both operands need the same element type; insert a `convert`",
            ));
        }
        let ok = match compare_type {
            "FLOAT" | "TOTALORDER" => self.dtype().is_float(),
            "SIGNED" => self.dtype().is_signed_int(),
            "UNSIGNED" => self.dtype().is_unsigned(),
            _ => false,
        };
        if !ok {
            return Err(dtype_err(op, &[self, rhs], format!("comparison type `{compare_type}` does not fit {}; use Value::compare to choose it from the dtype", self.dtype())));
        }
        let (a, b) = self.broadcast_pair(op, rhs)?;
        let out = a.ty.with_dtype(DType::I1);
        let p = P::new()
            .t(format!("stablehlo.compare {}, ", dir.mlir()))
            .v(&a)
            .t(", ")
            .v(&b)
            .t(format!(", {compare_type} : ({}, {}) -> {out}", a.ty, b.ty));
        self.func().emit1(op, &[&a, &b], p, out)
    }

    /// `self == rhs`.
    pub fn eq(&self, rhs: &Value) -> Result<Value> {
        self.compare(rhs, Cmp::Eq)
    }
    /// `self != rhs`.
    pub fn ne(&self, rhs: &Value) -> Result<Value> {
        self.compare(rhs, Cmp::Ne)
    }
    /// `self < rhs`.
    pub fn lt(&self, rhs: &Value) -> Result<Value> {
        self.compare(rhs, Cmp::Lt)
    }
    /// `self <= rhs`.
    pub fn le(&self, rhs: &Value) -> Result<Value> {
        self.compare(rhs, Cmp::Le)
    }
    /// `self > rhs`.
    pub fn gt(&self, rhs: &Value) -> Result<Value> {
        self.compare(rhs, Cmp::Gt)
    }
    /// `self >= rhs`.
    pub fn ge(&self, rhs: &Value) -> Result<Value> {
        self.compare(rhs, Cmp::Ge)
    }

    /// `select`: `self` is the `i1` predicate; picks `on_true` where set. All three broadcast.
    pub fn select(&self, on_true: &Value, on_false: &Value) -> Result<Value> {
        let op = "select";
        if self.dtype() != DType::I1 {
            return Err(dtype_err(
                op,
                &[self, on_true, on_false],
                "the predicate must be i1; build it with compare",
            ));
        }
        if on_true.dtype() != on_false.dtype() {
            return Err(dtype_err(
                op,
                &[self, on_true, on_false],
                "both branches need the same element type; insert a `convert`",
            ));
        }
        let shape = broadcast_shape(self.shape(), on_true.shape())
            .and_then(|s| broadcast_shape(&s, on_false.shape()))
            .ok_or_else(|| {
                shape_err(
                    op,
                    &[self, on_true, on_false],
                    "shapes are not broadcast-compatible",
                )
            })?;
        let fit = |v: &Value| {
            if v.shape() == shape.as_slice() {
                Ok(v.clone())
            } else {
                v.broadcast_to(&shape)
            }
        };
        let (p_, t, f) = (fit(self)?, fit(on_true)?, fit(on_false)?);
        let p = P::new()
            .t("stablehlo.select ")
            .v(&p_)
            .t(", ")
            .v(&t)
            .t(", ")
            .v(&f)
            .t(format!(" : {}, {}", p_.ty, t.ty));
        self.func().emit1(op, &[&p_, &t, &f], p, t.ty.clone())
    }

    /// Clamps into `[lo, hi]`; bounds are rank 0 or of the same shape.
    pub fn clamp(&self, lo: &Value, hi: &Value) -> Result<Value> {
        let op = "clamp";
        let all = [lo, self, hi];
        if lo.dtype() != self.dtype() || hi.dtype() != self.dtype() {
            return Err(dtype_err(
                op,
                &all,
                "bounds need the operand's element type",
            ));
        }
        for b in [lo, hi] {
            if b.rank() != 0 && b.shape() != self.shape() {
                return Err(shape_err(
                    op,
                    &all,
                    "each bound must be rank 0 or have the operand's shape",
                ));
            }
        }
        let tys = [lo.ty.clone(), self.ty.clone(), hi.ty.clone()];
        let p = P::new().t("\"stablehlo.clamp\"(").vs(&all).t(format!(
            ") : {}",
            fn_type(&tys, std::slice::from_ref(&self.ty))
        ));
        self.func().emit1(op, &all, p, self.ty.clone())
    }

    /// Numeric conversion to `dtype` (floats to ints truncate toward zero).
    pub fn convert(&self, dtype: DType) -> Result<Value> {
        let out = self.ty.with_dtype(dtype);
        let p = P::new()
            .t("stablehlo.convert ")
            .v(self)
            .t(format!(" : ({}) -> {out}", self.ty));
        self.func().emit1("convert", &[self], p, out)
    }

    /// Reinterprets the bits as `dtype`, which must have the same bit width.
    pub fn bitcast_convert(&self, dtype: DType) -> Result<Value> {
        if dtype.bits() != self.dtype().bits() || dtype == DType::I1 {
            return Err(dtype_err(
                "bitcast_convert",
                &[self],
                format!(
                    "{} has {} bits but {dtype} has {}; bitcast only between types of equal width",
                    self.dtype(),
                    self.dtype().bits(),
                    dtype.bits()
                ),
            ));
        }
        let out = self.ty.with_dtype(dtype);
        let p = P::new()
            .t("stablehlo.bitcast_convert ")
            .v(self)
            .t(format!(" : ({}) -> {out}", self.ty));
        self.func().emit1("bitcast_convert", &[self], p, out)
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

    /// `dot_general`. Result dimensions: batch, then free lhs, then free rhs.
    pub fn dot_general(&self, rhs: &Value, dims: &DotDims) -> Result<Value> {
        let op = "dot_general";
        let both = [self, rhs];
        if self.dtype() != rhs.dtype() {
            return Err(dtype_err(
                op,
                &both,
                "both operands need the same element type; insert a `convert`",
            ));
        }
        check_kind(op, self, Kind::Numeric)?;
        check_dims(
            op,
            self,
            &[dims.lhs_batch.as_slice(), &dims.lhs_contract].concat(),
            "lhs batch/contracting dimension",
        )?;
        check_dims(
            op,
            rhs,
            &[dims.rhs_batch.as_slice(), &dims.rhs_contract].concat(),
            "rhs batch/contracting dimension",
        )?;
        if dims.lhs_batch.len() != dims.rhs_batch.len()
            || dims.lhs_contract.len() != dims.rhs_contract.len()
        {
            return Err(attr_err(
                op,
                &both,
                "lhs and rhs need the same number of batch and of contracting dimensions",
            ));
        }
        for (pairs, what) in [
            ((&dims.lhs_batch, &dims.rhs_batch), "batch"),
            ((&dims.lhs_contract, &dims.rhs_contract), "contracting"),
        ] {
            for (&l, &r) in pairs.0.iter().zip(pairs.1) {
                if self.shape()[l] != rhs.shape()[r] {
                    return Err(shape_err(
                        op,
                        &both,
                        format!(
                            "{what} dimension {l} of lhs (size {}) and {r} of rhs (size {}) differ",
                            self.shape()[l],
                            rhs.shape()[r]
                        ),
                    ));
                }
            }
        }
        let mut shape: Vec<i64> = dims.lhs_batch.iter().map(|&d| self.shape()[d]).collect();
        shape.extend(
            (0..self.rank())
                .filter(|d| !dims.lhs_batch.contains(d) && !dims.lhs_contract.contains(d))
                .map(|d| self.shape()[d]),
        );
        shape.extend(
            (0..rhs.rank())
                .filter(|d| !dims.rhs_batch.contains(d) && !dims.rhs_contract.contains(d))
                .map(|d| rhs.shape()[d]),
        );
        let out = TensorType::new(self.dtype(), &shape);
        let batching = if dims.lhs_batch.is_empty() {
            String::new()
        } else {
            format!(
                "batching_dims = [{}] x [{}], ",
                ulist(&dims.lhs_batch),
                ulist(&dims.rhs_batch)
            )
        };
        let p = P::new()
            .t("stablehlo.dot_general ")
            .v(self)
            .t(", ")
            .v(rhs)
            .t(format!(
                ", {batching}contracting_dims = [{}] x [{}] : ({}, {}) -> {out}",
                ulist(&dims.lhs_contract),
                ulist(&dims.rhs_contract),
                self.ty,
                rhs.ty
            ));
        self.func().emit1(op, &both, p, out)
    }

    /// Matrix product: `[..., m, k] x [k, n]`, or batched `[b..., m, k] x [b..., k, n]`.
    pub fn matmul(&self, rhs: &Value) -> Result<Value> {
        let (lr, rr) = (self.rank(), rhs.rank());
        if lr >= 1 && rr == 2 {
            return self.dot_general(
                rhs,
                &DotDims {
                    lhs_contract: vec![lr - 1],
                    rhs_contract: vec![0],
                    ..Default::default()
                },
            );
        }
        if lr == rr && lr >= 3 {
            let batch: Vec<usize> = (0..lr - 2).collect();
            return self.dot_general(
                rhs,
                &DotDims {
                    lhs_batch: batch.clone(),
                    rhs_batch: batch,
                    lhs_contract: vec![lr - 1],
                    rhs_contract: vec![lr - 2],
                },
            );
        }
        Err(shape_err(
            "matmul",
            &[self, rhs],
            "need [..., m, k] x [k, n] or equal-rank batched [b..., m, k] x [b..., k, n]",
        ))
    }

    /// `self · rhsᵀ` for a rank-2 `rhs` of shape `(out, in)`: contracts the last dimension
    /// of `self` with dimension 1 of `rhs` (the `dense(x, W)` of the spec).
    pub fn matmul_nt(&self, rhs: &Value) -> Result<Value> {
        if self.rank() < 1 || rhs.rank() != 2 {
            return Err(shape_err(
                "matmul_nt",
                &[self, rhs],
                "need [..., k] x [n, k]",
            ));
        }
        self.dot_general(
            rhs,
            &DotDims {
                lhs_contract: vec![self.rank() - 1],
                rhs_contract: vec![1],
                ..Default::default()
            },
        )
    }

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
            Ok(vec![combiner(op, mlir, &a[0], &a[1])?])
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
        let out = f.reduce(&[self, &idx], &[&init, &zero], &[dim], |a| {
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

    /// Row lookup `table[ids]`: the result has shape `ids.shape + table.shape[1..]`.
    /// Out-of-range ids are clamped (XLA gather semantics).
    pub fn take_rows(&self, ids: &Value) -> Result<Value> {
        let op = "take_rows";
        if self.rank() < 1 {
            return Err(shape_err(op, &[self, ids], "the table needs rank >= 1"));
        }
        if !ids.dtype().is_int() {
            return Err(dtype_err(
                op,
                &[self, ids],
                "ids must be integers; convert them to i32",
            ));
        }
        let r = ids.rank();
        let mut ishape = ids.shape().to_vec();
        ishape.push(1);
        let idx = ids.broadcast_in_dim(&ishape, &(0..r).collect::<Vec<_>>())?;
        let mut shape = ids.shape().to_vec();
        shape.extend_from_slice(&self.shape()[1..]);
        let out = TensorType::new(self.dtype(), &shape);
        let offset: Vec<usize> = (r..r + self.rank() - 1).collect();
        let offset = if offset.is_empty() {
            String::new()
        } else {
            format!("offset_dims = [{}], ", ulist(&offset))
        };
        let mut sizes = vec![1];
        sizes.extend_from_slice(&self.shape()[1..]);
        let p = P::new().t("\"stablehlo.gather\"(").v(self).t(", ").v(&idx).t(format!(
            ") <{{dimension_numbers = #stablehlo.gather<{offset}collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = {r}>, indices_are_sorted = false, slice_sizes = array<i64: {}>}}> : ({}, {}) -> {out}",
            list(&sizes),
            self.ty,
            idx.ty
        ));
        self.func().emit1(op, &[self, &idx], p, out)
    }

    fn scatter_rows_with(
        &self,
        op: &str,
        ids: &Value,
        updates: &Value,
        add: bool,
    ) -> Result<Value> {
        let all = [self, ids, updates];
        if self.rank() < 1
            || ids.rank() != 1
            || updates.rank() != self.rank()
            || updates.shape()[0] != ids.shape()[0]
            || updates.shape()[1..] != self.shape()[1..]
        {
            return Err(shape_err(
                op,
                &all,
                "need operand [n, rest...], ids [k] and updates [k, rest...]",
            ));
        }
        if !ids.dtype().is_int() {
            return Err(dtype_err(
                op,
                &all,
                "ids must be integers; convert them to i32",
            ));
        }
        if updates.dtype() != self.dtype() {
            return Err(dtype_err(
                op,
                &all,
                "updates need the operand's element type",
            ));
        }
        let f = self.func();
        let idx = ids.broadcast_in_dim(&[ids.shape()[0], 1], &[0])?;
        let scal = TensorType::scalar(self.dtype());
        let spec = RegionSpec {
            isolated: true,
            manual: None,
            header: true,
            terminator: "stablehlo.return",
        };
        let (block, _) = f.region(op, spec, &[scal.clone(), scal], |a| {
            if add {
                Ok(vec![a[0].add(&a[1])?])
            } else {
                Ok(vec![a[1].clone()])
            }
        })?;
        let window: Vec<usize> = (1..self.rank()).collect();
        let window = if window.is_empty() {
            String::new()
        } else {
            format!("update_window_dims = [{}], ", ulist(&window))
        };
        let p = P::new()
            .t("\"stablehlo.scatter\"(")
            .vs(&[self, &idx, updates])
            .t(format!(
                ") <{{indices_are_sorted = false, scatter_dimension_numbers = #stablehlo.scatter<{window}inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>, unique_indices = false}}> ("
            ))
            .region(block)
            .t(format!(") : ({}, {}, {}) -> {}", self.ty, idx.ty, updates.ty, self.ty));
        f.emit1(op, &[self, &idx, updates], p, self.ty.clone())
    }

    /// `operand[ids[j]] = updates[j]` for each row `j` (later duplicates win, unspecified order).
    pub fn scatter_rows(&self, ids: &Value, updates: &Value) -> Result<Value> {
        self.scatter_rows_with("scatter_rows", ids, updates, false)
    }

    /// `operand[ids[j]] += updates[j]` for each row `j`.
    pub fn scatter_add_rows(&self, ids: &Value, updates: &Value) -> Result<Value> {
        self.scatter_rows_with("scatter_add_rows", ids, updates, true)
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
