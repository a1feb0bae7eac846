//! Hostile problem inputs refused before anything large is allocated (issue #15): Qwen2
//! `config.json` values that would make the forward NaN, a config whose layer count does
//! not match its weights, NaN weights, examples longer than the model's positions, broken
//! safetensors files, and problems too large for the host's memory; and the shapes-only
//! description of a problem matching the real one.

use std::path::{Path, PathBuf};

use shardes::hf::{check_checkpoint, load_checkpoint, parse_hf_config, read_hf_config, HfError};
use shardes::hlo::builder::DType;
use shardes::hlo::es::leaf_infos;
use shardes::hlo::problems::transformer_block::TransformerBlock;
use shardes::problem::memory::{self, MemorySource};
use shardes::{Problem, ProblemError, Qwen2Source, Qwen2Weights};

/// Checks that `text` contains each of `parts` (the message shows `text`).
fn says(text: &str, parts: &[&str]) {
    for part in parts {
        assert!(text.contains(part), "{text}");
    }
}

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/qwen2_tiny")
}

/// A copy of the tiny fixture checkpoint with `edit` applied to its config.json.
fn checkpoint_with(dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) -> PathBuf {
    let out = dir.join("ckpt");
    std::fs::create_dir_all(&out).unwrap();
    for name in ["config.json", "model.safetensors", "tokenizer.json"] {
        std::fs::copy(fixture().join(name), out.join(name)).unwrap();
    }
    let path = out.join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut config);
    std::fs::write(&path, config.to_string()).unwrap();
    out
}

/// An error and its sources joined with `: `, as `anyhow`'s `{:#}` prints them.
fn chain(e: &dyn std::error::Error) -> String {
    let mut parts = vec![e.to_string()];
    let mut cur = e.source();
    while let Some(c) = cur {
        parts.push(c.to_string());
        cur = c.source();
    }
    parts.join(": ")
}

fn source(weights: Qwen2Weights, data: PathBuf) -> Qwen2Source {
    Qwen2Source {
        weights,
        tokenizer: None,
        data,
        batch: None,
        seq: None,
        compute_dtype: DType::F32,
        layers: Default::default(),
    }
}

fn input_message(e: ProblemError) -> String {
    match e {
        ProblemError::Input { message, .. } => message,
        other => panic!("not an input error: {other}"),
    }
}

const CONFIG: &str = r#""model_type":"qwen2","vocab_size":64,"hidden_size":16,
    "intermediate_size":32,"num_hidden_layers":1,"num_attention_heads":2"#;

#[test]
fn config_values_that_make_the_forward_nan_are_refused() {
    let p = Path::new("dir/config.json");
    for (extra, needle) in [
        (r#""rms_norm_eps":-1"#, "rms_norm_eps = -1"),
        (r#""rms_norm_eps":0"#, "rms_norm_eps = 0"),
        (r#""rms_norm_eps":1e-60"#, "rms_norm_eps"),
        (r#""rope_theta":0"#, "rope_theta = 0"),
        (r#""rope_theta":-5.0"#, "rope_theta = -5"),
        (
            r#""rope_parameters":{"rope_theta":0.0,"rope_type":"default"}"#,
            "rope_theta = 0",
        ),
        (r#""num_key_value_heads":0"#, "num_key_value_heads = 0"),
        (r#""num_key_value_heads":3"#, "num_key_value_heads = 3"),
        (
            r#""max_position_embeddings":0"#,
            "max_position_embeddings = 0",
        ),
    ] {
        let text = format!("{{{CONFIG},{extra}}}");
        let e = parse_hf_config(&text, p).expect_err(extra);
        let msg = e.to_string();
        assert!(matches!(e, HfError::Config { .. }), "{extra}: {msg}");
        assert!(msg.contains(needle), "{extra}: {msg}");
        assert!(msg.contains("dir/config.json"), "{extra}: {msg}");
    }
    // Sizes that are not numbers, and sizes past what the model can hold.
    for (field, value) in [
        ("hidden_size", "-16"),
        ("num_hidden_layers", "1000000000"),
        ("vocab_size", "4294967296"),
    ] {
        let text = format!("{{{CONFIG}}}").replace(
            &format!("\"{field}\":"),
            &format!("\"{field}\":{value}, \"ignored_{field}\":"),
        );
        assert!(parse_hf_config(&text, p).is_err(), "{field} = {value}");
    }
    for (field, value) in [("hidden_size", "-32"), ("num_hidden_layers", "1.5")] {
        let text = format!("{{{CONFIG}}}").replace(
            &format!("\"{field}\":"),
            &format!("\"{field}\":{value}, \"ignored_{field}\":"),
        );
        let msg = parse_hf_config(&text, p).expect_err(field).to_string();
        assert!(
            msg.contains(&format!("{field} = {value} is invalid")),
            "{msg}"
        );
    }
    let ok = parse_hf_config(&format!("{{{CONFIG},\"max_position_embeddings\":32}}"), p)
        .expect("a valid config");
    assert_eq!(ok.max_position_embeddings, Some(32));
    assert_eq!(
        read_hf_config(fixture()).unwrap().max_position_embeddings,
        Some(64)
    );
}

#[test]
fn a_layer_count_that_does_not_match_the_weights_names_the_tensors() {
    let d = tempfile::tempdir().unwrap();
    let fewer = checkpoint_with(&d.path().join("fewer"), |c| {
        c["num_hidden_layers"] = 1.into()
    });
    let msg = load_checkpoint(&fewer)
        .expect_err("fewer layers")
        .to_string();
    says(
        &msg,
        &[
            "num_hidden_layers = 1 but the checkpoint holds 2 layers",
            "`model.layers.1.input_layernorm.weight`",
            "and 9 more",
        ],
    );
    // The headers alone show it (what `hlo` and `check` read).
    let config = read_hf_config(&fewer).unwrap().config;
    assert!(matches!(
        check_checkpoint(&fewer, &config),
        Err(HfError::LayerCount {
            config_layers: 1,
            checkpoint_layers: 2,
            ..
        })
    ));
    let more = checkpoint_with(&d.path().join("more"), |c| {
        c["num_hidden_layers"] = 4.into()
    });
    let msg = load_checkpoint(&more).expect_err("more layers").to_string();
    says(
        &msg,
        &[
            "layers 2..4 are missing",
            "`model.layers.2.input_layernorm.weight`",
        ],
    );
    // The fixture itself matches.
    check_checkpoint(fixture(), &read_hf_config(fixture()).unwrap().config).expect("fixture");
}

/// Overwrites element `at` of the f32 tensor `name` in a safetensors file with `value`.
fn poke(path: &Path, name: &str, at: usize, value: f32) {
    let mut bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    assert_eq!(header[name]["dtype"], "F32");
    let start = header[name]["data_offsets"][0].as_u64().unwrap() as usize;
    let off = 8 + n + start + 4 * at;
    bytes[off..off + 4].copy_from_slice(&value.to_le_bytes());
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn non_finite_weights_are_refused_naming_the_tensor() {
    let d = tempfile::tempdir().unwrap();
    for (value, shown) in [(f32::NAN, "NaN"), (f32::NEG_INFINITY, "-inf")] {
        let dir = checkpoint_with(&d.path().join(shown), |_| {});
        let name = "model.layers.1.mlp.up_proj.weight";
        poke(&dir.join("model.safetensors"), name, 17, value);
        poke(&dir.join("model.safetensors"), name, 40, value);
        let e = load_checkpoint(&dir).expect_err("non-finite weights");
        let msg = e.to_string();
        assert!(
            matches!(&e, HfError::NonFinite { name: n, count: 2, index: 17, .. } if n == name),
            "{msg}"
        );
        assert!(
            msg.contains(&format!("the first, {shown}, at element 17")),
            "{msg}"
        );
        says(&msg, &["model.safetensors"]);
        // The shapes need no values: a shapes-only problem still builds.
        let data = d.path().join("d.jsonl");
        std::fs::write(&data, "{\"prompt_ids\": [1], \"target_ids\": [2]}\n").unwrap();
        let src = source(Qwen2Weights::Checkpoint(dir.clone()), data);
        assert!(Problem::qwen2_shapes(&src, 0).is_ok());
        let e = Problem::qwen2(&src, 0).err().expect("refused on load");
        assert!(input_message(e).contains(name));
    }
}

#[test]
fn examples_longer_than_the_models_positions_are_refused_with_their_line() {
    let d = tempfile::tempdir().unwrap();
    let dir = checkpoint_with(d.path(), |c| c["max_position_embeddings"] = 4.into());
    let data = d.path().join("d.jsonl");
    // Line 3 needs 5 positions (6 tokens); lines 1 and 2 fit (4 and 5 tokens).
    std::fs::write(
        &data,
        "{\"prompt_ids\": [1, 2], \"target_ids\": [3, 4]}\n\
         {\"prompt_ids\": [1, 2], \"target_ids\": [3, 4, 5]}\n\n\
         {\"prompt_ids\": [1, 2, 3], \"target_ids\": [4, 5, 6]}\n",
    )
    .unwrap();
    let src = source(Qwen2Weights::Checkpoint(dir), data);
    for e in [
        Problem::qwen2_shapes(&src, 0).err().unwrap(),
        Problem::qwen2(&src, 0).err().unwrap(),
    ] {
        let msg = input_message(e);
        says(
            &msg,
            &[
                "d.jsonl:4: the example has 6 tokens",
                "max_position_embeddings = 4",
            ],
        );
    }
}

#[test]
fn a_random_preset_that_does_not_exist_is_named() {
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("d.jsonl");
    std::fs::write(&data, "{\"prompt_ids\": [1], \"target_ids\": [2]}\n").unwrap();
    let e = Problem::qwen2_shapes(&source(Qwen2Weights::Random("huge".into()), data), 0)
        .err()
        .unwrap();
    let msg = input_message(e);
    says(&msg, &["size = \"huge\""]);
    assert!(!msg.contains("size = 0"), "{msg}");
}

#[test]
fn shapes_describe_the_same_problem_without_its_values() {
    let tb = TransformerBlock {
        d_model: 8,
        batch: 2,
        seq: 3,
    };
    let real = Problem::transformer_block(tb, 5).unwrap();
    let shapes = Problem::transformer_block_shapes(tb, 5).unwrap();
    assert_eq!(shapes.leaves, leaf_infos(&real.params));
    assert_eq!(shapes.summary, real.summary);
    assert_eq!(shapes.key, real.key);
    assert_eq!(shapes.host_bytes.params, 6 * 8 * 8 * 4);
    assert_eq!(shapes.host_bytes.batch, 2 * 2 * 3 * 8 * 4);

    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("d.jsonl");
    std::fs::write(
        &data,
        "{\"prompt_ids\": [5, 6], \"target_ids\": [7, 8, 9]}\n{\"prompt_ids\": [1], \"target_ids\": [2]}\n",
    )
    .unwrap();
    for weights in [
        Qwen2Weights::Checkpoint(fixture()),
        Qwen2Weights::Random("tiny".into()),
    ] {
        let src = source(weights, data.clone());
        let real = Problem::qwen2(&src, 1).unwrap();
        let shapes = Problem::qwen2_shapes(&src, 1).unwrap();
        assert_eq!(shapes.leaves, leaf_infos(&real.params));
        assert_eq!(shapes.summary, real.summary);
        assert_eq!(
            shapes.model.batch_types(),
            real.model.batch_types(),
            "{}",
            real.summary
        );
    }
}

#[test]
fn a_problem_too_large_for_the_host_is_refused_before_allocating() {
    // 6 · (10^6)² f32 = 24 TB: more than any test machine has, refused at once.
    let tb = TransformerBlock {
        d_model: 1_000_000,
        batch: 1,
        seq: 1,
    };
    let start = std::time::Instant::now();
    let e = Problem::transformer_block(tb, 0).err().expect("refused");
    assert!(start.elapsed().as_secs() < 5);
    let ProblemError::Memory(m) = &e else {
        panic!("not a memory error: {e}");
    };
    assert!(
        m.needed >= 24_000_000_000_000 && m.needed > m.available,
        "{m:?}"
    );
    let msg = e.to_string();
    says(
        &msg,
        &["d_model = 1000000", "is available", "lower d_model"],
    );
    // The shapes of the same problem are cheap.
    let shapes = Problem::transformer_block_shapes(tb, 0).unwrap();
    assert_eq!(shapes.leaves[0].shape, [1_000_000, 1_000_000]);
    assert!(shapes.check_host_memory().is_err());
    // Dimensions whose byte count overflows u64 saturate rather than wrap to a small
    // number that would pass.
    let absurd = TransformerBlock {
        d_model: 1 << 40,
        batch: 1 << 40,
        seq: 1 << 40,
    };
    let shapes = Problem::transformer_block_shapes(absurd, 0).unwrap();
    assert_eq!(shapes.host_bytes.total(), u64::MAX);
    assert!(memory::require_within(
        shapes.host_bytes.total(),
        u64::MAX - 1,
        MemorySource::MemInfo,
        String::new,
        "d_model"
    )
    .is_err());
}

#[test]
fn broken_safetensors_files_are_described_once_naming_the_file() {
    let d = tempfile::tempdir().unwrap();
    for (name, bytes, needle) in [
        ("empty", Vec::new(), "shorter than the 8-byte header"),
        ("short", vec![1, 2, 3], "shorter than the 8-byte header"),
        (
            "truncated",
            std::fs::read(fixture().join("model.safetensors")).unwrap()[..100].to_vec(),
            "points past the end of the file (truncated)",
        ),
        (
            "appended",
            [
                std::fs::read(fixture().join("model.safetensors")).unwrap(),
                vec![0; 16],
            ]
            .concat(),
            "its size does not match the tensors its header lists",
        ),
        (
            "not_json",
            [8u64.to_le_bytes().to_vec(), b"notjson!".to_vec()].concat(),
            "not the JSON table",
        ),
    ] {
        let path = d.path().join(format!("{name}.safetensors"));
        std::fs::write(&path, &bytes).unwrap();
        let e = shardes::io::SafetensorsFile::open(&path).expect_err(name);
        // As the CLI prints it: the whole chain.
        let shown = chain(&e);
        assert!(shown.contains(needle), "{name}: {shown}");
        assert!(
            shown.contains(&path.display().to_string()),
            "{name}: {shown}"
        );
        assert_eq!(shown.matches("valid safetensors").count(), 1, "{shown}");
        assert!(!shown.contains("HeaderTooSmall"), "{shown}");
        // The same file as a checkpoint's weights.
        let dir = checkpoint_with(&d.path().join(name), |_| {});
        std::fs::write(dir.join("model.safetensors"), &bytes).unwrap();
        let msg = load_checkpoint(&dir).expect_err(name).to_string();
        assert!(msg.contains(needle), "{name}: {msg}");
        assert!(msg.contains("model.safetensors"), "{name}: {msg}");
    }
}

#[test]
fn an_index_naming_a_shard_outside_the_directory_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let shards = [
        "../model.safetensors",
        "/etc/passwd",
        "sub/x.safetensors",
        "",
    ];
    for shard in shards {
        let dir = checkpoint_with(&d.path().join(shard.replace('/', "_")), |_| {});
        let index = serde_json::json!({"weight_map": {"model.norm.weight": shard}});
        std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
        let e = load_checkpoint(&dir).expect_err(shard);
        assert!(matches!(e, HfError::BadShard { .. }), "{shard}: {e}");
    }
}
