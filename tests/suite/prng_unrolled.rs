//! threefry with its rounds unrolled (`emit::threefry2x32_unrolled`, `Keys::normal_unrolled`,
//! what `tell` draws under `how = A`) gives exactly the bits of the loop form
//! (`emit::threefry2x32`, `Keys::normal`), which the JAX vectors pin down
//! (`tests/suite/prng_emitted.rs`): words and normals compared bit for bit, in one program each.

use crate::support::{ints, u32s};

use shardes::hlo::builder::{Module, TensorType};
use shardes::hlo::prng::{emit, Key, Keys};
use shardes::runtime::{Client, CompileOptions};

/// Runs `main(key: u32[2]) -> (loop, unrolled)` on one device; both results as raw words.
fn both<F>(key: Key, body: F) -> (Vec<u32>, Vec<u32>)
where
    F: FnOnce(&Keys) -> (shardes::hlo::builder::Value, shardes::hlo::builder::Value),
{
    let client = Client::cpu(1).expect("CPU plugin");
    let mut m = Module::new("unrolled");
    let f = m.func("main");
    let k = f.arg("key", TensorType::u32(&[2])).unwrap();
    let (a, b) = body(&Keys::from_data(&k).unwrap());
    f.output(&a).unwrap();
    f.output(&b).unwrap();
    m.add(f.finish().unwrap()).unwrap();
    let exe = client
        .compile(&m.to_mlir(), &CompileOptions::new(1))
        .unwrap();
    let kb = client.buffer_from_host(&key.data(), &[2], 0).unwrap();
    let out = exe.execute(&[vec![&kb]]).unwrap();
    let words = |i: usize| -> Vec<u32> {
        out[0][i]
            .to_host_bytes()
            .unwrap()
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    };
    (words(0), words(1))
}

#[test]
fn unrolled_threefry_words_equal_the_loop() {
    // 64 member keys × 4096 counters: every word of every round path.
    let (lo, un) = both(Key::from_data([0x1234_5678, 0x9abc_def0]), |keys| {
        let f = keys.words().0.func();
        let ids = f.iota(TensorType::u32(&[64]), 0).unwrap();
        let members = keys.fold_in(&ids).unwrap();
        let full = [64, 4096];
        let wide = members.broadcast_in_dim(&full, &[0]).unwrap();
        let (k0, k1) = wide.words();
        let ctr = f.iota(TensorType::u32(&full), 1).unwrap();
        let zero = f.scalar(0u32).unwrap().broadcast_to(&full).unwrap();
        let (a0, a1) = emit::threefry2x32(k0, k1, &zero, &ctr).unwrap();
        let (b0, b1) = emit::threefry2x32_unrolled(k0, k1, &zero, &ctr).unwrap();
        let cat = |x: &shardes::hlo::builder::Value, y: &shardes::hlo::builder::Value| {
            f.concatenate(&[x, y], 1).unwrap()
        };
        (cat(&a0, &a1), cat(&b0, &b1))
    });
    assert_eq!(lo.len(), 64 * 4096 * 2);
    assert!(lo == un, "unrolled threefry words differ from the loop's");
}

#[test]
fn unrolled_normals_equal_the_loop_bit_for_bit() {
    // The JAX vectors' keys and shapes, then a batch of member keys as tell draws them.
    let v = crate::support::jax_vectors();
    for e in v["normal"].as_array().unwrap() {
        let k = u32s(&e["key"]);
        let shape = ints::<i64>(&e["shape"]);
        let (lo, un) = both(Key::from_data([k[0], k[1]]), |keys| {
            (
                keys.normal(&shape).unwrap(),
                keys.normal_unrolled(&shape).unwrap(),
            )
        });
        assert_eq!(lo, un, "normal {shape:?}: unrolled bits differ");
    }
    let (lo, un) = both(Key::from_data([7, 3]), |keys| {
        let f = keys.words().0.func();
        let dirs = f.iota(TensorType::u32(&[16]), 0).unwrap();
        let per = keys.fold_in(&dirs).unwrap();
        (
            per.normal(&[65536]).unwrap(),
            per.normal_unrolled(&[65536]).unwrap(),
        )
    });
    assert_eq!(lo.len(), 16 * 65536);
    let same = lo.iter().zip(&un).filter(|(a, b)| a == b).count();
    assert_eq!(
        same,
        lo.len(),
        "{} of {} normals differ",
        lo.len() - same,
        lo.len()
    );
}

#[test]
fn unrolled_threefry_refuses_mixed_shapes() {
    let m = Module::new("bad");
    let f = m.func("bad");
    let a = f.arg("a", TensorType::u32(&[4])).unwrap();
    let b = f.arg("b", TensorType::u32(&[1])).unwrap();
    let err = emit::threefry2x32_unrolled(&a, &a, &a, &b).unwrap_err();
    assert!(err.to_string().contains("one shape"), "{err}");
    let keys = Keys::new(a.clone(), a).unwrap();
    let err = keys.normal_unrolled(&[1 << 16, 1 << 16]).unwrap_err();
    assert!(err.to_string().contains("2^32"), "{err}");
}
