//! Snapshot of the emitted PRNG: every change to how keys, bits and normals are emitted is
//! reviewed as a diff of this module.

use shardes_hlo::builder::{Module, TensorType};
use shardes_hlo::prng::Keys;

#[test]
fn snapshot_prng_normal_per_member() {
    let mut m = Module::new("prng");
    let f = m.func("main");
    let key = f.arg("key", TensorType::u32(&[2])).unwrap();
    let ids = f.arg("ids", TensorType::u32(&[4])).unwrap();
    let z = Keys::from_data(&key)
        .unwrap()
        .fold_in(&ids)
        .unwrap()
        .normal(&[3])
        .unwrap();
    f.output(&z).unwrap();
    m.add(f.finish().unwrap()).unwrap();
    insta::assert_snapshot!(m.to_mlir());
}
