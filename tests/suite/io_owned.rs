//! Serializing a parameter tree by value (`io::params_into_bytes`, what a run's checkpoints
//! use to free each leaf as it is written) gives exactly the bytes of the borrowing
//! serializer, which the round-trip tests check against the safetensors reader.

use std::path::Path;

use shardes::hlo::params::{Array, ParamTree};
use shardes::hlo::prng::{fold_in, key, normal};
use shardes::io;

fn tree() -> ParamTree {
    let k = key(11).expect("seed");
    let leaf = |shape: Vec<usize>, salt: u32| {
        let data = normal(fold_in(k, salt), &shape).expect("shape");
        ParamTree::Leaf(Array::new(shape, data).expect("sizes"))
    };
    let special = Array::new(vec![3], vec![f32::NAN, -0.0, f32::NEG_INFINITY]).expect("sizes");
    // Maps, a list of more than ten entries (so `10` sorts before `2` by name) and a
    // nested map inside the list: every path form the tree can have.
    let layers = (0..12)
        .map(|i| {
            ParamTree::map([
                ("w", leaf(vec![3, 2], 10 + i)),
                ("b", leaf(vec![2], 100 + i)),
            ])
        })
        .collect();
    ParamTree::map([
        ("layers", ParamTree::List(layers)),
        ("embed", leaf(vec![5, 4], 1)),
        ("special", ParamTree::Leaf(special)),
        (
            "scalar",
            ParamTree::Leaf(Array::new(vec![], vec![2.5]).expect("sizes")),
        ),
    ])
}

#[test]
fn by_value_is_byte_identical_to_by_reference() {
    let path = Path::new("params.safetensors");
    let t = tree();
    let borrowed = io::params_to_bytes(path, &t).expect("borrowed");
    let owned = io::params_into_bytes(path, t.clone()).expect("owned");
    assert_eq!(borrowed.len(), owned.len());
    assert!(borrowed == owned, "the two serializers disagree");
    // And the bytes read back as the tree (leaf order and bits).
    let back = io::SafetensorsFile::from_bytes(path, owned).expect("valid safetensors");
    assert_eq!(back.names().len(), t.num_leaves());
    for (p, a) in t.leaves() {
        let b = back.f32(&p).expect("every leaf by its path");
        assert_eq!(a.shape(), b.shape());
        let bits = |x: &Array| x.data().iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(a), bits(&b), "{p}");
    }
}

#[test]
fn a_bare_leaf_serializes_the_same_way() {
    let path = Path::new("p.safetensors");
    let t = ParamTree::Leaf(Array::new(vec![2], vec![1.0, -1.0]).expect("sizes"));
    let borrowed = io::params_to_bytes(path, &t).expect("borrowed");
    let owned = io::params_into_bytes(path, t).expect("owned");
    assert!(borrowed == owned);
}
