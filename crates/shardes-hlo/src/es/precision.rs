//! The compute dtype of a [`super::ShardedES`]: the precision every model's forward runs in
//! on the f32 master parameters (`es.compute_dtype`, [`ComputeDtype`]).
//!
//! Under `bf16`:
//! - each chunk's unit noise is rounded to bf16 once, where it is drawn
//!   (`round_noise`, called by the emitter's one noise source), and kept as f32 values
//!   that are exactly bf16 numbers: `apply` perturbs with them and `tell` contracts them
//!   (in f32 accumulation), so both see the same bits;
//! - every leaf the model reads is converted to bf16 ([`crate::es::ModelParams::with_compute_dtype`]):
//!   a full-rank member's `θ + sσ ε` is formed in f32 and rounded; a low-rank member's base
//!   `θ`, factors and per-member scale `sσ/√r` are converted one by one, so the factors
//!   stay factors;
//! - the seams compute in the weight's dtype ([`crate::nn::dense`] rounds an f32 input to
//!   it), and an elementwise op between a bf16 and an f32 activation promotes to f32 (as
//!   JAX does), so an f32 input, target or residual keeps its precision where it meets the
//!   forward;
//! - the fitness stays f32 (a bf16 loss is refused, [`super::EsError::NarrowFitness`]) and
//!   the update stays f32 on the f32 masters.
//!
//! Under `f32` (the default) nothing is converted and the programs print as they always did.

use std::fmt;
use std::str::FromStr;

use crate::builder::{DType, Value};

use super::error::{invalid, EsError};
use super::spec::{excerpt, serde_as_text};
use super::strategy::Noise;

/// The dtype a model's forward runs in: `f32` (default) or `bf16`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum ComputeDtype {
    /// float32 throughout (the default).
    #[default]
    F32,
    /// bfloat16 forward on f32 masters, f32 fitness and update.
    Bf16,
}

/// The names a config writes, in [`ComputeDtype`] order.
pub const COMPUTE_DTYPE_NAMES: [&str; 2] = ["f32", "bf16"];

/// What to write instead of an unknown compute dtype.
const DTYPE_FIX: &str = "use \"f32\" (the default) or \"bf16\"";

/// A compute dtype other than `f32` or `bf16`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown compute dtype \"{input}\"; {DTYPE_FIX}")]
pub struct ComputeDtypeError {
    /// The text that was given, as an [`excerpt`].
    pub input: String,
}

impl ComputeDtypeError {
    /// What is wrong: `unknown compute dtype "fp8"`.
    pub fn message(&self) -> String {
        format!("unknown compute dtype \"{}\"", self.input)
    }

    /// What to write instead.
    pub fn fix(&self) -> &'static str {
        DTYPE_FIX
    }
}

impl ComputeDtype {
    /// The element type of the forward.
    pub fn dtype(self) -> DType {
        match self {
            ComputeDtype::F32 => DType::F32,
            ComputeDtype::Bf16 => DType::BF16,
        }
    }

    /// The compute dtype of an element type: `F32` or `BF16`, anything else refused.
    pub fn of(dtype: DType) -> Result<ComputeDtype, EsError> {
        match dtype {
            DType::F32 => Ok(ComputeDtype::F32),
            DType::BF16 => Ok(ComputeDtype::Bf16),
            other => Err(invalid(
                format!("compute dtype {}", other.mlir()),
                "use DType::F32 (the default) or DType::BF16 (es.compute_dtype = \"f32\" or \
                 \"bf16\")"
                    .into(),
            )),
        }
    }

    /// The config's name, `f32` or `bf16`.
    pub fn name(self) -> &'static str {
        match self {
            ComputeDtype::F32 => COMPUTE_DTYPE_NAMES[0],
            ComputeDtype::Bf16 => COMPUTE_DTYPE_NAMES[1],
        }
    }
}

impl fmt::Display for ComputeDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ComputeDtype {
    type Err = ComputeDtypeError;

    /// `f32` or `bf16`.
    fn from_str(input: &str) -> Result<Self, ComputeDtypeError> {
        match input {
            "f32" => Ok(ComputeDtype::F32),
            "bf16" => Ok(ComputeDtype::Bf16),
            _ => Err(ComputeDtypeError {
                input: excerpt(input),
            }),
        }
    }
}

serde_as_text!(ComputeDtype);

/// `v` rounded to `dtype` and back to its own type (the identity, with no op, when they
/// are the same): f32 values that are exactly `dtype` numbers.
fn round_trip(v: &Value, dtype: DType) -> Result<Value, EsError> {
    if v.dtype() == dtype {
        return Ok(v.clone());
    }
    Ok(v.convert(dtype)?.convert(v.dtype())?)
}

/// The drawn noise rounded to `dtype` once (f32: unchanged, no op emitted), before the
/// emitter materializes it: what `apply` perturbs with and `tell` contracts.
pub(super) fn round_noise(noise: Vec<Noise>, dtype: DType) -> Result<Vec<Noise>, EsError> {
    if dtype == DType::F32 {
        return Ok(noise);
    }
    noise
        .into_iter()
        .map(|n| {
            Ok(match n {
                Noise::Dense(v) => Noise::Dense(round_trip(&v, dtype)?),
                Noise::Factors { a, b } => Noise::Factors {
                    a: round_trip(&a, dtype)?,
                    b: round_trip(&b, dtype)?,
                },
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_list_the_valid_ones() {
        for (d, name) in [ComputeDtype::F32, ComputeDtype::Bf16]
            .iter()
            .zip(COMPUTE_DTYPE_NAMES)
        {
            assert_eq!(name.parse::<ComputeDtype>(), Ok(*d));
            assert_eq!(d.to_string(), name);
            assert_eq!(ComputeDtype::of(d.dtype()).unwrap(), *d);
        }
        let e = "fp8".parse::<ComputeDtype>().unwrap_err();
        assert_eq!(e.message(), "unknown compute dtype \"fp8\"");
        assert!(e.fix().contains("\"f32\"") && e.fix().contains("\"bf16\""));
        let e = ComputeDtype::of(DType::F16).unwrap_err().to_string();
        assert!(e.contains("f16") && e.contains("BF16"), "{e}");
        assert_eq!(ComputeDtype::default(), ComputeDtype::F32);
    }
}
