//! The reward loop across processes (issue #17's "each process decodes and scores its own
//! members; rewards are gathered like fitness"), with the processes as threads of this test
//! (`shardes::distributed::threads`): a `target_token` run of a tiny random Qwen2 on
//! 2 processes × 4 devices against one process with 8 devices, `how_hosts` A and B.
//!
//! Exact: member ids, sampling keys and the member chunk are those of 8 devices, and with
//! `how = B` inside the processes the update adds the devices' sums in one process's order,
//! so every generation's report (fitness, rewards, counts) and the final parameters are the
//! bits of one process, on every process. The MPI tier (`cli_mpi_tasks`) runs the same from the
//! command line.

use shardes::decode::DecodeConfig;
use shardes::distributed::{params_digest, threads, Distributed};
use shardes::finetune::{GenerationReport, RewardEvaluator, RewardLoop, RewardSettings, TextCodec};
use shardes::hlo::es::{EsSpec, How};
use shardes::hlo::params::ParamTree;
use shardes::hlo::prng::key;
use shardes::hlo::problems::qwen2::{Qwen2, Qwen2Config};
use shardes::population::Place;
use shardes::runtime::Client;
use shardes::tasks::target_token::{TargetToken, TargetTokenConfig};
use shardes::{CompileWhen, Population, PopulationDecoder};

const GENERATIONS: usize = 3;
const PROMPTS: usize = 2;

fn spec() -> EsSpec {
    let mut s = EsSpec::new(16, 0.05, 0.05);
    s.strategy = "mirrored(lowrank(r=1))".parse().expect("strategy");
    s.how = How::B;
    s
}

fn model() -> (Qwen2Config, ParamTree) {
    let cfg = Qwen2Config::tiny();
    let tree = cfg.init(key(5).unwrap(), 0.25).unwrap();
    (cfg, tree)
}

/// The reward run of `decoder`: target_token (the share of token 7), fresh prompts every
/// generation.
fn reward_loop(decoder: PopulationDecoder, vocab: usize) -> Population<RewardEvaluator> {
    let task = TargetToken::new(TargetTokenConfig {
        token: 7,
        vocab: vocab as u32,
        prompt_tokens: 4,
    })
    .unwrap();
    let settings = RewardSettings {
        seed: 0,
        prompts: PROMPTS,
        grouped: false,
    };
    let lp = RewardLoop::new(
        Box::new(task),
        TextCodec::new(None, None, None),
        settings,
        None,
    )
    .unwrap();
    decoder.rewarded(lp, None)
}

/// One generation of `run` with every process of `dist`: its report without timings.
fn step(run: &mut Population<RewardEvaluator>, dist: &Distributed) -> GenerationReport {
    let fitness = run.step_in(dist).expect("step");
    let r = run.evaluator().last_report().expect("a report").clone();
    assert_eq!(r.fitness, fitness);
    untimed(r)
}

/// Each report without its timings.
fn untimed(mut r: GenerationReport) -> GenerationReport {
    r.decode_secs = 0.0;
    r.host_secs = 0.0;
    r
}

fn decode_config() -> DecodeConfig {
    DecodeConfig::greedy(PROMPTS, 4, 6)
}

#[test]
fn a_reward_loop_across_processes_has_the_bits_of_one_process() {
    let (cfg, tree) = model();
    let client = Client::cpu(8).expect("8 devices");
    let es = spec().build(8).expect("es");
    let m = Qwen2::new(cfg.clone(), PROMPTS, 4);
    let decoder = PopulationDecoder::new(&client, &es, m, &tree, key(3).unwrap(), decode_config())
        .expect("decoder");
    let mut lp = reward_loop(decoder, cfg.vocab_size);
    let want: Vec<GenerationReport> = (0..GENERATIONS)
        .map(|_| step(&mut lp, &Distributed::single()))
        .collect();
    let want_params = lp.params().unwrap();
    assert!(
        want.iter().any(|r| r.rewards.iter().any(|&x| x > 0.0)),
        "no member ever emitted the token: the comparison would be vacuous"
    );

    for hosts in [How::A, How::B] {
        let got = threads::run(2, |dist: Distributed| {
            let es = spec().build(8).expect("es over both processes' devices");
            let client = Client::cpu(4).expect("4 devices");
            let m = Qwen2::new(cfg.clone(), PROMPTS, 4);
            let decoder = PopulationDecoder::placed(
                &client,
                &es,
                m,
                &tree,
                key(3).unwrap(),
                0,
                decode_config(),
                Place::Group(&dist, hosts),
                CompileWhen::Now,
            )
            .expect("process decoder");
            assert_eq!(decoder.members(), dist.members(16));
            assert_eq!(decoder.n(), 16);
            let mut lp = reward_loop(decoder, cfg.vocab_size);
            let reports: Vec<GenerationReport> =
                (0..GENERATIONS).map(|_| step(&mut lp, &dist)).collect();
            // A one-process tell is refused: the update is a collective.
            let e = lp.step().unwrap_err().to_string();
            assert!(e.contains("but was told as process 0 of 1"), "{e}");
            (reports, lp.params().unwrap())
        });
        for (rank, (reports, params)) in got.iter().enumerate() {
            assert_eq!(reports, &want, "process {rank}, how_hosts {hosts}");
            assert_eq!(
                params_digest(params),
                params_digest(&want_params),
                "process {rank}, how_hosts {hosts}"
            );
        }
    }
}

#[test]
fn a_process_outputs_program_holds_its_own_members_on_its_own_devices() {
    use shardes::hlo::es::{leaf_infos, Part};
    let (cfg, tree) = model();
    let es = spec().build(8).expect("es");
    let decode = decode_config()
        .spec(Qwen2::new(cfg, PROMPTS, 4))
        .expect("spec");
    let leaves = leaf_infos(&tree);
    // One process's part is the outputs program itself, printed the same.
    let whole = es.outputs_program(&decode, &leaves).expect("outputs");
    let single = es
        .part_outputs_program(&decode, &leaves, Part::SINGLE)
        .expect("part");
    assert_eq!(whole.module.to_mlir(), single.module.to_mlir());
    // Process 1 of 2: members 8..16 on 4 devices.
    let second = es
        .part_outputs_program(&decode, &leaves, Part::new(1, 2).unwrap())
        .expect("part 1 of 2");
    assert_eq!(second.layout.n, 8);
    assert_eq!(second.module.mesh().map(|m| m.size()), Some(4));
    assert_ne!(second.module.to_mlir(), whole.module.to_mlir());
    // 8 devices do not split over 3 processes.
    let e = match es.part_outputs_program(&decode, &leaves, Part::new(0, 3).unwrap()) {
        Ok(_) => panic!("a program for 3 processes of 8 devices"),
        Err(e) => e.to_string(),
    };
    assert!(e.contains("8 devices do not split over 3 processes"), "{e}");
}
