//! A fitness computed on the host: [`HostFitness`].

use shardes_hlo::es::EsError;
use shardes_runtime::half::{bf16, f16};

/// A fitness array computed on the host, one value per member (or `n × g` row-major for
/// `g` tasks), lower is better (`tell` descends: negate a reward).
#[derive(Clone, Debug, PartialEq)]
pub enum HostFitness {
    /// Used as is.
    F32(Vec<f32>),
    /// Rounded to f32 (values beyond f32's range become ±inf, NaN stays NaN and ranks worst).
    F64(Vec<f64>),
    /// Refused: in bf16 a population's losses collapse into ties.
    Bf16(Vec<bf16>),
    /// Refused: in f16 a population's losses collapse into ties.
    F16(Vec<f16>),
}

impl HostFitness {
    /// The number of values.
    pub fn len(&self) -> usize {
        match self {
            HostFitness::F32(v) => v.len(),
            HostFitness::F64(v) => v.len(),
            HostFitness::Bf16(v) => v.len(),
            HostFitness::F16(v) => v.len(),
        }
    }

    /// Whether there are no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The values as f32, refusing types narrower than f32 (with the reason and the fix).
    pub fn to_f32(&self) -> Result<Vec<f32>, EsError> {
        match self {
            HostFitness::F32(v) => Ok(v.clone()),
            // Rounding to the program's fitness precision is the point.
            HostFitness::F64(v) => Ok(v.iter().map(|&x| x as f32).collect()),
            HostFitness::Bf16(_) => Err(EsError::NarrowFitness {
                dtype: "bf16".into(),
            }),
            HostFitness::F16(_) => Err(EsError::NarrowFitness {
                dtype: "f16".into(),
            }),
        }
    }
}
