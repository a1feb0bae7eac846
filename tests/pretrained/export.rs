//! `shardes::export` round trips on the tiny fixtures: a model exported as a Hugging Face
//! directory or a GGUF file and loaded back with `pretrained::load`.
//!
//! Tolerances:
//! - Hugging Face f32 and GGUF F32: every leaf bit-identical to the exported parameters
//!   (for LLaMA this checks the q/k permutation against the loader's un-permutation); the
//!   config equal, except `rms_norm_eps` through GGUF, which stores it as f32 and so is
//!   compared as f32. A Hugging Face export of a GGUF source keeps the f32 value.
//! - Hugging Face bf16: every value equal to its round-to-nearest-even bf16 (`half`).
//! - GGUF F16: every matrix value equal to its f16 rounding; norms and biases F32, exact.
//! - GGUF Q8_0: each matrix value within 0.57·d of the original, d = max|x| / 127 over its
//!   block of 32 (rounding to the nearest step is ≤ 0.5·d; the f16 scale adds ≤
//!   127·d·2⁻¹¹ ≈ 0.062·d); at least one value changed; norms exact; logits within 0.2 of
//!   transformers' for the unquantized model (the limit `llama_gguf.rs` states for the
//!   llama.cpp-converted Q8_0 file of the same model, measured 0.1419).
//! - The logits of a directory export of `llama_tiny` (LLaMA 3 rotary scaling, untied,
//!   explicit head width) within 1e-4 of `expected.json` (f32 against PyTorch f32).
//! - Refusals: exact substrings of the message (the path, the tensor, the setting).

use std::path::{Path, PathBuf};

use half::{bf16, f16};
use serde::Deserialize;
use shardes::export::{self, ExportError, GgufType, HfDtype, Source};
use shardes::gguf::{self, GgmlType, GgufFile, MetaValue, TensorOut};
use shardes::hlo::params::ParamTree;
use shardes::pretrained;

/// A directory export's logits against transformers' (f32 against PyTorch f32).
const F32_LOGITS_TOL: f32 = 1e-4;
/// A Q8_0 export's logits against transformers' logits of the unquantized model.
const Q8_LOGITS_TOL: f32 = 0.2;
/// A Q8_0 value's distance from the original, in units of its block's step d.
const Q8_STEP_TOL: f32 = 0.57;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

#[derive(Deserialize)]
struct Expected {
    ids: Vec<Vec<i32>>,
    logits: Vec<f32>,
}

fn expected(dir: &str) -> Expected {
    let text = std::fs::read_to_string(fixtures().join(dir).join("expected.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// The source at `rel` (under the fixtures) and its own parameters.
fn source(rel: &str) -> (Source, ParamTree) {
    let s = Source::open(&fixtures().join(rel)).unwrap();
    let (_, params) = pretrained::load(&s.path).unwrap();
    (s, params)
}

/// The first leaf whose bits differ, if any.
fn first_difference(a: &ParamTree, b: &ParamTree) -> Option<String> {
    assert_eq!(a.leaf_paths(), b.leaf_paths());
    for ((name, x), (_, y)) in a.leaves().iter().zip(b.leaves()) {
        assert_eq!(x.shape(), y.shape(), "{name}");
        if let Some(i) = x
            .data()
            .iter()
            .zip(y.data())
            .position(|(p, q)| p.to_bits() != q.to_bits())
        {
            return Some(format!("{name}[{i}]"));
        }
    }
    None
}

/// Nothing but `keep` is left in `dir` (no temporaries, no moved-aside targets).
fn only(dir: &Path, keep: &[&str]) {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let mut want: Vec<String> = keep.iter().map(|s| s.to_string()).collect();
    want.sort();
    assert_eq!(names, want, "files in {}", dir.display());
}

#[test]
fn hf_export_of_a_directory_reads_back_bit_exact_with_its_tokenizer() {
    let d = tempfile::tempdir().unwrap();
    for rel in ["qwen2_tiny", "llama_tiny"] {
        let (src, params) = source(rel);
        let out = d.path().join(rel);
        let w = export::to_hf(&src, &params, &out, HfDtype::F32, false).unwrap();
        assert_eq!(w.tensors, params.num_leaves());
        assert_eq!(w.dtype, "f32");
        assert_eq!(w.bytes, w.files.iter().map(|(_, n)| n).sum::<u64>());
        let (info, back) = pretrained::load(&out).unwrap();
        assert_eq!(info, src.info, "{rel}");
        assert_eq!(first_difference(&back, &params), None, "{rel}");
        let config: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("config.json")).unwrap())
                .unwrap();
        assert_eq!(config["model_type"], rel.split('_').next().unwrap());
        assert_eq!(config["torch_dtype"], "float32");
        assert_eq!(
            config["bos_token_id"],
            if rel == "llama_tiny" { 1 } else { 0 }
        );
    }
    // The tokenizer file is copied as it is.
    let tok = |dir: &Path| std::fs::read(dir.join("tokenizer.json")).unwrap();
    assert_eq!(
        tok(&d.path().join("qwen2_tiny")),
        tok(&fixtures().join("qwen2_tiny"))
    );
    // LLaMA 3 scaling, an untied head and an explicit head width survive: the logits are
    // transformers'.
    let (info, tree) = pretrained::load(&d.path().join("llama_tiny")).unwrap();
    let want = expected("llama_tiny");
    let worst =
        crate::support::pretrained::logits_error(&info.config, &tree, &want.ids, &want.logits);
    assert!(worst <= F32_LOGITS_TOL, "logits off by {worst:e}");
    only(d.path(), &["qwen2_tiny", "llama_tiny"]);
}

#[test]
fn hf_bf16_export_rounds_each_value_to_nearest_even() {
    let d = tempfile::tempdir().unwrap();
    let (src, params) = source("qwen2_tiny");
    let out = d.path().join("bf16");
    let w = export::to_hf(&src, &params, &out, HfDtype::BF16, false).unwrap();
    assert_eq!(w.dtype, "bf16");
    let (_, back) = pretrained::load(&out).unwrap();
    for ((name, got), (_, want)) in back.leaves().iter().zip(params.leaves()) {
        for (g, x) in got.data().iter().zip(want.data()) {
            assert_eq!(*g, bf16::from_f32(*x).to_f32(), "{name}");
        }
    }
    let config = std::fs::read_to_string(out.join("config.json")).unwrap();
    assert!(config.contains("\"torch_dtype\": \"bfloat16\""), "{config}");
}

#[test]
fn gguf_f32_export_reads_back_bit_exact_for_both_families() {
    let d = tempfile::tempdir().unwrap();
    for rel in [
        "qwen2_tiny",
        "llama_tiny_linear",
        "gguf/llama_tiny_f32.gguf",
    ] {
        let (src, params) = source(rel);
        let out = d.path().join(format!("{}.gguf", rel.replace('/', "_")));
        let w = export::to_gguf(&src, &params, &out, GgufType::F32, false).unwrap();
        assert_eq!((w.tensors, w.dtype.as_str()), (params.num_leaves(), "F32"));
        assert_eq!(w.bytes, std::fs::metadata(&out).unwrap().len());
        let (info, back) = pretrained::load(&out).unwrap();
        assert_eq!(first_difference(&back, &params), None, "{rel}");
        let mut same_eps = info.clone();
        assert_eq!(
            info.config.rms_norm_eps as f32,
            src.info.config.rms_norm_eps as f32
        );
        same_eps.config.rms_norm_eps = src.info.config.rms_norm_eps;
        assert_eq!(same_eps, src.info, "{rel}");
    }
    // The LLaMA file's q/k rows are in llama.cpp's order: the converter's own F32 file
    // of the same model holds the same bytes for them.
    let mine = GgufFile::open(d.path().join("llama_tiny_linear.gguf")).unwrap();
    let theirs = GgufFile::open(fixtures().join("gguf/llama_tiny_f32.gguf")).unwrap();
    for name in [
        "blk.0.attn_q.weight",
        "blk.1.attn_k.weight",
        "token_embd.weight",
    ] {
        let (a, b) = (mine.tensor(name).unwrap(), theirs.tensor(name).unwrap());
        assert_eq!(a.dims, b.dims, "{name}");
        assert_eq!(mine.data(a), theirs.data(b), "{name}");
    }
    for key in [
        "llama.rope.scaling.type",
        "llama.rope.scaling.factor",
        "llama.rope.dimension_count",
        "llama.context_length",
        "llama.attention.head_count_kv",
    ] {
        assert_eq!(mine.get(key), theirs.get(key), "{key}");
    }
}

#[test]
fn gguf_f16_and_q8_0_exports_are_within_their_rounding() {
    let d = tempfile::tempdir().unwrap();
    let (src, params) = source("llama_tiny_linear");
    let f16_path = d.path().join("f16.gguf");
    export::to_gguf(&src, &params, &f16_path, GgufType::F16, false).unwrap();
    let (_, back) = pretrained::load(&f16_path).unwrap();
    for ((name, got), (_, want)) in back.leaves().iter().zip(params.leaves()) {
        for (g, x) in got.data().iter().zip(want.data()) {
            let rounded = if want.shape().len() == 1 {
                *x
            } else {
                f16::from_f32(*x).to_f32()
            };
            assert_eq!(g.to_bits(), rounded.to_bits(), "{name}");
        }
    }

    let q8_path = d.path().join("q8.gguf");
    let w = export::to_gguf(&src, &params, &q8_path, GgufType::Q8_0, false).unwrap();
    assert_eq!(w.dtype, "Q8_0");
    let file = GgufFile::open(&q8_path).unwrap();
    assert_eq!(file.get_u64("general.file_type").unwrap(), 7);
    assert_eq!(
        file.tensor("blk.0.ffn_down.weight").unwrap().ggml_type,
        GgmlType::Q8_0
    );
    assert_eq!(
        file.tensor("blk.0.attn_norm.weight").unwrap().ggml_type,
        GgmlType::F32
    );
    let (info, back) = pretrained::load(&q8_path).unwrap();
    let mut changed = 0usize;
    for ((name, got), (_, want)) in back.leaves().iter().zip(params.leaves()) {
        if want.shape().len() == 1 {
            assert_eq!(got.data(), want.data(), "{name}: norms stay F32");
            continue;
        }
        // Blocks run along the rows of the stored (q/k: permuted) matrix; permuting rows
        // does not change which values share a block (rows are 32 or 64 long here), so
        // the bound is taken over 32 consecutive values of the HF layout.
        for (g, x) in got.data().chunks(32).zip(want.data().chunks(32)) {
            let d = x.iter().fold(0.0f32, |m, v| m.max(v.abs())) / 127.0;
            for (a, b) in g.iter().zip(x) {
                assert!(
                    (a - b).abs() <= Q8_STEP_TOL * d + 1e-12,
                    "{name}: {a} vs {b}, d {d}"
                );
                changed += usize::from(a != b);
            }
        }
    }
    assert!(changed > 0, "Q8_0 changed no value");
    let want = expected("llama_tiny_linear");
    let worst =
        crate::support::pretrained::logits_error(&info.config, &back, &want.ids, &want.logits);
    println!("Q8_0 export: logits vs transformers, max abs err {worst:e}");
    assert!(
        worst <= Q8_LOGITS_TOL && worst > 1e-3,
        "logits off by {worst:e}"
    );
}

/// A copy of the converter's F32 file with a chat template added (written with the
/// writer under test, which so also copies every key type the file holds): its path, the
/// file opened as a source, and its parameters.
fn gguf_with_chat_template(dir: &Path) -> (PathBuf, Source, ParamTree) {
    let src = GgufFile::open(fixtures().join("gguf/llama_tiny_f32.gguf")).unwrap();
    let mut metadata: Vec<(String, MetaValue)> = src
        .metadata()
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    metadata.push((
        "tokenizer.chat_template".into(),
        MetaValue::String(
            "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}".into(),
        ),
    ));
    let data: Vec<(String, Vec<usize>, Vec<f32>)> = src
        .tensors()
        .iter()
        .map(|t| (t.name.clone(), t.shape(), src.dequantize(t).unwrap()))
        .collect();
    let tensors: Vec<TensorOut<'_>> = data
        .iter()
        .map(|(name, shape, values)| TensorOut {
            name,
            shape,
            ty: GgmlType::F32,
            data: values,
        })
        .collect();
    let path = dir.join("with_template.gguf");
    let mut f = std::fs::File::create(&path).unwrap();
    gguf::write_gguf(&mut f, &metadata, &tensors).unwrap();
    let src = Source::open(&path).unwrap();
    let (_, params) = pretrained::load(&path).unwrap();
    (path, src, params)
}

#[test]
fn gguf_source_keeps_its_tokenizer_and_chat_template_in_both_formats() {
    let d = tempfile::tempdir().unwrap();
    let g = d.path().join("out.gguf");
    let (src_path, src, params) = gguf_with_chat_template(d.path());

    export::to_gguf(&src, &params, &g, GgufType::F32, false).unwrap();
    let (a, b) = (
        GgufFile::open(&src_path).unwrap(),
        GgufFile::open(&g).unwrap(),
    );
    for (k, v) in a.metadata() {
        if k.starts_with("tokenizer.") || k == "general.name" || k == "general.architecture" {
            assert_eq!(b.get(k), Some(v), "{k}");
        }
    }
    let h = d.path().join("hf");
    export::to_hf(&src, &params, &h, HfDtype::F32, false).unwrap();
    let text = "the quick brown fox";
    for out in [&g, &h] {
        let want = pretrained::tokenizer(&src_path).unwrap().unwrap();
        let got = pretrained::tokenizer(out).unwrap().unwrap();
        assert_eq!(
            got.encode(text, true).unwrap(),
            want.encode(text, true).unwrap(),
            "{}",
            out.display()
        );
        let chat = pretrained::chat_template(out).unwrap();
        assert_eq!(
            chat.render("hi", None).unwrap(),
            pretrained::chat_template(&src_path)
                .unwrap()
                .render("hi", None)
                .unwrap()
        );
        let (info, back) = pretrained::load(out).unwrap();
        assert_eq!(first_difference(&back, &params), None);
        assert_eq!((info.eos.clone(), info.pad), (vec![2], Some(0)));
    }
    let gen: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(h.join("generation_config.json")).unwrap())
            .unwrap();
    assert_eq!(
        gen,
        serde_json::json!({"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0})
    );
}

#[test]
fn every_metadata_type_and_q8_0_round_trip_through_the_reader() {
    let d = tempfile::tempdir().unwrap();
    let metadata: Vec<(String, MetaValue)> = vec![
        (
            "general.architecture".into(),
            MetaValue::String("llama".into()),
        ),
        ("u8".into(), MetaValue::U8(200)),
        ("i8".into(), MetaValue::I8(-100)),
        ("u16".into(), MetaValue::U16(60000)),
        ("i16".into(), MetaValue::I16(-30000)),
        ("u32".into(), MetaValue::U32(4_000_000_000)),
        ("i32".into(), MetaValue::I32(-2_000_000_000)),
        ("u64".into(), MetaValue::U64(u64::MAX)),
        ("i64".into(), MetaValue::I64(i64::MIN)),
        ("f32".into(), MetaValue::F32(1.5e-5)),
        ("f64".into(), MetaValue::F64(-2.25e300)),
        ("bool".into(), MetaValue::Bool(true)),
        ("string".into(), MetaValue::String("Grüße ✓".into())),
        (
            "strings".into(),
            MetaValue::Array(vec![
                MetaValue::String("a b".into()),
                MetaValue::String(String::new()),
            ]),
        ),
        (
            "nested".into(),
            MetaValue::Array(vec![
                MetaValue::Array(vec![MetaValue::I32(1), MetaValue::I32(-2)]),
                MetaValue::Array(vec![MetaValue::I32(3)]),
            ]),
        ),
        ("empty".into(), MetaValue::Array(vec![])),
    ];
    // Values spanning several magnitudes, in 3 rows of 64 (6 blocks).
    let values: Vec<f32> = (0..192)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) * 10f32.powi(i / 64 - 1))
        .collect();
    let tensors = [
        TensorOut {
            name: "q8",
            shape: &[3, 64],
            ty: GgmlType::Q8_0,
            data: &values,
        },
        TensorOut {
            name: "f16",
            shape: &[192],
            ty: GgmlType::F16,
            data: &values,
        },
        TensorOut {
            name: "odd",
            shape: &[3],
            ty: GgmlType::F32,
            data: &values[..3],
        },
    ];
    let path = d.path().join("types.gguf");
    let mut bytes = Vec::new();
    let n = gguf::write_gguf(&mut bytes, &metadata, &tensors).unwrap();
    assert_eq!(n as usize, bytes.len());
    std::fs::write(&path, &bytes).unwrap();
    let file = GgufFile::open(&path).unwrap();
    assert_eq!(file.version(), 3);
    for (k, v) in &metadata {
        assert_eq!(file.get(k), Some(v), "{k}");
    }
    let q8 = file.tensor("q8").unwrap();
    assert_eq!(
        (q8.dims.clone(), q8.ggml_type),
        (vec![64, 3], GgmlType::Q8_0)
    );
    assert_eq!(
        file.data(q8),
        gguf::encode("q8", GgmlType::Q8_0, &values).unwrap()
    );
    let back = file.dequantize(q8).unwrap();
    for (block, (g, x)) in back.chunks(32).zip(values.chunks(32)).enumerate() {
        let d = x.iter().fold(0.0f32, |m, v| m.max(v.abs())) / 127.0;
        // The stored scale, and each value its step count times it.
        let stored = f16::from_le_bytes([file.data(q8)[block * 34], file.data(q8)[block * 34 + 1]]);
        assert_eq!(stored, f16::from_f32(d), "block {block}");
        for (a, b) in g.iter().zip(x) {
            assert!(
                (a - b).abs() <= Q8_STEP_TOL * d,
                "block {block}: {a} vs {b}"
            );
        }
    }
    let f = file.dequantize(file.tensor("f16").unwrap()).unwrap();
    assert!(f
        .iter()
        .zip(&values)
        .all(|(a, b)| *a == f16::from_f32(*b).to_f32()));
    assert_eq!(
        file.dequantize(file.tensor("odd").unwrap()).unwrap(),
        &values[..3]
    );
}

#[test]
fn existing_targets_need_force_and_are_replaced_whole() {
    let d = tempfile::tempdir().unwrap();
    let (src, params) = source("qwen2_tiny");
    let hf = d.path().join("hf");
    let g = d.path().join("m.gguf");
    export::to_hf(&src, &params, &hf, HfDtype::BF16, false).unwrap();
    export::to_gguf(&src, &params, &g, GgufType::F16, false).unwrap();
    std::fs::write(hf.join("stale.txt"), "from before").unwrap();
    let e = export::to_hf(&src, &params, &hf, HfDtype::F32, false).unwrap_err();
    assert!(matches!(e, ExportError::Exists { .. }), "{e}");
    assert!(
        e.to_string().contains("already exists") && e.to_string().contains("--force"),
        "{e}"
    );
    let e = export::to_gguf(&src, &params, &g, GgufType::F32, false).unwrap_err();
    assert!(e.to_string().contains(&g.display().to_string()), "{e}");
    // A file where a directory goes (and the reverse) is refused even with force.
    let e = export::to_hf(&src, &params, &g, HfDtype::F32, true).unwrap_err();
    assert!(e.to_string().contains("is a file"), "{e}");
    let e = export::to_gguf(&src, &params, &hf, GgufType::F32, true).unwrap_err();
    assert!(e.to_string().contains("is a directory"), "{e}");

    export::to_hf(&src, &params, &hf, HfDtype::F32, true).unwrap();
    export::to_gguf(&src, &params, &g, GgufType::F32, true).unwrap();
    assert!(
        !hf.join("stale.txt").exists(),
        "the old directory is replaced whole"
    );
    let (_, back) = pretrained::load(&hf).unwrap();
    assert_eq!(first_difference(&back, &params), None);
    let (_, back) = pretrained::load(&g).unwrap();
    assert_eq!(first_difference(&back, &params), None);
    only(d.path(), &["hf", "m.gguf"]);
}

#[test]
fn bad_targets_are_refused_before_anything_is_written() {
    let (src, params) = source("qwen2_tiny");
    let d = tempfile::tempdir().unwrap();
    let file = d.path().join("a_file");
    std::fs::write(&file, "x").unwrap();
    let e = export::to_gguf(&src, &params, &file.join("m.gguf"), GgufType::F32, false).unwrap_err();
    assert!(matches!(e, ExportError::ParentIsFile { .. }), "{e}");
    assert!(
        e.to_string().contains("a_file is a file, not a directory"),
        "{e}"
    );
    let e = export::to_hf(&src, &params, &file.join("sub/hf"), HfDtype::F32, false).unwrap_err();
    assert!(e.to_string().contains("a_file is a file"), "{e}");
    let missing = d.path().join("no/such/hf");
    let e = export::to_hf(&src, &params, &missing, HfDtype::F32, false).unwrap_err();
    assert!(matches!(e, ExportError::ParentMissing { .. }), "{e}");
    assert!(e.to_string().contains("does not exist"), "{e}");

    // An unwritable directory: a read-only one, or (as root, whom permissions do not stop)
    // sysfs, which refuses new files to everyone.
    let ro = d.path().join("ro");
    std::fs::create_dir(&ro).unwrap();
    let mut perms = std::fs::metadata(&ro).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o555);
    std::fs::set_permissions(&ro, perms).unwrap();
    let probe = std::fs::File::create(ro.join("probe")).is_ok();
    let target = if probe {
        PathBuf::from("/sys/shardes-export-test.gguf")
    } else {
        ro.join("m.gguf")
    };
    if target.parent().is_some_and(|p| p.is_dir()) {
        let e = export::to_gguf(&src, &params, &target, GgufType::F32, false).unwrap_err();
        assert!(matches!(e, ExportError::NotWritable { .. }), "{e}");
        assert!(e.to_string().contains("is not writable"), "{e}");
        assert!(e.is_user_error());
    }
    only(d.path(), &["a_file", "ro"]);
}

#[test]
fn params_of_another_model_are_refused_naming_the_tensor() {
    let d = tempfile::tempdir().unwrap();
    let (qwen, _) = source("qwen2_tiny");
    let (llama, llama_params) = source("llama_tiny");
    let (linear, _) = source("llama_tiny_linear");
    let write = |name: &str, tree: &ParamTree| {
        let p = d.path().join(name);
        shardes::io::write_params(&p, tree).unwrap();
        p
    };
    let llama_file = write("llama.safetensors", &llama_params);
    // Other names: qwen2's biases are missing, or llama's untied head is extra.
    let e = export::read_params(&llama_file, &qwen).unwrap_err();
    assert!(matches!(e, ExportError::Params { .. }), "{e}");
    assert!(e.to_string().contains("lm_head.weight"), "{e}");
    assert!(e.to_string().contains("another model's run"), "{e}");
    // The same names, another shape: llama_tiny's explicit head width 16 against 8.
    let e = export::read_params(&llama_file, &linear).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("self_attn.q_proj.weight` has shape [64, 32]")
            || msg.contains("lm_head.weight"),
        "{msg}"
    );
    // The run's own file passes.
    assert_eq!(
        first_difference(
            &export::read_params(&llama_file, &llama).unwrap(),
            &llama_params
        ),
        None
    );
    // A non-finite value is named.
    let mut bad = llama_params.clone();
    bad.leaves_mut()[3].data_mut()[5] = f32::NAN;
    let e = export::read_params(&write("nan.safetensors", &bad), &llama).unwrap_err();
    assert!(
        e.to_string()
            .contains("non-finite value (NaN) at element 5"),
        "{e}"
    );
}

#[test]
fn settings_a_gguf_file_cannot_hold_are_refused_leaving_nothing() {
    let (src, params) = source("llama_tiny");
    let d = tempfile::tempdir().unwrap();
    let target = d.path().join("m.gguf");
    let e = export::to_gguf(&src, &params, &target, GgufType::F32, false).unwrap_err();
    assert!(matches!(e, ExportError::Unsupported { .. }), "{e}");
    assert!(
        e.to_string().contains("rope_scaling") && e.to_string().contains("--hf"),
        "{e}"
    );
    only(d.path(), &[]);
}

#[test]
fn a_directorys_byte_level_tokenizer_becomes_gguf_tokenizer_keys() {
    let d = tempfile::tempdir().unwrap();
    let (gguf_src, src, params) = gguf_with_chat_template(d.path());
    // GGUF → directory (tokenizer.json rebuilt) → GGUF (tokenizer keys converted back).
    let hf = d.path().join("hf");
    export::to_hf(&src, &params, &hf, HfDtype::F32, false).unwrap();
    let back = d.path().join("back.gguf");
    let w = export::to_gguf(
        &Source::open(&hf).unwrap(),
        &params,
        &back,
        GgufType::F32,
        false,
    )
    .unwrap();
    assert!(w.notes.is_empty(), "{:?}", w.notes);
    let (a, b) = (
        GgufFile::open(&gguf_src).unwrap(),
        GgufFile::open(&back).unwrap(),
    );
    for key in [
        "tokenizer.ggml.model",
        "tokenizer.ggml.pre",
        "tokenizer.ggml.tokens",
        "tokenizer.ggml.token_type",
        "tokenizer.ggml.merges",
        "tokenizer.ggml.bos_token_id",
        "tokenizer.ggml.eos_token_id",
        "tokenizer.ggml.padding_token_id",
        "tokenizer.chat_template",
    ] {
        assert_eq!(
            b.get(key).map(|v| v.describe()),
            a.get(key).map(|v| v.describe()),
            "{key}"
        );
        assert_eq!(b.get(key), a.get(key), "{key}");
    }
    let text = "the quick brown fox";
    assert_eq!(
        pretrained::tokenizer(&back)
            .unwrap()
            .unwrap()
            .encode(text, true)
            .unwrap(),
        pretrained::tokenizer(&gguf_src)
            .unwrap()
            .unwrap()
            .encode(text, true)
            .unwrap()
    );
    // A tokenizer that is not byte-level BPE is not converted, and the export says so.
    let (qwen, qwen_params) = source("qwen2_tiny");
    let w = export::to_gguf(
        &qwen,
        &qwen_params,
        &d.path().join("q.gguf"),
        GgufType::F32,
        false,
    )
    .unwrap();
    assert!(
        w.notes.iter().any(|n| n.contains("not byte-level BPE")),
        "{:?}",
        w.notes
    );
}
