//! Fitness shaping: fitness `(n,)` (or `(n, g)`) to weights `(n,)`, emitted as ops.
//!
//! Exactly the definitions of the spec's "Shaping" section. Shaping runs on the gathered
//! fitness of the whole population (only scalars cross the wire).

use crate::builder::{Cmp, DType, Func, HloError, Result, TensorType, Value};

/// A fitness shaping. Implement it to plug in your own.
pub trait Shaping {
    /// A short name for logs and errors.
    fn name(&self) -> String;

    /// Fitness columns per member this shaping expects (`g` for `group_relative`, else 1).
    fn tasks(&self) -> Option<usize> {
        Some(1)
    }

    /// Emits the weights `f32[n]` for fitness `f32[n]` (or `f32[n, g]`).
    fn weights(&self, fitness: &Value) -> Result<Value>;
}

fn shaping_err(name: &str, fitness: &Value, reason: &str) -> HloError {
    HloError::InvalidAttribute {
        op: format!("shaping {name}"),
        types: fitness.ty().to_string(),
        reason: reason.into(),
    }
}

fn vector(name: &str, fitness: &Value) -> Result<i64> {
    match fitness.shape() {
        [n] if fitness.dtype() == DType::F32 => Ok(*n),
        _ => Err(shaping_err(
            name,
            fitness,
            "expects f32[n] fitness (one loss per member)",
        )),
    }
}

/// Midranks mapped to `[-0.5, 0.5]`: `w = midrank / (n - 1) - 0.5`; NaN ranks as `+inf`.
#[derive(Clone, Copy, Debug, Default)]
pub struct CenteredRanks;

/// `w = (f - mean f) · n / (n - 1)`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Centered;

/// Per task, advantages `(f - μ) / sd` (0 where `sd = 0`), averaged over tasks.
#[derive(Clone, Copy, Debug, Default)]
pub struct GroupRelative;

/// `w = f`.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoShaping;

/// The shaping named in a config: `centered_ranks`, `centered`, `group_relative`, `none`.
pub fn by_name(name: &str) -> Option<Box<dyn Shaping>> {
    match name {
        "centered_ranks" => Some(Box::new(CenteredRanks)),
        "centered" => Some(Box::new(Centered)),
        "group_relative" => Some(Box::new(GroupRelative)),
        "none" => Some(Box::new(NoShaping)),
        _ => None,
    }
}

/// Shifts `x` (length n) by `k` positions along dim 0, filling with `fill`:
/// `toward_end`: `y[p] = x[p - k]`; otherwise `y[p] = x[p + k]`.
fn shift(x: &Value, k: i64, fill: &Value, toward_end: bool) -> Result<Value> {
    let n = x.shape()[0];
    let (low, high) = if toward_end { (k, 0) } else { (0, k) };
    let padded = x.pad(fill, &[low], &[high], &[0])?;
    let start = if toward_end { 0 } else { k };
    padded.slice_in_dim(start, start + n, 0)
}

/// Inclusive prefix maximum (`toward_end`) or suffix minimum, by doubling steps.
fn scan(x: &Value, prefix_max: bool) -> Result<Value> {
    let n = x.shape()[0];
    let f = x.func();
    let fill = if prefix_max {
        f.scalar(i32::MIN)?
    } else {
        f.scalar(i32::MAX)?
    };
    let mut acc = x.clone();
    let mut k = 1;
    while k < n {
        let s = shift(&acc, k, &fill, prefix_max)?;
        acc = if prefix_max {
            acc.max(&s)?
        } else {
            acc.min(&s)?
        };
        k *= 2;
    }
    Ok(acc)
}

/// Midranks (0-based, ties share the mean of their positions) of `f32[n]`, NaN as `+inf`.
pub fn midranks(f: &Value) -> Result<Value> {
    midranks_scaled(f, None)
}

/// Midranks, optionally multiplied by `scale` (an f32 scalar) before they are permuted back
/// to member order.
fn midranks_scaled(f: &Value, scale: Option<&Value>) -> Result<Value> {
    let n = vector("centered_ranks", f)?;
    let func = f.func();
    let inf = func.scalar(f32::INFINITY)?;
    let nan = f.ne(f)?;
    let clean = nan.select(&inf.broadcast_to(&[n])?, f)?;
    let pos = func.iota(TensorType::i32(&[n]), 0)?;
    let sorted = func.sort_ascending(&[&clean, &pos], 0)?;
    let (s, perm) = (&sorted[0], &sorted[1]);
    // A position starts a tie group when its value differs from its predecessor; the
    // group's first position is the running maximum of the group starts.
    let neg = func.scalar(f32::NEG_INFINITY)?;
    let prev = shift(s, 1, &neg, true)?;
    let next = shift(s, 1, &neg, false)?;
    let first = pos.eq(&pos.const_like(0.0)?)?;
    let last = pos.eq(&pos.const_like((n - 1) as f64)?)?;
    let starts = s.compare(&prev, Cmp::Ne)?.or(&first)?;
    let ends = s.compare(&next, Cmp::Ne)?.or(&last)?;
    let zero = func.full(0i32, &[n])?;
    let end_fill = func.full((n - 1) as i32, &[n])?;
    let start = scan(&starts.select(&pos, &zero)?, true)?;
    let end = scan(&ends.select(&pos, &end_fill)?, false)?;
    let mid = start
        .convert(DType::F32)?
        .add(&end.convert(DType::F32)?)?
        .mul(&func.scalar(0.5f32)?)?;
    let mid = match scale {
        Some(k) => mid.mul(k)?,
        None => mid,
    };
    // Back to member order: sort the midranks by the permutation.
    let back = func.sort_ascending(&[perm, &mid], 0)?;
    Ok(back[1].clone())
}

impl Shaping for CenteredRanks {
    fn name(&self) -> String {
        "centered_ranks".into()
    }

    fn weights(&self, f: &Value) -> Result<Value> {
        let n = vector("centered_ranks", f)?;
        let func = f.func();
        if n < 2 {
            return func.full(0.0f32, &[n]);
        }
        let inv = func.scalar(1.0f32 / (n - 1) as f32)?;
        // The spec's (and JAX's) weights round `mid · inv` before subtracting 0.5; XLA's CPU
        // backend contracts `mid · inv − 0.5` into one FMA when both sit in one kernel
        // (158 of the quickstart's 256 weights then differ in the last bit), and it strips
        // optimization barriers before fusion. Scaling before the sort back to member order
        // puts the sort between the two operations.
        midranks_scaled(f, Some(&inv))?.sub(&func.scalar(0.5f32)?)
    }
}

impl Shaping for Centered {
    fn name(&self) -> String {
        "centered".into()
    }

    fn weights(&self, f: &Value) -> Result<Value> {
        let n = vector("centered", f)?;
        if n < 2 {
            return Ok(f.clone());
        }
        let func = f.func();
        let mean = f.reduce_mean(&[0])?;
        f.sub(&mean)?.mul(&func.scalar(n as f32 / (n - 1) as f32)?)
    }
}

impl Shaping for GroupRelative {
    fn name(&self) -> String {
        "group_relative".into()
    }

    fn tasks(&self) -> Option<usize> {
        None
    }

    fn weights(&self, f: &Value) -> Result<Value> {
        let (n, g) = match f.shape() {
            [n, g] if f.dtype() == DType::F32 => (*n, *g),
            [n] if f.dtype() == DType::F32 => (*n, 1),
            _ => {
                return Err(shaping_err(
                    "group_relative",
                    f,
                    "expects f32[n, g] fitness (members × tasks)",
                ))
            }
        };
        let f2 = f.reshape(&[n, g])?;
        let func = f.func();
        let mu = f2.reduce_mean(&[0])?;
        let dev = f2.sub(&mu.broadcast_in_dim(&[n, g], &[1])?)?;
        let sd = dev.mul(&dev)?.reduce_mean(&[0])?.sqrt()?;
        let sd_b = sd.broadcast_in_dim(&[n, g], &[1])?;
        let zero = func.full(0.0f32, &[n, g])?;
        let positive = sd_b.gt(&zero)?;
        // Divide by 1 where sd = 0 so no NaN is ever formed, then select exactly 0.
        let safe = positive.select(&sd_b, &func.full(1.0f32, &[n, g])?)?;
        let adv = positive.select(&dev.div(&safe)?, &zero)?;
        adv.reduce_mean(&[1])
    }
}

impl Shaping for NoShaping {
    fn name(&self) -> String {
        "none".into()
    }

    fn weights(&self, f: &Value) -> Result<Value> {
        vector("none", f)?;
        Ok(f.clone())
    }
}

/// Emits `shaping` in a fresh function `shape(fitness) -> weights` (for tests and the split
/// mode's host-side `tell`).
pub fn shaping_function(
    shaping: &dyn Shaping,
    fitness: TensorType,
) -> Result<crate::builder::Function> {
    let f = Func::new("main");
    let x = f.arg("fitness", fitness)?;
    let w = shaping.weights(&x)?;
    f.output(&w)?;
    f.finish()
}
