//! What the environments are written with: [`X`], an f32 expression that reads like the
//! equations in the module docs, and the helpers that split a state into its components
//! and stack them back.
//!
//! Every environment works on *components*: one value per state variable, each of the
//! same leading shape (`[E]` for shared episodes, `[C, E]` with a member dimension), so
//! the same code runs whatever dimensions the rollout carries.

use std::ops::{Add, Div, Mul, Neg, Sub};

use crate::builder::{HloError, Result, Value};

/// An emitted f32 (or `i1`) expression. Arithmetic with another `X` or an `f32` constant
/// (rounded once to f32, like a Python float meeting an f32 array) builds the op; the first
/// builder error is carried along and returned by [`X::get`], so an equation is written
/// once, without a `?` per operator.
#[derive(Clone, Debug)]
pub struct X(Result<Value>);

impl From<Value> for X {
    fn from(v: Value) -> X {
        X(Ok(v))
    }
}

impl From<&Value> for X {
    fn from(v: &Value) -> X {
        X(Ok(v.clone()))
    }
}

/// Methods `x.name(y)` that combine an expression with a literal `y` through a [`Value`] op.
macro_rules! literal_ops {
    ($($(#[$doc:meta])* $name:ident => $op:path;)*) => {
        $(
            $(#[$doc])*
            pub fn $name(&self, y: f32) -> X {
                self.zip(&self.lit(y), $op)
            }
        )*
    };
}

impl X {
    /// The value, or the first error met while building it.
    pub fn get(self) -> Result<Value> {
        self.0
    }

    /// The constant `x` next to this expression (same function, rank 0).
    fn lit(&self, x: f32) -> X {
        X(self
            .0
            .as_ref()
            .map_err(Clone::clone)
            .and_then(|v| v.func().scalar(x)))
    }

    fn map(&self, f: impl FnOnce(&Value) -> Result<Value>) -> X {
        X(self.0.as_ref().map_err(Clone::clone).and_then(f))
    }

    fn zip(&self, other: &X, f: impl FnOnce(&Value, &Value) -> Result<Value>) -> X {
        X(match (&self.0, &other.0) {
            (Ok(a), Ok(b)) => f(a, b),
            (Err(e), _) | (_, Err(e)) => Err(e.clone()),
        })
    }

    /// `sin x`.
    pub fn sin(&self) -> X {
        self.map(Value::sin)
    }

    /// `cos x`.
    pub fn cos(&self) -> X {
        self.map(Value::cos)
    }

    /// `e^x`.
    pub fn exp(&self) -> X {
        self.map(Value::exp)
    }

    /// `floor x`.
    pub fn floor(&self) -> X {
        self.map(Value::floor)
    }

    /// `x²`.
    pub fn sq(&self) -> X {
        self.zip(self, Value::mul)
    }

    /// `x` clipped to `[lo, hi]`.
    pub fn clip(&self, lo: f32, hi: f32) -> X {
        let (l, h) = (self.lit(lo), self.lit(hi));
        self.zip(&l, |v, l| match &h.0 {
            Ok(h) => v.clamp(l, h),
            Err(e) => Err(e.clone()),
        })
    }

    literal_ops! {
        /// `max(x, y)`.
        max => Value::max;
        /// `x > y` (`i1`).
        gt => Value::gt;
        /// `x < y` (`i1`).
        lt => Value::lt;
        /// `x >= y` (`i1`).
        ge => Value::ge;
        /// `x <= y` (`i1`).
        le => Value::le;
        /// `x == y` (`i1`).
        eq => Value::eq;
    }

    /// Logical or of two `i1` expressions.
    pub fn or(&self, y: &X) -> X {
        self.zip(y, Value::or)
    }

    /// Logical and of two `i1` expressions.
    pub fn and(&self, y: &X) -> X {
        self.zip(y, Value::and)
    }

    /// `self ? a : b` for an `i1` predicate.
    pub fn select(&self, a: &X, b: &X) -> X {
        self.zip(a, |p, a| match &b.0 {
            Ok(b) => p.select(a, b),
            Err(e) => Err(e.clone()),
        })
    }

    /// `self ? a : b` with a constant `a`.
    pub fn select_lit(&self, a: f32, b: &X) -> X {
        let a = b.lit(a);
        self.select(&a, b)
    }

    /// `(x + π) mod 2π − π` with the modulo rounding toward −∞ (Python's `%`): the angle
    /// in `[−π, π)`.
    pub fn angle_normalize(&self) -> X {
        let pi = std::f32::consts::PI;
        let tau = std::f32::consts::TAU;
        let y = self + pi;
        &y - (&y / tau).floor() * tau - pi
    }

    /// `x` wrapped into `[lo, hi)` by whole periods `hi − lo`.
    pub fn wrap(&self, lo: f32, hi: f32) -> X {
        let d = hi - lo;
        self - ((self - lo) / d).floor() * d
    }

    /// The constant `x` in this expression's shape.
    pub fn fill(&self, x: f32) -> X {
        self.map(|v| v.func().full(x, v.shape()))
    }

    /// An all-false `i1` of this expression's shape.
    pub fn never(&self) -> X {
        self.map(|v| v.func().full(false, v.shape()))
    }
}

macro_rules! binop {
    ($Tr:ident, $m:ident, $op:path) => {
        impl $Tr<&X> for &X {
            type Output = X;
            fn $m(self, r: &X) -> X {
                self.zip(r, $op)
            }
        }
        impl $Tr<X> for X {
            type Output = X;
            fn $m(self, r: X) -> X {
                self.zip(&r, $op)
            }
        }
        impl $Tr<&X> for X {
            type Output = X;
            fn $m(self, r: &X) -> X {
                self.zip(r, $op)
            }
        }
        impl $Tr<X> for &X {
            type Output = X;
            fn $m(self, r: X) -> X {
                self.zip(&r, $op)
            }
        }
        impl $Tr<f32> for &X {
            type Output = X;
            fn $m(self, r: f32) -> X {
                self.zip(&self.lit(r), $op)
            }
        }
        impl $Tr<f32> for X {
            type Output = X;
            fn $m(self, r: f32) -> X {
                self.zip(&self.lit(r), $op)
            }
        }
        impl $Tr<&X> for f32 {
            type Output = X;
            fn $m(self, r: &X) -> X {
                r.lit(self).zip(r, $op)
            }
        }
        impl $Tr<X> for f32 {
            type Output = X;
            fn $m(self, r: X) -> X {
                r.lit(self).zip(&r, $op)
            }
        }
    };
}

binop!(Add, add, Value::add);
binop!(Sub, sub, Value::sub);
binop!(Mul, mul, Value::mul);
binop!(Div, div, Value::div);

impl Neg for &X {
    type Output = X;
    fn neg(self) -> X {
        self.map(Value::neg)
    }
}

impl Neg for X {
    type Output = X;
    fn neg(self) -> X {
        self.map(Value::neg)
    }
}

/// One environment step as emitted: the next state `[.., S]`, the reward `[..]` (f32) and
/// whether the next state is terminal `[..]` (`i1`).
#[derive(Clone, Debug)]
pub struct Transition {
    /// The state after the step.
    pub state: Value,
    /// The reward of the step.
    pub reward: Value,
    /// Whether the state after the step is terminal.
    pub done: Value,
}

fn state_err(v: &Value, dim: usize) -> HloError {
    HloError::ShapeMismatch {
        op: "control state".into(),
        types: v.ty().to_string(),
        reason: format!("the last axis must hold the environment's {dim} state variables"),
    }
}

/// The `dim` components of a state `[.., dim]`, each of shape `[..]`.
pub fn components(state: &Value, dim: usize) -> Result<Vec<X>> {
    let shape = state.shape();
    let Some((&last, lead)) = shape.split_last() else {
        return Err(state_err(state, dim));
    };
    if last != dim as i64 {
        return Err(state_err(state, dim));
    }
    let axis = shape.len() - 1;
    (0..dim as i64)
        .map(|i| Ok(X::from(state.slice_in_dim(i, i + 1, axis)?.reshape(lead)?)))
        .collect()
}

/// The inverse of [`components`]: `[..]` values stacked into `[.., k]`.
pub fn stack(parts: Vec<X>) -> Result<Value> {
    let vals: Vec<Value> = parts.into_iter().map(X::get).collect::<Result<_>>()?;
    let first = vals.first().ok_or_else(|| HloError::InvalidAttribute {
        op: "control state".into(),
        types: String::new(),
        reason: "no components to stack".into(),
    })?;
    let mut shape = first.shape().to_vec();
    shape.push(1);
    let cols: Vec<Value> = vals
        .iter()
        .map(|v| v.reshape(&shape))
        .collect::<Result<_>>()?;
    let refs: Vec<&Value> = cols.iter().collect();
    first.func().concatenate(&refs, shape.len() - 1)
}

/// The observation of a state `[.., dim]` whose components at `angles` are angles: each
/// angle as `cos, sin` (continuous across the wrap), every other component as it is, in
/// order.
pub fn observe_angles(state: &Value, dim: usize, angles: &[usize]) -> Result<Value> {
    let mut out = Vec::with_capacity(dim + angles.len());
    for (i, x) in components(state, dim)?.into_iter().enumerate() {
        if angles.contains(&i) {
            out.push(x.cos());
            out.push(x.sin());
        } else {
            out.push(x);
        }
    }
    stack(out)
}

/// The single action of `action [.., 1]` as a component `[..]`, clipped to `[-1, 1]`.
pub fn action(action: &Value) -> Result<X> {
    let mut a = components(action, 1)?;
    Ok(a.remove(0).clip(-1.0, 1.0))
}
