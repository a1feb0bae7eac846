//! The control problem (`shardes::hlo::problems::control::Control`) as a model: masking
//! after termination, the policy rollout against the f64 host reference, the fitness
//! layouts, the seams (low rank never forms a perturbed matrix), and bit-identical
//! generation-0 fitness on 1 and 8 devices.
//!
//! Tolerances: returns of environments with integer rewards (cart-pole balance, acrobot)
//! and of the masking cases are compared exactly; the pendulum's return over 50 steps of a
//! random policy within `1e-4` relative (f32 against f64 through the policy and the
//! dynamics: the measured difference is ~1e-7); 1 vs 8 devices bit for bit.

use crate::support::control as reference;
use shardes::hlo::builder::{Module, TensorType, Value};
use shardes::hlo::es::strategy::from_spec;
use shardes::hlo::es::{check_model, leaf_infos, shaping, Model, ModelParams, ShardedES};
use shardes::hlo::params::{Array, ParamTree};
use shardes::hlo::prng::{fold_in, key};
use shardes::hlo::problems::control::{Control, Env, Fitness};
use shardes::runtime::{Client, CompileOptions};
use shardes::{Problem, Trainer};

/// The loss of `model` for the unperturbed `params` and `reset`, as one program on one
/// device: `f32[E]` (per episode) or `f32[]`.
fn plain_loss(client: &Client, model: &Control, params: &ParamTree, reset: &Array) -> Vec<f32> {
    let mut m = Module::new("loss");
    let f = m.func("main");
    let mut args = Vec::new();
    let mut leaves = Vec::new();
    for (path, a) in params.leaves() {
        let shape: Vec<i64> = a.shape().iter().map(|&d| d as i64).collect();
        let v = f.arg(&path, TensorType::f32(&shape)).unwrap();
        leaves.push((path, v));
        args.push(a.clone());
    }
    let shape: Vec<i64> = reset.shape().iter().map(|&d| d as i64).collect();
    let r: Value = f.arg("reset", TensorType::f32(&shape)).unwrap();
    args.push(reset.clone());
    let loss = model.loss(&ModelParams::plain(leaves), &[r]).unwrap();
    f.output(loss.value()).unwrap();
    m.add(f.finish().unwrap()).unwrap();
    let exe = client
        .compile(&m.to_mlir(), &CompileOptions::new(1))
        .unwrap();
    let bufs: Vec<_> = args
        .iter()
        .map(|a| client.buffer_from_host(a.data(), a.shape(), 0).unwrap())
        .collect();
    let refs: Vec<_> = bufs.iter().collect();
    let mut out = exe.execute(&[refs]).unwrap();
    out.remove(0)[0].to_host::<f32>().unwrap()
}

fn zero_policy(model: &Control) -> ParamTree {
    model
        .init(key(0).unwrap())
        .unwrap()
        .map_leaves(|_, a| Array::zeros(a.shape().to_vec()).unwrap())
}

/// The tanh MLP of `params` in f64.
fn host_policy(params: &ParamTree, layers: usize) -> impl Fn(&[f64]) -> f64 + '_ {
    move |obs: &[f64]| {
        let mut h = obs.to_vec();
        for i in 0..layers {
            let w = params.get(&format!("layers.{i}.w")).unwrap();
            let b = params.get(&format!("layers.{i}.b")).unwrap();
            let (m, k) = (w.shape()[0], w.shape()[1]);
            h = (0..m)
                .map(|r| {
                    let dot: f64 = (0..k).map(|c| f64::from(w.data()[r * k + c]) * h[c]).sum();
                    (dot + f64::from(b.data()[r])).tanh()
                })
                .collect();
        }
        h[0]
    }
}

/// Episodes that end for sure score only the reward up to their first terminal step:
/// a cart already leaving the track (1 step), a pole past its tipping point, a mountain car
/// at the flag (100, then nothing), an acrobot standing up (0), against episodes that
/// never end (the full length).
#[test]
fn reward_after_the_first_termination_is_masked() {
    let client = Client::cpu(1).unwrap();
    let steps = 50;
    let cases: [(Env, Vec<f32>, Vec<f64>); 3] = [
        (
            Env::CartpoleBalance,
            // x' = 2.39 + 0.02·5 > 2.4 at once; θ = 0.2 falls past 12° in a few steps;
            // the upright rest state with a = 0 is an equilibrium.
            vec![2.39, 5.0, 0.0, 0.0, 0.0, 0.0, 0.2, 0.0, 0.0, 0.0, 0.0, 0.0],
            vec![1.0, f64::NAN, 50.0],
        ),
        (
            Env::MountainCar,
            // At the flag moving right: 100 on the first step and nothing after, although
            // the car stays past the flag (an unmasked sum would collect 100 per step).
            vec![0.44, 0.07, -0.5, 0.0],
            vec![100.0, 0.0],
        ),
        (
            Env::Acrobot,
            // Standing straight up: terminal after the first step (reward 0), against
            // hanging at rest: −1 for every step.
            vec![std::f32::consts::PI, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
            vec![0.0, -50.0],
        ),
    ];
    for (env, states, want) in cases {
        let e = want.len();
        let model = Control::new(env, e, steps, &[])
            .unwrap()
            .with_fitness(Fitness::PerEpisode);
        let params = zero_policy(&model);
        let reset = Array::new(vec![e, env.state_dim()], states.clone()).unwrap();
        let got = plain_loss(&client, &model, &params, &reset);
        assert_eq!(got.len(), e);
        let s = env.state_dim();
        for i in 0..e {
            let s0: Vec<f64> = states[i * s..(i + 1) * s]
                .iter()
                .map(|&x| f64::from(x))
                .collect();
            let (ret, end) = reference::masked_return(env.name(), &s0, steps, &|_| 0.0);
            let ret_got = -f64::from(got[i]);
            println!("{env} episode {i}: return {ret_got} (reference {ret}, ends at {end:?})");
            assert_eq!(ret_got, ret, "{env} episode {i}");
            if !want[i].is_nan() {
                assert_eq!(ret_got, want[i], "{env} episode {i}");
            }
        }
    }
    // The falling pole of the second cart-pole episode ends early and scores 1 per step
    // up to and including its last.
    let (ret, end) =
        reference::masked_return("cartpole_balance", &[0.0, 0.0, 0.2, 0.0], steps, &|_| 0.0);
    let end = end.expect("the pole falls");
    assert!(end > 0 && end < 20, "{end}");
    assert_eq!(ret, (end + 1) as f64);
}

/// A random tanh policy rolled out in the program against the f64 reference rollout with
/// the same masking.
#[test]
fn policy_rollouts_match_the_host_reference() {
    let client = Client::cpu(1).unwrap();
    for (env, steps, rel) in [
        (Env::CartpoleBalance, 200, 0.0),
        (Env::Acrobot, 100, 0.0),
        (Env::Pendulum, 50, 1e-4),
    ] {
        let e = 6;
        let model = Control::new(env, e, steps, &[8])
            .unwrap()
            .with_fitness(Fitness::PerEpisode);
        let k = key(11).unwrap();
        let params = model.init(k).unwrap();
        let reset = model.reset_states(fold_in(k, 1)).unwrap();
        let got = plain_loss(&client, &model, &params, &reset);
        let policy = host_policy(&params, 2);
        let s = env.state_dim();
        for (i, (row, fit)) in reset.data().chunks(s).zip(&got).enumerate() {
            let s0: Vec<f64> = row.iter().map(|&x| f64::from(x)).collect();
            let (want, _) = reference::masked_return(env.name(), &s0, steps, &policy);
            let have = -f64::from(*fit);
            println!("{env} episode {i}: return {have} (reference {want})");
            assert!(
                (have - want).abs() <= rel * want.abs(),
                "{env} episode {i}: {have} vs {want}"
            );
        }
        // The mean fitness is the mean of the per-episode ones.
        let mean = plain_loss(
            &client,
            &model.clone().with_fitness(Fitness::Mean),
            &params,
            &reset,
        );
        assert_eq!(mean.len(), 1);
        let avg = got.iter().map(|&x| f64::from(x)).sum::<f64>() / e as f64;
        assert!((f64::from(mean[0]) - avg).abs() <= 1e-5 * avg.abs().max(1.0));
    }
}

#[test]
fn fitness_layouts_tasks_and_seams() {
    let model = Control::new(Env::CartpoleSwingup, 3, 10, &[13]).unwrap();
    let params = model.init(key(0).unwrap()).unwrap();
    let leaves = leaf_infos(&params);
    assert_eq!(model.tasks(), 1);
    assert_eq!(model.clone().with_fitness(Fitness::PerEpisode).tasks(), 3);
    assert_eq!(check_model(&model, &leaves).unwrap(), vec![]);
    // Low rank reads W (13, 5) through the seam: no [C, 13, 5] value may appear; full-rank
    // noise must form one (the check is meaningful).
    for (strategy, forms) in [
        ("mirrored(lowrank(r=1))", false),
        ("mirrored(seed_regenerated)", true),
    ] {
        let es = ShardedES::new(from_spec(&strategy.parse().unwrap()), 16, 0.1, 0.1, 2).unwrap();
        let program = es.generation_program(&model, &leaves).unwrap();
        let offenders: Vec<String> = program
            .module
            .value_types()
            .into_iter()
            .filter(|t| t.rank() >= 3 && t.shape.contains(&13) && t.shape.contains(&5))
            .map(|t| t.to_string())
            .collect();
        assert_eq!(!offenders.is_empty(), forms, "{strategy}: {offenders:?}");
    }
}

/// Generation 0's fitness on 1 and on 8 devices, bit for bit, for both published
/// strategies and both fitness layouts (the pendulum's returns are not integers, so a
/// 1-ulp difference anywhere would show).
#[test]
fn generation_0_fitness_is_bit_identical_on_1_and_8_devices() {
    let client = Client::cpu(8).unwrap();
    for (env, shaping_name, fitness) in [
        (Env::CartpoleBalance, "centered_ranks", Fitness::Mean),
        (Env::Pendulum, "group_relative", Fitness::PerEpisode),
    ] {
        let control = Control::new(env, 4, 100, &[8])
            .unwrap()
            .with_fitness(fitness);
        let problem = Problem::control(control, 5).unwrap();
        for strategy in ["mirrored(lowrank(r=1))", "mirrored(seed_regenerated)"] {
            let mut runs = Vec::new();
            for devices in [1, 8] {
                let es =
                    ShardedES::new(from_spec(&strategy.parse().unwrap()), 32, 0.1, 0.1, devices)
                        .unwrap()
                        .with_shaping(shaping::by_name(shaping_name).unwrap())
                        .with_member_bytes(problem.model.member_bytes());
                let mut t = Trainer::new(&client, &es, &problem).unwrap();
                let fit = t.step().unwrap();
                assert_eq!(fit.len(), 32 * problem.model.tasks());
                runs.push(fit);
            }
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&runs[0]),
                bits(&runs[1]),
                "{env} {strategy}: 1 vs 8 devices"
            );
            println!(
                "{env} {strategy}: mean return {:.3} on 1 and 8 devices",
                Control::mean_return(&runs[0])
            );
        }
    }
}
