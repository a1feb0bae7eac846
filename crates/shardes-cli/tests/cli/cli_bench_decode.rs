//! `shardes bench` on a decode config (a `[decode]` section): the table of the ES decode
//! against the plain batched decode, the JSON report, and config errors (exit 2).

use crate::common::{json_file, mirrored_es, ok_flags, refused, s, write};

/// A decode config small enough to compile and run in well under a minute.
fn decode_config(extra: &str) -> String {
    format!(
        r#"devices = 2
[decode]
size = "tiny"
batch = 2
prompt_len = 4
max_new = 3
{extra}
{}"#,
        mirrored_es(8, 0.01, 0.01)
    )
}

#[test]
fn bench_on_a_decode_config_prints_the_ratio_and_writes_json() {
    let d = tempfile::tempdir().unwrap();
    let c = write(d.path(), "d.toml", &decode_config(""));
    let json = d.path().join("r.json");
    let flags = "--generations 2 --warmup 0 --json";
    let (table, _) = ok_flags("bench", &c, flags, &[s(&json)]);
    for want in ["ES decode", "plain decode", "tokens/s ratio"] {
        assert!(table.contains(want), "{table}");
    }
    let r = json_file(&json);
    assert_eq!(r["tokens_per_call"], 8 * 2 * 3);
    assert!(r["ratio"].as_f64().unwrap() > 0.0);
    assert!(r["es"]["tokens_per_s"].as_f64().unwrap() > 0.0);
    // A difference of two timings: present, of either sign under load.
    assert!(r["es"]["step_ms"].is_f64());
    assert!(r["gemm_peak_gflops"].as_f64().unwrap() > 0.0);
    assert!(table.contains("GEMM peak"), "{table}");
}

#[test]
fn a_bad_decode_config_is_a_config_error() {
    let d = tempfile::tempdir().unwrap();
    let c = write(d.path(), "d.toml", &decode_config("compute_dtype = \"f8\""));
    refused(
        &["bench", &c.to_string_lossy()],
        "decode.compute_dtype",
        "bf16",
    );
    let c = write(d.path(), "e.toml", &decode_config("typo = 1"));
    refused(&["bench", &c.to_string_lossy()], "typo", "[decode]");
}
