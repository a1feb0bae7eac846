//! `PopulationDecoder` row by row: a right-padded batch of prompts of different lengths
//! decodes each row exactly as that row alone; EOS ends a row (EOS included, padding after
//! it on the device); greedy decoding of the Hugging Face fixture equals `transformers`'
//! `generate` (`tests/fixtures/qwen2_tiny/generate.json`, by `tools/qwen2_fixture.py
//! --generate`); sampling is reproducible from the key and generation; bf16 decoding runs
//! and is device-count invariant; bad prompt batches are refused with typed errors.
//!
//! Tolerances: tokens exactly equal throughout (the fixture's smallest top-1/top-2 margin is
//! checked to be above 1e-3, so f32 reassociation cannot flip a token).

use std::path::{Path, PathBuf};

use crate::support::decode::Greedy;
use serde::Deserialize;
use shardes::decode::{load_qwen2, Bounded, DecodeConfig, DecodeError, Decoded, Sampling};
use shardes::hlo::builder::DType;
use shardes::hlo::es::ShardedES;
use shardes::hlo::params::ParamTree;
use shardes::hlo::prng::key;
use shardes::hlo::problems::qwen2::{Qwen2, Qwen2Config};
use shardes::population::Place;
use shardes::runtime::Client;
use shardes::{CompileWhen, Error, HostFitness, PopulationDecoder, Qwen2Weights};

const N: usize = 16;

fn model() -> (Qwen2Config, ParamTree) {
    let cfg = Qwen2Config::tiny();
    let tree = cfg.init(key(5).unwrap(), 0.25).unwrap();
    (cfg, tree)
}

fn es(devices: usize) -> ShardedES {
    crate::support::sharded::es("mirrored(lowrank(r=1))", N, 0.05, 0.01, devices)
        // Chunks dividing n / 8: the tokens are the same bits on 1 and 8 devices.
        .with_device_invariant(true)
}

fn decoder(
    client: &Client,
    cfg: &Qwen2Config,
    tree: &ParamTree,
    config: DecodeConfig,
) -> PopulationDecoder {
    let m = Qwen2::new(cfg.clone(), config.batch, config.prompt_len);
    PopulationDecoder::new(client, &es(8), m, tree, key(3).unwrap(), config).unwrap()
}

fn prompts() -> Vec<Vec<u32>> {
    vec![vec![17, 3, 99, 41, 8, 120], vec![64, 2, 77], vec![5]]
}

// Each row alone compiles two programs (about 25 s a row on 2 cores): the default tier
// checks the most padded row, the slow tier (run by `.ci/run`) every row.
#[test]
fn a_padded_batch_decodes_its_most_padded_row_as_that_row_alone() {
    padded_rows_decode_alone(&[2]);
}

#[test]
#[ignore = "slow tier"]
fn slow_a_padded_batch_decodes_each_row_as_that_row_alone() {
    padded_rows_decode_alone(&[0, 1, 2]);
}

/// The batch of [`prompts`] decoded together, against rows `rows` decoded alone.
fn padded_rows_decode_alone(rows: &[usize]) {
    let client = Client::cpu(8).unwrap();
    let (cfg, tree) = model();
    let t = 5;
    let batch = decoder(&client, &cfg, &tree, DecodeConfig::greedy(3, 6, t));
    let all = batch.decode(&prompts()).unwrap();
    let plain = batch.decode_plain(&prompts()).unwrap();
    assert_eq!(all.tokens.len(), N);
    assert_eq!(all.generated, N * 3 * t, "no EOS: every row full");
    for (j, p) in prompts().iter().enumerate() {
        if !rows.contains(&j) {
            continue;
        }
        // The row alone: one row, no padding.
        let alone = decoder(&client, &cfg, &tree, DecodeConfig::greedy(1, p.len(), t));
        let one = alone.decode(std::slice::from_ref(p)).unwrap();
        for i in 0..N {
            assert_eq!(all.tokens[i][j], one.tokens[i][0], "prompt {j}, member {i}");
        }
        assert_eq!(
            plain[j],
            alone.decode_plain(std::slice::from_ref(p)).unwrap()[0]
        );
        // And the unperturbed row is what the one-device greedy program decodes.
        let ids: Vec<i32> = p.iter().map(|&x| x as i32).collect();
        let (want, gap) = Greedy::new(&client, &cfg, &tree, 1, p.len(), t).decode(&tree, &ids);
        assert!(gap > 1e-3, "near tie {gap}");
        let want: Vec<u32> = want.iter().map(|&x| x as u32).collect();
        assert_eq!(plain[j], want, "prompt {j}: plain decode vs greedy_program");
    }
    // Fewer prompts than rows: the rest are filled in and dropped.
    let two = batch.decode(&prompts()[..2]).unwrap();
    for i in 0..N {
        assert_eq!(two.tokens[i], all.tokens[i][..2]);
    }
}

#[test]
fn eos_ends_a_row_with_the_eos_token_and_padding_after_it() {
    let client = Client::cpu(8).unwrap();
    let (cfg, tree) = model();
    let t = 6;
    let free = decoder(&client, &cfg, &tree, DecodeConfig::greedy(3, 6, t));
    let before = free.decode(&prompts()).unwrap();
    // An id member 0 emits in its first row's completion, not as the first token.
    let row = &before.tokens[0][0];
    let eos = row[1..]
        .iter()
        .copied()
        .find(|&x| x != row[0])
        .unwrap_or(row[1]);
    let pad = 127;
    let config = DecodeConfig {
        eos: vec![eos],
        pad,
        ..DecodeConfig::greedy(3, 6, t)
    };
    let stopping = decoder(&client, &cfg, &tree, config);
    let after = stopping.decode(&prompts()).unwrap();
    let mut ended = 0;
    for i in 0..N {
        for j in 0..3 {
            let full = &before.tokens[i][j];
            let want = match full.iter().position(|&x| x == eos) {
                Some(at) => &full[..=at],
                None => &full[..],
            };
            assert_eq!(after.tokens[i][j], want, "member {i}, prompt {j}");
            assert_eq!(after.ended[i][j], want.last() == Some(&eos));
            ended += usize::from(after.ended[i][j]);
        }
    }
    assert!(ended > 0 && after.generated < before.generated);
    // On the device: the pad id after the EOS, and the length counts the EOS.
    let c = stopping.config();
    let mut ids = vec![pad as i32; 3 * 6];
    let mut lens = vec![0i32; 3];
    for (j, p) in prompts().iter().enumerate() {
        for (k, &x) in p.iter().enumerate() {
            ids[j * 6 + k] = x as i32;
        }
        lens[j] = p.len() as i32;
    }
    let raw = stopping
        .raw_outputs(&[
            shardes::HostArray::i32(&[3, 6], ids),
            shardes::HostArray::i32(&[3], lens),
        ])
        .unwrap();
    let (tokens, lengths) = (raw[0].as_i32().unwrap(), raw[1].as_i32().unwrap());
    let len0 = lengths[0] as usize;
    assert_eq!(tokens[len0 - 1], eos as i32);
    assert!(tokens[len0..c.max_new].iter().all(|&x| x == pad as i32));
}

#[derive(Deserialize)]
struct Case {
    eos: Vec<u32>,
    completions: Vec<Vec<u32>>,
    min_margin: f64,
}

#[derive(Deserialize)]
struct Generate {
    prompt_ids: Vec<Vec<u32>>,
    max_new_tokens: usize,
    cases: Vec<Case>,
}

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/qwen2_tiny")
}

#[test]
fn greedy_decoding_of_the_fixture_equals_transformers_generate() {
    let text = std::fs::read_to_string(fixture().join("generate.json")).unwrap();
    let want: Generate = serde_json::from_str(&text).unwrap();
    let client = Client::cpu(8).unwrap();
    let loaded = load_qwen2(&Qwen2Weights::Checkpoint(fixture()), DType::F32, 0).unwrap();
    // generation_config.json's ids.
    assert_eq!((loaded.eos.clone(), loaded.pad), (vec![0], Some(0)));
    let p = want.prompt_ids.iter().map(Vec::len).max().unwrap();
    let b = want.prompt_ids.len();
    for case in &want.cases {
        assert!(case.min_margin > 1e-3, "near tie {}", case.min_margin);
        let config = DecodeConfig {
            eos: case.eos.clone(),
            ..loaded.decode_config(b, p, want.max_new_tokens)
        };
        let d = PopulationDecoder::from_qwen2(&client, &es(8), &loaded, config).unwrap();
        let got = d.decode_plain(&want.prompt_ids).unwrap();
        assert_eq!(got, case.completions, "eos {:?}", case.eos);
    }
    assert!(
        want.cases[1]
            .completions
            .iter()
            .any(|c| c.len() < want.max_new_tokens),
        "the second case's EOS ends a completion early"
    );
    // The checkpoint's positions bound prompt_len + max_new.
    let too_long = loaded.decode_config(1, 60, 8);
    let e = PopulationDecoder::new(
        &client,
        &es(8),
        loaded.decoder(&too_long),
        &loaded.params,
        loaded.key,
        too_long,
    )
    .err()
    .unwrap();
    assert!(e.to_string().contains("more than the model's 64"), "{e}");
}

/// The population's tokens sampled at `generation` on `devices` devices.
fn sampled(client: &Client, generation: u32, sampling: Sampling, devices: usize) -> Decoded {
    let (cfg, tree) = model();
    let config = DecodeConfig {
        sampling,
        ..DecodeConfig::greedy(3, 6, 6)
    };
    let m = Qwen2::new(cfg.clone(), 3, 6);
    PopulationDecoder::placed(
        client,
        &es(devices),
        m,
        &tree,
        key(3).unwrap(),
        generation,
        config,
        Place::Alone,
        CompileWhen::Now,
    )
    .unwrap()
    .decode(&prompts())
    .unwrap()
}

const HOT: Sampling = Sampling::Sample {
    temperature: 1.5,
    top_p: 0.9,
};

#[test]
fn sampling_is_reproducible_from_the_key_and_generation() {
    let client = Client::cpu(8).unwrap();
    let a = sampled(&client, 4, HOT, 8);
    assert_eq!(
        a,
        sampled(&client, 4, HOT, 8),
        "same key and generation: same tokens"
    );
    assert_eq!(a, sampled(&client, 4, HOT, 1), "device-count invariant");
    assert_ne!(
        a,
        sampled(&client, 5, HOT, 8),
        "another generation draws other tokens"
    );
}

// Two more decoders to compile (about 20 s here): the slow tier.
#[test]
#[ignore = "slow tier"]
fn slow_a_vanishing_nucleus_samples_as_greedy() {
    let client = Client::cpu(8).unwrap();
    // A vanishing nucleus keeps the argmax alone: greedy.
    let narrow = Sampling::Sample {
        temperature: 1.0,
        top_p: 1e-6,
    };
    assert_eq!(
        sampled(&client, 4, narrow, 8),
        sampled(&client, 4, Sampling::Greedy, 8)
    );
}

#[test]
fn bf16_decoding_runs_and_is_device_count_invariant() {
    let client = Client::cpu(8).unwrap();
    let (cfg, tree) = model();
    let run = |devices: usize| {
        let m = Qwen2::new(cfg.clone(), 3, 6).with_compute_dtype(DType::BF16);
        let d = PopulationDecoder::new(
            &client,
            &es(devices),
            m,
            &tree,
            key(3).unwrap(),
            DecodeConfig::greedy(3, 6, 5),
        )
        .unwrap();
        let out = d.decode(&prompts()).unwrap();
        (out, d)
    };
    let (one, _) = run(1);
    let (eight, mut d) = run(8);
    assert_eq!(one, eight);
    assert_eq!(eight.generated, N * 3 * 5);
    // tell moves the parameters and the generation.
    let before = d.params().unwrap();
    d.tell(&HostFitness::F32((0..N).map(|i| i as f32).collect()))
        .unwrap();
    assert_eq!(d.generation(), 1);
    assert_ne!(d.params().unwrap(), before);
}

#[test]
fn bad_prompt_batches_are_refused_naming_the_prompt() {
    let client = Client::cpu(8).unwrap();
    let (cfg, tree) = model();
    let d = decoder(&client, &cfg, &tree, DecodeConfig::greedy(2, 4, 3));
    let refused = |prompts: &[Vec<u32>]| match d.decode(prompts) {
        Err(Error::Decode(e)) => e,
        other => panic!("expected a decode error, got {other:?}"),
    };
    assert_eq!(
        refused(&[vec![1], vec![2], vec![3]]),
        DecodeError::TooManyPrompts { got: 3, batch: 2 }
    );
    assert_eq!(
        refused(&[vec![1], vec![]]),
        DecodeError::EmptyPrompt { index: 1 }
    );
    let e = refused(&[vec![1, 2, 3, 4, 5]]);
    assert_eq!(
        e,
        DecodeError::PromptTooLong {
            index: 0,
            len: 5,
            prompt_len: 4
        }
    );
    assert!(e.to_string().contains("prompt_len = 4"), "{e}");
    assert_eq!(
        refused(&[vec![128]]),
        DecodeError::TokenOutOfVocab {
            index: 0,
            token: 128,
            vocab: 128
        }
    );
    // A model bounded to 8 positions refuses prompt_len 6 + max_new 3.
    let bounded = Bounded {
        inner: Qwen2::new(cfg.clone(), 1, 6),
        max_positions: 8,
    };
    let e = PopulationDecoder::new(
        &client,
        &es(8),
        bounded,
        &tree,
        key(3).unwrap(),
        DecodeConfig::greedy(1, 6, 3),
    )
    .err()
    .unwrap();
    assert!(e.to_string().contains("more than the model's 8"), "{e}");
}
