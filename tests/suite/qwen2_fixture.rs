//! The Qwen2 forward, greedy decoding, checkpoint loading and tokenizer against the reference
//! implementation: a tiny random model saved by Hugging Face `transformers` with its outputs
//! (`tests/fixtures/qwen2_tiny/`, written by `tools/qwen2_fixture.py`).
//!
//! Tolerances: logits ≤ 1e-4 absolute (f32 against PyTorch f32); greedy tokens and token
//! ids exactly equal.

use std::path::{Path, PathBuf};

use crate::support::pretrained::greedy_tokens;
use serde::Deserialize;
use shardes::hf::load_checkpoint;
use shardes::hlo::problems::qwen2::Qwen2Config;
use shardes::runtime::Client;
use shardes::tokenizer::Tokenizer;

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/qwen2_tiny")
}

#[derive(Deserialize)]
struct Expected {
    prompts: Vec<String>,
    prompt_ids: Vec<Vec<u32>>,
    max_new_tokens: usize,
    greedy: Vec<Vec<i32>>,
    greedy_min_margin: f64,
    ids: Vec<Vec<i32>>,
    logits_shape: Vec<usize>,
    logits: Vec<f32>,
}

fn expected() -> Expected {
    let text = std::fs::read_to_string(fixture().join("expected.json")).expect("expected.json");
    serde_json::from_str(&text).expect("parse expected.json")
}

#[test]
fn checkpoint_config_is_the_tiny_preset() {
    let (cfg, tree) = load_checkpoint(fixture()).expect("load the transformers checkpoint");
    // transformers 5 writes rope_theta inside `rope_parameters`; it must still be read.
    assert_eq!(cfg, Qwen2Config::tiny());
    assert_eq!(tree.num_leaves(), cfg.param_shapes().len());
}

#[test]
fn logits_match_transformers() {
    let want = expected();
    let (cfg, tree) = load_checkpoint(fixture()).expect("load");
    assert_eq!(
        want.logits_shape,
        [want.ids.len(), want.ids[0].len(), cfg.vocab_size]
    );
    let worst = crate::support::pretrained::logits_error(&cfg, &tree, &want.ids, &want.logits);
    let scale = want.logits.iter().map(|w| w.abs()).fold(0.0f32, f32::max);
    println!("logits vs transformers: max abs err {worst:e} (max |logit| {scale})");
    assert!(worst <= 1e-4, "logits off by {worst:e}");
}

#[test]
fn greedy_tokens_match_transformers_generate() {
    let want = expected();
    let (cfg, tree) = load_checkpoint(fixture()).expect("load");
    // The reference's argmax never hinged on a near tie, so f32 noise cannot flip a token.
    assert!(want.greedy_min_margin > 1e-3, "{}", want.greedy_min_margin);
    let client = Client::cpu(1).expect("cpu client");
    for (prompt, greedy) in want.prompt_ids.iter().zip(&want.greedy) {
        let got = greedy_tokens(&client, &cfg, &tree, prompt, want.max_new_tokens);
        assert_eq!(&got, greedy, "prompt {prompt:?}");
    }
}

#[test]
fn tokenizer_matches_the_tokenizers_library() {
    let want = expected();
    let tok = Tokenizer::from_checkpoint(fixture()).expect("tokenizer.json");
    for (text, ids) in want.prompts.iter().zip(&want.prompt_ids) {
        assert_eq!(&tok.encode(text, true).expect("encode"), ids, "{text:?}");
    }
}
