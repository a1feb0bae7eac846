//! Hostile inputs (issue #15, classes 6, 10, 11 and 12): each is refused with exit 2, one
//! line naming the key or flag and a hint, before anything is compiled and with nothing
//! written to `out/`; and configs too large to run still print and check their program,
//! which needs only shapes.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::common::*;

fn strategy(dir: &Path, s: &str) -> String {
    small_with(
        dir,
        "\"mirrored(lowrank(r=1))\"",
        &format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\"")),
    )
}

/// [`refused`], then: promptly, and `out/` untouched.
fn refused_early(dir: &Path, args: &[&str], what: &str, hint: &str) {
    let start = Instant::now();
    refused(args, what, hint);
    assert!(
        start.elapsed() < Duration::from_secs(20),
        "{args:?} took {:?}",
        start.elapsed()
    );
    assert!(!dir.join("out").exists(), "{args:?} wrote out/");
}

/// A usage error from clap: exit 2 at once, the message naming `flag` and `why`.
fn usage_error(args: &[&str], flag: &str, why: &str) {
    let start = Instant::now();
    let o = shardes(args);
    let (_, stderr) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{args:?}: {stderr}");
    assert!(
        stderr.contains(flag) && stderr.contains(why),
        "{args:?}: {stderr}"
    );
    assert!(start.elapsed() < Duration::from_secs(5), "{args:?}");
}

#[test]
fn strategies_nested_deep_or_long_are_refused_without_a_crash() {
    let d = tempfile::tempdir().unwrap();
    let deep = format!(
        "{}iid_gaussian{}",
        "mirrored(".repeat(30_000),
        ")".repeat(30_000)
    );
    for sub in ["run", "check", "hlo"] {
        let c = strategy(d.path(), &deep);
        refused_early(d.path(), &[sub, &c], "es.strategy", "valid strategies");
    }
    let o = shardes(&["check", &strategy(d.path(), &deep)]);
    let (_, stderr) = text(&o);
    assert!(stderr.contains("at most 256"), "{stderr}");
    // The 270 kB string is quoted as an excerpt, not echoed back whole.
    assert!(stderr.len() < 1000, "{} bytes of stderr", stderr.len());
    assert!(stderr.contains("… (300012 characters)"), "{stderr}");
    // Short but nested past the bound.
    let nested = format!("{}lowrank{}", "mirrored(".repeat(9), ")".repeat(9));
    let c = strategy(d.path(), &nested);
    let what = "more than 8 levels deep";
    refused_early(d.path(), &["run", &c], what, "valid strategies");
}

#[test]
fn strategy_messages_name_the_whole_word_and_refuse_repeated_arguments() {
    let d = tempfile::tempdir().unwrap();
    for (s, what) in [
        ("lörank(r=1)", "unknown strategy \"lörank\""),
        ("lowrank(r=1, r=2)", "lowrank is given argument r twice"),
        ("mirrored(lowrank(r=1,r=1))", "argument r twice"),
        ("lowrank(r=99999999999999999999999)", "is too large"),
        ("", "expected a strategy name"),
        ("lowrank(=2)", "argument name before '='"),
    ] {
        let c = strategy(d.path(), s);
        refused_early(d.path(), &["run", &c], what, "valid strategies");
    }
}

#[test]
fn a_config_too_large_to_run_prints_and_checks_its_program_from_shapes() {
    let d = tempfile::tempdir().unwrap();
    // 6 · 100000² f32 = 240 GB of parameters, never allocated by hlo or check.
    let c = small_with(d.path(), "d_model = 16", "d_model = 100000");
    let (stdout, _) = ok(&["hlo", &c]);
    assert!(stdout.starts_with("module @generation"), "{stdout:.200}");
    assert!(stdout.contains("tensor<100000x100000xf32>"));
    let (stdout, _) = ok(&["check", &c]);
    assert!(stdout.contains("reads all 6 leaves"), "{stdout}");
    // Running it needs the parameters: refused with both figures, before out/ exists.
    let o = shardes(&["run", &c]);
    let (_, stderr) = text(&o);
    // A config error (exit 2), never the allocator's abort (134).
    assert_eq!(o.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("needs 280.0 GB"), "{stderr}");
    assert!(stderr.contains("is available"), "{stderr}");
    assert!(stderr.contains("lower d_model"), "{stderr}");
    assert!(!d.path().join("out").exists());
}

#[test]
fn bench_flags_are_refused_before_anything_runs() {
    let d = tempfile::tempdir().unwrap();
    let c = small_with(d.path(), "n = 32", "n = 32");
    for (flag, value, why) in [
        ("--generations", "0", "must be at least 1"),
        ("--per-dispatch", "0", "must be at least 1"),
        ("--devices", "0", "must be at least 1"),
        ("--n", "0", "must be at least 1"),
        ("--member-chunk", "0", "must be at least 1"),
        ("--generations", "x", "must be a whole number"),
        ("--how", "C", "use A, B or AB"),
    ] {
        usage_error(&["bench", &c, flag, value], flag, why);
    }
    let json = d.path().join("no/such/dir/report.json");
    let cases: [(&[&str], &str, &str); 5] = [
        // Overrides are validated with the config as a whole.
        (
            &["--n", "7"],
            "with the command-line overrides: es.n = 7 is not divisible",
            "--n, --devices and --member-chunk replace those keys",
        ),
        (
            &["--devices", "3"],
            "es.n = 32 is not divisible by devices (3)",
            "multiple of 6",
        ),
        // A report that could not be written is refused before the benchmark, not after.
        (&["--json", s(&json)], "--json", "writable"),
        (
            &["--json", s(d.path())],
            "cannot write the report there",
            "writable",
        ),
        (
            &["--gemm-size", "100000000"],
            "the peak GEMM of --gemm-size 100000000 needs",
            "lower --gemm-size",
        ),
    ];
    for (flags, what, hint) in cases {
        refused_early(d.path(), &[&["bench", &c], flags].concat(), what, hint);
    }
    let big = small_with(d.path(), "d_model = 16", "d_model = 100000");
    let (what, hint) = ("needs 280.0 GB", "lower d_model");
    refused_early(d.path(), &["bench", &big], what, hint);
}

#[test]
fn devices_and_diag_flags_are_refused_at_once() {
    let at_least_1 = "must be at least 1";
    usage_error(&["devices", "--devices", "0"], "--devices", at_least_1);
    let d = tempfile::tempdir().unwrap();
    let c = small_with(d.path(), "n = 32", "n = 32");
    for (flag, value, why) in [
        ("--depths", "0", "between 1 and 10000"),
        ("--depths", "1,100000", "between 1 and 10000"),
        ("--ranks", "4,0", at_least_1),
    ] {
        usage_error(&["diag", &c, flag, value], flag, why);
    }
    let json = d.path().join("no/such/dir/diag.json");
    let diag = ["diag", &c, "--json", s(&json)];
    refused_early(d.path(), &diag, "--json", "writable");
    let plugin = small_with(d.path(), "devices = 2", "plugin = \"cuda\"\ndevices = 2");
    let (what, hint) = ("CPU plugin only", "remove the `plugin` key");
    refused_early(d.path(), &["diag", &plugin], what, hint);
}

// ---------------------------------------------------------------------------------------
// qwen2: config.json, weights and data checked when read
// ---------------------------------------------------------------------------------------

fn fixture() -> PathBuf {
    repo().join("tests/fixtures/qwen2_tiny")
}

/// A copy of the tiny checkpoint in `dir/ckpt` with `edit` applied to its config.json.
fn checkpoint_with(dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) -> PathBuf {
    let out = dir.join("ckpt");
    std::fs::create_dir_all(&out).unwrap();
    let mut config = json_file(&fixture().join("config.json"));
    edit(&mut config);
    write(&out, "config.json", &config.to_string());
    for name in ["model.safetensors", "tokenizer.json"] {
        std::fs::copy(fixture().join(name), out.join(name)).unwrap();
    }
    out
}

/// A qwen2 config on `weights` (`checkpoint = ...` or `size = ...`) and `data` lines.
fn qwen2(dir: &Path, weights: &str, data: &str) -> String {
    let data_path = write(dir, "d.jsonl", data);
    let text = format!(
        "devices = 2\n[problem]\nname = \"qwen2\"\n{weights}\ndata = \"{}\"\n[es]\nn = 16\n\
         sigma = 0.01\nlr = 0.01\n[run]\ngenerations = 1\nout = \"{}\"\n",
        data_path.display(),
        dir.join("out").display()
    );
    write(dir, "q.toml", &text).to_string_lossy().into_owned()
}

const DATA: &str = "{\"prompt_ids\": [5, 6], \"target_ids\": [7, 8, 9]}\n";

fn ckpt(dir: &Path) -> String {
    format!("checkpoint = \"{}\"", dir.join("ckpt").display())
}

#[test]
fn qwen2_config_values_are_validated_when_read() {
    type Edit = fn(&mut serde_json::Value);
    let cases: [(Edit, &str); 5] = [
        (|c| c["rms_norm_eps"] = (-1).into(), "rms_norm_eps = -1"),
        (
            |c| c["rope_parameters"]["rope_theta"] = 0.into(),
            "rope_theta = 0",
        ),
        (
            |c| c["num_key_value_heads"] = 3.into(),
            "num_key_value_heads = 3",
        ),
        (|c| c["hidden_size"] = 30.into(), "hidden_size = 30"),
        (
            |c| c["max_position_embeddings"] = 0.into(),
            "max_position_embeddings = 0",
        ),
    ];
    for (edit, what) in cases {
        let d = tempfile::tempdir().unwrap();
        checkpoint_with(d.path(), edit);
        let c = qwen2(d.path(), &ckpt(d.path()), DATA);
        for sub in ["run", "check"] {
            refused_early(d.path(), &[sub, &c], what, "problem.checkpoint");
        }
    }
    let d = tempfile::tempdir().unwrap();
    let c = qwen2(d.path(), "size = \"huge\"", DATA);
    refused_early(d.path(), &["run", &c], "size = \"huge\"", "\"tiny\"");
    let o = shardes(&["run", &c]);
    assert!(!text(&o).1.contains("size = 0"));
}

#[test]
fn a_layer_count_that_does_not_match_the_checkpoint_is_refused() {
    for (layers, what) in [
        (
            1,
            "num_hidden_layers = 1 but the checkpoint holds 2 layers (tensors of layers 1..2 \
             would be ignored: `model.layers.1.input_layernorm.weight`",
        ),
        (
            3,
            "num_hidden_layers = 3 but the checkpoint holds 2 layers (layers 2..3 are missing",
        ),
    ] {
        let d = tempfile::tempdir().unwrap();
        checkpoint_with(d.path(), |c| c["num_hidden_layers"] = layers.into());
        let c = qwen2(d.path(), &ckpt(d.path()), DATA);
        for sub in ["run", "check", "hlo"] {
            refused_early(d.path(), &[sub, &c], what, "problem.checkpoint");
        }
    }
}

#[test]
fn an_example_longer_than_the_model_is_refused_with_its_line() {
    let d = tempfile::tempdir().unwrap();
    checkpoint_with(d.path(), |c| c["max_position_embeddings"] = 3.into());
    let data = "{\"prompt_ids\": [1], \"target_ids\": [2]}\n".to_string() + DATA;
    let c = qwen2(d.path(), &ckpt(d.path()), &data);
    refused_early(
        d.path(),
        &["run", &c],
        "d.jsonl:2: the example has 5 tokens (prompt 2 + target 3), so the model reads 4 \
         positions, more than the checkpoint's max_position_embeddings = 3",
        "at most 4 tokens",
    );
}

#[test]
fn broken_or_non_finite_weights_are_refused_naming_the_file_or_tensor() {
    // A NaN in one weight: refused when the values are loaded, before out/ exists.
    let d = tempfile::tempdir().unwrap();
    let dir = checkpoint_with(d.path(), |_| {});
    let path = dir.join("model.safetensors");
    let mut bytes = std::fs::read(&path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let name = "model.layers.0.self_attn.q_proj.weight";
    let start = header[name]["data_offsets"][0].as_u64().unwrap() as usize;
    bytes[8 + n + start..8 + n + start + 4].copy_from_slice(&f32::NAN.to_le_bytes());
    std::fs::write(&path, &bytes).unwrap();
    let c = qwen2(d.path(), &ckpt(d.path()), DATA);
    refused_early(
        d.path(),
        &["run", &c],
        &format!("tensor `{name}`"),
        "problem.checkpoint",
    );
    let o = shardes(&["run", &c]);
    assert!(text(&o)
        .1
        .contains("non-finite value(s) (the first, NaN, at element 0)"));

    // Truncated and empty weight files: one message naming the file, said once.
    for (label, cut) in [("truncated", 100), ("empty", 0), ("tiny", 3)] {
        let d = tempfile::tempdir().unwrap();
        let dir = checkpoint_with(d.path(), |_| {});
        let whole = std::fs::read(fixture().join("model.safetensors")).unwrap();
        std::fs::write(dir.join("model.safetensors"), &whole[..cut]).unwrap();
        let c = qwen2(d.path(), &ckpt(d.path()), DATA);
        refused_early(
            d.path(),
            &["run", &c],
            "model.safetensors is not a valid safetensors file",
            "problem.checkpoint",
        );
        let o = shardes(&["check", &c]);
        let (_, stderr) = text(&o);
        assert_eq!(
            stderr.matches("valid safetensors").count(),
            1,
            "{label}: {stderr}"
        );
        assert!(!stderr.contains("HeaderTooSmall"), "{label}: {stderr}");
        assert!(
            stderr.contains("truncated"),
            "{label}: the message says what is wrong: {stderr}"
        );
    }
}
