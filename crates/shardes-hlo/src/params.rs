//! Parameter trees: named f32 arrays in JAX leaf order.
//!
//! Parameters are a tree of float32 arrays (named maps and lists) that keep their shapes
//! from sampling to update; there is no global flattening. The leaf order is JAX's
//! tree-flatten order: map keys sorted byte-wise at every level (what `BTreeMap<String, _>`
//! gives), list items by position. Leaf `j` is the j-th leaf in that order, and the noise of
//! leaf `j` comes from `fold_in(base_key, j)`, so this order is part of the numbers.
//!
//! A leaf's path joins the map keys and list positions on the way to it with `.`:
//! `"wq"`, `"layers.0.wq"`. A tree that is a single leaf has the empty path `""`.

use std::collections::BTreeMap;

use thiserror::Error;

/// Errors building or combining parameter trees.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ParamError {
    /// The data length does not match the product of the shape.
    #[error(
        "array of shape {shape:?} needs {expected} elements but {got} were given; \
         pass data of exactly the shape's size (row-major)"
    )]
    SizeMismatch {
        /// The requested shape.
        shape: Vec<usize>,
        /// Its number of elements.
        expected: usize,
        /// The length of the data given.
        got: usize,
    },
    /// The number of elements of a shape overflows `usize`.
    #[error("shape {shape:?} has more elements than fit in usize; use a smaller shape")]
    ShapeOverflow {
        /// The requested shape.
        shape: Vec<usize>,
    },
    /// `from_leaves` got a different number of leaves than the template has.
    #[error(
        "the template has {expected} leaves but {got} arrays were given; \
         pass one array per leaf, in the template's leaf order"
    )]
    LeafCount {
        /// Leaves in the template.
        expected: usize,
        /// Arrays given.
        got: usize,
    },
    /// A replacement leaf does not have the template leaf's shape.
    #[error(
        "leaf `{path}` has shape {expected:?} in the template but the new array has \
         shape {got:?}; parameters keep their shapes, so reshape the array first"
    )]
    LeafShape {
        /// Path of the leaf.
        path: String,
        /// The template's shape.
        expected: Vec<usize>,
        /// The shape given.
        got: Vec<usize>,
    },
    /// Two named arrays would sit at the same place, or one would sit inside another.
    #[error(
        "path `{path}` conflicts with another path (a duplicate, or a leaf that is also \
         a prefix of another path); give every array a distinct, non-nested name"
    )]
    ConflictingPath {
        /// The offending path.
        path: String,
    },
    /// A path has an empty segment (`"a..b"`, a leading or trailing `.`).
    #[error("path `{path}` has an empty segment; use names like `layers.0.wq`")]
    EmptySegment {
        /// The offending path.
        path: String,
    },
}

/// A dense, row-major f32 array.
#[derive(Debug, Clone, PartialEq)]
pub struct Array {
    shape: Vec<usize>,
    data: Vec<f32>,
}

impl Array {
    /// An array of `shape` holding `data` (row-major); errors if the sizes differ.
    pub fn new(shape: Vec<usize>, data: Vec<f32>) -> Result<Array, ParamError> {
        let expected = checked_size(&shape)?;
        if expected != data.len() {
            return Err(ParamError::SizeMismatch {
                shape,
                expected,
                got: data.len(),
            });
        }
        Ok(Array { shape, data })
    }

    /// An array of zeros.
    pub fn zeros(shape: Vec<usize>) -> Result<Array, ParamError> {
        let n = checked_size(&shape)?;
        Ok(Array {
            shape,
            data: vec![0.0; n],
        })
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The elements, row-major.
    pub fn data(&self) -> &[f32] {
        &self.data
    }

    /// The elements, row-major, for in-place updates (the shape cannot change).
    pub fn data_mut(&mut self) -> &mut [f32] {
        &mut self.data
    }

    /// Consumes the array, returning its elements.
    pub fn into_data(self) -> Vec<f32> {
        self.data
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.data.len()
    }

    /// Whether the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// Number of dimensions.
    pub fn ndim(&self) -> usize {
        self.shape.len()
    }
}

fn checked_size(shape: &[usize]) -> Result<usize, ParamError> {
    shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| ParamError::ShapeOverflow {
            shape: shape.to_vec(),
        })
}

/// A tree of f32 arrays: leaves, named maps and lists.
#[derive(Debug, Clone, PartialEq)]
pub enum ParamTree {
    /// One array.
    Leaf(Array),
    /// Named subtrees; iterated in byte-wise key order, which is JAX's.
    Map(BTreeMap<String, ParamTree>),
    /// Positional subtrees.
    List(Vec<ParamTree>),
}

fn join(prefix: &str, seg: &str) -> String {
    if prefix.is_empty() {
        seg.to_string()
    } else {
        format!("{prefix}.{seg}")
    }
}

impl ParamTree {
    /// A map from `(name, subtree)` pairs.
    pub fn map<I, S>(entries: I) -> ParamTree
    where
        I: IntoIterator<Item = (S, ParamTree)>,
        S: Into<String>,
    {
        ParamTree::Map(entries.into_iter().map(|(k, v)| (k.into(), v)).collect())
    }

    /// The leaves with their paths, in JAX leaf order.
    pub fn leaves(&self) -> Vec<(String, &Array)> {
        let mut out = Vec::new();
        self.visit(String::new(), &mut |path, a| out.push((path, a)));
        out
    }

    fn visit<'a>(&'a self, path: String, f: &mut dyn FnMut(String, &'a Array)) {
        match self {
            ParamTree::Leaf(a) => f(path, a),
            ParamTree::Map(m) => {
                for (k, v) in m {
                    v.visit(join(&path, k), f);
                }
            }
            ParamTree::List(l) => {
                for (i, v) in l.iter().enumerate() {
                    v.visit(join(&path, &i.to_string()), f);
                }
            }
        }
    }

    /// Mutable references to the leaves, in JAX leaf order.
    pub fn leaves_mut(&mut self) -> Vec<&mut Array> {
        let mut out = Vec::new();
        fn go<'a>(t: &'a mut ParamTree, out: &mut Vec<&'a mut Array>) {
            match t {
                ParamTree::Leaf(a) => out.push(a),
                ParamTree::Map(m) => m.values_mut().for_each(|v| go(v, out)),
                ParamTree::List(l) => l.iter_mut().for_each(|v| go(v, out)),
            }
        }
        go(self, &mut out);
        out
    }

    /// The leaf paths, in JAX leaf order.
    pub fn leaf_paths(&self) -> Vec<String> {
        self.leaves().into_iter().map(|(p, _)| p).collect()
    }

    /// The leaf shapes, in JAX leaf order.
    pub fn shapes(&self) -> Vec<Vec<usize>> {
        self.leaves()
            .into_iter()
            .map(|(_, a)| a.shape().to_vec())
            .collect()
    }

    /// Number of leaves.
    pub fn num_leaves(&self) -> usize {
        match self {
            ParamTree::Leaf(_) => 1,
            ParamTree::Map(m) => m.values().map(ParamTree::num_leaves).sum(),
            ParamTree::List(l) => l.iter().map(ParamTree::num_leaves).sum(),
        }
    }

    /// Total number of scalar parameters.
    pub fn num_params(&self) -> usize {
        self.leaves().iter().map(|(_, a)| a.len()).sum()
    }

    /// The leaf at `path`, if any.
    pub fn get(&self, path: &str) -> Option<&Array> {
        self.leaves()
            .into_iter()
            .find(|(p, _)| p == path)
            .map(|(_, a)| a)
    }

    /// A tree of the same structure with every leaf replaced by `f(path, leaf)`.
    pub fn map_leaves<F>(&self, mut f: F) -> ParamTree
    where
        F: FnMut(&str, &Array) -> Array,
    {
        fn go<F: FnMut(&str, &Array) -> Array>(t: &ParamTree, path: &str, f: &mut F) -> ParamTree {
            match t {
                ParamTree::Leaf(a) => ParamTree::Leaf(f(path, a)),
                ParamTree::Map(m) => ParamTree::Map(
                    m.iter()
                        .map(|(k, v)| (k.clone(), go(v, &join(path, k), f)))
                        .collect(),
                ),
                ParamTree::List(l) => ParamTree::List(
                    l.iter()
                        .enumerate()
                        .map(|(i, v)| go(v, &join(path, &i.to_string()), f))
                        .collect(),
                ),
            }
        }
        go(self, "", &mut f)
    }

    /// A tree with `template`'s structure whose leaves are `leaves`, in JAX leaf order.
    ///
    /// Errors if the count differs or any array's shape differs from the template leaf's.
    pub fn from_leaves(template: &ParamTree, leaves: Vec<Array>) -> Result<ParamTree, ParamError> {
        let expected = template.num_leaves();
        if leaves.len() != expected {
            return Err(ParamError::LeafCount {
                expected,
                got: leaves.len(),
            });
        }
        for ((path, t), a) in template.leaves().into_iter().zip(&leaves) {
            if t.shape() != a.shape() {
                return Err(ParamError::LeafShape {
                    path,
                    expected: t.shape().to_vec(),
                    got: a.shape().to_vec(),
                });
            }
        }
        let mut it = leaves.into_iter();
        // Counts were checked above, so every leaf of the template finds an array.
        let tree = template.map_leaves(|_, t| it.next().unwrap_or_else(|| t.clone()));
        Ok(tree)
    }

    /// Builds a tree from `(path, array)` pairs, splitting paths on `.`.
    ///
    /// A level whose keys are exactly `0, 1, .., n-1` becomes a [`ParamTree::List`], any
    /// other level a [`ParamTree::Map`]; so `leaves()` of a tree without numeric map keys
    /// round-trips through this function. A single pair with the empty path gives a bare
    /// leaf.
    pub fn from_paths(named: Vec<(String, Array)>) -> Result<ParamTree, ParamError> {
        #[derive(Default)]
        struct Node {
            leaf: Option<Array>,
            children: BTreeMap<String, Node>,
        }
        let mut root = Node::default();
        for (path, a) in named {
            let mut node = &mut root;
            if !path.is_empty() {
                for seg in path.split('.') {
                    if seg.is_empty() {
                        return Err(ParamError::EmptySegment { path });
                    }
                    if node.leaf.is_some() {
                        return Err(ParamError::ConflictingPath { path });
                    }
                    node = node.children.entry(seg.to_string()).or_default();
                }
            }
            if node.leaf.is_some() || !node.children.is_empty() {
                return Err(ParamError::ConflictingPath { path });
            }
            node.leaf = Some(a);
        }
        fn build(n: Node) -> ParamTree {
            if let Some(a) = n.leaf {
                return ParamTree::Leaf(a);
            }
            let len = n.children.len();
            let is_list = len > 0 && (0..len).all(|i| n.children.contains_key(&i.to_string()));
            if is_list {
                let mut kids = n.children;
                ParamTree::List(
                    (0..len)
                        .filter_map(|i| kids.remove(&i.to_string()).map(build))
                        .collect(),
                )
            } else {
                ParamTree::Map(n.children.into_iter().map(|(k, v)| (k, build(v))).collect())
            }
        }
        Ok(build(root))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arr(shape: Vec<usize>, start: f32) -> Array {
        let n: usize = shape.iter().product();
        Array::new(shape, (0..n).map(|i| start + i as f32).collect()).expect("sizes match")
    }

    fn sample() -> ParamTree {
        ParamTree::map([
            ("wq", ParamTree::Leaf(arr(vec![2, 2], 0.0))),
            (
                "layers",
                ParamTree::List(vec![
                    ParamTree::map([
                        ("b", ParamTree::Leaf(arr(vec![3], 10.0))),
                        ("W", ParamTree::Leaf(arr(vec![1, 2], 20.0))),
                    ]),
                    ParamTree::map([("b", ParamTree::Leaf(arr(vec![3], 30.0)))]),
                ]),
            ),
            ("w_up", ParamTree::Leaf(arr(vec![2], 40.0))),
        ])
    }

    #[test]
    fn array_size_is_checked() {
        assert!(matches!(
            Array::new(vec![2, 3], vec![0.0; 5]),
            Err(ParamError::SizeMismatch {
                expected: 6,
                got: 5,
                ..
            })
        ));
        assert!(Array::new(vec![], vec![1.0]).is_ok());
        assert!(matches!(
            Array::zeros(vec![usize::MAX, 3]),
            Err(ParamError::ShapeOverflow { .. })
        ));
    }

    #[test]
    fn jax_leaf_order() {
        // Byte-wise order: uppercase before lowercase, '_' (0x5F) before 'q' (0x71).
        let t = sample();
        assert_eq!(
            t.leaf_paths(),
            ["layers.0.W", "layers.0.b", "layers.1.b", "w_up", "wq"]
        );
        assert_eq!(t.num_params(), 4 + 3 + 2 + 3 + 2);
        assert_eq!(t.num_leaves(), 5);
        assert_eq!(t.shapes()[0], vec![1, 2]);
        assert_eq!(t.get("layers.1.b").map(|a| a.data()[0]), Some(30.0));
    }

    #[test]
    fn from_leaves_round_trip_and_checks() {
        let t = sample();
        let leaves: Vec<Array> = t.leaves().into_iter().map(|(_, a)| a.clone()).collect();
        assert_eq!(ParamTree::from_leaves(&t, leaves.clone()), Ok(t.clone()));
        assert!(matches!(
            ParamTree::from_leaves(&t, leaves[1..].to_vec()),
            Err(ParamError::LeafCount { .. })
        ));
        let mut bad = leaves;
        bad[3] = arr(vec![1, 2], 0.0);
        match ParamTree::from_leaves(&t, bad) {
            Err(ParamError::LeafShape { path, .. }) => assert_eq!(path, "w_up"),
            other => panic!("expected LeafShape, got {other:?}"),
        }
    }

    #[test]
    fn map_leaves_keeps_structure() {
        let t = sample();
        let doubled = t.map_leaves(|_, a| {
            Array::new(
                a.shape().to_vec(),
                a.data().iter().map(|x| 2.0 * x).collect(),
            )
            .expect("same shape")
        });
        assert_eq!(doubled.leaf_paths(), t.leaf_paths());
        assert_eq!(doubled.get("wq").map(|a| a.data()[3]), Some(6.0));
    }

    #[test]
    fn from_paths_rebuilds_lists_and_maps() {
        let t = sample();
        let named: Vec<(String, Array)> = t
            .leaves()
            .into_iter()
            .map(|(p, a)| (p, a.clone()))
            .collect();
        assert_eq!(ParamTree::from_paths(named), Ok(t));
        let dup = vec![
            ("a.b".to_string(), arr(vec![1], 0.0)),
            ("a".to_string(), arr(vec![1], 0.0)),
        ];
        assert!(matches!(
            ParamTree::from_paths(dup),
            Err(ParamError::ConflictingPath { .. })
        ));
        assert!(matches!(
            ParamTree::from_paths(vec![("a..b".to_string(), arr(vec![1], 0.0))]),
            Err(ParamError::EmptySegment { .. })
        ));
        let bare = ParamTree::from_paths(vec![(String::new(), arr(vec![2], 1.0))]);
        assert_eq!(bare, Ok(ParamTree::Leaf(arr(vec![2], 1.0))));
    }
}
