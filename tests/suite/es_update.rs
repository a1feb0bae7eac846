//! The emitted update against an exact oracle: the explicit loop
//! `u = Σ_k c_k A_k B_kᵀ / √r` (low rank) or `Σ_k c_k ε_k` (full rank) of
//! `crate::support::es::Es::contraction`, accumulated in f32 on the host from the spec's noise
//! derivation, for the MLP with prime leaf dims (`w1 (7, 13)`, `w2 (5, 7)`, `b1 [7]`).
//!
//! Each case runs twice: `tell` contracting the noise `apply` kept (`how = B` under the
//! default budget) and `tell` regenerating it (`with_keep_noise_bytes(0)`).
//!
//! The cases are the ones the quickstart cannot tell apart: rank r > 1 (the `1/√r` scale),
//! and local direction counts that are not powers of two (3 and 5 per device on 8
//! devices), so a `tell` that contracts the wrong number of directions per step drops
//! whole steps. The weights are the host's centered ranks of the emitted fitness (the
//! shaping has its own exact tests in `es_shaping`).
//!
//! Tolerance: `θ₁ − θ₀` within 1e-5 relative in norm per leaf of the oracle's (the two
//! sum the same f32 terms in different orders; measured ≤ 3e-7).

use crate::support::es::{base_key, Es, Inner};
use crate::support::rel_norm_diff;
use crate::support::tiny::{mlp_batch, mlp_params, one_generation, Mlp};
use shardes::hlo::es::strategy::from_spec;
use shardes::hlo::es::{leaf_infos, ShardedES, StrategySpec, KEEP_NOISE_BYTES};
use shardes::hlo::params::ParamTree;
use shardes::hlo::prng::key;
use shardes::runtime::Client;

const SIGMA: f32 = 0.1;
/// Large enough that the update is of the order of the parameters, so `θ₁ − θ₀` carries
/// the update's own precision.
const LR: f32 = 1.0;
const TOL: f64 = 1e-5;

/// Runs generation 0 of `spec` with population `n` on `devices` devices and checks every
/// leaf's update against the oracle, with `tell` contracting the noise `apply` kept and
/// with `tell` regenerating it.
fn check(client: &Client, spec: &str, oracle: Es, devices: usize) {
    let parsed: StrategySpec = spec.parse().unwrap_or_else(|e| panic!("{spec}: {e}"));
    let params = mlp_params(1);
    for keep in [KEEP_NOISE_BYTES, 0] {
        let es = ShardedES::new(from_spec(&parsed), oracle.n, SIGMA, LR, devices)
            .unwrap_or_else(|e| panic!("{spec}: {e}"))
            .with_keep_noise_bytes(keep);
        assert_eq!(es.keeps_noise(&leaf_infos(&params)), keep > 0, "{spec}");
        check_one(client, &es, spec, oracle, devices, &params);
    }
}

fn check_one(
    client: &Client,
    es: &ShardedES,
    spec: &str,
    oracle: Es,
    devices: usize,
    params: &ParamTree,
) {
    let spec = format!(
        "{spec} (kept noise: {})",
        es.keeps_noise(&leaf_infos(params))
    );
    let g = one_generation(client, es, &Mlp::PLAIN, params, &mlp_batch(2));
    let weights = crate::support::shaping::centered_ranks(&g.fitness);
    let want = oracle.update(params, base_key(key(7).expect("seed"), 0), &weights);
    for ((got, (path, p0)), (_, p1)) in g.update.iter().zip(params.leaves()).zip(want.leaves()) {
        let delta = crate::support::sub(p1.data(), p0.data());
        let e = rel_norm_diff(got, &delta);
        println!(
            "{spec}, n = {}, {devices} devices: {path} rel err {e:e}",
            oracle.n
        );
        assert!(
            e <= TOL,
            "{spec}, n = {}, {devices} devices: the update of {path} is off the oracle by {e:e}",
            oracle.n
        );
    }
}

fn es(inner: Inner, mirrored: bool, n: usize) -> Es {
    Es {
        inner,
        mirrored,
        n,
        sigma: SIGMA,
        lr: LR,
    }
}

#[test]
fn low_rank_update_matches_the_explicit_loop_at_rank_above_one() {
    let client = Client::cpu(8).expect("cpu client");
    // 5 directions per device.
    check(&client, "lowrank(r=3)", es(Inner::LowRank(3), false, 40), 8);
    // 3 directions (6 members) per device.
    check(
        &client,
        "mirrored(lowrank(r=2))",
        es(Inner::LowRank(2), true, 48),
        8,
    );
    // One device, 12 directions.
    check(
        &client,
        "mirrored(lowrank(r=2))",
        es(Inner::LowRank(2), true, 24),
        1,
    );
}

#[test]
fn full_rank_update_matches_the_explicit_loop() {
    let client = Client::cpu(8).expect("cpu client");
    // 3 directions per device.
    check(
        &client,
        "seed_regenerated(chunk=3)",
        es(Inner::FullRank, false, 24),
        8,
    );
    check(
        &client,
        "mirrored(seed_regenerated(chunk=2))",
        es(Inner::FullRank, true, 48),
        8,
    );
}
