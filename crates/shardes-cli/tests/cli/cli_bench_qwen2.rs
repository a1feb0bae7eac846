//! `shardes bench` on a qwen2 run config: the teacher-forced generation against the
//! inference limit with tokens per second, `--layers`, and the `size` dimensions grammar.

use crate::common::{json_file, ok_flags, qwen2_ids_config, refused, s, small_config, write};

fn qwen2_config(dir: &std::path::Path, size: &str) -> std::path::PathBuf {
    let data = "{\"prompt_ids\": [1, 2, 3], \"target_ids\": [4, 5]}\n\
                {\"prompt_ids\": [6, 7], \"target_ids\": [8, 9, 10]}\n";
    qwen2_ids_config(dir, size, data)
}

#[test]
fn bench_of_a_qwen2_config_reports_tokens_per_second() {
    let d = tempfile::tempdir().unwrap();
    let c = qwen2_config(d.path(), "tiny");
    let json = d.path().join("b.json");
    let flags = "--layers 1 --generations 1 --warmup 0 --gemm-size 0 --json";
    let (stdout, _) = ok_flags("bench", &c, flags, &[s(&json)]);
    for want in ["tokens/s: generation (how B)", "1 layers"] {
        assert!(stdout.contains(want), "{stdout}");
    }
    assert!(!stdout.contains("of GEMM peak"), "no FLOP lines: {stdout}");
    let v = json_file(&json);
    // Two sequences of prompt + target − 1 = 4 tokens: batch 2 × seq 4.
    assert_eq!(v["tokens_per_member"], 8, "{v}");
    assert_eq!(v["report"]["n"], 8);
    assert!(
        v["generation_tokens_per_s"][0].as_f64().unwrap() > 0.0,
        "{v}"
    );
    assert!(v["inference_tokens_per_s"].as_f64().unwrap() > 0.0, "{v}");
    assert_eq!(
        v["param_bytes"].as_u64().unwrap(),
        4 * v["params"].as_u64().unwrap()
    );
}

#[test]
fn a_size_of_dimensions_with_a_bad_value_is_refused_naming_it() {
    let d = tempfile::tempdir().unwrap();
    let c = qwen2_config(d.path(), "vocab=64,d=abc");
    refused(
        &["bench", &c.to_string_lossy()],
        "`abc` is not a positive whole number",
        "\"tiny\"",
    );
    let c = qwen2_config(d.path(), "vocab=64,width=32");
    refused(
        &["bench", &c.to_string_lossy()],
        "unknown dimension `width`",
        "\"tiny\"",
    );
}

#[test]
fn layers_is_refused_for_other_problems() {
    let d = tempfile::tempdir().unwrap();
    let text = small_config(&d.path().join("out"), 1, 1);
    let c = write(d.path(), "c.toml", &text);
    refused(
        &["bench", &c.to_string_lossy(), "--layers", "2"],
        "--layers is for qwen2 configs",
        "drop --layers",
    );
}
