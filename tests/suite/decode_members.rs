//! Decoding under every member's perturbation (`DecodeSpec` over `Qwen2` in the outputs
//! program): the tokens member `i` decodes equal the tokens `Qwen2::greedy_program` decodes
//! from member `i`'s perturbation materialized on the host, for low rank (r = 1, 2,
//! mirrored and not) and seed_regenerated, with the layers unrolled and, for low rank, as
//! a loop (`Layers::Loop`: the layers' noise drawn in a loop over the layer index once per
//! chunk); identical on 1 and 8 devices.
//!
//! Tolerances: tokens exactly equal, on prompts whose smallest top-1/top-2 logit gap along
//! the oracle's decode is above `MIN_GAP` (checked; a member with a nearer tie is skipped,
//! and at least 4 of the 6 members checked per strategy must qualify), so float
//! reassociation between the low-rank seams and the materialized weights cannot flip an
//! argmax.

use crate::support::decode::{member_params, Greedy};
use crate::support::es::{base_key, Es, Inner};
use shardes::hlo::decode::{DecodeShape, DecodeSpec};
use shardes::hlo::es::ShardedES;
use shardes::hlo::params::ParamTree;
use shardes::hlo::prng::{fold_in, key, Key};
use shardes::hlo::problems::qwen2::{Layers, Qwen2, Qwen2Config};
use shardes::runtime::Client;
use shardes::{HostArray, OutputsRunner};

const B: usize = 2;
const P: usize = 5;
const T: usize = 6;
const N: usize = 16;
const SIGMA: f32 = 0.05;
const MIN_GAP: f32 = 1e-3;

/// The tiny preset with weights large enough for peaked logits (clear argmax winners).
fn model() -> (Qwen2Config, ParamTree) {
    let cfg = Qwen2Config::tiny();
    let tree = cfg.init(key(5).unwrap(), 0.25).unwrap();
    (cfg, tree)
}

fn prompts(seed: u64, vocab: usize) -> Vec<i32> {
    let k = fold_in(key(seed).unwrap(), 7);
    shardes::hlo::prng::bits(k, &[B * P])
        .unwrap()
        .iter()
        .map(|b| (b % vocab as u32) as i32)
        .collect()
}

fn es(strategy: &str, devices: usize) -> ShardedES {
    crate::support::sharded::es(strategy, N, SIGMA, 0.01, devices)
        // Chunks dividing n / 8: the tokens are the same bits on 1 and 8 devices.
        .with_device_invariant(true)
}

#[allow(clippy::too_many_arguments)]
fn decode(
    client: &Client,
    strategy: &str,
    layers: Layers,
    devices: usize,
    (cfg, tree): (&Qwen2Config, &ParamTree),
    k: Key,
    generation: u32,
    ids: &[i32],
) -> Vec<i32> {
    let spec = DecodeSpec::new(
        Qwen2::new(cfg.clone(), B, P).with_layers(layers),
        DecodeShape {
            batch: B,
            prompt_len: P,
            max_new: T,
        },
        Vec::new(),
        0,
    )
    .unwrap();
    let runner =
        OutputsRunner::with_state(client, &es(strategy, devices), &spec, tree, k, generation)
            .unwrap();
    let out = runner
        .outputs(&[
            HostArray::i32(&[B, P], ids.to_vec()),
            HostArray::i32(&[B], vec![P as i32; B]),
        ])
        .unwrap();
    assert_eq!(out[0].dims, [N, B, T]);
    assert_eq!(
        out[1].as_i32().unwrap(),
        vec![T as i32; N * B],
        "no EOS: full length"
    );
    out[0].as_i32().unwrap().to_vec()
}

#[test]
fn each_member_decodes_what_its_materialized_perturbation_decodes() {
    let client = Client::cpu(8).unwrap();
    let (cfg, tree) = model();
    let ids = prompts(1, cfg.vocab_size);
    let oracle = Greedy::new(&client, &cfg, &tree, B, P, T);
    let (plain, gap) = oracle.decode(&tree, &ids);
    assert!(
        gap > MIN_GAP,
        "the unperturbed decode has a near tie ({gap})"
    );
    let k = key(21).unwrap();
    let generation = 3;
    let base = base_key(k, generation);
    for (strategy, inner, mirrored, layers) in [
        ("lowrank(r=1)", Inner::LowRank(1), false, Layers::Unrolled),
        (
            "mirrored(lowrank(r=1))",
            Inner::LowRank(1),
            true,
            Layers::Unrolled,
        ),
        ("lowrank(r=2)", Inner::LowRank(2), false, Layers::Unrolled),
        (
            "mirrored(lowrank(r=2))",
            Inner::LowRank(2),
            true,
            Layers::Unrolled,
        ),
        ("seed_regenerated", Inner::FullRank, false, Layers::Unrolled),
        (
            "mirrored(lowrank(r=1))",
            Inner::LowRank(1),
            true,
            Layers::Loop,
        ),
        // lowrank(r=2) looped on 2 devices: tests/suite/decode_layer_noise.rs (slow tier).
    ] {
        let tokens = decode(
            &client,
            strategy,
            layers,
            8,
            (&cfg, &tree),
            k,
            generation,
            &ids,
        );
        let strategy = format!("{strategy}, {}", layers.name());
        let host = Es {
            inner,
            mirrored,
            n: N,
            sigma: SIGMA,
            lr: 0.01,
        };
        let mut checked = 0;
        let mut differ = 0;
        for i in [0, 1, 2, 7, 10, 15] {
            let member = member_params(&host, &tree, base, i);
            let (want, gap) = oracle.decode(&member, &ids);
            if gap <= MIN_GAP {
                // A near tie: f32 reassociation may pick either token.
                continue;
            }
            let got = &tokens[i * B * T..(i + 1) * B * T];
            assert_eq!(got, want, "{strategy}: member {i}");
            checked += 1;
            differ += usize::from(want != plain);
        }
        assert!(
            checked >= 4,
            "{strategy}: only {checked} members without a near tie"
        );
        assert!(
            differ > 0,
            "{strategy}: σ too small to change any member's tokens"
        );
    }
}

/// Each strategy's tokens on 1 and on 8 devices.
fn identical_on_1_and_8_devices(strategies: &[&str]) {
    let client = Client::cpu(8).unwrap();
    let (cfg, tree) = model();
    let ids = prompts(2, cfg.vocab_size);
    let k = key(4).unwrap();
    for strategy in strategies {
        let on = |devices| {
            let model = (&cfg, &tree);
            decode(
                &client,
                strategy,
                Layers::Unrolled,
                devices,
                model,
                k,
                0,
                &ids,
            )
        };
        assert_eq!(on(1), on(8), "{strategy}");
    }
}

// Low rank's decode is device-count invariant in the default tier through
// `decode_rows.rs` (sampled, mirrored low rank, 1 and 8 devices); full rank's only here.
#[test]
fn tokens_are_identical_on_1_and_8_devices() {
    identical_on_1_and_8_devices(&["seed_regenerated"]);
}

#[test]
#[ignore = "slow tier"]
fn slow_low_rank_tokens_are_identical_on_1_and_8_devices() {
    identical_on_1_and_8_devices(&["mirrored(lowrank(r=1))"]);
}
