//! LLaMA-architecture GGUF files against the Hugging Face directory they were converted
//! from: `tests/fixtures/llama_tiny_linear/` (tied embeddings, `linear` rotary scaling,
//! factor 4) written by `tools/llama_gguf_fixture.py` the way llama.cpp's
//! `convert_hf_to_gguf.py` writes a `LlamaForCausalLM` (q/k rows permuted, `llama.*` keys,
//! no `output.weight`) into `tests/fixtures/gguf/`: `llama_tiny_f32.gguf` (all F32),
//! `llama_tiny_q8.gguf` (matrices Q8_0, norms F32) and `llama_tiny_yarn.gguf` (Q8_0, with
//! the `yarn` rotary scaling keys shardes refuses).
//!
//! Tolerances:
//! - F32 file: every leaf bit-identical to the directory's (this checks the q/k
//!   un-permutation exactly); the config equal to the directory's, except `rms_norm_eps`,
//!   which GGUF stores as f32 and so is compared as f32 (1e-5 widens to 9.99999974737875e-6);
//!   logits ≤ 1e-4 absolute from `expected.json` (f32 against PyTorch f32, as in
//!   `tests/pretrained/llama_fixture.rs`).
//! - Q8_0 file: each matrix value within 0.57·d of the directory's, d = max|x| / 127 over
//!   its block of 32 (rounding to the nearest step of d is ≤ 0.5·d; the f16 scale adds
//!   ≤ 127·d·2⁻¹¹ ≈ 0.062·d), and at least one value not equal (the file is quantized);
//!   norms bit-identical. Logits ≤ [`Q8_LOGITS_TOL`] = 0.2 absolute from `expected.json`:
//!   transformers measured 0.1419 on this file (`llama_tiny_gguf.json`), all of it Q8_0
//!   rounding (the same quantize-dequantize applied to the safetensors weights gives the
//!   same 0.1419); our forward matches transformers' to ≤ 1e-4 on equal weights, so 0.2
//!   leaves 40% margin while a wrong dequantization or permutation (logits off by ~1, as
//!   without the scaling: 3.58) fails. The measured value must also exceed 1e-3.
//! - Damaged files: exact substrings of the message (the file's path, the key or tensor,
//!   the values).

use std::path::{Path, PathBuf};

use serde::Deserialize;
use shardes::hlo::params::ParamTree;
use shardes::hlo::problems::qwen2::Qwen2Config;
use shardes::pretrained::{self, ModelError};

use crate::gguf_read::find_once;
use crate::support::says;

/// The F32 file's logits against transformers' f32 ones.
const F32_LOGITS_TOL: f32 = 1e-4;
/// The Q8_0 file's logits against transformers' logits of the unquantized model.
const Q8_LOGITS_TOL: f32 = 0.2;
/// A Q8_0 value's distance from the original, in units of its block's step d.
const Q8_STEP_TOL: f32 = 0.57;

#[derive(Deserialize)]
struct Expected {
    ids: Vec<Vec<i32>>,
    logits_shape: Vec<usize>,
    logits: Vec<f32>,
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn hf_dir() -> PathBuf {
    fixtures().join("llama_tiny_linear")
}

fn gguf(name: &str) -> PathBuf {
    fixtures().join("gguf").join(name)
}

fn expected() -> Expected {
    let text = std::fs::read_to_string(hf_dir().join("expected.json")).expect("expected.json");
    serde_json::from_str(&text).expect("parse expected.json")
}

/// The largest absolute difference of `config`/`tree`'s logits from `expected.json`'s.
fn logits_error(config: &Qwen2Config, tree: &ParamTree) -> f32 {
    let want = expected();
    assert_eq!(
        want.logits_shape,
        [want.ids.len(), want.ids[0].len(), config.vocab_size]
    );
    crate::support::pretrained::logits_error(config, tree, &want.ids, &want.logits)
}

#[test]
fn f32_file_loads_to_the_directorys_config_leaves_and_logits() {
    let (hf_info, hf_tree) = pretrained::load(&hf_dir()).expect("load the HF directory");
    let path = gguf("llama_tiny_f32.gguf");
    let (info, tree) = pretrained::load(&path).expect("load the F32 GGUF");

    // GGUF stores the norm epsilon as f32; everything else must be equal.
    assert_eq!(
        info.config.rms_norm_eps as f32,
        hf_info.config.rms_norm_eps as f32
    );
    let mut same_eps = info.clone();
    same_eps.config.rms_norm_eps = hf_info.config.rms_norm_eps;
    assert_eq!(same_eps, hf_info);
    assert_eq!(info.family, "llama");
    assert!(info.config.tie_word_embeddings);

    let hf_leaves = hf_tree.leaves();
    let leaves = tree.leaves();
    let names: Vec<&str> = leaves.iter().map(|(p, _)| p.as_str()).collect();
    let hf_names: Vec<&str> = hf_leaves.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(names, hf_names);
    for ((name, got), (_, want)) in leaves.iter().zip(&hf_leaves) {
        assert_eq!(got.shape(), want.shape(), "{name}");
        let differ = got
            .data()
            .iter()
            .zip(want.data())
            .position(|(g, w)| g.to_bits() != w.to_bits());
        assert_eq!(differ, None, "{name}: first differing element");
    }

    let worst = logits_error(&info.config, &tree);
    println!("F32 GGUF: logits vs transformers, max abs err {worst:e}");
    assert!(worst <= F32_LOGITS_TOL, "logits off by {worst:e}");
}

#[test]
fn q8_file_is_within_one_quantization_step_and_its_logits_within_tolerance() {
    let (hf_info, hf_tree) = pretrained::load(&hf_dir()).expect("load the HF directory");
    let (info, tree) = pretrained::load(&gguf("llama_tiny_q8.gguf")).expect("load the Q8 GGUF");
    let mut same_eps = info.config.clone();
    same_eps.rms_norm_eps = hf_info.config.rms_norm_eps;
    assert_eq!(same_eps, hf_info.config);

    let mut quantized = 0usize;
    for (name, want) in hf_tree.leaves() {
        let got = tree.get(&name).unwrap_or_else(|| panic!("{name} missing"));
        assert_eq!(got.shape(), want.shape(), "{name}");
        if want.shape().len() == 1 {
            let same = got
                .data()
                .iter()
                .zip(want.data())
                .all(|(g, w)| g.to_bits() == w.to_bits());
            assert!(same, "{name}: a norm must stay F32");
            continue;
        }
        let cols = want.shape()[1];
        assert_eq!(cols % 32, 0, "{name}: rows of whole Q8_0 blocks");
        for (b, (gb, wb)) in got
            .data()
            .chunks(32)
            .zip(want.data().chunks(32))
            .enumerate()
        {
            let d = wb.iter().fold(0.0f32, |m, x| m.max(x.abs())) / 127.0;
            for (k, (g, w)) in gb.iter().zip(wb).enumerate() {
                assert!(
                    (g - w).abs() <= Q8_STEP_TOL * d,
                    "{name}: element {} is {g}, the original {w} (step {d})",
                    b * 32 + k
                );
                quantized += usize::from(g != w);
            }
        }
    }
    assert!(
        quantized > 0,
        "no matrix value differs: the file is not Q8_0"
    );

    let worst = logits_error(&info.config, &tree);
    println!("Q8_0 GGUF: logits vs transformers' f32 model, max abs err {worst:e}");
    assert!(worst <= Q8_LOGITS_TOL, "logits off by {worst:e}");
    assert!(worst > 1e-3, "logits off by only {worst:e}: not quantized?");
}

/// The offset of the value of metadata key `key`, after its u32 type, which must be `ty`
/// (4: u32, 8: string).
fn value_at(bytes: &[u8], key: &str, ty: u32) -> usize {
    let at = find_once(bytes, key.as_bytes()) + key.len();
    let got = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
    assert_eq!(got, ty, "type of {key}");
    at + 4
}

/// A copy of the F32 file in a temporary directory, changed by `edit`.
fn mutated(edit: impl FnOnce(&mut Vec<u8>)) -> (tempfile::TempDir, PathBuf) {
    let mut bytes = std::fs::read(gguf("llama_tiny_f32.gguf")).expect("read the F32 GGUF");
    edit(&mut bytes);
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("mutated.gguf");
    std::fs::write(&path, bytes).expect("write the mutated copy");
    (dir, path)
}

/// Sets the u32 metadata value of `key`, which must hold `old`.
fn set_u32(bytes: &mut [u8], key: &str, old: u32, new: u32) {
    let at = value_at(bytes, key, 4);
    assert_eq!(
        u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()),
        old
    );
    bytes[at..at + 4].copy_from_slice(&new.to_le_bytes());
}

/// The message of `result`'s error, which must name `path`.
fn message<T: std::fmt::Debug>(result: Result<T, ModelError>, path: &Path) -> String {
    let text = result.expect_err("must fail").to_string();
    let shown = path.display().to_string();
    assert!(text.contains(&shown), "{text:?} does not name {shown}");
    println!("{text}");
    text
}

#[test]
fn an_unknown_architecture_is_refused_listing_the_known_ones() {
    let (_dir, path) = mutated(|b| {
        // The string value: u64 length 5, then the bytes.
        let at = value_at(b, "general.architecture", 8);
        assert_eq!(&b[at..at + 13], b"\x05\0\0\0\0\0\0\0llama");
        b[at + 12] = b'q';
    });
    let text = message(pretrained::load(&path), &path);
    says(&text, &["general.architecture = `llamq`"]);
    for family in shardes::family::FAMILIES {
        for arch in family.gguf_architectures {
            assert!(text.contains(&format!("`{arch}`")), "{text} lacks {arch}");
        }
    }
}

#[test]
fn a_missing_required_key_is_named() {
    let (_dir, path) = mutated(|b| {
        let at = find_once(b, b"llama.block_count");
        b[at..at + 17].copy_from_slice(b"llama.block_c0unt");
    });
    let text = message(pretrained::read_info(&path), &path);
    says(&text, &["metadata key `llama.block_count` is missing"]);
}

#[test]
fn a_tensor_shape_that_does_not_fit_the_keys_names_both_shapes() {
    let (_dir, path) = mutated(|b| set_u32(b, "llama.feed_forward_length", 64, 96));
    // The keys alone are consistent; the tensors are not.
    let info = pretrained::read_info(&path).expect("keys read");
    assert_eq!(info.config.intermediate_size, 96);
    let forms = [
        ("ffn_gate", [64, 32], [96, 32]),
        ("ffn_up", [64, 32], [96, 32]),
        ("ffn_down", [32, 64], [32, 96]),
    ]
    .map(|(t, has, wants)| {
        format!("tensor `blk.0.{t}.weight` has shape {has:?}, but the file's keys imply {wants:?}")
    });
    for text in [
        message(pretrained::check_weights(&path, &info.config), &path),
        message(pretrained::load(&path), &path),
    ] {
        assert!(forms.iter().any(|f| text.contains(f)), "{text}");
    }
}

#[test]
fn a_layer_past_block_count_is_refused() {
    let (_dir, path) = mutated(|b| set_u32(b, "llama.block_count", 2, 1));
    let text = message(pretrained::load(&path), &path);
    says(
        &text,
        &[
            "tensor `blk.1.",
            "is of layer 1, but the file's block_count is 1",
        ],
    );
}

#[test]
fn an_unsupported_rope_scaling_is_named() {
    let path = gguf("llama_tiny_yarn.gguf");
    let text = message(pretrained::read_info(&path), &path);
    says(
        &text,
        &["`llama.rope.scaling.type` = `yarn` is not supported"],
    );
}

#[test]
fn a_path_that_is_neither_a_directory_nor_gguf_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("model.bin");
    std::fs::write(&path, b"PK\x03\x04 not a model").expect("write");
    let text = message(pretrained::read_info(&path), &path);
    says(
        &text,
        &["is neither a Hugging Face model directory nor a GGUF file"],
    );
    let missing = dir.path().join("absent");
    let text = message(pretrained::read_info(&missing), &missing);
    says(&text, &["is neither"]);
    // A `.gguf` name with other bytes goes to the GGUF reader, which names the file.
    let fake = dir.path().join("fake.gguf");
    std::fs::write(&fake, b"not a GGUF file at all").expect("write");
    message(pretrained::read_info(&fake), &fake);
}
