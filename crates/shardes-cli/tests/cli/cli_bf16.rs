//! `es.compute_dtype` end to end: a bf16 transformer_block run (finite, and not the f32
//! run's trajectory), and the config errors naming the key and the valid values.

use crate::common::*;

fn with_dtype(out: &std::path::Path, line: &str) -> String {
    small_config(out, 3, 3).replace("how = \"B\"", &format!("how = \"B\"\n{line}"))
}

#[test]
fn a_bf16_run_trains_and_differs_from_the_f32_run() {
    let d = tempfile::tempdir().unwrap();
    let mut finals = Vec::new();
    for dtype in ["f32", "bf16"] {
        let out = d.path().join(dtype);
        let text = with_dtype(&out, &format!("compute_dtype = \"{dtype}\""));
        ok(&["run", s(&write(d.path(), &format!("{dtype}.toml"), &text))]);
        let m = metrics(&out);
        assert_eq!(m.len(), 3, "{dtype}: one metrics line per generation");
        let last = m.last().unwrap();
        assert!(last.fitness_mean.is_finite(), "{dtype}: {last:?}");
        finals.push(last.fitness_mean);
        // The resolved config records the key.
        let written = std::fs::read_to_string(out.join("config.toml")).unwrap();
        assert!(
            written.contains(&format!("compute_dtype = \"{dtype}\"")),
            "{written}"
        );
    }
    let rel = (finals[0] - finals[1]).abs() / finals[0].abs();
    println!(
        "final mean loss f32 {} bf16 {} (rel {rel:e})",
        finals[0], finals[1]
    );
    assert!(
        rel > 0.0,
        "the bf16 run followed the f32 trajectory exactly"
    );
    // bf16 keeps 8 significant bits; three generations apart, the mean loss stays close.
    assert!(rel < 2e-2, "the bf16 run is {rel:e} off the f32 run");
}

#[test]
fn compute_dtype_errors_name_the_key_and_the_valid_values() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("out");
    for (sub, name, line, what, hint) in [
        (
            "run",
            "bad.toml",
            "compute_dtype = \"fp8\"",
            "es.compute_dtype: unknown compute dtype \"fp8\"",
            "valid: f32, bf16",
        ),
        (
            "check",
            "wrong.toml",
            "compute_dtype = 16",
            "es.compute_dtype must be a string",
            "\"bf16\"",
        ),
    ] {
        let c = write(d.path(), name, &with_dtype(&out, line));
        refused(&[sub, s(&c)], what, hint);
    }
}
