//! The builder's error type.

/// Errors raised while building a program. Every message names the op (or the
/// construct) and the operand types involved, and says how to fix the call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HloError {
    /// Operand element types do not fit the op.
    #[error("op `{op}`: element types do not match ({types}): {reason}")]
    DTypeMismatch {
        /// The op being built.
        op: String,
        /// The operand types, comma separated.
        types: String,
        /// What was expected and how to fix it.
        reason: String,
    },
    /// Operand shapes do not fit the op.
    #[error("op `{op}`: incompatible shapes ({types}): {reason}")]
    ShapeMismatch {
        /// The op being built.
        op: String,
        /// The operand types, comma separated.
        types: String,
        /// What was expected and how to fix it.
        reason: String,
    },
    /// An attribute (dimension list, permutation, slice bounds, ...) is invalid for the operands.
    #[error("op `{op}`: invalid attribute for operands ({types}): {reason}")]
    InvalidAttribute {
        /// The op being built.
        op: String,
        /// The operand types, comma separated.
        types: String,
        /// What is wrong and how to fix it.
        reason: String,
    },
    /// A value belongs to another function (or another builder).
    #[error("op `{op}`: value {value} belongs to function `{owner}`, not to `{func}`; pass it as an argument or compute it inside `{func}`")]
    ForeignValue {
        /// The op being built.
        op: String,
        /// The offending value (name and type).
        value: String,
        /// The function that owns the value.
        owner: String,
        /// The function being built.
        func: String,
    },
    /// A value is not visible where it is used (closed region, or an isolated region boundary).
    #[error("op `{op}`: value {value} is not visible here: {reason}")]
    OutOfScope {
        /// The op being built.
        op: String,
        /// The offending value (name and type).
        value: String,
        /// Why, and how to fix it.
        reason: String,
    },
    /// A region body returned the wrong number or types of values.
    #[error("op `{op}`: region returned ({got}) but must return ({expected})")]
    RegionResult {
        /// The op whose region was built.
        op: String,
        /// Types returned by the closure.
        got: String,
        /// Types the op requires.
        expected: String,
    },
    /// Sharding or mesh misuse.
    #[error("sharding error in `{what}`: {reason}")]
    Sharding {
        /// The construct (argument, op, ...).
        what: String,
        /// What is wrong and how to fix it.
        reason: String,
    },
    /// A function-level problem (duplicate names, unknown callee, finished builder, ...).
    #[error("function `{func}`: {reason}")]
    Function {
        /// The function concerned.
        func: String,
        /// What is wrong and how to fix it.
        reason: String,
    },
    /// Constant data does not fit its declared shape or type.
    #[error("constant {ty}: {reason}")]
    Constant {
        /// The constant's type.
        ty: String,
        /// What is wrong and how to fix it.
        reason: String,
    },
}

/// Result alias for builder calls.
pub type Result<T, E = HloError> = std::result::Result<T, E>;
