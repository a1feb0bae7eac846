//! `es.compute_dtype = "bf16"` (`ShardedES::with_compute_dtype`): every model's forward in
//! bf16 on the f32 masters, the noise rounded to bf16 once for `apply` and `tell`.
//!
//! - `apply` and `tell` see bit-identical noise: a probe model outputs the leaves it reads
//!   (θ = 0, σ = 1), which must be exactly the host's `bf16(ε)`, and a one-hot fitness
//!   tells exactly that member's `bf16(ε)` back (exact: one nonzero term, `lr/(nσ)` = 1);
//! - the update against the explicit-loop oracle `lr/(nσ) · Σ_i w_i s_i bf16(ε_i)` summed in
//!   f64 on the host: within 1e-5 relative in norm per leaf (f32 accumulation on the
//!   device; es_update's tolerance; measured ≤ 9.4e-8), while the oracle on the unrounded
//!   noise is off by more than 1e-4 (measured ≥ 9.2e-4), so the rounding is what is
//!   measured;
//! - 1 vs 8 devices under bf16: within es_gen0's 1e-5 relative in norm per leaf (measured
//!   ≤ 7e-8 after 3 generations, the fitness bit-identical);
//! - a bf16 transformer_block's fitness (the quickstart's generation 0) against the f32
//!   run's: within 1e-3 relative per member (measured 1.5e-4: the matmuls run in bf16, the
//!   residual stream, the input and the loss stay f32), and not equal to it (bf16 is in
//!   effect);
//! - a bf16 control policy: its fitness bit-identical on 1 and 8 devices, and not the f32
//!   run's (measured mean loss 310.190 against 310.220 on the pendulum);
//! - the low-rank guarantee under bf16 on the optimized program, and f32 programs print as
//!   they did without the setting.

use crate::support::es::{base_key, Es, Inner, LeafNoise};
use crate::support::tiny::{mlp_batch, mlp_params, one_generation, Mlp, HIDDEN, IN, OUT};
use crate::support::{hlo_offenders, rel_norm_diff};
use shardes::hlo::builder::{DType, TensorType, Value};
use shardes::hlo::es::shaping::ShapingSpec;
use shardes::hlo::es::strategy::from_spec;
use shardes::hlo::es::{
    leaf_infos, EsError, EsSpec, MemberInfo, MemberOutputs, ModelParams, ShardedES,
    KEEP_NOISE_BYTES,
};
use shardes::hlo::nn::{self, Act};
use shardes::hlo::params::{Array, ParamTree};
use shardes::hlo::prng::{fold_in, key, Key};
use shardes::hlo::problems::transformer_block::TransformerBlock;
use shardes::runtime::half::bf16;
use shardes::runtime::Client;
use shardes::{HostArray, HostFitness, OutputsRunner, Trainer};

/// `x` rounded to bf16 (round to nearest even, as XLA converts).
fn r(x: f32) -> f32 {
    bf16::from_f32(x).to_f32()
}

fn strategy_es(strategy: &str, n: usize, sigma: f32, lr: f32, devices: usize) -> ShardedES {
    ShardedES::new(
        from_spec(
            &strategy
                .parse()
                .unwrap_or_else(|e| panic!("{strategy}: {e}")),
        ),
        n,
        sigma,
        lr,
        devices,
    )
    .unwrap_or_else(|e| panic!("{strategy}: {e}"))
}

fn bf16_es(strategy: &str, n: usize, sigma: f32, lr: f32, devices: usize) -> ShardedES {
    strategy_es(strategy, n, sigma, lr, devices)
        .with_compute_dtype(DType::BF16)
        .unwrap()
}

// ---------------------------------------------------------------------------------------
// apply and tell see the same noise
// ---------------------------------------------------------------------------------------

/// Length of the probe's 1-D leaf `v` (dense noise under every strategy).
const V: usize = 11;
/// `(m, k)` of the probe's 2-D leaf `w`.
const W: [usize; 2] = [5, 3];

/// Outputs the leaves as a member reads them, in f32: `v` and `dense(I_k, w) = wᵀ`.
struct Probe;

impl MemberOutputs for Probe {
    fn input_types(&self) -> Vec<(String, TensorType)> {
        let k = W[1] as i64;
        vec![("eye".into(), TensorType::f32(&[k, k]))]
    }

    fn output_types(&self) -> Vec<(String, TensorType)> {
        let [m, k] = W.map(|d| d as i64);
        vec![
            ("v".into(), TensorType::f32(&[V as i64])),
            ("wt".into(), TensorType::f32(&[k, m])),
        ]
    }

    fn outputs(
        &self,
        p: &ModelParams,
        inputs: &[Value],
        _: &MemberInfo,
    ) -> Result<Vec<Act>, EsError> {
        let v = p.tensor("v")?;
        let wt = nn::dense(&Act::shared(inputs[0].clone()), &p.weight("w")?)?;
        Ok(vec![v.convert(DType::F32)?, wt.convert(DType::F32)?])
    }
}

fn zeros_tree() -> ParamTree {
    ParamTree::map([
        ("v", ParamTree::Leaf(Array::zeros(vec![V]).unwrap())),
        ("w", ParamTree::Leaf(Array::zeros(W.to_vec()).unwrap())),
    ])
}

fn eye() -> HostArray {
    let k = W[1];
    let data = (0..k * k)
        .map(|i| if i / k == i % k { 1.0 } else { 0.0 })
        .collect();
    HostArray::f32(&[k, k], data)
}

/// Member `i`'s bf16 noise on the host: `v`'s `bf16(ε)`, and `w` as `(m, k)` row-major —
/// `bf16(ε)` for full rank, the exact f32 product `bf16(a) bf16(b)` for rank 1.
fn host_noise(e: &Es, base: Key, i: usize) -> (f32, Vec<f32>, Vec<f32>) {
    let (id, s) = e.member(i);
    let v = match e.leaf_noise(base, 0, &[V], id) {
        LeafNoise::Full(eps) => eps.into_iter().map(r).collect(),
        other => panic!("v has dense noise, got {other:?}"),
    };
    let w = match e.leaf_noise(base, 1, &W, id) {
        LeafNoise::Full(eps) => eps.into_iter().map(r).collect(),
        LeafNoise::LowRank { a, b, m, k, r: 1 } => {
            let mut w = vec![0.0f32; m * k];
            for row in 0..m {
                for col in 0..k {
                    w[row * k + col] = r(a[row]) * r(b[col]);
                }
            }
            w
        }
        other => panic!("rank-1 or dense noise for w, got {other:?}"),
    };
    (s, v, w)
}

#[test]
fn apply_and_tell_see_bit_identical_bf16_noise() {
    let client = Client::cpu(8).unwrap();
    let k = key(5).unwrap();
    let (n, generation) = (16, 3);
    let tree = zeros_tree();
    for (strategy, inner, mirrored) in [
        ("lowrank(r=1)", Inner::LowRank(1), false),
        ("mirrored(lowrank(r=1))", Inner::LowRank(1), true),
        ("seed_regenerated", Inner::FullRank, false),
    ] {
        // σ = 1 and lr = nσ: the update's factor lr/(nσ) is exactly 1.
        let es = || bf16_es(strategy, n, 1.0, n as f32, 8).with_shaping(ShapingSpec::None.build());
        let host = Es {
            inner,
            mirrored,
            n,
            sigma: 1.0,
            lr: n as f32,
        };
        let base = base_key(k, generation);
        for j in [0, n - 1] {
            let mut runner =
                OutputsRunner::with_state(&client, &es(), &Probe, &tree, k, generation).unwrap();
            let outs = runner.outputs(&[eye()]).unwrap();
            let (v_out, wt_out) = (outs[0].as_f32().unwrap(), outs[1].as_f32().unwrap());
            let [m, kk] = W;
            // apply: every member reads exactly its bf16 noise.
            for i in 0..n {
                let (s, v, w) = host_noise(&host, base, i);
                let got_v = &v_out[i * V..(i + 1) * V];
                let want_v: Vec<f32> = v.iter().map(|x| s * x).collect();
                assert_eq!(got_v, want_v, "{strategy}: member {i} reads v");
                for row in 0..m {
                    for col in 0..kk {
                        let got = wt_out[i * m * kk + col * m + row];
                        // The bf16 forward rounds a rank-1 product once (exact already
                        // for full rank).
                        let want = s * r(w[row * kk + col]);
                        assert_eq!(got, want, "{strategy}: member {i} reads w[{row}, {col}]");
                    }
                }
            }
            // tell: a fitness of 1 on member j alone gives θ₁ = −s_j bf16(ε_j), exactly.
            let mut fitness = vec![0.0f32; n];
            fitness[j] = 1.0;
            runner.tell(&HostFitness::F32(fitness)).unwrap();
            let after = runner.params().unwrap();
            let (s, v, w) = host_noise(&host, base, j);
            let told_v = after.get("v").unwrap().data().to_vec();
            let want_v: Vec<f32> = v.iter().map(|x| -s * x).collect();
            assert_eq!(told_v, want_v, "{strategy}: tell's v noise of member {j}");
            let told_w = after.get("w").unwrap().data().to_vec();
            let want_w: Vec<f32> = w.iter().map(|x| -s * x).collect();
            assert_eq!(told_w, want_w, "{strategy}: tell's w noise of member {j}");
            // The same bits as apply's reads.
            let applied: Vec<f32> = v_out[j * V..(j + 1) * V].iter().map(|x| -x).collect();
            assert_eq!(told_v, applied, "{strategy}: apply and tell differ on v");
            println!("{strategy}: member {j}: apply and tell see the same bf16 noise");
        }
    }
}

// ---------------------------------------------------------------------------------------
// The update against the explicit loop
// ---------------------------------------------------------------------------------------

/// `lr/(nσ) · Σ_i w_i s_i ε̂_i` per leaf, summed in f64 over an explicit loop of members,
/// with `ε̂` the noise rounded to bf16 (`rounded`) or not.
fn oracle_update(
    e: &Es,
    params: &ParamTree,
    base: Key,
    weights: &[f32],
    rounded: bool,
) -> Vec<Vec<f32>> {
    let q = |x: f32| if rounded { r(x) } else { x };
    let step = f64::from(e.lr) / (e.n as f64 * f64::from(e.sigma));
    params
        .leaves()
        .into_iter()
        .enumerate()
        .map(|(j, (_, leaf))| {
            let mut u = vec![0.0f64; leaf.len()];
            for (i, &w) in weights.iter().enumerate() {
                let (id, s) = e.member(i);
                let c = f64::from(w) * f64::from(s);
                match e.leaf_noise(base, j, leaf.shape(), id) {
                    LeafNoise::Full(eps) => {
                        for (x, y) in u.iter_mut().zip(&eps) {
                            *x += c * f64::from(q(*y));
                        }
                    }
                    LeafNoise::LowRank { a, b, m, k, r } => {
                        let inv = 1.0 / (r as f64).sqrt();
                        for row in 0..m {
                            for col in 0..k {
                                let dot: f64 = (0..r)
                                    .map(|t| {
                                        f64::from(q(a[row * r + t])) * f64::from(q(b[col * r + t]))
                                    })
                                    .sum();
                                u[row * k + col] += c * dot * inv;
                            }
                        }
                    }
                }
            }
            u.iter().map(|x| (-step * x) as f32).collect()
        })
        .collect()
}

#[test]
fn the_bf16_update_contracts_the_rounded_noise_apply_used() {
    let client = Client::cpu(8).unwrap();
    let params = mlp_params(1);
    let (sigma, lr) = (0.1, 1.0);
    for (strategy, inner, mirrored, n) in [
        ("mirrored(lowrank(r=2))", Inner::LowRank(2), true, 48),
        ("lowrank(r=1)", Inner::LowRank(1), false, 16),
        ("seed_regenerated(chunk=3)", Inner::FullRank, false, 24),
    ] {
        let host = Es {
            inner,
            mirrored,
            n,
            sigma,
            lr,
        };
        for keep in [KEEP_NOISE_BYTES, 0] {
            let es = bf16_es(strategy, n, sigma, lr, 8).with_keep_noise_bytes(keep);
            assert_eq!(es.keeps_noise(&leaf_infos(&params)), keep > 0);
            let g = one_generation(&client, &es, &Mlp::PLAIN, &params, &mlp_batch(2));
            let weights = crate::support::shaping::centered_ranks(&g.fitness);
            let base = base_key(key(7).unwrap(), 0);
            let want = oracle_update(&host, &params, base, &weights, true);
            let unrounded = oracle_update(&host, &params, base, &weights, false);
            for (((got, want), plain), (path, _)) in g
                .update
                .iter()
                .zip(&want)
                .zip(&unrounded)
                .zip(params.leaves())
            {
                let e = rel_norm_diff(got, want);
                let off = rel_norm_diff(got, plain);
                println!(
                    "{strategy} (kept {}): {path}: {e:e} off the bf16 oracle, {off:e} off the \
                     unrounded one",
                    keep > 0
                );
                assert!(e <= 1e-5, "{strategy}: {path} off the bf16 oracle by {e:e}");
                assert!(
                    off > 1e-4,
                    "{strategy}: {path} is as close to the unrounded noise ({off:e})"
                );
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Device counts, the f32 reference, the low-rank guarantee
// ---------------------------------------------------------------------------------------

const TB: TransformerBlock = TransformerBlock {
    d_model: 16,
    batch: 2,
    seq: 8,
};

/// Three generations of `es` on the small transformer_block: each generation's fitness and
/// the final parameters.
fn tb_run(
    client: &Client,
    es: &ShardedES,
    tb: TransformerBlock,
    steps: usize,
) -> (Vec<Vec<f32>>, ParamTree) {
    let k = key(0).unwrap();
    let params = tb.init(k).unwrap();
    let batch = tb.make_batch(fold_in(k, 1)).unwrap();
    let mut t = Trainer::with_state(client, es, &tb, &params, k, &[batch.x, batch.target], 0)
        .unwrap_or_else(|e| panic!("{es:?}: {e}"));
    let fitness = (0..steps).map(|_| t.step().unwrap()).collect();
    (fitness, t.params().unwrap())
}

#[test]
fn bf16_runs_are_device_count_invariant() {
    let client = Client::cpu(8).unwrap();
    for strategy in ["mirrored(lowrank(r=1))", "seed_regenerated(chunk=4)"] {
        let run = |devices| tb_run(&client, &bf16_es(strategy, 64, 0.05, 0.05, devices), TB, 3);
        let (f1, p1) = run(1);
        let (f8, p8) = run(8);
        for (g, (a, b)) in f1.iter().zip(&f8).enumerate() {
            let e = rel_norm_diff(a, b);
            println!("{strategy}: generation {g} fitness 1 vs 8 devices: {e:e}");
            assert!(
                e <= 1e-5,
                "{strategy}: generation {g} fitness differs by {e:e}"
            );
        }
        for ((path, a), (_, b)) in p1.leaves().into_iter().zip(p8.leaves()) {
            let e = rel_norm_diff(a.data(), b.data());
            println!("{strategy}: {path} after 3 generations, 1 vs 8 devices: {e:e}");
            assert!(e <= 1e-5, "{strategy}: {path} differs by {e:e}");
        }
    }
}

#[test]
fn a_bf16_transformer_block_is_within_bf16_precision_of_f32() {
    let client = Client::cpu(8).unwrap();
    let tb = TransformerBlock::QUICKSTART;
    let strategy = "mirrored(lowrank(r=1))";
    let (f32_fit, _) = tb_run(&client, &strategy_es(strategy, 64, 0.01, 0.01, 8), tb, 1);
    let (bf16_fit, _) = tb_run(&client, &bf16_es(strategy, 64, 0.01, 0.01, 8), tb, 1);
    let worst = f32_fit[0]
        .iter()
        .zip(&bf16_fit[0])
        .map(|(a, b)| (a - b).abs() / a.abs())
        .fold(0.0f32, f32::max);
    println!("quickstart fitness, bf16 vs f32: max rel {worst:e}");
    assert!(worst <= 1e-3, "bf16 fitness off the f32 run by {worst:e}");
    assert!(
        worst > 1e-5,
        "bf16 fitness equals f32's ({worst:e}): bf16 not in effect"
    );
}

#[test]
fn low_rank_stays_factors_under_bf16_in_the_optimized_program() {
    let client = Client::cpu(8).unwrap();
    let params = mlp_params(1);
    for strategy in [
        "lowrank(r=1)",
        "mirrored(lowrank(r=2))",
        "seed_regenerated(chunk=4)",
    ] {
        let es = bf16_es(strategy, 64, 0.1, 1.0, 8);
        let program = es
            .generation_program(&Mlp::PLAIN, &leaf_infos(&params))
            .unwrap();
        let text = program.module.to_mlir();
        assert!(
            text.contains("xbf16>"),
            "{strategy}: no bf16 value in the program"
        );
        let g = one_generation(&client, &es, &Mlp::PLAIN, &params, &mlp_batch(2));
        let hlo = g.trainer.executable().optimized_hlo().unwrap();
        let bf16_ops = hlo
            .instructions()
            .filter(|i| i.shape.element_type == "bf16")
            .count();
        assert!(
            bf16_ops > 0,
            "{strategy}: the optimized program computes no bf16"
        );
        let offenders = hlo_offenders(&hlo, &[(HIDDEN, IN), (OUT, HIDDEN)]);
        if strategy.contains("lowrank") {
            assert!(
                offenders.is_empty(),
                "{strategy}: member × m × k values under bf16: {offenders:?}"
            );
        } else {
            // Full rank trips the same check, so it can fail.
            assert!(
                !offenders.is_empty(),
                "{strategy}: expected dense member weights"
            );
        }
    }
}

#[test]
fn f32_is_the_default_and_prints_todays_programs() {
    let params = mlp_params(1);
    let leaves = leaf_infos(&params);
    let plain = EsSpec::new(64, 0.1, 1.0).build(8).unwrap();
    assert_eq!(plain.compute_dtype(), DType::F32);
    let mut spec = EsSpec::new(64, 0.1, 1.0);
    spec.compute_dtype = Some("f32".parse().unwrap());
    let explicit = spec.build(8).unwrap();
    let text = |es: &ShardedES| {
        es.generation_program(&Mlp::PLAIN, &leaves)
            .unwrap()
            .module
            .to_mlir()
    };
    assert_eq!(text(&plain), text(&explicit));
    assert!(!text(&plain).contains("bf16"));
    spec.compute_dtype = Some("bf16".parse().unwrap());
    let bf = spec.build(8).unwrap();
    assert_eq!(bf.compute_dtype(), DType::BF16);
    assert_ne!(text(&plain), text(&bf));
    // Only f32 and bf16 are compute dtypes.
    let err = EsSpec::new(64, 0.1, 1.0)
        .build(8)
        .unwrap()
        .with_compute_dtype(DType::F16)
        .unwrap_err()
        .to_string();
    assert!(err.contains("f16") && err.contains("BF16"), "{err}");
}

#[test]
fn a_bf16_control_policy_runs_and_is_device_count_invariant() {
    use shardes::hlo::problems::control::{Control, Env};
    use shardes::Problem;
    let client = Client::cpu(8).unwrap();
    let control = Control::new(Env::Pendulum, 4, 50, &[8]).unwrap();
    let problem = Problem::control(control, 5).unwrap();
    let run = |devices, dtype| {
        let es = strategy_es("mirrored(lowrank(r=1))", 32, 0.1, 0.1, devices)
            .with_compute_dtype(dtype)
            .unwrap()
            .with_member_bytes(problem.model.member_bytes());
        Trainer::new(&client, &es, &problem)
            .unwrap()
            .step()
            .unwrap()
    };
    let (one, eight) = (run(1, DType::BF16), run(8, DType::BF16));
    let f32_fit = run(8, DType::F32);
    assert!(one.iter().all(|x| x.is_finite()), "{one:?}");
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&one), bits(&eight), "bf16 control: 1 vs 8 devices");
    assert_ne!(
        bits(&one),
        bits(&f32_fit),
        "bf16 not in effect on the policy"
    );
    let mean = |v: &[f32]| v.iter().sum::<f32>() / v.len() as f32;
    println!(
        "pendulum mean loss: bf16 {} f32 {}",
        mean(&one),
        mean(&f32_fit)
    );
}
