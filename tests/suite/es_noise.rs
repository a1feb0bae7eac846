//! The strategies' noise, run through XLA, against the spec's derivation evaluated on the
//! host PRNG (`prng::host`, pinned to JAX's vectors by `tests/suite/prng_vectors.rs`):
//!
//! - low rank `r`, 2-D leaf `j` of shape `(m, k)`: column keys `c_q = fold_in(stream_j, q)`
//!   for `q < 2r`; direction `i`'s keys `fold_in(c_q, i)`; `a[i, q] = normal(key, [m])` for
//!   `q < r`, `b[i, q − r] = normal(key, [k])` for `r ≤ q < 2r`;
//! - any other leaf, and every leaf of a full-rank strategy: `normal(fold_in(stream_j, i),
//!   [size])`.
//!
//! `stream_j = fold_in(base, j)`. The leaves mix square, non-square and 1-D shapes, r = 3
//! (so `2r`, `2 + r` and `r²` all differ) and directions out of order, which the quickstart
//! (r = 1, square leaves, directions `0..d`) cannot tell apart. Tolerance: 2e-6 absolute, the
//! PRNG's (erf_inv may round differently under FMA contraction); the count of bit-exact values
//! is printed.

use shardes::hlo::builder::{Module, TensorType};
use shardes::hlo::es::strategy::{LowRank, Mirrored, SeedRegenerated};
use shardes::hlo::es::{LeafInfo, Noise, Strategy};
use shardes::hlo::prng::{self, Key, Keys};
use shardes::runtime::{Client, CompileOptions};

const BASE: [u32; 2] = [0x1234_5678, 0x9abc_def0];
const DIRS: [u32; 3] = [5, 0, 2];

fn leaves() -> Vec<LeafInfo> {
    [vec![4, 4], vec![3, 5], vec![6], vec![5, 2]]
        .into_iter()
        .enumerate()
        .map(|(index, shape)| LeafInfo {
            index,
            path: format!("leaf{index}"),
            shape,
        })
        .collect()
}

/// Every leaf's noise for `DIRS` from `strategy.noise_all` (or leaf by leaf through
/// `strategy.noise` when `per_leaf`), flattened and concatenated in leaf order (`a` then `b`).
fn emitted(strategy: &dyn Strategy, per_leaf: bool) -> Vec<f32> {
    let leaves = leaves();
    let mut m = Module::new("noise");
    let f = m.func("main");
    let key = f.arg("key", TensorType::u32(&[2])).expect("key");
    let dirs = f
        .arg("dirs", TensorType::u32(&[DIRS.len() as i64]))
        .expect("dirs");
    let ids = f
        .iota(TensorType::u32(&[leaves.len() as i64]), 0)
        .expect("iota");
    let streams = Keys::from_data(&key)
        .and_then(|k| k.fold_in(&ids))
        .expect("streams");
    let noise: Vec<Noise> = if per_leaf {
        leaves
            .iter()
            .enumerate()
            .map(|(j, l)| {
                strategy
                    .noise(&streams.at(j as i64).expect("key j"), l, &dirs)
                    .expect("noise")
            })
            .collect()
    } else {
        strategy
            .noise_all(&streams, &leaves, &dirs)
            .expect("noise_all")
    };
    let mut flat = Vec::new();
    for n in &noise {
        let parts = match n {
            Noise::Dense(v) => vec![v.clone()],
            Noise::Factors { a, b } => vec![a.clone(), b.clone()],
        };
        for v in parts {
            let size: i64 = v.shape().iter().product();
            flat.push(v.reshape(&[size]).expect("flatten"));
        }
    }
    let refs: Vec<_> = flat.iter().collect();
    let out = f.concatenate(&refs, 0).expect("concatenate");
    f.output(&out).expect("output");
    m.add(f.finish().expect("finish")).expect("add");
    let client = Client::cpu(1).expect("CPU plugin");
    let exe = client
        .compile(&m.to_mlir(), &CompileOptions::new(1))
        .expect("compile");
    let kb = client.buffer_from_host(&BASE, &[2], 0).expect("key buffer");
    let db = client
        .buffer_from_host(&DIRS, &[DIRS.len()], 0)
        .expect("dirs buffer");
    let out = exe.execute(&[vec![&kb, &db]]).expect("execute");
    out[0][0].to_host::<f32>().expect("to host")
}

/// The spec's noise on the host, in the same layout. `rank = None`: full rank everywhere.
fn expected(rank: Option<usize>) -> Vec<f32> {
    let base = Key::from_data(BASE);
    let mut out = Vec::new();
    for leaf in leaves() {
        let stream = prng::fold_in(base, leaf.index as u32);
        let shape: Vec<usize> = leaf.shape.iter().map(|&d| d as usize).collect();
        match (rank, shape.as_slice()) {
            (Some(r), &[m, k]) => {
                let key = |i: u32, q: usize| prng::fold_in(prng::fold_in(stream, q as u32), i);
                for (cols, len) in [(0..r, m), (r..2 * r, k)] {
                    for &i in &DIRS {
                        for q in cols.clone() {
                            out.extend(prng::normal(key(i, q), &[len]).expect("normal"));
                        }
                    }
                }
            }
            _ => {
                let size = shape.iter().product();
                for &i in &DIRS {
                    let key = prng::fold_in(stream, i);
                    out.extend(prng::normal(key, &[size]).expect("normal"));
                }
            }
        }
    }
    out
}

fn assert_close(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: number of noise values");
    let exact = got.iter().zip(want).filter(|(a, b)| a == b).count();
    let worst = got
        .iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    println!(
        "{what}: {exact} of {} bit-exact, max abs diff {worst:e}",
        got.len()
    );
    assert!(worst <= 2e-6, "{what}: noise off by {worst:e}");
}

#[test]
fn low_rank_noise_of_every_leaf_kind_follows_the_spec() {
    let low = LowRank { r: 3 };
    let want = expected(Some(3));
    assert_close(&emitted(&low, false), &want, "lowrank(r=3).noise_all");
    assert_close(
        &emitted(&low, true),
        &want,
        "lowrank(r=3).noise, leaf by leaf",
    );
    let mirrored = Mirrored(Box::new(LowRank { r: 3 }));
    assert_close(&emitted(&mirrored, false), &want, "mirrored(lowrank(r=3))");
}

#[test]
fn full_rank_noise_of_every_leaf_follows_the_spec() {
    let want = expected(None);
    let full = SeedRegenerated { chunk: None };
    assert_close(&emitted(&full, false), &want, "seed_regenerated.noise_all");
    let mirrored = Mirrored(Box::new(SeedRegenerated { chunk: None }));
    assert_close(
        &emitted(&mirrored, false),
        &want,
        "mirrored(seed_regenerated)",
    );
}
