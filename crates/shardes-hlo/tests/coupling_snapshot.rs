//! Snapshots of the coupled draws: every change to how `orthogonal_hd` rows (Hadamard row,
//! Rademacher signs, two fast Walsh–Hadamard transforms) and shifted Sobol normals are
//! emitted is reviewed as a diff of these modules.

use shardes_hlo::builder::{Module, TensorType};
use shardes_hlo::es::coupling::{hd_noise, sobol_normals};
use shardes_hlo::prng::Keys;

#[test]
fn snapshot_orthogonal_hd_rows() {
    let mut m = Module::new("hd");
    let f = m.func("main");
    let key = Keys::from_data(&f.arg("key", TensorType::u32(&[2])).unwrap()).unwrap();
    let dirs = f.arg("dirs", TensorType::u32(&[2])).unwrap();
    f.output(&hd_noise(&key, &dirs, 3).unwrap()).unwrap();
    m.add(f.finish().unwrap()).unwrap();
    insta::assert_snapshot!(m.to_mlir());
}

#[test]
fn snapshot_sobol_normals() {
    let mut m = Module::new("sobol");
    let f = m.func("main");
    let key = Keys::from_data(&f.arg("key", TensorType::u32(&[2])).unwrap()).unwrap();
    let dirs = f.arg("dirs", TensorType::u32(&[2])).unwrap();
    f.output(&sobol_normals(&key, &dirs, 2).unwrap()).unwrap();
    m.add(f.finish().unwrap()).unwrap();
    insta::assert_snapshot!(m.to_mlir());
}
