//! Statistical tier (ignored by default;
//! `cargo test --release --test suite es_stat:: -- --ignored`).
//!
//! On `f(θ) = ½‖θ − θ*‖²` (leaves `b [7]`, `w (5, 3)`) at θ = 0, with shaping `none`, the
//! ES gradient estimate `ĝ = 1/(nσ) Σ f_i s_i ε_i` is read off one generation with lr = 1:
//! `θ' = 0 − ĝ` exactly. Over R replicates (generation r uses key fold_in(key, r)) its mean
//! must be within 4 standard errors of the true gradient `θ − θ* = −θ*`:
//! `‖mean ĝ − g‖ ≤ 4 · sqrt(tr Cov(ĝ) / R)` with the covariance estimated from the same
//! replicates (the expected error norm is about one standard error), and the relative error
//! must be under 25%. The mean cosine similarity with `g` grows with n (64 → 1024).

use crate::support::tiny::{Quadratic, QUAD_B, QUAD_W, STRATEGIES};
use shardes::hlo::es::shaping::NoShaping;
use shardes::hlo::es::strategy::from_spec;
use shardes::hlo::es::{leaf_infos, ShardedES};
use shardes::hlo::params::{Array, ParamTree};
use shardes::hlo::prng::{fold_in, key, normal};
use shardes::runtime::{Client, CompileOptions, Executable};

const SIGMA: f32 = 0.05;
const REPLICATES: usize = 64;

struct Problem {
    zero: ParamTree,
    batch: Vec<Array>,
    /// The true gradient at θ = 0, flattened in leaf order (b, then w).
    grad: Vec<f64>,
}

fn problem() -> Problem {
    let [m, k] = QUAD_W;
    let kk = key(11).expect("seed");
    let bstar: Vec<f32> = normal(fold_in(kk, 0), &[QUAD_B])
        .expect("normal")
        .iter()
        .map(|x| 0.1 * x)
        .collect();
    let wstar: Vec<f32> = normal(fold_in(kk, 1), &[m, k])
        .expect("normal")
        .iter()
        .map(|x| 0.1 * x)
        .collect();
    let mut wt = vec![0.0f32; k * m];
    for i in 0..m {
        for j in 0..k {
            wt[j * m + i] = wstar[i * k + j];
        }
    }
    let mut eye = vec![0.0f32; k * k];
    for i in 0..k {
        eye[i * k + i] = 1.0;
    }
    let zero = ParamTree::map([
        (
            "b",
            ParamTree::Leaf(Array::zeros(vec![QUAD_B]).expect("shape")),
        ),
        (
            "w",
            ParamTree::Leaf(Array::zeros(vec![m, k]).expect("shape")),
        ),
    ]);
    let grad = bstar.iter().chain(&wstar).map(|&x| -f64::from(x)).collect();
    Problem {
        zero,
        batch: vec![
            Array::new(vec![k, k], eye).expect("shape"),
            Array::new(vec![QUAD_B], bstar).expect("shape"),
            Array::new(vec![k, m], wt).expect("shape"),
        ],
        grad,
    }
}

/// One generation at θ = 0: returns ĝ (flattened) = −θ'.
fn estimate(client: &Client, exe: &Executable, p: &Problem, generation: u32) -> Vec<f64> {
    let mut args = Vec::new();
    for (_, a) in p.zero.leaves() {
        args.push(
            client
                .buffer_from_host(a.data(), a.shape(), 0)
                .expect("upload"),
        );
    }
    args.push(
        client
            .buffer_from_host(&key(3).expect("seed").data(), &[2], 0)
            .expect("key"),
    );
    args.push(client.buffer_from_host(&[generation], &[], 0).expect("gen"));
    for a in &p.batch {
        args.push(
            client
                .buffer_from_host(a.data(), a.shape(), 0)
                .expect("upload"),
        );
    }
    let refs: Vec<_> = args.iter().collect();
    let outs = exe.execute(&[refs]).expect("execute").remove(0);
    let mut g = Vec::new();
    for b in &outs[..p.zero.num_leaves()] {
        g.extend(
            b.to_host::<f32>()
                .expect("download")
                .iter()
                .map(|&x| -f64::from(x)),
        );
    }
    g
}

fn cosine(a: &[f64], b: &[f64]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let na: f64 = a.iter().map(|x| x * x).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|x| x * x).sum::<f64>().sqrt();
    dot / (na * nb)
}

#[test]
#[ignore = "statistical tier"]
fn es_gradient_is_unbiased_and_sharpens_with_n() {
    let client = Client::cpu(1).expect("CPU client");
    let p = problem();
    let leaves = leaf_infos(&p.zero);
    let gnorm: f64 = p.grad.iter().map(|x| x * x).sum::<f64>().sqrt();
    for strat in STRATEGIES {
        let mut cos_by_n = Vec::new();
        for n in [64usize, 1024] {
            let es = ShardedES::new(from_spec(&strat.parse().expect("spec")), n, SIGMA, 1.0, 1)
                .expect("valid")
                .with_shaping(Box::new(NoShaping));
            let program = es.generation_program(&Quadratic, &leaves).expect("program");
            let exe = client
                .compile(&program.module.to_mlir(), &CompileOptions::new(1))
                .expect("compile");
            let reps: Vec<Vec<f64>> = (0..REPLICATES as u32)
                .map(|r| estimate(&client, &exe, &p, r))
                .collect();
            let dim = p.grad.len();
            let r = REPLICATES as f64;
            let mean: Vec<f64> = (0..dim)
                .map(|i| reps.iter().map(|g| g[i]).sum::<f64>() / r)
                .collect();
            let trace: f64 = (0..dim)
                .map(|i| reps.iter().map(|g| (g[i] - mean[i]).powi(2)).sum::<f64>() / (r - 1.0))
                .sum();
            let se = (trace / r).sqrt();
            let err = crate::support::distance(&mean, &p.grad);
            let cos = reps.iter().map(|g| cosine(g, &p.grad)).sum::<f64>() / r;
            println!(
                "{strat:36} n={n:5}: ‖mean ĝ − g‖ = {err:.4} ({:.1}% of ‖g‖ = {gnorm:.3}), \
                 standard error {se:.4}, mean cosine {cos:.3}",
                100.0 * err / gnorm
            );
            if n == 1024 {
                assert!(
                    err <= 4.0 * se,
                    "{strat}: biased? error {err} > 4 × se {se}"
                );
                assert!(err <= 0.25 * gnorm, "{strat}: error {err} vs ‖g‖ {gnorm}");
            }
            cos_by_n.push(cos);
        }
        assert!(
            cos_by_n[1] > cos_by_n[0],
            "{strat}: cosine did not grow with n: {cos_by_n:?}"
        );
    }
}
