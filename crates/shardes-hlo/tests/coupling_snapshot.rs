//! Snapshots of the coupled draws: every change to how `orthogonal_hd` rows (Hadamard row,
//! Rademacher signs, two fast Walsh–Hadamard transforms) and shifted Sobol normals are
//! emitted is reviewed as a diff of these modules.

use shardes_hlo::builder::{Module, Result, TensorType, Value};
use shardes_hlo::es::coupling::{hd_noise, sobol_normals};
use shardes_hlo::prng::Keys;

/// Module `name` whose `main` takes a key and a `u32[2]` of directions and returns what
/// `draw` emits from them.
fn module(name: &str, draw: impl FnOnce(&Keys, &Value) -> Result<Value>) -> String {
    let mut m = Module::new(name);
    let f = m.func("main");
    let key = Keys::from_data(&f.arg("key", TensorType::u32(&[2])).unwrap()).unwrap();
    let dirs = f.arg("dirs", TensorType::u32(&[2])).unwrap();
    f.output(&draw(&key, &dirs).unwrap()).unwrap();
    m.add(f.finish().unwrap()).unwrap();
    m.to_mlir()
}

#[test]
fn snapshot_orthogonal_hd_rows() {
    insta::assert_snapshot!(module("hd", |key, dirs| hd_noise(key, dirs, 3)));
}

#[test]
fn snapshot_sobol_normals() {
    insta::assert_snapshot!(module("sobol", |key, dirs| sobol_normals(key, dirs, 2)));
}
