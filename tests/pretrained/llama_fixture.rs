//! The LLaMA family against `transformers`: tiny random `LlamaForCausalLM`s saved by
//! `tools/llama_fixture.py` — one with an explicit `head_dim` (16, not d/H = 8), an untied
//! output head and `llama3` rotary scaling whose frequencies fall in all three of its
//! regimes (`tests/fixtures/llama_tiny/`), one with `linear` scaling and tied embeddings
//! (`tests/fixtures/llama_tiny_linear/`).
//!
//! Tolerances: logits ≤ 1e-4 absolute (f32 against PyTorch f32); rotary inverse
//! frequencies ≤ 1 ulp-scale relative 1e-6; greedy tokens exactly equal (the reference's
//! smallest top-1/top-2 margin is checked to exceed 1e-3).

use std::path::{Path, PathBuf};

use crate::support::pretrained::greedy_tokens;
use serde::Deserialize;
use shardes::hlo::problems::qwen2::RopeScaling;
use shardes::pretrained;
use shardes::runtime::Client;

#[derive(Deserialize)]
struct Rope {
    inv_freq: Vec<f32>,
}

#[derive(Deserialize)]
struct Expected {
    rope: Option<Rope>,
    ids: Vec<Vec<i32>>,
    logits_shape: Vec<usize>,
    logits: Vec<f32>,
    prompt_ids: Vec<Vec<u32>>,
    max_new_tokens: usize,
    greedy: Vec<Vec<i32>>,
    greedy_min_margin: f64,
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn expected(name: &str) -> Expected {
    let text = std::fs::read_to_string(fixture(name).join("expected.json")).expect("expected.json");
    serde_json::from_str(&text).expect("parse expected.json")
}

#[test]
fn configs_read_the_llama_settings() {
    let (info, tree) = pretrained::load(&fixture("llama_tiny")).expect("load llama_tiny");
    let c = &info.config;
    assert_eq!(info.family, "llama");
    assert_eq!(c.head_dim(), 16);
    assert!(!c.attention_bias && !c.tie_word_embeddings);
    assert!(matches!(c.rope_scaling, RopeScaling::Llama3 { .. }));
    assert!(tree.get("lm_head.weight").is_some());
    assert!(tree.get("model.layers.0.self_attn.q_proj.bias").is_none());
    assert_eq!(tree.num_leaves(), c.param_shapes().len());
    let want = expected("llama_tiny").rope.expect("rope block");
    let got = c.inv_freq();
    assert_eq!(got.len(), want.inv_freq.len());
    for (i, (g, w)) in got.iter().zip(&want.inv_freq).enumerate() {
        assert!((g - w).abs() <= 1e-6 * w.abs(), "inv_freq[{i}]: {g} vs {w}");
    }
    let (info, _) = pretrained::load(&fixture("llama_tiny_linear")).expect("load linear");
    assert!(matches!(info.config.rope_scaling, RopeScaling::Linear { factor } if factor == 4.0));
    assert!(info.config.tie_word_embeddings);
}

fn logits_match(name: &str) {
    let want = expected(name);
    let (info, tree) = pretrained::load(&fixture(name)).expect("load");
    let cfg = info.config;
    assert_eq!(
        want.logits_shape,
        [want.ids.len(), want.ids[0].len(), cfg.vocab_size]
    );
    let worst = crate::support::pretrained::logits_error(&cfg, &tree, &want.ids, &want.logits);
    println!("{name}: logits vs transformers, max abs err {worst:e}");
    assert!(worst <= 1e-4, "{name}: logits off by {worst:e}");
}

fn greedy_matches(name: &str) {
    let want = expected(name);
    let (info, tree) = pretrained::load(&fixture(name)).expect("load");
    assert!(want.greedy_min_margin > 1e-3, "{}", want.greedy_min_margin);
    let client = Client::cpu(1).expect("cpu client");
    for (prompt, greedy) in want.prompt_ids.iter().zip(&want.greedy) {
        let got = greedy_tokens(&client, &info.config, &tree, prompt, want.max_new_tokens);
        assert_eq!(&got, greedy, "{name}: prompt {prompt:?}");
    }
}

#[test]
fn llama3_scaling_untied_head_and_head_dim_match_transformers() {
    logits_match("llama_tiny");
    greedy_matches("llama_tiny");
}

#[test]
fn linear_scaling_and_tied_embeddings_match_transformers() {
    logits_match("llama_tiny_linear");
    greedy_matches("llama_tiny_linear");
}
