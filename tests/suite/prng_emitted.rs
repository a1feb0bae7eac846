//! The emitted PRNG (`shardes_hlo::prng::emit`) reproduces JAX's vectors in
//! `shared/testdata/jax_prng.json` when run through XLA, with the keys as traced program
//! inputs. Tolerances as for the host PRNG: keys, threefry and bits exactly; floats to 1e-6
//! absolute (with the bit-exact count printed). A batched check derives one key per member id
//! inside the program and compares every member's normals with the host PRNG.

use crate::support::{floats, ints, u32s, words};

use serde_json::Value as Json;
use shardes::hlo::builder::{self, Func, Module, TensorType, Value};
use shardes::hlo::prng::{self, emit, Key, Keys};
use shardes::runtime::{Client, CompileOptions};

/// Builds `main(key: u32[2], extra: u32[m]) -> out` with `body`, runs it on one device.
fn run<F>(extra: &[u32], body: F) -> Vec<u8>
where
    F: FnOnce(&Func, &Value, &Value) -> Value,
{
    thread_local! {
        static CLIENT: Client = Client::cpu(1).expect("CPU plugin");
    }
    let mut m = Module::new("prng");
    let f = m.func("main");
    let key = f.arg("key", TensorType::u32(&[2])).unwrap();
    let xs = f
        .arg("extra", TensorType::u32(&[extra.len() as i64]))
        .unwrap();
    let out = body(&f, &key, &xs);
    f.output(&out).unwrap();
    m.add(f.finish().unwrap()).unwrap();
    CLIENT.with(|c| {
        let exe = c.compile(&m.to_mlir(), &CompileOptions::new(1)).unwrap();
        // The key is bound per call through `KEY`.
        KEY.with(|k| {
            let kb = c.buffer_from_host(&k.get().data(), &[2], 0).unwrap();
            let xb = c.buffer_from_host(extra, &[extra.len()], 0).unwrap();
            let out = exe.execute(&[vec![&kb, &xb]]).unwrap();
            out[0][0].to_host_bytes().unwrap()
        })
    })
}

thread_local! {
    static KEY: std::cell::Cell<Key> = std::cell::Cell::new(Key::from_data([0, 0]));
}

fn with_key(k: &[u32]) {
    KEY.with(|c| c.set(Key::from_data([k[0], k[1]])));
}

fn check_floats(what: &str, got: &[f32], e: &Json) {
    let want = u32s(&e["f32_bits"]);
    assert_eq!(got.len(), want.len(), "{what}");
    let mut exact = 0;
    for (g, w) in got.iter().zip(&want) {
        let err = (g - f32::from_bits(*w)).abs();
        assert!(
            err <= 1e-6,
            "{what}: {g} vs {} ({err:e})",
            f32::from_bits(*w)
        );
        exact += usize::from(g.to_bits() == *w);
    }
    println!("{what}: {exact}/{} bit-exact", got.len());
}

#[test]
fn threefry_and_fold_in_match_jax() {
    let v = crate::support::jax_vectors();
    for e in v["threefry2x32"].as_array().unwrap() {
        with_key(&u32s(&e["key"]));
        let x = u32s(&e["x"]);
        let got = words(&run(&x, |_, k, xs| {
            let kk = Keys::from_data(k).unwrap();
            let (k0, k1) = kk.words();
            let x0 = xs.slice_in_dim(0, 1, 0).unwrap().reshape(&[]).unwrap();
            let x1 = xs.slice_in_dim(1, 2, 0).unwrap().reshape(&[]).unwrap();
            let (y0, y1) = emit::threefry2x32(k0, k1, &x0, &x1).unwrap();
            Keys::new(y0, y1).unwrap().data().unwrap()
        }));
        assert_eq!(got, u32s(&e["y"]), "threefry2x32 {e}");
    }
    for e in v["fold_in"].as_array().unwrap() {
        if let Some(chain) = e.get("keys") {
            // fold_in(fold_in(key, d0), d1)...: every intermediate key, data traced.
            let data = u32s(&e["data"]);
            with_key(&u32s(&e["start"]));
            let n = data.len() as i64;
            let got = words(&run(&data, |_, k, xs| {
                let mut cur = Keys::from_data(k).unwrap();
                let mut all = vec![cur.data().unwrap()];
                for i in 0..n {
                    let d = xs.slice_in_dim(i, i + 1, 0).unwrap().reshape(&[]).unwrap();
                    cur = cur.fold_in(&d).unwrap();
                    all.push(cur.data().unwrap());
                }
                let refs: Vec<&Value> = all.iter().collect();
                k.func().concatenate(&refs, 0).unwrap()
            }));
            let want: Vec<u32> = chain
                .as_array()
                .unwrap()
                .iter()
                .flat_map(|c| u32s(&c["key"]))
                .collect();
            assert_eq!(got, want, "fold_in chain");
        } else {
            with_key(&u32s(&e["key"]));
            let d = u32::try_from(e["data"].as_u64().unwrap()).unwrap();
            let got = words(&run(&[d], |_, k, xs| {
                let d = xs.reshape(&[]).unwrap();
                Keys::from_data(k)
                    .unwrap()
                    .fold_in(&d)
                    .unwrap()
                    .data()
                    .unwrap()
            }));
            assert_eq!(got, u32s(&e["out"]), "fold_in {e}");
        }
    }
}

#[test]
fn bits_uniform_normal_match_jax() {
    let v = crate::support::jax_vectors();
    for e in v["bits"].as_array().unwrap() {
        with_key(&u32s(&e["key"]));
        let shape = ints::<i64>(&e["shape"]);
        let got = words(&run(&[0], |_, k, _| {
            Keys::from_data(k).unwrap().bits(&shape).unwrap()
        }));
        assert_eq!(got, u32s(&e["values"]), "bits {shape:?}");
    }
    for e in v["uniform"].as_array().unwrap() {
        with_key(&u32s(&e["key"]));
        let shape = ints::<i64>(&e["shape"]);
        let (lo, hi) = (
            e["lo"].as_f64().unwrap() as f32,
            e["hi"].as_f64().unwrap() as f32,
        );
        let got = floats(&run(&[0], |_, k, _| {
            Keys::from_data(k).unwrap().uniform(&shape, lo, hi).unwrap()
        }));
        check_floats(&format!("uniform {shape:?} [{lo}, {hi})"), &got, e);
    }
    for e in v["normal"].as_array().unwrap() {
        with_key(&u32s(&e["key"]));
        let shape = ints::<i64>(&e["shape"]);
        let got = floats(&run(&[0], |_, k, _| {
            Keys::from_data(k).unwrap().normal(&shape).unwrap()
        }));
        check_floats(&format!("normal {shape:?}"), &got, e);
    }
}

#[test]
fn member_keys_as_values_match_the_host() {
    // One program derives the keys of 64 members from a traced id array and draws each
    // member's normals: element (i, c) must equal the host's normal(fold_in(key, id_i))[c].
    let base = prng::fold_in(prng::key(7).unwrap(), 3);
    KEY.with(|c| c.set(base));
    let ids: Vec<u32> = (0..64).map(|i| i * 37 + 5).collect();
    let got = floats(&run(&ids, |_, k, xs| {
        Keys::from_data(k)
            .unwrap()
            .fold_in(xs)
            .unwrap()
            .normal(&[3, 5])
            .unwrap()
    }));
    let mut worst = 0.0f32;
    let mut exact = 0;
    for (i, id) in ids.iter().enumerate() {
        let want = prng::normal(prng::fold_in(base, *id), &[3, 5]).unwrap();
        for (g, w) in got[i * 15..(i + 1) * 15].iter().zip(&want) {
            worst = worst.max((g - w).abs());
            exact += usize::from(g.to_bits() == w.to_bits());
        }
    }
    println!(
        "member keys: {exact}/{} bit-exact, max |err| {worst:e}",
        got.len()
    );
    assert!(worst <= 1e-6, "emitted member normals off by {worst:e}");
}

/// The draws refuse what they cannot emit, each on its own condition (not only when two
/// hold at once), and accept an empty draw.
#[test]
fn bad_keys_and_shapes_are_refused_one_condition_at_a_time() {
    let m = Module::new("guards");
    let f = m.func("main");
    let u32_of = |shape: &[i64]| f.arg("k", TensorType::u32(shape)).unwrap();
    // Key data: u32 with a last dimension of 2.
    assert!(Keys::from_data(&u32_of(&[2])).is_ok());
    assert!(Keys::from_data(&u32_of(&[3])).is_err(), "last dimension 3");
    let f32_key = f.arg("k", TensorType::f32(&[2])).unwrap();
    assert!(Keys::from_data(&f32_key).is_err(), "f32 key data");
    // Key j of a one-dimensional batch.
    let batch = Keys::from_data(&u32_of(&[4, 2])).unwrap();
    assert!(batch.at(3).is_ok());
    // Refused by `at` itself, naming the key (not by the slice it would emit).
    let refused = |r: Result<Keys, builder::HloError>, want: &str| match r {
        Ok(_) => panic!("{want}: accepted"),
        Err(e) => assert!(e.to_string().contains(want), "{want}: {e}"),
    };
    refused(batch.at(4), "key 4 of a batch of shape [4]");
    refused(batch.at(-1), "key -1 of a batch of shape [4]");
    let square = Keys::from_data(&u32_of(&[2, 2, 2])).unwrap();
    refused(square.at(0), "key 0 of a batch of shape [2, 2]");
    // Counters: at most 2^32 per key, no negative dimension; empty draws are fine.
    let one = Keys::constant(&f, prng::key(0).unwrap()).unwrap();
    assert_eq!(one.bits(&[0]).unwrap().shape(), &[0]);
    assert_eq!(one.bits(&[3, 0]).unwrap().shape(), &[3, 0]);
    assert!(one.bits(&[1 << 16, 1 << 16]).is_err(), "2^32 counters");
    assert!(one.bits(&[-1, -2]).is_err(), "negative dimensions");
}
