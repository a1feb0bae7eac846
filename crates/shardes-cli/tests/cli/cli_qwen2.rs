//! `[problem] name = "qwen2"` end to end: an ES run on the transformers-saved tiny
//! checkpoint (f32 and bf16 forward), and every qwen2 config error with its hint.

use std::path::Path;

use crate::common::*;

fn config(dir: &Path, problem: &str, generations: usize) -> String {
    let text = format!(
        r#"devices = 2
[problem]
name = "qwen2"
{problem}
{}[run]
generations = {generations}
out = "{}"
checkpoint_every = 2
"#,
        mirrored_es(16, 0.01, 0.01),
        dir.join("out").display()
    );
    write(dir, "q.toml", &text).to_string_lossy().into_owned()
}

fn checkpoint() -> String {
    repo()
        .join("tests/fixtures/qwen2_tiny")
        .to_string_lossy()
        .into_owned()
}

const DATA: &str = r#"{"prompt": "low rank noise", "target": "is never"}
{"prompt_ids": [5, 6], "target_ids": [7, 8, 9]}
"#;

#[test]
fn es_runs_on_the_transformers_checkpoint_in_f32_and_bf16() {
    for dtype in ["f32", "bf16"] {
        let d = tempfile::tempdir().unwrap();
        let data = write(d.path(), "d.jsonl", DATA);
        let c = config(
            d.path(),
            &format!(
                "checkpoint = \"{}\"\ndata = \"{}\"\ncompute_dtype = \"{dtype}\"",
                checkpoint(),
                data.display()
            ),
            4,
        );
        let o = shardes(&["run", &c]);
        let (stdout, stderr) = text(&o);
        assert!(o.status.success(), "{dtype}: {stdout}\n{stderr}");
        assert!(
            stdout.contains("qwen2 (checkpoint") && stdout.contains(dtype),
            "{stdout}"
        );
        let m = metrics(&d.path().join("out"));
        assert_eq!(m.len(), 4, "{dtype}");
        // At the checkpoint the model is random over 128 tokens: the NLL sits near ln 128
        // (4.85) give or take the peaked fixture weights; members differ.
        for g in &m {
            assert!(g.fitness_mean.is_finite() && g.fitness_mean > 0.5, "{g:?}");
            assert!(g.fitness_max > g.fitness_min, "{g:?}");
        }
        // The checkpoint keeps the Hugging Face names and shapes; ES moved the weights.
        let (_, before) = shardes::hf::load_checkpoint(checkpoint()).unwrap();
        let after =
            shardes::io::read_params_inferred(d.path().join("out/params.safetensors")).unwrap();
        assert_eq!(after.leaf_paths(), before.leaf_paths(), "{dtype}");
        let name = "model.layers.1.mlp.down_proj.weight";
        let (a, b) = (after.get(name).unwrap(), before.get(name).unwrap());
        assert_eq!(a.shape(), b.shape());
        assert!(a.data().iter().all(|x| x.is_finite()));
        assert!(a.data() != b.data(), "{dtype}: {name} did not move");
    }
}

/// Runs `shardes run` on a qwen2 `[problem]` body and checks the exit code 2, the error and
/// the hint.
fn refused(problem: &str, what: &str, hint: &str) {
    let d = tempfile::tempdir().unwrap();
    let problem = problem
        .replace("CKPT", &checkpoint())
        .replace("DATA", &write(d.path(), "d.jsonl", DATA).to_string_lossy());
    std::fs::write(
        d.path().join("bad.jsonl"),
        "{\"prompt_ids\": [1]}\n{\"prompt\": 3}\n",
    )
    .unwrap();
    std::fs::write(
        d.path().join("big.jsonl"),
        "{\"prompt_ids\": [1], \"target_ids\": [128]}\n",
    )
    .unwrap();
    let problem = problem.replace("BAD", &d.path().join("bad.jsonl").to_string_lossy());
    let problem = problem.replace("BIG", &d.path().join("big.jsonl").to_string_lossy());
    let c = config(d.path(), &problem, 1);
    crate::common::refused(&["run", &c], what, hint);
}

#[test]
fn qwen2_config_errors_name_the_key_and_the_fix() {
    refused(
        "checkpoint = \"CKPT\"\nsize = \"tiny\"\ndata = \"DATA\"",
        "problem.checkpoint and problem.size are both set",
        "keep one",
    );
    refused(
        "data = \"DATA\"",
        "needs problem.model, problem.checkpoint or problem.size",
        "size = \"tiny\"",
    );
    refused("size = \"tiny\"", "needs problem.data", "data = ");
    refused(
        "size = \"tiny\"\nd_model = 8\ndata = \"DATA\"",
        "problem.d_model does not apply to problem \"qwen2\"",
        "remove it",
    );
    refused(
        "size = \"tiny\"\ndata = \"DATA\"\ncompute_dtype = \"fp8\"",
        "unknown dtype \"fp8\"",
        "\"bf16\"",
    );
    refused("size = \"7b\"\ndata = \"DATA\"", "problem.size", "\"0.5b\"");
    // Text needs a tokenizer: a random model has none unless one is named.
    refused(
        "size = \"tiny\"\ndata = \"DATA\"",
        "d.jsonl:1: `prompt` is text but there is no tokenizer",
        "prompt_ids",
    );
    refused(
        "size = \"tiny\"\ndata = \"BAD\"",
        "bad.jsonl:1: missing `target`",
        "a prompt and a target",
    );
    refused(
        "size = \"tiny\"\ndata = \"BIG\"",
        "token id 128 is outside the model's vocabulary of 128",
        "ids below vocab_size",
    );
    refused(
        "checkpoint = \"CKPT\"\ndata = \"DATA\"\nbatch = 3",
        "problem.batch = 3 but",
        "remove problem.batch",
    );
    refused(
        "checkpoint = \"CKPT\"\ndata = \"DATA\"\nseq = 2",
        "problem.seq = 2",
        "raise problem.seq",
    );
    refused(
        "checkpoint = \"/nonexistent/qwen\"\ndata = \"DATA\"",
        "problem.checkpoint",
        "config.json",
    );
}

/// The trajectory covers the problem's files by content, not only by path: a resume after
/// the data file was edited in place is refused (exit 2, naming the file), and the same
/// files resume.
#[test]
fn resume_on_changed_data_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let data = write(d.path(), "d.jsonl", DATA);
    let problem = format!(
        "checkpoint = \"{}\"\ndata = \"{}\"",
        checkpoint(),
        data.display()
    );
    let c = config(d.path(), &problem, 2);
    let o = shardes(&["run", &c]);
    assert!(o.status.success(), "{:?}", text(&o));
    let longer = config(d.path(), &problem, 4);
    std::fs::write(&data, DATA.replace("low rank noise", "full rank noise")).unwrap();
    let state = std::fs::read(d.path().join("out/state.json")).unwrap();
    crate::common::refused(
        &["run", &longer, "--resume"],
        &format!(
            "--resume: {} changed since the checkpoint was written",
            data.display()
        ),
        "start over with --force",
    );
    assert_eq!(
        std::fs::read(d.path().join("out/state.json")).unwrap(),
        state
    );
    std::fs::write(&data, DATA).unwrap();
    let o = shardes(&["run", &longer, "--resume"]);
    assert!(o.status.success(), "{:?}", text(&o));
    assert!(
        text(&o).0.contains("resuming at generation 2"),
        "{:?}",
        text(&o)
    );
}
