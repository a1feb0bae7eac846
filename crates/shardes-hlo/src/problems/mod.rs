//! Example problems: each defines its parameters (`init`), its data (`make_batch`) and, as
//! emitted programs, its forward pass and loss.
//!
//! The host functions here produce the exact numbers of `shared/spec/` (they draw from the
//! JAX-compatible PRNG in [`crate::prng`]), so a run started from Rust and one started from
//! the JAX reference begin from the same parameters and see the same batch.
//!
//! Each problem also describes its parameters by shape alone (`param_shapes`), so a program
//! can be built, checked and sized ([`leaf_infos_of_shapes`], [`f32_bytes`]) without
//! allocating a single parameter.

use thiserror::Error;

use crate::es::LeafInfo;
use crate::params::{Array, ParamError, ParamTree};
use crate::prng::PrngError;

pub mod control;
pub mod quadratic;
pub mod qwen2;
pub mod transformer_block;

/// Errors of the problems' host functions.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ProblemError {
    /// A model dimension is zero or too large.
    #[error("{what} = {value} is invalid: {fix}")]
    BadDimension {
        /// Which dimension (`d_model`, `batch`, `seq`).
        what: &'static str,
        /// The value given.
        value: usize,
        /// How to fix it.
        fix: &'static str,
    },
    /// A setting that is not a dimension (an epsilon, a rotary base, a preset name) cannot
    /// be used.
    #[error("{what} = {value} is invalid: {fix}")]
    BadSetting {
        /// Which setting (`rms_norm_eps`, `rope_theta`, `size`).
        what: &'static str,
        /// The value given, as written in messages.
        value: String,
        /// How to fix it.
        fix: &'static str,
    },
    /// Drawing random numbers failed (a shape too large).
    #[error(transparent)]
    Prng(#[from] PrngError),
    /// Assembling an array or tree failed.
    #[error(transparent)]
    Param(#[from] ParamError),
}

/// A leaf path with its shape: what a problem's parameters are before any is allocated.
pub type ShapedPath = (String, Vec<usize>);

/// The [`LeafInfo`]s (JAX leaf order, as [`crate::es::leaf_infos`] gives them for the tree)
/// of a tree with these paths and shapes, without allocating the tree's values.
///
/// The order is [`ParamTree::from_paths`]'s own (it is run on one-element placeholders),
/// so it cannot drift from the order of the real tree.
pub fn leaf_infos_of_shapes(named: &[ShapedPath]) -> Result<Vec<LeafInfo>, ProblemError> {
    let mut placeholders = Vec::with_capacity(named.len());
    for (path, _) in named {
        placeholders.push((path.clone(), Array::new(Vec::new(), vec![0.0])?));
    }
    let order = ParamTree::from_paths(placeholders)?.leaf_paths();
    let shapes: std::collections::HashMap<&str, &[usize]> = named
        .iter()
        .map(|(p, s)| (p.as_str(), s.as_slice()))
        .collect();
    let mut out = Vec::with_capacity(order.len());
    for (index, path) in order.into_iter().enumerate() {
        let shape = shapes.get(path.as_str()).copied().unwrap_or_default();
        let shape = shape
            .iter()
            .map(|&d| {
                i64::try_from(d).map_err(|_| ProblemError::BadDimension {
                    what: "a leaf dimension",
                    value: d,
                    fix: "use dimensions below 2^63",
                })
            })
            .collect::<Result<Vec<i64>, _>>()?;
        out.push(LeafInfo { index, path, shape });
    }
    Ok(out)
}

/// Bytes of `f32` arrays of these shapes, saturating at `u64::MAX` (a hostile shape must
/// not wrap around to a small number that passes a memory check).
pub fn f32_bytes<'a>(shapes: impl IntoIterator<Item = &'a [usize]>) -> u64 {
    shapes
        .into_iter()
        .map(|s| s.iter().fold(4u64, |acc, &d| acc.saturating_mul(d as u64)))
        .fold(0u64, u64::saturating_add)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::es::leaf_infos;
    use crate::prng::Key;

    #[test]
    fn shapes_alone_give_the_leaf_infos_of_the_tree() {
        let key = Key::from_data([0, 3]);
        let mut cfg = qwen2::Qwen2Config::tiny();
        // 12 layers: a list whose indices sort differently as text (10 < 2).
        cfg.num_hidden_layers = 12;
        cfg.tie_word_embeddings = false;
        let tree = cfg.init(key, 0.02).expect("init");
        assert_eq!(
            leaf_infos_of_shapes(&cfg.param_shapes()).expect("shapes"),
            leaf_infos(&tree)
        );
        let tb = transformer_block::TransformerBlock::QUICKSTART;
        let tree = tb.init(key).expect("init");
        assert_eq!(
            leaf_infos_of_shapes(&tb.param_shapes()).expect("shapes"),
            leaf_infos(&tree)
        );
        assert_eq!(
            f32_bytes(tb.param_shapes().iter().map(|(_, s)| s.as_slice())),
            6 * 64 * 64 * 4
        );
    }

    #[test]
    fn byte_counts_saturate_instead_of_wrapping() {
        let huge: &[usize] = &[usize::MAX, usize::MAX];
        assert_eq!(f32_bytes([huge, huge]), u64::MAX);
        assert_eq!(f32_bytes([&[][..]]), 4);
    }
}
