//! safetensors I/O: a tree survives write → read bit for bit; errors name the problem.

use std::path::PathBuf;

use shardes::hlo::params::{Array, ParamTree};
use shardes::hlo::prng::{key, normal};
use shardes::io::{self, IoError, SafetensorsFile};

fn tmp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("shardes-io-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("create temp dir");
    dir
}

fn sample_tree() -> ParamTree {
    let k = key(7).expect("seed");
    let leaf = |shape: Vec<usize>, salt: u32| {
        let data = normal(shardes::hlo::prng::fold_in(k, salt), &shape).expect("shape");
        ParamTree::Leaf(Array::new(shape, data).expect("sizes"))
    };
    // Special values must survive too: the format is raw little-endian bits.
    let special = Array::new(
        vec![4],
        vec![f32::NAN, -0.0, f32::INFINITY, f32::MIN_POSITIVE / 2.0],
    )
    .expect("sizes");
    ParamTree::map([
        (
            "layers",
            ParamTree::List(vec![
                ParamTree::map([("wq", leaf(vec![3, 5], 0)), ("b", leaf(vec![5], 1))]),
                ParamTree::map([("wq", leaf(vec![3, 5], 2)), ("b", leaf(vec![5], 3))]),
            ]),
        ),
        ("embed", leaf(vec![11, 3], 4)),
        ("special", ParamTree::Leaf(special)),
        ("scalar", leaf(vec![], 5)),
    ])
}

fn bits_of(t: &ParamTree) -> Vec<(String, Vec<usize>, Vec<u32>)> {
    t.leaves()
        .into_iter()
        .map(|(p, a)| {
            (
                p,
                a.shape().to_vec(),
                a.data().iter().map(|x| x.to_bits()).collect(),
            )
        })
        .collect()
}

#[test]
fn tree_round_trips_bit_exact() {
    let dir = tmp_dir("rt");
    let path = dir.join("params.safetensors");
    let tree = sample_tree();
    io::write_params(&path, &tree).expect("write");
    let back = io::read_params(&path, &tree).expect("read with template");
    assert_eq!(bits_of(&back), bits_of(&tree));
    let inferred = io::read_params_inferred(&path).expect("read inferred");
    assert_eq!(bits_of(&inferred), bits_of(&tree));
    assert!(matches!(inferred.get("layers.1.wq"), Some(a) if a.shape() == [3, 5]));
    // Overwriting is atomic and leaves no temporary files behind.
    io::write_params(&path, &tree).expect("overwrite");
    let names: Vec<_> = std::fs::read_dir(&dir)
        .expect("list")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(names.len(), 1, "stray files: {names:?}");
    let file = SafetensorsFile::open(&path).expect("open");
    assert_eq!(file.names().len(), 7);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn missing_file_names_the_path() {
    let path = tmp_dir("missing").join("nope.safetensors");
    let err = io::read_params(&path, &sample_tree()).expect_err("missing file");
    assert!(matches!(err, IoError::Read { .. }), "{err:?}");
    assert!(err.to_string().contains("nope.safetensors"), "{err}");
}

#[test]
fn wrong_dtype_missing_tensor_and_wrong_shape() {
    let gen0 = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../shared/testdata/quickstart_gen0.safetensors"
    );
    let file = SafetensorsFile::open(gen0).expect("open gen0");
    let err = file.f32("base_key").expect_err("base_key is u32");
    assert!(matches!(err, IoError::WrongDtype { .. }), "{err:?}");
    assert!(
        err.to_string().contains("base_key") && err.to_string().contains("U32"),
        "{err}"
    );
    assert!(matches!(
        file.u32("fitness"),
        Err(IoError::WrongDtype { .. })
    ));
    let err = file.f32("no.such").expect_err("missing tensor");
    assert!(matches!(err, IoError::MissingTensor { .. }) && err.to_string().contains("no.such"));

    let dir = tmp_dir("shape");
    let path = dir.join("p.safetensors");
    let tree = sample_tree();
    io::write_params(&path, &tree).expect("write");
    let other = tree.map_leaves(|p, a| {
        if p == "embed" {
            Array::zeros(vec![3, 11]).expect("shape")
        } else {
            a.clone()
        }
    });
    let err = io::read_params(&path, &other).expect_err("shape differs");
    assert!(
        matches!(err, IoError::WrongShape { ref name, .. } if name == "embed"),
        "{err:?}"
    );
    // A garbage file is a format error naming the file.
    let junk = dir.join("junk.safetensors");
    std::fs::write(&junk, b"not a safetensors file").expect("write junk");
    let err = SafetensorsFile::open(&junk).expect_err("junk");
    assert!(
        matches!(err, IoError::Format { .. }) && err.to_string().contains("junk"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn duplicate_names_are_refused() {
    let dir = tmp_dir("dup");
    let a = Array::zeros(vec![2]).expect("shape");
    let err =
        io::write_named(dir.join("d.safetensors"), &[("x", &a), ("x", &a)]).expect_err("duplicate");
    assert!(matches!(err, IoError::DuplicateName { .. }), "{err:?}");
    std::fs::remove_dir_all(&dir).ok();
}
