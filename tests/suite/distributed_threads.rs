//! One population across processes, with the processes as threads of this test
//! (`shardes::distributed::threads`): `P` processes × `D` devices against one process with
//! all `P·D` devices (the fused `Trainer`), for low rank and seed regenerated, `how_hosts`
//! A and B. The MPI tier (`.ci/mpi-tier`) runs the same through `mpirun`.
//!
//! Tolerances: none where one process's split mode has the fused program's bits (here:
//! with `keep_noise_mib = 0`, see `spec`): member ids are global, the member chunk is the one of `P·D` devices, and the
//! update adds every device's sum in device order as one process's all-reduce does, so
//! fitness and parameters are bit-identical to one process with every device, for `how = B`
//! inside the processes (both placements across them) and for `how = A` with
//! `how_hosts = A`. With `how = A` and `how_hosts = B` each process's sum is added to the
//! others' where one process would go on adding member chunks: the parameters agree to
//! 1e-5 relative per leaf after three generations (the device-count tolerance of
//! `‖u₁ − u₈‖/‖u₈‖ ≤ 1e-5`). Every process holds bit-identical parameters.

use crate::support::tiny::{mlp_batch, mlp_params, Mlp};
use crate::support::worst_leaf_diff;
use shardes::distributed::{params_digest, threads};
use shardes::hlo::es::{EsSpec, How, SigmaPatterns};
use shardes::hlo::params::ParamTree;
use shardes::hlo::prng::key;
use shardes::population::{CompileWhen, Place, Start};
use shardes::runtime::Client;
use shardes::{HostFitness, SplitTrainer, Trainer};

const GENERATIONS: usize = 3;

fn spec(strategy: &str, how: How) -> EsSpec {
    let mut s = EsSpec::new(64, 0.1, 1.0);
    s.strategy = strategy.parse().expect("strategy");
    s.how = how;
    // One process's fused program contracts the noise `apply` kept; for full-rank noise XLA
    // compiles that contraction to other last bits than the regenerating one, which split
    // programs (and so processes) use. Without keeping, one process has the bits of its
    // split mode.
    s.keep_noise_mib = Some(0);
    s
}

/// `(fitness per generation, final parameters)` of one process with 8 devices.
fn one_process(spec: &EsSpec) -> (Vec<Vec<f32>>, ParamTree) {
    let client = Client::cpu(8).expect("8 devices");
    let es = spec.build(8).expect("es");
    let (params, batch, k) = (mlp_params(1), mlp_batch(2), key(7).unwrap());
    let mut t =
        Trainer::with_state(&client, &es, &Mlp::PLAIN, &params, k, &batch, 0).expect("trainer");
    let fitness = (0..GENERATIONS).map(|_| t.step().expect("step")).collect();
    (fitness, t.params().expect("params"))
}

/// The same on `processes` threads of `8 / processes` devices each, per process.
fn processes(spec: &EsSpec, processes: usize, hosts: How) -> Vec<(Vec<Vec<f32>>, ParamTree)> {
    threads::run(processes, |dist| {
        // The ES describes every process's devices (ShardedES is not Sync: one per thread).
        let es = spec.build(8).expect("es over every process's devices");
        let client = Client::cpu(8 / processes).expect("devices");
        let (params, batch, k) = (mlp_params(1), mlp_batch(2), key(7).unwrap());
        let place = Place::Group(&dist, hosts);
        let start = Start {
            key: k,
            batch: &batch,
            generation: 0,
        };
        let mut t = SplitTrainer::placed(
            &client,
            &es,
            &Mlp::PLAIN,
            &params,
            start,
            place,
            CompileWhen::Now,
        )
        .expect("process trainer");
        assert_eq!(t.members(), dist.members(64));
        let fitness = (0..GENERATIONS)
            .map(|_| t.step_in(&dist).expect("step"))
            .collect();
        t.check_params(&dist, t.generation())
            .expect("the same parameters");
        (fitness, t.params().expect("params"))
    })
}

#[test]
fn processes_times_devices_match_one_process_with_every_device() {
    // Each strategy with both process counts and both placements across processes; the
    // MPI tier runs the whole grid.
    for (strategy, cases) in [
        ("mirrored(lowrank(r=1))", [(2, How::A), (4, How::B)]),
        ("seed_regenerated(chunk=4)", [(2, How::B), (4, How::A)]),
    ] {
        let s = spec(strategy, How::B);
        let (f1, p1) = one_process(&s);
        for (p, hosts) in cases {
            let case = format!("{strategy}, {p} × {}, how_hosts {hosts}", 8 / p);
            let runs = processes(&s, p, hosts);
            for (rank, (fitness, params)) in runs.iter().enumerate() {
                assert_eq!(
                    fitness, &f1,
                    "{case}: fitness of every generation, rank {rank}"
                );
                assert_eq!(
                    params_digest(params),
                    params_digest(&p1),
                    "{case}: the parameters of one process, bit for bit"
                );
                assert_eq!(
                    params_digest(params),
                    params_digest(&runs[0].1),
                    "{case}: every process holds the same bits"
                );
            }
        }
    }
}

#[test]
fn optimizer_state_and_frozen_leaves_cross_processes() {
    // adam's moments live next to the parameters on every process and are updated by the
    // update program (how_hosts B) or the whole tell (A); a frozen leaf with per-leaf σ on
    // the others has no sum to exchange. Both match one process with every device.
    let mut adam = spec("mirrored(lowrank(r=1))", How::B);
    adam.optimizer.name = "adam".parse().expect("optimizer");
    let mut frozen = spec("mirrored(lowrank(r=1))", How::B);
    frozen.freeze = vec!["b1".into()];
    frozen.sigma_leaves = SigmaPatterns(vec![("w2".into(), 0.05)]);
    // adam's step is compiled into a program of its own across processes, where XLA may
    // fuse its divisions and square roots otherwise than in the fused generation: there the
    // tolerance is the device-count one, 1e-5 relative (measured: last-bit differences in
    // the third generation's fitness).
    for (name, s, exact) in [
        ("adam", &adam, false),
        ("freeze b1, σ(w2) = 0.05", &frozen, true),
    ] {
        let (f1, p1) = one_process(s);
        for hosts in [How::A, How::B] {
            let runs = processes(s, 2, hosts);
            for (rank, (fitness, params)) in runs.iter().enumerate() {
                assert_eq!(
                    params_digest(params),
                    params_digest(&runs[0].1),
                    "{name}, how_hosts {hosts}: every process holds the same bits, rank {rank}"
                );
                if exact {
                    assert_eq!(
                        fitness, &f1,
                        "{name}, how_hosts {hosts}: fitness, rank {rank}"
                    );
                    assert_eq!(
                        params_digest(params),
                        params_digest(&p1),
                        "{name}, how_hosts {hosts}: parameters, rank {rank}"
                    );
                } else {
                    let diff = worst_leaf_diff(params, &p1);
                    assert!(diff <= 1e-5, "{name}, how_hosts {hosts}: {diff:e}");
                    let worst = fitness
                        .iter()
                        .flatten()
                        .zip(f1.iter().flatten())
                        .map(|(a, b)| ((a - b).abs() / b.abs().max(1e-6)) as f64)
                        .fold(0.0, f64::max);
                    assert!(
                        worst <= 1e-5,
                        "{name}, how_hosts {hosts}: fitness {worst:e}"
                    );
                }
            }
        }
        if name.starts_with("freeze") {
            assert_eq!(
                p1.get("b1").expect("b1").data(),
                mlp_params(1).get("b1").expect("b1").data(),
                "a frozen leaf keeps its values"
            );
        }
    }
}

#[test]
fn how_a_inside_a_process_matches_too() {
    // how = A places the contraction inside each process; across processes it is how_hosts.
    let s = spec("mirrored(lowrank(r=1))", How::A);
    let (f1, p1) = one_process(&s);
    // Every process contracts every member, as every device does on one process.
    let runs = processes(&s, 2, How::A);
    assert_eq!(runs[1].0, f1, "how A, how_hosts A: the same fitness");
    assert_eq!(params_digest(&runs[1].1), params_digest(&p1));
    // Each process's sum of its own members, added across processes.
    let runs = processes(&s, 2, How::B);
    assert_eq!(runs[0].0[0], f1[0], "how A, how_hosts B: generation 0");
    let d = worst_leaf_diff(&runs[1].1, &p1);
    assert!(d <= 1e-5, "how A, how_hosts B: parameters differ by {d:e}");
    assert_eq!(params_digest(&runs[0].1), params_digest(&runs[1].1));
}

#[test]
fn processes_that_hold_different_parameters_are_stopped_naming_the_generation() {
    let s = spec("mirrored(lowrank(r=1))", How::B);
    let errors = threads::run(2, |dist| {
        let es = s.build(8).expect("es");
        let client = Client::cpu(4).expect("devices");
        // Process 1 starts from other parameters: as if it had drifted.
        let params = mlp_params(1 + dist.rank() as u64);
        let mut t = SplitTrainer::placed(
            &client,
            &es,
            &Mlp::PLAIN,
            &params,
            Start {
                key: key(7).unwrap(),
                batch: &mlp_batch(2),
                generation: 0,
            },
            Place::Group(&dist, How::A),
            CompileWhen::Now,
        )
        .expect("process trainer");
        t.step_in(&dist).expect("step");
        t.check_params(&dist, t.generation())
            .expect_err("different parameters")
            .to_string()
    });
    for e in &errors {
        assert!(
            e.starts_with("the processes disagree on the parameters at generation 1: process"),
            "{e}"
        );
    }
}

#[test]
fn a_reward_loop_scores_its_own_members_and_gathers_them() {
    // Rewards computed on the host per process (here: the negated loss), gathered like the
    // fitness, give the trajectory of one split-mode process telling the same rewards.
    let s = spec("mirrored(lowrank(r=1))", How::B);
    let es8 = s.build(8).expect("es");
    let client = Client::cpu(8).expect("devices");
    let (params, batch, k) = (mlp_params(1), mlp_batch(2), key(7).unwrap());
    let mut split =
        SplitTrainer::new(&client, &es8, &Mlp::PLAIN, &params, k, &batch, 0).expect("split");
    let one = shardes::distributed::Distributed::single();
    for _ in 0..2 {
        let rewards: Vec<f32> = split.evaluate().unwrap().iter().map(|x| -x).collect();
        let local = HostFitness::F32(rewards.iter().map(|r| -r).collect());
        let all = split.tell_gathered(&one, &local).expect("tell");
        assert_eq!(all.len(), 64);
    }
    let want = split.params().unwrap();
    let got = threads::run(2, |dist| {
        let es8 = s.build(8).expect("es");
        let client = Client::cpu(4).expect("devices");
        let mut t = SplitTrainer::placed(
            &client,
            &es8,
            &Mlp::PLAIN,
            &params,
            Start {
                key: k,
                batch: &batch,
                generation: 0,
            },
            Place::Group(&dist, How::B),
            CompileWhen::Now,
        )
        .expect("process trainer");
        for _ in 0..2 {
            let mine = t.evaluate().unwrap();
            assert_eq!(mine.len(), t.members().len());
            let rewards: Vec<f32> = mine.iter().map(|x| -x).collect();
            let local = HostFitness::F64(rewards.iter().map(|r| -f64::from(*r)).collect());
            t.tell_gathered(&dist, &local).expect("tell");
        }
        // A wrong count names the process's own members.
        let e = t
            .tell_gathered(&dist, &HostFitness::F32(vec![0.0; 3]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("got 3 fitness values for its 32 members"), "{e}");
        t.params().unwrap()
    });
    for p in &got {
        let d = worst_leaf_diff(p, &want);
        assert!(
            d <= 1e-5,
            "reward loop across processes: parameters differ by {d:e}"
        );
    }
}

/// A population built for one process alone, stepped as one process of a group, is refused
/// before anything runs — the fused program too, which never reaches a tell.
#[test]
fn a_one_process_population_stepped_in_a_group_is_refused() {
    let errors = threads::run(2, |dist| {
        let client = Client::cpu(4).expect("4 devices");
        let es = spec("lowrank(r=1)", How::B).build(4).expect("es");
        let (params, batch, k) = (mlp_params(1), mlp_batch(2), key(7).unwrap());
        let mut t =
            Trainer::with_state(&client, &es, &Mlp::PLAIN, &params, k, &batch, 0).expect("trainer");
        let e = t.step_in(&dist).unwrap_err().to_string();
        (e, t.generation())
    });
    for (rank, (e, generation)) in errors.iter().enumerate() {
        assert!(
            e.contains(&format!("but was told as process {rank} of 2")),
            "{e}"
        );
        assert_eq!(*generation, 0, "process {rank} ran a generation");
    }
}
