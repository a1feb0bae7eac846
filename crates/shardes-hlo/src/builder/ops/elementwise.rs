//! Elementwise ops: unary math, binary arithmetic with numpy broadcasting, comparisons,
//! `select`, `clamp` and conversions.

use super::{broadcast_shape, check_kind, dtype_err, shape_err, Cmp, Kind};
use crate::builder::error::Result;
use crate::builder::func::{Value, P};
use crate::builder::types::{fn_type, DType};

/// `self.name(rhs)` as [`Value::compare`] with one [`Cmp`] direction each.
macro_rules! compare_shorthands {
    ($($(#[$doc:meta])* $name:ident => $dir:ident;)*) => {
        $(
            $(#[$doc])*
            pub fn $name(&self, rhs: &Value) -> Result<Value> {
                self.compare(rhs, Cmp::$dir)
            }
        )*
    };
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

    compare_shorthands! {
        /// `self == rhs`.
        eq => Eq;
        /// `self != rhs`.
        ne => Ne;
        /// `self < rhs`.
        lt => Lt;
        /// `self <= rhs`.
        le => Le;
        /// `self > rhs`.
        gt => Gt;
        /// `self >= rhs`.
        ge => Ge;
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
}
