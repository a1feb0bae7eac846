//! Every error a user can act on exits 2 with one line naming the problem and a hint.

use crate::common::*;

/// [`refused`] on `shardes SUB C` for each `(SUB, from, to, what, hint)`: C the small config
/// with `from` replaced by `to`.
fn refused_edits(cases: &[(&str, &str, &str, &str, &str)]) {
    let d = tempfile::tempdir().unwrap();
    for &(sub, from, to, what, hint) in cases {
        refused(&[sub, &small_with(d.path(), from, to)], what, hint);
    }
}

#[test]
fn unknown_key_names_the_nearest_valid_key() {
    refused_edits(&[
        (
            "run",
            "sigma = 0.01",
            "sigmaa = 0.01",
            "unknown key `es.sigmaa`",
            "did you mean `sigma`?",
        ),
        (
            "run",
            "devices = 2",
            "device = 2",
            "unknown key `device`",
            "did you mean `devices`?",
        ),
    ]);
}

#[test]
fn wrong_type_quotes_the_line() {
    refused_edits(&[
        (
            "run",
            "n = 32",
            "n = \"many\"",
            "(`n = \"many\"`)",
            "type of each key",
        ),
        (
            "check",
            "seed = 3",
            "seed = 1.5",
            "seed = 1.5",
            "type of each key",
        ),
    ]);
}

#[test]
fn population_not_divisible_by_devices_times_pairing() {
    // 2 devices × pairing 2: n must be a multiple of 4.
    refused_edits(&[(
        "run",
        "n = 32",
        "n = 30",
        "es.n = 30 is not divisible by devices (2) × pairing (2",
        "multiple of 4, e.g. 28 or 32",
    )]);
    // Without mirroring the pairing is 1: n must be a multiple of the device count.
    let d = tempfile::tempdir().unwrap();
    let c = small_with(d.path(), "n = 32", "n = 31");
    let c2 = std::fs::read_to_string(&c)
        .unwrap()
        .replace("mirrored(lowrank(r=1))", "lowrank(r=1)");
    std::fs::write(&c, c2).unwrap();
    refused(&["check", &c], "es.n = 31", "multiple of 2");
}

#[test]
fn unknown_strategy_and_shaping() {
    refused_edits(&[
        (
            "run",
            "mirrored(lowrank(r=1))",
            "mirrored(lowrnk(r=1))",
            "es.strategy",
            "valid strategies",
        ),
        (
            "run",
            "\"centered_ranks\"",
            "\"centred_ranks\"",
            "unknown shaping \"centred_ranks\"",
            "did you mean \"centered_ranks\"?",
        ),
        (
            "check",
            "\"transformer_block\"",
            "\"transformer\"",
            "unknown problem",
            "transformer_block",
        ),
    ]);
}

#[test]
fn missing_plugin_path() {
    let d = tempfile::tempdir().unwrap();
    let missing = d.path().join("no_such_plugin.so").display().to_string();
    let m = missing.as_str();
    let key = format!("plugin = \"{m}\"\ndevices = 2");
    let c = small_with(d.path(), "devices = 2", &key);
    refused(&["run", &c], "does not exist", "check the path");
    let c = small_with(d.path(), "devices = 2", "devices = 2");
    for args in [
        vec!["run", &c, "--plugin", m],
        vec!["devices", "--plugin", m],
        vec!["hlo", &c, "--optimized", "--plugin", m],
    ] {
        refused(&args, "does not exist", "check the path");
    }
}

#[test]
fn out_dir_of_another_config_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("out");
    foreign_state(&out, 2);
    let c = small_with(d.path(), "lr = 0.01", "lr = 0.01");
    refused(
        &["run", &c],
        "holds a run of another config (hash 0123456789abcdef",
        "--force",
    );
    refused(
        &["run", &c, "--resume"],
        "holds a run of another config",
        "resume with the config that started it",
    );
    // Only state.json before the first checkpoint? The resolved config.toml identifies it.
    std::fs::remove_file(out.join("state.json")).unwrap();
    let other = small_config(&out, 2, 1).replace("sigma = 0.01", "sigma = 0.02");
    std::fs::write(out.join("config.toml"), other).unwrap();
    refused(&["run", &c], "holds a run of another config", "--force");
    refused(
        &["run", &c, "--resume"],
        "holds no checkpoint",
        "without --resume",
    );
}

#[test]
fn missing_config_file_and_bad_usage() {
    refused(
        &["run", "/nonexistent/shardes.toml"],
        "cannot read config /nonexistent/shardes.toml",
        "examples/quickstart.toml",
    );
    // clap's own usage errors also exit 2.
    let o = shardes(&["run"]);
    assert_eq!(o.status.code(), Some(2));
    let o = shardes(&["frobnicate"]);
    assert_eq!(o.status.code(), Some(2));
    let o = shardes(&["--help"]);
    assert_eq!(o.status.code(), Some(0));
}

#[test]
fn toml_syntax_errors_name_line_column_and_text() {
    refused_edits(&[
        (
            "run",
            "[es]",
            "[es",
            "not valid TOML at line",
            "TOML syntax",
        ),
        ("check", "[es]", "[es", "column 4 (`[es`)", "on that line"),
    ]);
}

#[test]
fn plugin_paths_that_are_not_plugins_are_named() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().to_str().unwrap().to_string();
    refused(
        &["devices", "--plugin", &dir],
        "is a directory, not a plugin library",
        "check the path",
    );
    let text = write(d.path(), "x.so", "not a library");
    refused(
        &["devices", "--plugin", text.to_str().unwrap()],
        "is not an ELF shared object",
        "check the path",
    );
}

#[test]
fn floats_beyond_f32_are_named_as_written() {
    refused_edits(&[(
        "run",
        "sigma = 0.01",
        "sigma = 1e39",
        "es.sigma = 1e39 is beyond the float32 range",
        "set es.sigma",
    )]);
}

#[test]
fn a_compile_cache_bound_that_is_not_a_size_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let o = bin()
        .args(["devices", "--devices", "1"])
        .env("SHARDES_COMPILE_CACHE", d.path())
        .env("SHARDES_COMPILE_CACHE_MAX_BYTES", "lots")
        .env_remove("XLA_FLAGS")
        .output()
        .expect("spawning shardes");
    let (stdout, stderr) = text(&o);
    assert_eq!(
        o.status.code(),
        Some(2),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    let line = |prefix: &str| {
        stderr
            .lines()
            .find(|l| l.trim_start().starts_with(prefix))
            .unwrap_or_default()
            .to_string()
    };
    assert!(
        line("error: ").contains("SHARDES_COMPILE_CACHE_MAX_BYTES = \"lots\" is not a size"),
        "{stderr}"
    );
    assert!(line("hint: ").contains("such as 500M or 4G"), "{stderr}");
}
