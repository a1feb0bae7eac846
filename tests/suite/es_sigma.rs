//! Per-leaf σ, separable σ and frozen leaves (semantics.md, "Per-leaf σ and frozen
//! leaves") on the MLP with prime leaf dims (`b1 [7]`, `w1 (7, 13)`, `w2 (5, 7)`), against
//! an explicit-loop host oracle in f64: member `i` evaluates `θ_j + s σ_j ⊙ E_j(i)` on leaf
//! `j` (`E` the spec's unit noise, materialized on the host; a separable σ as the dense
//! `p qᵀ`, each product rounded to f32 as the program rounds it), and the update is
//! `−lr/n · u_j ⊘ σ_j` with `u_j = Σ_k c_k E_j(k)` accumulated in f64. The weights `c` are
//! the host's centered ranks of the program's fitness.
//!
//! Tolerances: fitness within 2e-6 of the oracle's, relative to the largest |fitness| (an
//! f32 forward against an f64 one; measured ≤ 2.3e-7); the update `θ₁ − θ₀` within 1e-5
//! relative in norm per leaf (f32 sums and the f32 subtraction against f64; measured
//! ≤ 1e-6); 1 vs 8 devices ≤ 1e-5 per leaf as in `es_program`. Where the spec says
//! bit-identical (one σ on every leaf against the scalar, a leaf's update with and without
//! freezing another), the test compares bits.

use std::collections::BTreeMap;

use crate::support::es::{base_key, Es, Inner, LeafNoise};
use crate::support::tiny::{
    mlp_batch, mlp_on_8_devices, mlp_params, one_generation, Mlp, BATCH, IN,
};
use crate::support::{member_by_matrix, rel_norm_diff};
use shardes::hlo::es::shaping::ShapingSpec;
use shardes::hlo::es::strategy::from_spec;
use shardes::hlo::es::{
    leaf_infos, EsSpec, How, LeafScale, LeafSigma, ShardedES, StrategySpec, KEEP_NOISE_BYTES,
};
use shardes::hlo::params::ParamTree;
use shardes::hlo::prng::{key, Key};
use shardes::runtime::{Client, HloModule};
use shardes::{HostFitness, SplitTrainer};

const N: usize = 64;
const SIGMA: f32 = 0.1;
const LR: f32 = 1.0;
const FIT_TOL: f64 = 2e-6;
const TOL: f64 = 1e-5;

fn es(strat: &str, devices: usize) -> ShardedES {
    let spec: StrategySpec = strat.parse().unwrap_or_else(|e| panic!("{strat}: {e}"));
    ShardedES::new(from_spec(&spec), N, SIGMA, LR, devices).expect("valid settings")
}

/// The host's view of a strategy name.
fn oracle(strat: &str) -> Es {
    let mirrored = strat.starts_with("mirrored(");
    let inner = match strat.find("lowrank(r=") {
        Some(at) => {
            let r: String = strat[at + 10..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            Inner::LowRank(r.parse().expect("rank"))
        }
        None => Inner::FullRank,
    };
    Es {
        inner,
        mirrored,
        n: N,
        sigma: SIGMA,
        lr: LR,
    }
}

fn tree(b1: f32, w1: f32, w2: f32) -> BTreeMap<String, LeafSigma> {
    [("b1", b1), ("w1", w1), ("w2", w2)]
        .into_iter()
        .map(|(k, v)| (k.to_string(), LeafSigma::Scalar(v)))
        .collect()
}

/// `p` and `q` for an `(m, k)` leaf: spread over [0.05, 0.3], no two alike.
fn separable(m: usize, k: usize, salt: f32) -> (Vec<f32>, Vec<f32>) {
    let spread = |len: usize, at: f32| -> Vec<f32> {
        (0..len)
            .map(|i| 0.05 + 0.25 * ((i as f32 * 0.618 + at).fract()))
            .collect()
    };
    (spread(m, salt), spread(k, salt + 0.3))
}

/// Each leaf's σ as the host applies it: per element (`p_i q_j` rounded to f32), or
/// frozen.
fn dense_sigmas(scales: &[LeafScale], params: &ParamTree) -> Vec<Option<Vec<f32>>> {
    scales
        .iter()
        .zip(params.leaves())
        .map(|(s, (_, w))| match s {
            LeafScale::Frozen => None,
            LeafScale::Sigma(LeafSigma::Scalar(x)) => Some(vec![*x; w.len()]),
            LeafScale::Sigma(LeafSigma::Separable { p, q }) => Some(
                p.iter()
                    .flat_map(|pi| q.iter().map(move |qj| pi * qj))
                    .collect(),
            ),
        })
        .collect()
}

/// The unit noise `E_j(i)` of leaf `j` for direction `i`, dense, in f64.
fn unit_noise(o: &Es, base: Key, j: usize, shape: &[usize], i: u32) -> Vec<f64> {
    match o.leaf_noise(base, j, shape, i) {
        LeafNoise::Full(e) => e.iter().map(|&x| f64::from(x)).collect(),
        LeafNoise::LowRank { a, b, m, k, r } => {
            let mut e = vec![0.0f64; m * k];
            for row in 0..m {
                for col in 0..k {
                    let dot: f64 = (0..r)
                        .map(|q| f64::from(a[row * r + q]) * f64::from(b[col * r + q]))
                        .sum();
                    e[row * k + col] = dot / (r as f64).sqrt();
                }
            }
            e
        }
    }
}

/// The MLP's loss in f64 for leaves `b1 [7]`, `w1 (7, 13)`, `w2 (5, 7)`.
fn mlp_loss(w: &[Vec<f64>], batch: &[shardes::hlo::params::Array]) -> f64 {
    let (b1, w1, w2) = (&w[0], &w[1], &w[2]);
    let (hidden, out) = (b1.len(), w2.len() / b1.len());
    let (x, t) = (batch[0].data(), batch[1].data());
    let mut sum = 0.0;
    for row in 0..BATCH {
        let h: Vec<f64> = (0..hidden)
            .map(|o| {
                let pre: f64 = (0..IN)
                    .map(|c| w1[o * IN + c] * f64::from(x[row * IN + c]))
                    .sum();
                (pre + b1[o]).tanh()
            })
            .collect();
        for o in 0..out {
            let y: f64 = (0..hidden).map(|c| w2[o * hidden + c] * h[c]).sum();
            sum += (y - f64::from(t[row * out + o])).powi(2);
        }
    }
    sum / (BATCH * out) as f64
}

/// Every member's loss under the oracle.
fn host_fitness(o: &Es, params: &ParamTree, sigmas: &[Option<Vec<f32>>], base: Key) -> Vec<f64> {
    let batch = mlp_batch(2);
    (0..N)
        .map(|i| {
            let (dir, s) = o.member(i);
            let w: Vec<Vec<f64>> = params
                .leaves()
                .into_iter()
                .zip(sigmas)
                .enumerate()
                .map(|(j, ((_, theta), sigma))| {
                    let mut w: Vec<f64> = theta.data().iter().map(|&x| f64::from(x)).collect();
                    if let Some(sigma) = sigma {
                        let e = unit_noise(o, base, j, theta.shape(), dir);
                        for ((wi, ei), si) in w.iter_mut().zip(&e).zip(sigma) {
                            *wi += f64::from(s) * f64::from(*si) * ei;
                        }
                    }
                    w
                })
                .collect();
            mlp_loss(&w, &batch)
        })
        .collect()
}

/// The update `−lr/n · u_j ⊘ σ_j` per leaf (zero where frozen), in f64.
fn host_update(
    o: &Es,
    params: &ParamTree,
    sigmas: &[Option<Vec<f32>>],
    base: Key,
    weights: &[f32],
) -> Vec<Vec<f64>> {
    let coefs: Vec<f64> = (0..o.directions())
        .map(|k| {
            f64::from(if o.mirrored {
                weights[2 * k] - weights[2 * k + 1]
            } else {
                weights[k]
            })
        })
        .collect();
    params
        .leaves()
        .into_iter()
        .zip(sigmas)
        .enumerate()
        .map(|(j, ((_, theta), sigma))| {
            let Some(sigma) = sigma else {
                return vec![0.0; theta.len()];
            };
            let mut u = vec![0.0f64; theta.len()];
            for (k, c) in coefs.iter().enumerate() {
                let e = unit_noise(o, base, j, theta.shape(), k as u32);
                for (ui, ei) in u.iter_mut().zip(&e) {
                    *ui += c * ei;
                }
            }
            let step = f64::from(LR) / N as f64;
            u.iter()
                .zip(sigma)
                .map(|(ui, si)| -step * ui / f64::from(*si))
                .collect()
        })
        .collect()
}

/// Runs generation 0 of `es` on the MLP and checks the fitness and every leaf's update
/// against the oracle; frozen leaves must not move at all. Returns the worst errors.
fn check_against_oracle(client: &Client, es: &ShardedES, strat: &str, what: &str) -> (f64, f64) {
    let params = mlp_params(1);
    let scales = es.leaf_scales(&leaf_infos(&params)).expect("resolves");
    let sigmas = dense_sigmas(&scales, &params);
    let o = oracle(strat);
    let base = base_key(key(7).expect("seed"), 0);
    let g = one_generation(client, es, &Mlp::PLAIN, &params, &mlp_batch(2));
    let want = host_fitness(&o, &params, &sigmas, base);
    let scale = want.iter().fold(0.0f64, |a, b| a.max(b.abs()));
    let fit = g
        .fitness
        .iter()
        .zip(&want)
        .map(|(a, b)| (f64::from(*a) - b).abs() / scale)
        .fold(0.0, f64::max);
    assert!(fit <= FIT_TOL, "{what}: fitness off the oracle by {fit:e}");
    let weights = crate::support::shaping::centered_ranks(&g.fitness);
    let update = host_update(&o, &params, &sigmas, base, &weights);
    let mut worst = 0.0f64;
    for ((got, want), (path, _)) in g.update.iter().zip(&update).zip(params.leaves()) {
        if want.iter().all(|x| *x == 0.0) {
            assert!(
                got.iter().all(|x| x.to_bits() == 0),
                "{what}: frozen {path} moved"
            );
            continue;
        }
        let want: Vec<f32> = want.iter().map(|&x| x as f32).collect();
        let e = rel_norm_diff(got, &want);
        assert!(e <= TOL, "{what}: update of {path} off the oracle by {e:e}");
        worst = worst.max(e);
    }
    println!("{what}: fitness {fit:.2e}, update {worst:.2e}");
    (fit, worst)
}

#[test]
fn one_sigma_on_every_leaf_is_the_scalar_program_and_run() {
    let (client, params, batch) = mlp_on_8_devices();
    let leaves = leaf_infos(&params);
    for strat in [
        "mirrored(lowrank(r=1))",
        "seed_regenerated(chunk=4)",
        "mirrored(iid_gaussian)",
    ] {
        let scalar = es(strat, 8);
        let table = es(strat, 8)
            .with_sigma_leaves(tree(SIGMA, SIGMA, SIGMA))
            .expect("valid tree");
        let mut spec = EsSpec::new(N, SIGMA, LR);
        spec.strategy = strat.parse().unwrap();
        spec.sigma_leaves.0 = vec![("w*".into(), SIGMA), ("*".into(), SIGMA)];
        let patterns = spec.build(8).expect("valid spec");
        assert!(scalar.sigma_is_scalar() && !table.sigma_is_scalar());
        let text = |e: &ShardedES| {
            [
                e.generation_program(&Mlp::PLAIN, &leaves),
                e.ask_apply_program(&Mlp::PLAIN, &leaves),
                e.tell_program(&Mlp::PLAIN, &leaves),
            ]
            .map(|p| p.expect("program").module.to_mlir())
        };
        assert_eq!(text(&scalar), text(&table), "{strat}: tree");
        assert_eq!(text(&scalar), text(&patterns), "{strat}: patterns");
        let a = one_generation(&client, &scalar, &Mlp::PLAIN, &params, &batch);
        let b = one_generation(&client, &table, &Mlp::PLAIN, &params, &batch);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&a.fitness), bits(&b.fitness), "{strat}: fitness");
        for (x, y) in a.update.iter().zip(&b.update) {
            assert_eq!(bits(x), bits(y), "{strat}: update");
        }
    }
}

#[test]
fn per_leaf_sigma_matches_the_explicit_loop() {
    let client = Client::cpu(8).expect("8 CPU devices");
    for strat in [
        "lowrank(r=2)",
        "mirrored(lowrank(r=1))",
        "seed_regenerated(chunk=4)",
        "mirrored(iid_gaussian)",
    ] {
        for (how, keep) in [(How::B, KEEP_NOISE_BYTES), (How::B, 0), (How::A, 0)] {
            let e = es(strat, 8)
                .with_how(how)
                .with_keep_noise_bytes(keep)
                .with_sigma_leaves(tree(0.05, 0.2, 0.1))
                .expect("valid tree");
            check_against_oracle(&client, &e, strat, &format!("{strat} {how:?} keep {keep}"));
        }
    }
}

/// Separable σ for the MLP's two matrices.
fn mlp_separable() -> BTreeMap<String, (Vec<f32>, Vec<f32>)> {
    [
        ("w1".to_string(), separable(7, 13, 0.1)),
        ("w2".to_string(), separable(5, 7, 0.45)),
    ]
    .into()
}

#[test]
fn separable_sigma_equals_its_dense_form_in_the_forward_and_the_update() {
    let client = Client::cpu(8).expect("8 CPU devices");
    let sep = mlp_separable();
    for strat in [
        "lowrank(r=1)",
        "mirrored(lowrank(r=3))",
        "seed_regenerated(chunk=4)",
    ] {
        for (how, keep) in [(How::B, KEEP_NOISE_BYTES), (How::A, 0)] {
            let e = es(strat, 8)
                .with_how(how)
                .with_keep_noise_bytes(keep)
                .with_sigma_leaves(tree(0.07, 1.0, 1.0))
                .expect("valid tree")
                .with_sigma_separable(sep.clone())
                .expect("valid vectors");
            check_against_oracle(&client, &e, strat, &format!("separable {strat} {how:?}"));
        }
    }
}

// About 27 s on 2 cores; the explicit-loop and dense-form checks of the same σ stay in the
// default tier: the slow tier, to keep the default command under 15 minutes.
#[test]
#[ignore = "slow tier"]
fn slow_per_leaf_and_separable_sigma_are_device_count_invariant() {
    let client = Client::cpu(8).expect("8 CPU devices");
    let (params, batch) = (mlp_params(1), mlp_batch(2));
    let sep: BTreeMap<String, (Vec<f32>, Vec<f32>)> =
        [("w1".to_string(), separable(7, 13, 0.2))].into();
    for strat in ["mirrored(lowrank(r=2))", "seed_regenerated(chunk=4)"] {
        for how in [How::A, How::B] {
            for freeze in [&[][..], &["b1"][..]] {
                let make = |devices| {
                    es(strat, devices)
                        .with_how(how)
                        .with_sigma_leaves(tree(0.05, 0.3, 0.15))
                        .unwrap()
                        .with_sigma_separable(sep.clone())
                        .unwrap()
                        .with_freeze(freeze)
                        .unwrap()
                        .with_shaping(ShapingSpec::Centered.build())
                };
                let g1 = one_generation(&client, &make(1), &Mlp::PLAIN, &params, &batch);
                let g8 = one_generation(&client, &make(8), &Mlp::PLAIN, &params, &batch);
                let fit = crate::support::max_abs_diff(&g1.fitness, &g8.fitness);
                let scale = g8.fitness.iter().fold(0.0f32, |a, b| a.max(b.abs()));
                assert!(fit <= 1e-6 * scale, "{strat} {how:?}: fitness {fit:e}");
                for ((u1, u8), (path, _)) in g1.update.iter().zip(&g8.update).zip(params.leaves()) {
                    if freeze.contains(&path.as_str()) {
                        assert!(u1.iter().chain(u8).all(|x| *x == 0.0), "{path} moved");
                        continue;
                    }
                    let e = rel_norm_diff(u1, u8);
                    assert!(e <= TOL, "{strat} {how:?} {freeze:?}: {path} 1 vs 8 {e:e}");
                }
            }
        }
    }
}

const MATRICES: [(usize, usize); 2] = [(7, 13), (5, 7)];

fn offenders(shapes: impl Iterator<Item = Vec<usize>>) -> Vec<Vec<usize>> {
    shapes
        .filter(|d| MATRICES.iter().any(|&(m, k)| member_by_matrix(d, m, k)))
        .collect()
}

fn hlo_shapes(hlo: &HloModule) -> Vec<Vec<usize>> {
    hlo.instructions()
        .filter(|i| i.shape.element_type != "tuple")
        .map(|i| i.shape.dims.clone())
        .collect()
}

#[test]
fn separable_low_rank_never_forms_a_member_by_matrix_value() {
    let (client, params, batch) = mlp_on_8_devices();
    let leaves = leaf_infos(&params);
    let sep = mlp_separable();
    for strat in [
        "lowrank(r=1)",
        "mirrored(lowrank(r=2))",
        "seed_regenerated(chunk=4)",
    ] {
        let low = strat.contains("lowrank");
        for (devices, how) in [(8, How::A), (8, How::B), (1, How::B)] {
            if !low && devices == 1 {
                continue;
            }
            let e = es(strat, devices)
                .with_how(how)
                .with_sigma_separable(sep.clone())
                .unwrap();
            let program = e.generation_program(&Mlp::PLAIN, &leaves).unwrap();
            let emitted = offenders(
                program
                    .module
                    .value_types()
                    .into_iter()
                    .map(|t| t.shape.iter().map(|&d| d as usize).collect()),
            );
            let g = one_generation(&client, &e, &Mlp::PLAIN, &params, &batch);
            let optimized = offenders(
                hlo_shapes(&g.trainer.executable().optimized_hlo().expect("hlo")).into_iter(),
            );
            // Full rank must trip the same check: it is what makes it meaningful.
            assert_eq!(
                emitted.is_empty(),
                low,
                "{strat} {devices} {how:?}: {emitted:?}"
            );
            assert_eq!(
                optimized.is_empty(),
                low,
                "{strat} {devices} {how:?}: {optimized:?}"
            );
        }
    }
}

#[test]
fn a_frozen_leaf_is_plain_and_keeps_every_other_leafs_noise() {
    frozen_leaves_under(&["mirrored(lowrank(r=1))", "seed_regenerated(chunk=4)"]);
}

// Rank 2 as well: six more programs to compile (about 15 s here), in the slow tier.
#[test]
#[ignore = "slow tier"]
fn slow_a_frozen_leaf_under_rank_2_is_plain_and_keeps_every_other_leafs_noise() {
    frozen_leaves_under(&["lowrank(r=2)"]);
}

/// Frozen leaves under each of `strategies`: plain in the forward and the update, every
/// other leaf on its whole-tree stream (against the oracle, and bit for bit against the
/// tree with nothing frozen).
fn frozen_leaves_under(strategies: &[&str]) {
    let (client, params, batch) = mlp_on_8_devices();
    for &strat in strategies {
        // The forward and the update against the oracle with the leaf unperturbed and the
        // others on their whole-tree streams.
        for frozen in ["b1", "w1"] {
            let e = es(strat, 8)
                .with_sigma_leaves(tree(0.05, 0.2, 0.1))
                .unwrap()
                .with_freeze(&[frozen])
                .unwrap();
            check_against_oracle(&client, &e, strat, &format!("{strat} frozen {frozen}"));
        }
        // With the same host fitness (so the same weights), each other leaf's update is
        // bit-identical with and without the frozen leaf.
        let fitness: Vec<f32> = (0..N).map(|i| ((i * 37) % 64) as f32 * 0.01).collect();
        let tell = |e: &ShardedES| {
            let mut t =
                SplitTrainer::new(&client, e, &Mlp::PLAIN, &params, key(7).unwrap(), &batch, 0)
                    .expect("split trainer");
            t.tell(&HostFitness::F32(fitness.clone())).expect("tell");
            t.params().expect("params")
        };
        let whole = tell(&es(strat, 8));
        for frozen in [&["b1"][..], &["w1"][..], &["b*", "w2"][..]] {
            let part = tell(&es(strat, 8).with_freeze(frozen).unwrap());
            for (((path, a), (_, b)), (_, p0)) in whole
                .leaves()
                .into_iter()
                .zip(part.leaves())
                .zip(params.leaves())
            {
                let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                let moved = frozen.iter().any(|p| glob_like(p, &path));
                if moved {
                    assert_eq!(
                        bits(b.data()),
                        bits(p0.data()),
                        "{strat}: frozen {path} moved"
                    );
                } else {
                    assert_eq!(
                        bits(a.data()),
                        bits(b.data()),
                        "{strat}: {path} changed with {frozen:?} frozen"
                    );
                }
            }
        }
    }
}

/// The test's two patterns: a trailing `*` or an exact path.
fn glob_like(pattern: &str, path: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => path.starts_with(prefix),
        None => pattern == path,
    }
}
