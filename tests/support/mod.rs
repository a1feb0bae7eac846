//! Test support: an independent host reference of one ES generation, written straight from
//! `shared/spec/semantics.md` and `shared/spec/transformer_block.md` with plain loops in f32
//! (f32 accumulation, sequential sums). It shares only the PRNG and parameter-tree types with
//! the library, and those are checked against JAX's vectors on their own (`prng_vectors`).
//!
//! - [`model`]: transformer_block forward and loss through a `dense` seam;
//! - [`es`]: noise (full rank, low-rank factors), mirrored pairing, member evaluation and
//!   the update;
//! - [`shaping`]: centered_ranks, centered, group_relative, none;
//! - [`tiny`]: small models (MLP, multi-task, constant, quadratic) for the ES tests.

// Each test binary uses a different part of the support code.
#![allow(dead_code)]

pub mod control;
pub mod decode;
pub mod es;
pub mod model;
pub mod pretrained;
pub mod shaping;
pub mod sharded;
pub mod tiny;

use std::path::PathBuf;

/// Path of a file under `shared/`.
pub fn shared(rel: &str) -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../shared/")).join(rel)
}

/// Parses `shared/testdata/jax_prng.json`.
pub fn jax_vectors() -> serde_json::Value {
    let path = shared("testdata/jax_prng.json");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()))
}

/// A temporary directory and the path `out` inside it (not created): where a test's run
/// goes. Keep the directory alive for as long as the path is used.
pub fn out_dir() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    (dir, out)
}

/// This test binary running only `test` (its full name, `module::test`; one thread, output
/// shown), with `var` set to `value` so that the test knows it is the child, its stderr
/// discarded; the caller sets stdin and stdout and spawns it.
pub fn this_test_as_child(test: &str, var: &str, value: &std::path::Path) -> std::process::Command {
    let mut c = std::process::Command::new(std::env::current_exe().unwrap());
    c.args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(var, value)
        .stderr(std::process::Stdio::null());
    c
}

/// A JSON array of non-negative integers (shapes in the JAX vectors) as `T`.
pub fn ints<T: TryFrom<u64>>(v: &serde_json::Value) -> Vec<T> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| T::try_from(x.as_u64().expect("int")).ok().expect("fits"))
        .collect()
}

/// A JSON array of u32 words (keys, counters, bits in the JAX vectors).
pub fn u32s(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| u32::try_from(x.as_u64().expect("u32")).expect("fits u32"))
        .collect()
}

/// Max absolute and max relative (to `max|b|`) difference of two slices.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// `a − b` elementwise: a leaf's update from its values after (`a`) and before (`b`).
pub fn sub(a: &[f32], b: &[f32]) -> Vec<f32> {
    a.iter().zip(b).map(|(x, y)| x - y).collect()
}

/// `‖a − b‖₂ / ‖b‖₂`, computed in f64.
pub fn rel_norm_diff(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    let num: f64 = (0..a.len())
        .map(|i| (f64::from(a[i]) - f64::from(b[i])).powi(2))
        .sum();
    let den: f64 = b.iter().map(|y| f64::from(*y).powi(2)).sum();
    (num / den).sqrt()
}

/// The Euclidean distance `‖a − b‖` in f64, summed in order: how far an estimate lies from
/// the gradient it estimates.
pub fn distance(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).powi(2))
        .sum::<f64>()
        .sqrt()
}

/// Tells `a` and `b` the same `fitness` and asserts that they then hold the same
/// parameters: two paths (programs, placements) to the one update, bit for bit.
pub fn tell_both<A, B>(
    a: &mut shardes::Population<A>,
    b: &mut shardes::Population<B>,
    fitness: Vec<f32>,
    what: &str,
) {
    a.tell(&shardes::HostFitness::F32(fitness.clone())).unwrap();
    b.tell(&shardes::HostFitness::F32(fitness)).unwrap();
    assert_eq!(a.params().unwrap(), b.params().unwrap(), "{what}");
}

/// Deterministic pseudo-random ids in `0..vocab` (a 64-bit LCG): `n` of them from `seed`.
pub fn lcg_ids(n: usize, vocab: usize, seed: u64) -> Vec<u64> {
    let mut s = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (s >> 33) % vocab as u64
        })
        .collect()
}

/// The largest [`rel_norm_diff`] over two trees' leaves, in leaf order.
pub fn worst_leaf_diff(
    a: &shardes::hlo::params::ParamTree,
    b: &shardes::hlo::params::ParamTree,
) -> f64 {
    a.leaves()
        .into_iter()
        .zip(b.leaves())
        .map(|((_, x), (_, y))| rel_norm_diff(x.data(), y.data()))
        .fold(0.0, f64::max)
}

/// Whether an array shape holds at least two whole `m × k` matrices' worth of elements in
/// a multiple of `m·k` (with prime `m`, `k` that only arises from a member × m × k value,
/// flattened or not).
pub fn member_by_matrix(dims: &[usize], m: usize, k: usize) -> bool {
    let el: usize = dims.iter().product();
    let has_both = dims.contains(&m) && dims.contains(&k) && dims.len() >= 3;
    has_both || (el >= 2 * m * k && el.is_multiple_of(m * k))
}

/// The instructions of `hlo` holding a member × m × k value of one of `matrices`, as
/// `opcode type[dims]`.
pub fn hlo_offenders(
    hlo: &shardes::runtime::HloModule,
    matrices: &[(usize, usize)],
) -> Vec<String> {
    hlo.instructions()
        .filter(|i| i.shape.element_type != "tuple")
        .filter(|i| {
            matrices
                .iter()
                .any(|&(m, k)| member_by_matrix(&i.shape.dims, m, k))
        })
        .map(|i| format!("{} {}{:?}", i.opcode, i.shape.element_type, i.shape.dims))
        .collect()
}

/// `b` read as little-endian u32 words (a device buffer's bytes).
pub fn words(b: &[u8]) -> Vec<u32> {
    b.chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// `b` read as little-endian f32s.
pub fn floats(b: &[u8]) -> Vec<f32> {
    words(b).into_iter().map(f32::from_bits).collect()
}

/// Checks that `text` contains each of `parts` (the message shows `text`).
pub fn says(text: &str, parts: &[&str]) {
    for part in parts {
        assert!(text.contains(part), "{text}");
    }
}
