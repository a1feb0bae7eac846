//! `shardes export` end to end: a two-generation run of the tiny Qwen2 checkpoint exported
//! as a Hugging Face directory and a GGUF file, each loading back to the run's parameters
//! (bit for bit in f32; Q8_0 within a step of its block), and every refusal with its hint.

mod common;

use std::path::{Path, PathBuf};

use common::*;

const DATA: &str = r#"{"prompt": "low rank noise", "target": "is never"}
"#;

/// A config of a 2-generation loss run on the tiny Qwen2 checkpoint, and its run directory
/// (run once).
fn run(dir: &Path) -> (PathBuf, PathBuf) {
    let data = write(dir, "d.jsonl", DATA);
    let out = dir.join("run");
    let text = format!(
        r#"devices = 1
[problem]
name = "qwen2"
checkpoint = "{}"
data = "{}"
[es]
strategy = "mirrored(lowrank(r=1))"
n = 4
sigma = 0.01
lr = 0.01
[run]
generations = 2
out = "{}"
"#,
        repo().join("tests/fixtures/qwen2_tiny").display(),
        data.display(),
        out.display()
    );
    let config = write(dir, "q.toml", &text);
    exited(&shardes(&["run", config.to_str().unwrap()]), 0);
    (config, out)
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn a_run_exports_to_both_formats_and_loads_back() {
    let d = tempfile::tempdir().unwrap();
    let (config, out) = run(d.path());
    let hf = d.path().join("hf");
    let gguf = d.path().join("m.gguf");
    let o = shardes(&["export", s(&out), "--hf", s(&hf), "--gguf", s(&gguf)]);
    let (stdout, _) = exited(&o, 0);
    assert!(stdout.contains("26 tensors"), "{stdout}");
    assert!(
        stdout.contains(&format!("wrote {} (Hugging Face directory)", hf.display())),
        "{stdout}"
    );
    assert!(
        stdout.contains("model.safetensors") && stdout.contains("bytes"),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("wrote {} (GGUF file)", gguf.display())),
        "{stdout}"
    );

    let trained = shardes::io::read_params_inferred(out.join("params.safetensors")).unwrap();
    let (_, fixture) =
        shardes::pretrained::load(&repo().join("tests/fixtures/qwen2_tiny")).unwrap();
    for path in [&hf, &gguf] {
        let (info, back) = shardes::pretrained::load(path).unwrap();
        assert_eq!(info.family, "qwen2");
        for (name, a) in back.leaves() {
            let want = trained.get(&name).unwrap();
            assert_eq!(a.data(), want.data(), "{}: {name}", path.display());
        }
        // The run moved the weights: the export is not the starting checkpoint.
        assert!(back
            .leaves()
            .iter()
            .zip(fixture.leaves())
            .any(|((_, a), (_, b))| a.data() != b.data()));
    }

    // Again without --force: refused, nothing changed; with it, replaced (bf16, Q8_0).
    refused(
        &["export", s(&out), "--hf", s(&hf)],
        "already exists",
        "--force",
    );
    refused(
        &["export", s(&out), "--gguf", s(&gguf)],
        "already exists",
        "--force",
    );
    let o = shardes(&[
        "export",
        s(&out),
        "--hf",
        s(&hf),
        "--dtype",
        "bf16",
        "--gguf",
        s(&gguf),
        "--gguf-type",
        "Q8_0",
        "--force",
    ]);
    let (stdout, _) = exited(&o, 0);
    assert!(
        stdout.contains("bf16") && stdout.contains("Q8_0"),
        "{stdout}"
    );
    let f = shardes::gguf::GgufFile::open(&gguf).unwrap();
    assert_eq!(f.get_u64("general.file_type").unwrap(), 7);

    // A config file with --params is the same export.
    let other = d.path().join("again.gguf");
    let o = shardes(&[
        "export",
        s(&config),
        "--params",
        s(&out.join("params.safetensors")),
        "--gguf",
        s(&other),
    ]);
    exited(&o, 0);
    let (_, back) = shardes::pretrained::load(&other).unwrap();
    assert_eq!(
        back.get("model.norm.weight").unwrap().data(),
        trained.get("model.norm.weight").unwrap().data()
    );
}

#[test]
fn bad_exports_are_refused_with_a_hint() {
    let d = tempfile::tempdir().unwrap();
    let (config, out) = run(d.path());
    let target = d.path().join("x.gguf");
    refused(
        &["export", s(&out)],
        "neither --hf nor --gguf",
        "--hf OUT_DIR",
    );
    refused(
        &["export", s(&config), "--gguf", s(&target)],
        "export needs the parameters",
        "--params",
    );
    refused(
        &["export", s(d.path()), "--gguf", s(&target)],
        "no config.toml",
        "shardes run",
    );
    let file = write(d.path(), "a_file", "x");
    refused(
        &["export", s(&out), "--gguf", s(&file.join("m.gguf"))],
        "is a file, not a directory",
        "directory you can write to",
    );
    // Parameters of another model name the tensor that does not fit.
    let llama = repo().join("tests/fixtures/llama_tiny/model.safetensors");
    refused(
        &[
            "export",
            s(&out),
            "--params",
            s(&llama),
            "--gguf",
            s(&target),
        ],
        "lm_head.weight",
        "--params",
    );
    refused(
        &["export", s(&out), "--gguf", s(&target), "--hf", s(&target)],
        "both name",
        "different paths",
    );
    assert!(!target.exists());
}
