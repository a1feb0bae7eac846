//! `es.compute_dtype`, and `[problem] compute_dtype` of a qwen2 problem, its older
//! spelling: one setting, the dtype every model's forward runs in
//! ([`shardes::hlo::es::ShardedES::with_compute_dtype`]).

use shardes::hlo::builder::DType;
use shardes::hlo::es::{ComputeDtype, COMPUTE_DTYPE_NAMES};

use super::{Config, ConfigError, ProblemConfig};

/// `es.compute_dtype` from the raw `[es]` table, before serde: an unknown name with the
/// valid ones, a value that is not a string named by its key.
pub(super) fn check_es_table(es: &toml::Table) -> Result<(), ConfigError> {
    match es.get("compute_dtype") {
        None => Ok(()),
        Some(toml::Value::String(s)) => match s.parse::<ComputeDtype>() {
            Ok(_) => Ok(()),
            Err(e) => Err(ConfigError::new(
                format!("es.compute_dtype: {}", e.message()),
                format!("{} (valid: {})", e.fix(), COMPUTE_DTYPE_NAMES.join(", ")),
            )),
        },
        Some(_) => Err(ConfigError::new(
            "es.compute_dtype must be a string",
            "write es.compute_dtype = \"bf16\" or \"f32\"",
        )),
    }
}

impl Config {
    /// The forward's dtype: `es.compute_dtype`, else a qwen2 problem's `compute_dtype`,
    /// else f32; the two keys set to different dtypes are refused.
    pub fn compute_dtype(&self) -> Result<DType, ConfigError> {
        let problem = match &self.problem {
            ProblemConfig::Qwen2 {
                compute_dtype: Some(s),
                ..
            } => Some(s.parse::<ComputeDtype>().map_err(|e| {
                ConfigError::new(format!("problem.compute_dtype: {}", e.message()), e.fix())
            })?),
            _ => None,
        };
        let dtype = match (problem, self.es.compute_dtype) {
            (Some(p), Some(e)) if p != e => {
                return Err(ConfigError::new(
                    format!(
                        "problem.compute_dtype = \"{p}\" and es.compute_dtype = \"{e}\" disagree"
                    ),
                    "keep one: es.compute_dtype sets the forward's dtype of every model, and \
                     problem.compute_dtype is the same setting for qwen2",
                ))
            }
            (p, e) => e.or(p).unwrap_or_default(),
        };
        Ok(dtype.dtype())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(problem: &str, es: &str) -> Result<Config, ConfigError> {
        Config::parse(&format!(
            "devices = 2\n[problem]\n{problem}\n[es]\nn = 32\nsigma = 0.01\nlr = 0.01\n{es}\n\
             [run]\ngenerations = 3\n"
        ))
    }

    const TB: &str = "name = \"transformer_block\"";
    const QWEN: &str = "name = \"qwen2\"\nsize = \"tiny\"\ndata = \"d.jsonl\"";

    #[test]
    fn es_compute_dtype_or_the_qwen2_key_sets_the_dtype() {
        let dtype = |p: &str, e: &str| config(p, e).unwrap().compute_dtype().unwrap();
        assert_eq!(dtype(TB, ""), DType::F32);
        assert_eq!(dtype(TB, "compute_dtype = \"bf16\""), DType::BF16);
        assert_eq!(dtype(QWEN, "compute_dtype = \"bf16\""), DType::BF16);
        let q = |d: &str| format!("{QWEN}\ncompute_dtype = \"{d}\"");
        assert_eq!(dtype(&q("bf16"), ""), DType::BF16);
        assert_eq!(dtype(&q("bf16"), "compute_dtype = \"bf16\""), DType::BF16);
        assert_eq!(dtype(&q("f32"), ""), DType::F32);
        // Unset, the key is not written back (the trajectory hash stays as it was).
        let c = config(TB, "").unwrap();
        assert!(!toml::to_string(&c.es).unwrap().contains("compute_dtype"));
    }

    #[test]
    fn bad_and_conflicting_dtypes_name_the_keys() {
        let e = config(TB, "compute_dtype = \"fp8\"").unwrap_err();
        assert_eq!(e.message, "es.compute_dtype: unknown compute dtype \"fp8\"");
        assert!(e.hint.contains("valid: f32, bf16"), "{}", e.hint);
        let e = config(TB, "compute_dtype = 16").unwrap_err();
        assert!(e.message.contains("es.compute_dtype"), "{}", e.message);
        let e = config(
            &format!("{QWEN}\ncompute_dtype = \"bf16\""),
            "compute_dtype = \"f32\"",
        )
        .unwrap_err();
        assert!(
            e.message.contains("problem.compute_dtype = \"bf16\"")
                && e.message.contains("es.compute_dtype = \"f32\""),
            "{}",
            e.message
        );
        assert!(e.hint.contains("keep one"), "{}", e.hint);
    }
}
