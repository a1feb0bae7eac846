//! Optimizers on the ES gradient (`es::optimizer`): each one against a host implementation
//! of its rule, resume, device counts, split mode, several generations per dispatch, and the
//! errors of bad settings.
//!
//! The oracle is a host loop in f64 over 5 generations, fed with the program's own fitness:
//! at each generation the host takes the fitness the trainer returns, shapes it with the
//! spec's centered ranks, contracts the spec's noise (`crate::support::es::Es::contraction`,
//! in f32) into `u`, forms `g = u / (nσ)` and applies the rule to its own f64 parameters and state,
//! which never see the device's. The MLP on 8 devices, `mirrored(lowrank(r=1))`, n = 16.
//!
//! Tolerances: per leaf, `‖θ_dev − θ_host‖ / ‖θ_host − θ₀‖ ≤ 3e-5` and, for each state
//! tensor, `‖s_dev − s_host‖ / ‖s_host‖ ≤ 3e-5` after every generation (f32 against f64 and
//! two summation orders of `u`; measured below 3e-6). Adam's `count` is exact. Resume is
//! bit-identical (the same program on the same state). 1 vs 8 devices: ≤ 1e-5 relative per
//! leaf after 5 generations (`u` differs in the all-reduce's order only; the fitness is
//! bit-identical across device counts). Split mode and 5 generations per dispatch against 5
//! fused steps: ≤ 1e-5.

use crate::support::es::{base_key, Es, Inner};
use crate::support::rel_norm_diff;
use crate::support::shaping::centered_ranks;
use crate::support::tiny::{mlp_on_8_devices, Mlp};
use shardes::hlo::es::strategy::from_spec;
use shardes::hlo::es::{EsSpec, Optimizer, OptimizerKind, ShardedES, StrategySpec};
use shardes::hlo::params::{Array, ParamTree};
use shardes::hlo::prng::{key, Key};
use shardes::population::Start;
use shardes::rundir::{read_checkpoint, Mode, RunDir};
use shardes::runtime::Client;
use shardes::{HostFitness, SplitTrainer, Trainer};

const N: usize = 16;
const SIGMA: f32 = 0.1;
const GENERATIONS: u32 = 5;
const TOL: f64 = 3e-5;

fn seed() -> Key {
    key(7).expect("seed")
}

fn es(optimizer: Optimizer, lr: f32, devices: usize) -> ShardedES {
    crate::support::sharded::es("mirrored(lowrank(r=1))", N, SIGMA, lr, devices)
        .with_optimizer(optimizer)
        .expect("valid optimizer")
}

/// The host rule, in f64, with its own parameters and state.
struct Host {
    opt: Optimizer,
    lr: f64,
    theta: Vec<Vec<f64>>,
    /// `velocity` (momentum, clipup) or Adam's `m`.
    first: Vec<Vec<f64>>,
    /// Adam's `v`.
    second: Vec<Vec<f64>>,
    count: f64,
    /// Generations at which ClipUp's speed limit bit.
    clipped: Vec<bool>,
}

fn norm(xs: &[Vec<f64>]) -> f64 {
    xs.iter().flatten().map(|x| x * x).sum::<f64>().sqrt()
}

impl Host {
    fn new(opt: Optimizer, lr: f32, params: &ParamTree) -> Host {
        let theta: Vec<Vec<f64>> = params
            .leaves()
            .iter()
            .map(|(_, a)| a.data().iter().map(|&x| f64::from(x)).collect())
            .collect();
        let zeros: Vec<Vec<f64>> = theta.iter().map(|t| vec![0.0; t.len()]).collect();
        Host {
            opt,
            lr: f64::from(lr),
            theta,
            first: zeros.clone(),
            second: zeros,
            count: 0.0,
            clipped: Vec::new(),
        }
    }

    fn step(&mut self, g: &[Vec<f64>]) {
        let lr = self.lr;
        let wd = f64::from(self.opt.weight_decay);
        let before = self.theta.clone();
        let steps: Vec<Vec<f64>> = match self.opt.kind {
            OptimizerKind::Sgd => g
                .iter()
                .map(|g| g.iter().map(|x| lr * x).collect())
                .collect(),
            OptimizerKind::Momentum { momentum } => {
                let mu = f64::from(momentum);
                for (v, g) in self.first.iter_mut().zip(g) {
                    for (v, g) in v.iter_mut().zip(g) {
                        *v = g + mu * *v;
                    }
                }
                self.first
                    .iter()
                    .map(|v| v.iter().map(|x| lr * x).collect())
                    .collect()
            }
            OptimizerKind::Adam { b1, b2, eps } => {
                let (b1, b2, eps) = (f64::from(b1), f64::from(b2), f64::from(eps));
                self.count += 1.0;
                let (c1, c2) = (1.0 - b1.powf(self.count), 1.0 - b2.powf(self.count));
                let mut steps = Vec::new();
                for ((m, v), g) in self.first.iter_mut().zip(&mut self.second).zip(g) {
                    let mut s = Vec::new();
                    for ((m, v), g) in m.iter_mut().zip(v.iter_mut()).zip(g) {
                        *m = (1.0 - b1) * g + b1 * *m;
                        *v = (1.0 - b2) * g * g + b2 * *v;
                        s.push(lr * (*m / c1) / ((*v / c2).sqrt() + eps));
                    }
                    steps.push(s);
                }
                steps
            }
            OptimizerKind::ClipUp {
                momentum,
                max_speed,
                eps,
            } => {
                let (mu, max, eps) = (f64::from(momentum), f64::from(max_speed), f64::from(eps));
                let gn = norm(g);
                for (v, g) in self.first.iter_mut().zip(g) {
                    for (v, g) in v.iter_mut().zip(g) {
                        *v = mu * *v + lr * g / (gn + eps);
                    }
                }
                let speed = norm(&self.first);
                self.clipped.push(speed > max);
                if speed > max {
                    for x in self.first.iter_mut().flatten() {
                        *x *= max / speed;
                    }
                }
                self.first.clone()
            }
        };
        for ((t, s), b) in self.theta.iter_mut().zip(&steps).zip(&before) {
            for ((t, s), b) in t.iter_mut().zip(s).zip(b) {
                *t = *t - s - lr * wd * b;
            }
        }
    }

    /// The state as the device names it.
    fn state(&self, paths: &[String]) -> Vec<(String, Vec<f64>)> {
        let per_leaf = |prefix: &str, xs: &[Vec<f64>]| {
            paths
                .iter()
                .zip(xs)
                .map(|(p, x)| (format!("{prefix}.{p}"), x.clone()))
                .collect::<Vec<_>>()
        };
        match self.opt.kind {
            OptimizerKind::Sgd => Vec::new(),
            OptimizerKind::Momentum { .. } | OptimizerKind::ClipUp { .. } => {
                per_leaf("velocity", &self.first)
            }
            OptimizerKind::Adam { .. } => {
                let mut out = per_leaf("m", &self.first);
                out.extend(per_leaf("v", &self.second));
                out.push(("count".into(), vec![self.count]));
                out
            }
        }
    }
}

fn rel64(a: &[f32], b: &[f64]) -> f64 {
    let num: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| (f64::from(*x) - y).powi(2))
        .sum();
    let den: f64 = b.iter().map(|y| y * y).sum();
    (num / den).sqrt()
}

/// Runs `opt` for 5 generations against the host rule; returns the worst relative errors
/// of the parameters and of the state, and the host (for what it saw).
fn against_host(client: &Client, opt: Optimizer, lr: f32) -> (f64, f64, Host) {
    let (_, params, batch) = mlp_on_8_devices();
    let es = es(opt, lr, 8);
    let mut trainer =
        Trainer::with_state(client, &es, &Mlp::PLAIN, &params, seed(), &batch, 0).expect("trainer");
    let oracle = Es {
        inner: Inner::LowRank(1),
        mirrored: true,
        n: N,
        sigma: SIGMA,
        lr,
    };
    let paths: Vec<String> = params.leaves().into_iter().map(|(p, _)| p).collect();
    let theta0 = Host::new(opt, lr, &params).theta;
    let mut host = Host::new(opt, lr, &params);
    let (mut worst_theta, mut worst_state) = (0.0f64, 0.0f64);
    let c = 1.0 / (N as f64 * f64::from(SIGMA));
    for g in 0..GENERATIONS {
        let fitness = trainer.step().expect("step");
        let weights = centered_ranks(&fitness);
        let u = oracle.contraction(&params, base_key(seed(), g), &weights);
        let grad: Vec<Vec<f64>> = u
            .iter()
            .map(|u| u.iter().map(|&x| f64::from(x) * c).collect())
            .collect();
        host.step(&grad);
        let dev = trainer.params().unwrap();
        for (((path, a), h), t0) in dev.leaves().into_iter().zip(&host.theta).zip(&theta0) {
            let moved: Vec<f64> = h.iter().zip(t0).map(|(x, y)| x - y).collect();
            let err: f64 = a
                .data()
                .iter()
                .zip(h)
                .map(|(x, y)| (f64::from(*x) - y).powi(2))
                .sum::<f64>()
                .sqrt()
                / norm(&[moved]);
            assert!(err <= TOL, "{opt:?} generation {g} leaf {path}: {err:e}");
            worst_theta = worst_theta.max(err);
        }
        let dev_state = trainer.optimizer_state().unwrap();
        let host_state = host.state(&paths);
        let dev_names: Vec<&String> = dev_state.iter().map(|(n, _)| n).collect();
        let host_names: Vec<&String> = host_state.iter().map(|(n, _)| n).collect();
        assert_eq!(dev_names, host_names, "{opt:?}");
        for ((name, a), (_, h)) in dev_state.iter().zip(&host_state) {
            if name == "count" {
                assert_eq!(f64::from(a.data()[0]), h[0], "{opt:?} generation {g}");
                continue;
            }
            let err = rel64(a.data(), h);
            assert!(err <= TOL, "{opt:?} generation {g} state {name}: {err:e}");
            worst_state = worst_state.max(err);
        }
    }
    (worst_theta, worst_state, host)
}

fn with_b1(b1: f32) -> Optimizer {
    let mut o = Optimizer::adam();
    if let OptimizerKind::Adam { b1: x, .. } = &mut o.kind {
        *x = b1;
    }
    o
}

#[test]
fn each_optimizer_matches_its_host_rule_over_five_generations() {
    let (client, _, _) = mlp_on_8_devices();
    for (opt, lr) in [
        (Optimizer::sgd(), 0.5),
        (Optimizer::sgd().with_weight_decay(0.1), 0.5),
        (Optimizer::momentum(0.9), 0.1),
        (Optimizer::momentum(0.5).with_weight_decay(0.2), 0.1),
        (Optimizer::adam(), 0.01),
        (with_b1(0.8).with_weight_decay(0.05), 0.01),
        // ‖lr ĝ‖ = 0.1 per generation: the speed limit of 0.15 bites once momentum builds.
        (Optimizer::clipup(0.15), 0.1),
        (Optimizer::clipup(0.15).with_weight_decay(0.1), 0.1),
    ] {
        let (theta, state, host) = against_host(&client, opt, lr);
        println!("{opt:?}: parameters {theta:e}, state {state:e}");
        if let OptimizerKind::ClipUp { .. } = opt.kind {
            // Both branches of the speed limit: free at first, clipped later.
            println!("{opt:?}: clipped {:?}", host.clipped);
            assert!(
                !host.clipped[0] && host.clipped.iter().filter(|&&c| c).count() >= 2,
                "{opt:?}: {:?}",
                host.clipped
            );
        }
    }
}

/// `steps` generations of `es` from generation `start` with the given state.
fn run(
    client: &Client,
    es: &ShardedES,
    params: &ParamTree,
    batch: &[Array],
    start: u32,
    opt_state: Option<&[(String, Array)]>,
    steps: u32,
) -> (ParamTree, Vec<(String, Array)>) {
    let mut t = Trainer::with_state(client, es, &Mlp::PLAIN, params, seed(), batch, start)
        .expect("trainer");
    if let Some(s) = opt_state {
        t.set_optimizer_state(s).expect("state");
    }
    for _ in 0..steps {
        t.step().expect("step");
    }
    (t.params().unwrap(), t.optimizer_state().unwrap())
}

fn bits(tree: &ParamTree) -> Vec<u32> {
    tree.leaves()
        .into_iter()
        .flat_map(|(_, a)| a.data().iter().map(|x| x.to_bits()).collect::<Vec<_>>())
        .collect()
}

fn state_bits(s: &[(String, Array)]) -> Vec<(String, Vec<u32>)> {
    s.iter()
        .map(|(n, a)| (n.clone(), a.data().iter().map(|x| x.to_bits()).collect()))
        .collect()
}

#[test]
fn resuming_from_a_checkpoint_mid_run_is_bit_identical() {
    let (client, params, batch) = mlp_on_8_devices();
    for (opt, lr) in [
        (Optimizer::momentum(0.9), 0.1),
        (Optimizer::adam().with_weight_decay(0.01), 0.01),
        (Optimizer::clipup(0.15), 0.1),
    ] {
        let es = es(opt, lr, 8);
        let (straight, straight_state) = run(&client, &es, &params, &batch, 0, None, 5);
        // Two generations, a checkpoint through the out directory, three more.
        let (mid, mid_state) = run(&client, &es, &params, &batch, 0, None, 2);
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let mut rd = fresh(&out);
        let state = rd
            .write_checkpoint_with_optimizer(seed().data(), 2, &mid, &mid_state, None)
            .unwrap()
            .clone();
        let file = state.optimizer_file.clone().expect("an optimizer file");
        assert!(out.join(&file).is_file(), "{file}");
        drop(rd);
        let ckpt = read_checkpoint(&out).unwrap().expect("a checkpoint");
        assert_eq!(ckpt.state().generation, 2);
        let loaded = ckpt.optimizer_state().unwrap();
        assert_eq!(loaded.len(), mid_state.len(), "{opt:?}");
        let (resumed, resumed_state) = run(
            &client,
            &es,
            &ckpt.params(&params).unwrap(),
            &batch,
            2,
            Some(&loaded),
            3,
        );
        assert_eq!(bits(&resumed), bits(&straight), "{opt:?}");
        assert_eq!(
            state_bits(&resumed_state),
            state_bits(&straight_state),
            "{opt:?}"
        );
        // Starting over from zero state at generation 2 is another trajectory.
        let (fresh, _) = run(&client, &es, &mid, &batch, 2, None, 3);
        assert_ne!(bits(&fresh), bits(&straight), "{opt:?}");
    }
}

/// A fresh out directory at `out`, committed to a run.
fn fresh(out: &std::path::Path) -> RunDir {
    RunDir::prepare(out, Mode::Fresh { force: false }, "hash")
        .unwrap()
        .commit()
        .unwrap()
}

#[test]
fn a_checkpoint_without_state_has_no_optimizer_file_and_a_damaged_one_is_refused() {
    let (client, params, batch) = mlp_on_8_devices();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let mut rd = fresh(&out);
    let sgd = rd
        .write_checkpoint_with_optimizer(seed().data(), 1, &params, &[], None)
        .unwrap()
        .clone();
    assert_eq!((sgd.optimizer_file, sgd.optimizer_sha256), (None, None));
    let text = std::fs::read_to_string(out.join("state.json")).unwrap();
    assert!(!text.contains("optimizer"), "{text}");
    // Adam's state after `k` generations from the start.
    let adam_after = |k| {
        run(
            &client,
            &es(Optimizer::adam(), 0.01, 8),
            &params,
            &batch,
            0,
            None,
            k,
        )
        .1
    };
    let state = adam_after(1);
    let first = rd
        .write_checkpoint_with_optimizer(seed().data(), 2, &params, &state, None)
        .unwrap()
        .clone();
    let later = adam_after(2);
    let second = rd
        .write_checkpoint_with_optimizer(seed().data(), 3, &params, &later, None)
        .unwrap()
        .clone();
    // The previous generation's optimizer file is deleted with its parameters.
    let old = first.optimizer_file.unwrap();
    let new = second.optimizer_file.clone().unwrap();
    assert!(!out.join(&old).exists() && out.join(&new).is_file());
    drop(rd);
    std::fs::write(out.join(&new), b"damaged").unwrap();
    let e = read_checkpoint(&out).unwrap_err().to_string();
    assert!(
        e.contains("that") && e.contains("does not match the sha256 it records"),
        "{e}"
    );
    std::fs::remove_file(out.join(&new)).unwrap();
    let e = read_checkpoint(&out).unwrap_err().to_string();
    assert!(e.contains(&new) && e.contains("is missing"), "{e}");
}

#[test]
fn one_and_eight_devices_agree() {
    let (client, params, batch) = mlp_on_8_devices();
    for (opt, lr) in [
        (Optimizer::momentum(0.9), 0.1),
        (Optimizer::adam(), 0.01),
        (Optimizer::clipup(0.15), 0.1),
    ] {
        let (one, one_state) = run(&client, &es(opt, lr, 1), &params, &batch, 0, None, 5);
        let (eight, eight_state) = run(&client, &es(opt, lr, 8), &params, &batch, 0, None, 5);
        for ((path, a), (_, b)) in one.leaves().into_iter().zip(eight.leaves()) {
            let e = rel_norm_diff(a.data(), b.data());
            println!("{opt:?} {path}: 1 vs 8 devices {e:e}");
            assert!(e <= 1e-5, "{opt:?} {path}: {e:e}");
        }
        for ((name, a), (_, b)) in one_state.iter().zip(&eight_state) {
            let e = rel_norm_diff(a.data(), b.data());
            assert!(e <= 1e-5, "{opt:?} {name}: {e:e}");
        }
    }
}

#[test]
fn split_mode_and_several_generations_per_dispatch_carry_the_state() {
    let (client, params, batch) = mlp_on_8_devices();
    let es = es(Optimizer::adam().with_weight_decay(0.01), 0.01, 8);
    let (fused, fused_state) = run(&client, &es, &params, &batch, 0, None, 5);
    let mut split =
        SplitTrainer::new(&client, &es, &Mlp::PLAIN, &params, seed(), &batch, 0).unwrap();
    for _ in 0..5 {
        let f = split.evaluate().unwrap();
        split.tell(&HostFitness::F32(f)).unwrap();
    }
    let start = Start {
        key: seed(),
        batch: &batch,
        generation: 0,
    };
    let mut multi =
        Trainer::with_generations_per_dispatch(&client, &es, &Mlp::PLAIN, &params, start, 5)
            .unwrap();
    multi.step().unwrap();
    for (what, p, s) in [
        (
            "split",
            split.params().unwrap(),
            split.optimizer_state().unwrap(),
        ),
        (
            "5 per dispatch",
            multi.params().unwrap(),
            multi.optimizer_state().unwrap(),
        ),
    ] {
        for ((path, a), (_, b)) in p.leaves().into_iter().zip(fused.leaves()) {
            let e = rel_norm_diff(a.data(), b.data());
            assert!(e <= 1e-5, "{what} {path}: {e:e}");
        }
        for ((name, a), (_, b)) in s.iter().zip(&fused_state) {
            let e = rel_norm_diff(a.data(), b.data());
            assert!(e <= 1e-5, "{what} {name}: {e:e}");
        }
    }
    // The split trainer's state resumes a fused run.
    let mut t = Trainer::with_state(&client, &es, &Mlp::PLAIN, &params, seed(), &batch, 5).unwrap();
    t.set_optimizer_state(&split.optimizer_state().unwrap())
        .unwrap();
    t.step().unwrap();
}

#[test]
fn sgd_programs_are_those_of_an_es_without_an_optimizer() {
    let (_, params, _) = mlp_on_8_devices();
    let leaves = shardes::hlo::es::leaf_infos(&params);
    let plain = crate::support::sharded::es("mirrored(lowrank(r=1))", N, SIGMA, 0.5, 8);
    let sgd = es(Optimizer::sgd(), 0.5, 8);
    let text = |es: &ShardedES| {
        (
            es.generation_program(&Mlp::PLAIN, &leaves)
                .unwrap()
                .module
                .to_mlir(),
            es.tell_program(&Mlp::PLAIN, &leaves)
                .unwrap()
                .module
                .to_mlir(),
        )
    };
    assert_eq!(text(&plain), text(&sgd));
    let layout = sgd.generation_program(&Mlp::PLAIN, &leaves).unwrap().layout;
    assert!(layout.opt_state.is_empty() && layout.opt_count() == 0);
}

#[test]
fn bad_settings_and_state_are_refused_with_their_names() {
    let lowrank = || from_spec(&"lowrank(r=1)".parse::<StrategySpec>().unwrap());
    let err = |o: Optimizer| {
        ShardedES::new(lowrank(), 16, 0.1, 0.1, 1)
            .unwrap()
            .with_optimizer(o)
            .unwrap_err()
            .to_string()
    };
    assert_eq!(
        err(Optimizer::momentum(1.5)),
        "optimizer momentum = 1.5 is not in [0, 1); set optimizer momentum to a decay such as 0.9"
    );
    assert!(err(Optimizer::clipup(0.0)).starts_with("optimizer max_speed = 0 is not a finite"));
    assert!(err(with_b1(-0.5)).starts_with("optimizer b1 = -0.5 is not in [0, 1)"));
    let spec = |json: &str| -> Result<EsSpec, String> {
        serde_json::from_str(&format!(
            r#"{{"n": 16, "sigma": 0.1, "lr": 0.1, "optimizer": {json}}}"#
        ))
        .map_err(|e| e.to_string())
    };
    let e = spec(r#""adamw""#).unwrap_err();
    assert!(
        e.contains("unknown optimizer \"adamw\" (valid: sgd, momentum, adam, clipup)"),
        "{e}"
    );
    let build = |json: &str| spec(json).unwrap().build(1).unwrap_err();
    let e = build(r#""clipup""#);
    assert!(
        e.message()
            .starts_with("es.optimizer.max_speed: clipup needs its max speed"),
        "{e}"
    );
    let e = build(r#"{"name": "adam", "b2": 1.0}"#);
    assert_eq!(e.message(), "es.optimizer.b2 = 1 is not in [0, 1)");
    let e = build(r#"{"name": "sgd", "momentum": 0.9}"#);
    assert_eq!(e.message(), "es.optimizer.momentum is not a setting of sgd");
    // State that does not fit the optimizer.
    let (client, params, batch) = mlp_on_8_devices();
    let es = es(Optimizer::momentum(0.9), 0.1, 2);
    let mut t = Trainer::with_state(&client, &es, &Mlp::PLAIN, &params, seed(), &batch, 0).unwrap();
    let mut s = t.optimizer_state().unwrap();
    assert_eq!(
        s.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
        ["velocity.b1", "velocity.w1", "velocity.w2"]
    );
    let e = t.set_optimizer_state(&s[..2]).unwrap_err().to_string();
    assert!(
        e.contains("has 2 tensors but this ES's optimizer keeps 3"),
        "{e}"
    );
    s[0].0 = "m.b1".into();
    let e = t.set_optimizer_state(&s).unwrap_err().to_string();
    assert!(e.contains("no tensor `velocity.b1`"), "{e}");
    s[0] = ("velocity.b1".into(), Array::zeros(vec![3]).unwrap());
    let e = t.set_optimizer_state(&s).unwrap_err().to_string();
    assert!(
        e.contains("`velocity.b1` has shape [3] but the optimizer keeps tensor<7xf32>"),
        "{e}"
    );
    // Nothing changed: the trainer still steps.
    t.step().unwrap();
}
