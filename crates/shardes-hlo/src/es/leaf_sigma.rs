//! The types of per-leaf σ: a leaf's σ ([`LeafSigma`]), what a program does with a leaf
//! ([`LeafScale`]), the config's patterns ([`SigmaPatterns`]) and a [`super::ShardedES`]'s
//! unresolved per-leaf settings. They depend on nothing else of the ES, so that the
//! settings can hold them and [`super::sigma`] resolve them without either importing the
//! other both ways.

use std::collections::BTreeMap;
use std::fmt;

use glob::Pattern;
use serde::de::{MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The σ of one leaf.
#[derive(Clone, Debug, PartialEq)]
pub enum LeafSigma {
    /// One σ for every element of the leaf.
    Scalar(f32),
    /// `σ = p qᵀ` for a 2-D leaf `(m, k)`: `p` has one entry per output row (`m`), `q` one
    /// per input column (`k`). Low rank folds it into the factors, `(p ∘ A)(q ∘ B)ᵀ`.
    Separable {
        /// Per output row, length `m`.
        p: Vec<f32>,
        /// Per input column, length `k`.
        q: Vec<f32>,
    },
}

/// What the program does with one leaf, resolved against the tree
/// ([`crate::es::ShardedES::leaf_scales`]).
#[derive(Clone, Debug, PartialEq)]
pub enum LeafScale {
    /// No noise, no update; the model reads it as a plain weight.
    Frozen,
    /// Perturbed and updated with this σ.
    Sigma(LeafSigma),
}

/// `es.sigma_leaves`: glob patterns over leaf paths and their σ, in the order written
/// (the first pattern that matches a leaf gives its σ; leaves that match none take
/// `es.sigma`). Reads and writes as a map, keeping the order of its entries.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SigmaPatterns(pub Vec<(String, f32)>);

impl SigmaPatterns {
    /// Whether no pattern is set.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl Serialize for SigmaPatterns {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (pattern, sigma) in &self.0 {
            map.serialize_entry(pattern, sigma)?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for SigmaPatterns {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Ordered;
        impl<'de> Visitor<'de> for Ordered {
            type Value = SigmaPatterns;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a table of glob patterns over leaf paths to σ, e.g. { \"w*\" = 0.02 }")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<SigmaPatterns, A::Error> {
                let mut out: Vec<(String, f32)> = Vec::new();
                while let Some((pattern, sigma)) = map.next_entry::<String, f32>()? {
                    if out.iter().any(|(p, _)| *p == pattern) {
                        return Err(serde::de::Error::custom(format!(
                            "pattern \"{pattern}\" is given twice"
                        )));
                    }
                    out.push((pattern, sigma));
                }
                Ok(SigmaPatterns(out))
            }
        }
        d.deserialize_map(Ordered)
    }
}

/// Whose names the messages use: the library's methods or the config's keys.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) enum Names {
    #[default]
    Library,
    Config,
}

impl Names {
    pub(super) fn key(self, library: &str, config: &str) -> String {
        match self {
            Names::Library => library.into(),
            Names::Config => config.into(),
        }
    }
}

/// The per-leaf settings of a [`ShardedES`] beside its scalar σ, unresolved (the leaves
/// are known when a program is built).
#[derive(Clone, Debug, Default)]
pub(crate) struct LeafSettings {
    pub(super) names: Names,
    /// The library's tree: every leaf's σ.
    pub(super) tree: Option<BTreeMap<String, LeafSigma>>,
    /// The config's patterns, in order.
    pub(super) patterns: Vec<(Pattern, f32)>,
    /// Separable σ by leaf path; wins over a pattern.
    pub(super) separable: BTreeMap<String, (Vec<f32>, Vec<f32>)>,
    /// Patterns (or paths) of the frozen leaves.
    pub(super) freeze: Vec<Pattern>,
}

impl LeafSettings {
    /// Whether nothing is set: every leaf takes the scalar σ.
    pub(crate) fn is_scalar(&self) -> bool {
        self.tree.is_none()
            && self.patterns.is_empty()
            && self.separable.is_empty()
            && self.freeze.is_empty()
    }
}
