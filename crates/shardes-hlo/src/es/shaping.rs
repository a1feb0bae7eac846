//! Fitness shaping: fitness `(n,)` (or `(n, g)`) to weights `(n,)`, emitted as ops.
//!
//! Exactly the definitions of the spec's "Shaping" section. Shaping runs on the gathered
//! fitness of the whole population (only scalars cross the wire).

use std::fmt;

use crate::builder::{Cmp, DType, Func, HloError, Result, TensorType, Value};

use super::spec::serde_as_text;

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

/// The names of the shapings as a config writes them, in [`ShapingSpec::ALL`]'s order: the
/// one place they are listed.
pub const SHAPING_NAMES: [&str; 4] = ["centered_ranks", "centered", "group_relative", "none"];

/// One of the spec's four shapings by name: `centered_ranks`, `centered`, `group_relative`,
/// `none`. [`std::str::FromStr`] and [`fmt::Display`] round-trip (serde goes through
/// them), and [`ShapingSpec::build`] gives the shaping.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ShapingSpec {
    /// [`CenteredRanks`] (default).
    #[default]
    CenteredRanks,
    /// [`Centered`].
    Centered,
    /// [`GroupRelative`].
    GroupRelative,
    /// [`NoShaping`].
    None,
}

impl ShapingSpec {
    /// Every shaping, in [`SHAPING_NAMES`]'s order.
    pub const ALL: [ShapingSpec; 4] = [
        ShapingSpec::CenteredRanks,
        ShapingSpec::Centered,
        ShapingSpec::GroupRelative,
        ShapingSpec::None,
    ];

    /// The config name.
    pub fn name(self) -> &'static str {
        // `ALL` lists the variants in declaration order, so the discriminant is the index.
        SHAPING_NAMES[self as usize]
    }

    /// The shaping.
    pub fn build(self) -> Box<dyn Shaping> {
        match self {
            ShapingSpec::CenteredRanks => Box::new(CenteredRanks),
            ShapingSpec::Centered => Box::new(Centered),
            ShapingSpec::GroupRelative => Box::new(GroupRelative),
            ShapingSpec::None => Box::new(NoShaping),
        }
    }
}

impl fmt::Display for ShapingSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A shaping name that is not one of [`SHAPING_NAMES`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown shaping \"{input}\" (valid: {})", SHAPING_NAMES.join(", "))]
pub struct ShapingError {
    /// The text that was given.
    pub input: String,
}

impl ShapingError {
    /// What is wrong: `unknown shaping "x"`.
    pub fn message(&self) -> String {
        format!("unknown shaping \"{}\"", self.input)
    }

    /// The names that are accepted.
    pub fn valid(&self) -> &'static [&'static str] {
        &SHAPING_NAMES
    }
}

impl std::str::FromStr for ShapingSpec {
    type Err = ShapingError;

    fn from_str(input: &str) -> std::result::Result<Self, ShapingError> {
        SHAPING_NAMES
            .iter()
            .position(|&n| n == input)
            .map(|i| ShapingSpec::ALL[i])
            .ok_or_else(|| ShapingError {
                input: input.to_string(),
            })
    }
}

serde_as_text!(ShapingSpec);

/// The shaping named in a config, `None` for an unknown name: [`ShapingSpec`]'s parse and
/// [`ShapingSpec::build`] (whose error names the valid shapings).
pub fn by_name(name: &str) -> Option<Box<dyn Shaping>> {
    name.parse::<ShapingSpec>().ok().map(ShapingSpec::build)
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
    let n = vector(ShapingSpec::CenteredRanks.name(), f)?;
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
        ShapingSpec::CenteredRanks.name().into()
    }

    fn weights(&self, f: &Value) -> Result<Value> {
        let n = vector(ShapingSpec::CenteredRanks.name(), f)?;
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
        ShapingSpec::Centered.name().into()
    }

    fn weights(&self, f: &Value) -> Result<Value> {
        let n = vector(ShapingSpec::Centered.name(), f)?;
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
        ShapingSpec::GroupRelative.name().into()
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
                    ShapingSpec::GroupRelative.name(),
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
        ShapingSpec::None.name().into()
    }

    fn weights(&self, f: &Value) -> Result<Value> {
        vector(ShapingSpec::None.name(), f)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shaping_names_round_trip_and_build_their_shaping() {
        for (spec, name) in ShapingSpec::ALL.into_iter().zip(SHAPING_NAMES) {
            assert_eq!(spec.to_string(), name);
            assert_eq!(name.parse::<ShapingSpec>().unwrap(), spec);
            assert_eq!(spec.build().name(), name);
            assert_eq!(by_name(name).map(|s| s.name()), Some(name.to_string()));
        }
        assert_eq!(
            ["centered_ranks", "centered", "group_relative", "none"],
            SHAPING_NAMES
        );
        assert_eq!(ShapingSpec::default(), ShapingSpec::CenteredRanks);
    }

    #[test]
    fn an_unknown_shaping_names_itself_and_the_valid_list() {
        let e = "centred_ranks".parse::<ShapingSpec>().unwrap_err();
        assert_eq!(e.input, "centred_ranks");
        assert_eq!(e.message(), "unknown shaping \"centred_ranks\"");
        assert_eq!(e.valid(), SHAPING_NAMES);
        assert_eq!(
            e.to_string(),
            "unknown shaping \"centred_ranks\" (valid: centered_ranks, centered, \
             group_relative, none)"
        );
        assert!("".parse::<ShapingSpec>().is_err());
        // Names are exact: no case folding, unlike placements.
        assert!("None".parse::<ShapingSpec>().is_err());
        assert!(by_name("ranks").is_none());
    }

    #[test]
    fn serde_reads_and_writes_the_name() {
        let s: ShapingSpec = serde_json::from_str("\"group_relative\"").unwrap();
        assert_eq!(s, ShapingSpec::GroupRelative);
        assert_eq!(serde_json::to_string(&s).unwrap(), "\"group_relative\"");
        let e = serde_json::from_str::<ShapingSpec>("\"rank\"")
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown shaping \"rank\" (valid: "), "{e}");
    }
}
