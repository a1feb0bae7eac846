//! Loading tiny Qwen2 checkpoints written here in the Hugging Face layout (config.json,
//! safetensors in bf16 / f32, single file and sharded with an index), the loading errors,
//! and the tokenizer from a `tokenizer.json` written here.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use half::bf16;
use safetensors::tensor::{Dtype, TensorView};
use shardes::hf::{load_checkpoint, HfError};
use shardes::hlo::params::ParamTree;
use shardes::hlo::prng::key;
use shardes::hlo::problems::qwen2::Qwen2Config;
use shardes::tokenizer::{lm_batch, Tokenizer};

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("shardes-qwen2-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

fn config_json(c: &Qwen2Config) -> String {
    format!(
        r#"{{"architectures":["Qwen2ForCausalLM"],"model_type":"qwen2","vocab_size":{},
        "hidden_size":{},"intermediate_size":{},"num_hidden_layers":{},
        "num_attention_heads":{},"num_key_value_heads":{},"rope_theta":{:.1},
        "rms_norm_eps":{:e},"tie_word_embeddings":{},"torch_dtype":"bfloat16"}}"#,
        c.vocab_size,
        c.hidden_size,
        c.intermediate_size,
        c.num_hidden_layers,
        c.num_attention_heads,
        c.num_key_value_heads,
        c.rope_theta,
        c.rms_norm_eps,
        c.tie_word_embeddings
    )
}

/// Raw little-endian bytes of `data` in `dtype`.
/// One tensor to write: name, shape, dtype, values.
type Tensor = (String, Vec<usize>, Dtype, Vec<f32>);

/// Edits the tensors of a checkpoint to break it in one way.
type Breakage = Box<dyn Fn(&mut Vec<Tensor>)>;

/// The tensor `name` of `t`.
fn named<'a>(t: &'a mut [Tensor], name: &str) -> &'a mut Tensor {
    t.iter_mut().find(|(n, ..)| n == name).expect(name)
}

fn encode(data: &[f32], dtype: Dtype) -> Vec<u8> {
    match dtype {
        Dtype::F32 => data.iter().flat_map(|x| x.to_le_bytes()).collect(),
        Dtype::BF16 => data
            .iter()
            .flat_map(|&x| bf16::from_f32(x).to_le_bytes())
            .collect(),
        Dtype::F64 => data
            .iter()
            .flat_map(|&x| f64::from(x).to_le_bytes())
            .collect(),
        other => panic!("test encodes no {other:?}"),
    }
}

/// Writes `tensors` (name, shape, dtype, data) into one safetensors file.
fn write_file(path: &Path, tensors: &[Tensor]) {
    let bytes: Vec<Vec<u8>> = tensors.iter().map(|(_, _, d, x)| encode(x, *d)).collect();
    let views: Vec<(String, TensorView)> = tensors
        .iter()
        .zip(&bytes)
        .map(|((n, s, d, _), b)| (n.clone(), TensorView::new(*d, s.clone(), b).expect("view")))
        .collect();
    safetensors::serialize_to_file(views, &None, path).expect("write safetensors");
}

/// The tensors of `tree`: 2-D leaves in `matrix_dtype`, the rest in f32 (as real Qwen
/// checkpoints mix nothing, this exercises both conversions in one load).
fn tensors(tree: &ParamTree, matrix_dtype: Dtype) -> Vec<Tensor> {
    tree.leaves()
        .into_iter()
        .map(|(p, a)| {
            let d = if a.ndim() == 2 {
                matrix_dtype
            } else {
                Dtype::F32
            };
            (p, a.shape().to_vec(), d, a.data().to_vec())
        })
        .collect()
}

fn tiny() -> (Qwen2Config, ParamTree) {
    let c = Qwen2Config::tiny();
    let p = c.init(key(11).expect("key"), 0.5).expect("init");
    (c, p)
}

fn bf16_round(x: f32) -> f32 {
    bf16::from_f32(x).to_f32()
}

#[test]
fn single_file_bf16_and_f32_loads_exactly() {
    let (c, p) = tiny();
    let dir = temp_dir("single");
    std::fs::write(dir.join("config.json"), config_json(&c)).unwrap();
    write_file(&dir.join("model.safetensors"), &tensors(&p, Dtype::BF16));
    let (c2, loaded) = load_checkpoint(&dir).expect("load");
    assert_eq!(c2, c);
    assert_eq!(loaded.leaf_paths(), p.leaf_paths());
    for ((path, want), (_, got)) in p.leaves().into_iter().zip(loaded.leaves()) {
        assert_eq!(got.shape(), want.shape(), "{path}");
        for (g, w) in got.data().iter().zip(want.data()) {
            let w = if want.ndim() == 2 { bf16_round(*w) } else { *w };
            assert_eq!(g.to_bits(), w.to_bits(), "{path}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sharded_checkpoint_with_index_loads() {
    let (mut c, _) = tiny();
    c.tie_word_embeddings = false;
    let p = c.init(key(12).unwrap(), 0.5).unwrap();
    let dir = temp_dir("sharded");
    std::fs::write(dir.join("config.json"), config_json(&c)).unwrap();
    let all = tensors(&p, Dtype::F32);
    let (a, b) = all.split_at(all.len() / 2);
    let names = [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ];
    write_file(&dir.join(names[0]), a);
    write_file(&dir.join(names[1]), b);
    let mut map = BTreeMap::new();
    for (i, part) in [a, b].iter().enumerate() {
        for (n, ..) in part.iter() {
            map.insert(n.clone(), names[i].to_string());
        }
    }
    let index = serde_json::json!({"metadata": {"total_size": 0}, "weight_map": map});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
    let (_, loaded) = load_checkpoint(&dir).expect("load sharded");
    assert!(loaded.get("lm_head.weight").is_some());
    assert_eq!(loaded, p);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn loading_errors_name_the_tensor() {
    let (c, p) = tiny();
    let cases: Vec<(&str, Breakage, &str)> = vec![
        (
            "missing",
            Box::new(|t| t.retain(|(n, ..)| n != "model.layers.1.mlp.up_proj.weight")),
            "tensor `model.layers.1.mlp.up_proj.weight` is missing",
        ),
        (
            "shape",
            Box::new(|t| named(t, "model.norm.weight").1 = vec![2, 16]),
            "tensor `model.norm.weight` has shape [2, 16] but config.json implies [32]",
        ),
        (
            "dtype",
            Box::new(|t| named(t, "model.layers.0.self_attn.q_proj.bias").2 = Dtype::F64),
            "tensor `model.layers.0.self_attn.q_proj.bias` is stored as F64",
        ),
    ];
    for (name, edit, want) in cases {
        let dir = temp_dir(name);
        std::fs::write(dir.join("config.json"), config_json(&c)).unwrap();
        let mut t = tensors(&p, Dtype::BF16);
        edit(&mut t);
        write_file(&dir.join("model.safetensors"), &t);
        let err = load_checkpoint(&dir).expect_err(name);
        let msg = err.to_string();
        assert!(msg.contains(want), "{name}: {msg}");
        let _ = std::fs::remove_dir_all(&dir);
    }
    let dir = temp_dir("empty");
    std::fs::write(dir.join("config.json"), config_json(&c)).unwrap();
    assert!(matches!(
        load_checkpoint(&dir),
        Err(HfError::NoWeights { .. })
    ));
    std::fs::remove_file(dir.join("config.json")).unwrap();
    let msg = load_checkpoint(&dir).expect_err("no config").to_string();
    assert!(msg.contains("config.json"), "{msg}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn tokenizer_json_round_trip_and_batch() {
    let dir = temp_dir("tok");
    // A WordLevel model with whitespace pre-tokenization, in the tokenizers JSON format.
    let tok = r#"{
      "version": "1.0",
      "truncation": null,
      "padding": null,
      "added_tokens": [
        {"id": 0, "content": "<pad>", "single_word": false, "lstrip": false, "rstrip": false,
         "normalized": false, "special": true}
      ],
      "normalizer": null,
      "pre_tokenizer": {"type": "Whitespace"},
      "post_processor": null,
      "decoder": null,
      "model": {
        "type": "WordLevel",
        "vocab": {"<pad>": 0, "<unk>": 1, "the": 2, "cat": 3, "sat": 4, "on": 5, "mat": 6},
        "unk_token": "<unk>"
      }
    }"#;
    std::fs::write(dir.join("tokenizer.json"), tok).unwrap();
    let t = Tokenizer::from_checkpoint(&dir).expect("tokenizer");
    assert_eq!(t.vocab_size(), 7);
    let ids = t.encode("the cat sat on the mat", false).expect("encode");
    assert_eq!(ids, [2, 3, 4, 5, 2, 6]);
    assert_eq!(t.encode("the dog", false).unwrap(), [2, 1]);
    assert_eq!(t.token_to_id("mat"), Some(6));
    let text = t.decode(&ids, true).expect("decode");
    assert_eq!(text, "the cat sat on the mat");
    let prompt = t.encode("the cat", false).unwrap();
    let target = t.encode("sat", false).unwrap();
    let b = lm_batch(&[(prompt, target)], 4, 0).unwrap();
    assert_eq!(b.ids, [2, 3, 0, 0]);
    assert_eq!(b.targets, [3, 4, 0, 0]);
    assert_eq!(b.mask, [0.0, 1.0, 0.0, 0.0]);
    let err = Tokenizer::from_file(dir.join("missing.json"))
        .err()
        .expect("missing");
    assert!(err.to_string().contains("missing.json"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
