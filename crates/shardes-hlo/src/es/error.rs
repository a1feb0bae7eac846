//! [`EsError`], the one error type of the ES layer.

use crate::builder::HloError;

/// Errors of the ES layer: invalid settings (naming the number to change) and program
/// construction errors.
#[derive(Debug, thiserror::Error)]
pub enum EsError {
    /// A setting is out of range.
    #[error("{message}; {fix}")]
    Invalid {
        /// What is wrong.
        message: String,
        /// What to change.
        fix: String,
    },
    /// The model's fitness is narrower than f32.
    #[error(
        "fitness is {dtype}: narrower than float32 is refused because in {dtype} a population's \
         losses collapse into ties and ranks of ties are noise; reduce the loss in float32 \
         (convert before the final mean)"
    )]
    NarrowFitness {
        /// The offending element type.
        dtype: String,
    },
    /// A model read a parameter the wrong way.
    #[error("parameter `{path}`: {reason}")]
    Param {
        /// Leaf path.
        path: String,
        /// What went wrong and the fix.
        reason: String,
    },
    /// An argument or result list does not have the length its [`crate::es::Layout`] says.
    #[error("the {program} program's {what}: got {got}, its layout has {expected} ({detail})")]
    Layout {
        /// The program (`generation`, `ask_apply`, `tell`).
        program: String,
        /// Which list: `results`, `parameter arguments`, `batch arguments`, ...
        what: String,
        /// The length given.
        got: usize,
        /// The length the layout has.
        expected: usize,
        /// What the expected entries are.
        detail: String,
    },
    /// Building the program failed.
    #[error(transparent)]
    Hlo(#[from] HloError),
}

impl EsError {
    /// What is wrong, without the fix (for a front end that prints the fix on its own line,
    /// like the CLI's `error: … / hint: …`). [`EsError::Invalid`] and
    /// [`EsError::NarrowFitness`] split their text in two; the others are all message.
    pub fn message(&self) -> String {
        match self {
            EsError::Invalid { message, .. } => message.clone(),
            EsError::NarrowFitness { dtype } => format!(
                "fitness is {dtype}: narrower than float32 is refused because in {dtype} a \
                 population's losses collapse into ties and ranks of ties are noise"
            ),
            other => other.to_string(),
        }
    }

    /// How to fix it, where the error carries the fix apart from the message.
    pub fn fix(&self) -> Option<String> {
        match self {
            EsError::Invalid { fix, .. } => Some(fix.clone()),
            EsError::NarrowFitness { .. } => {
                Some("reduce the loss in float32 (convert before the final mean)".into())
            }
            _ => None,
        }
    }
}

/// An [`EsError::Invalid`].
pub(crate) fn invalid(message: String, fix: String) -> EsError {
    EsError::Invalid { message, fix }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_and_fix_make_up_the_displayed_text() {
        for e in [
            invalid("n = 0".into(), "set n to at least 1".into()),
            EsError::NarrowFitness {
                dtype: "bf16".into(),
            },
        ] {
            let (m, fix) = (e.message(), e.fix().expect("a fix"));
            assert_eq!(format!("{m}; {fix}"), e.to_string());
        }
        let e = EsError::Param {
            path: "w".into(),
            reason: "no such leaf".into(),
        };
        assert_eq!(e.message(), "parameter `w`: no such leaf");
        assert_eq!(e.fix(), None);
    }
}
