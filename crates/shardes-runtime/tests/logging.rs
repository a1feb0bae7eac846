//! The plugin's own logging: quiet by default (no `I0000` lines, no absl pre-init notice),
//! everything with verbose or `SHARDES_LOG=info`. XLA reads its level once per process, so
//! each case runs in a child process: this test binary re-executed with a mode variable.

mod common;

use std::process::Command;

use shardes_runtime::plugin::{self, LogLevel};
use shardes_runtime::{Client, CompileOptions};

const MODE: &str = "SHARDES_TEST_LOG_MODE";

/// The child's work: a CPU client and one sharded compile, which print the plugin's usual
/// lines (`cpu_device_count set via create_options`, `Using Shardy ...`).
#[test]
fn child() {
    let Ok(mode) = std::env::var(MODE) else {
        return;
    };
    if mode == "verbose" {
        assert!(plugin::set_verbose(true));
    }
    let client = Client::cpu(8).unwrap();
    client
        .compile(&common::sharded_program(8), &CompileOptions::new(8))
        .unwrap();
    println!("CHILD DONE at level {}", plugin::log_level().unwrap());
    // Too late now: the plugin is loaded.
    assert!(!plugin::set_log_level(LogLevel::Error));
}

/// Runs [`child`] with `mode` and `env`, the logging variables otherwise unset; returns
/// (stdout, stderr).
fn run_child(mode: &str, env: &[(&str, &str)]) -> (String, String) {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", "child", "--nocapture", "--test-threads=1"])
        .env(MODE, mode)
        .env_remove("SHARDES_LOG")
        .env_remove("TF_CPP_MIN_LOG_LEVEL")
        .env_remove("TF_CPP_MAX_VLOG_LEVEL");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "child failed: {:?}\n{stdout}\n{stderr}",
        out.status
    );
    assert!(stdout.contains("CHILD DONE"), "{stdout}\n{stderr}");
    (stdout, stderr)
}

fn is_quiet(stderr: &str) -> bool {
    !stderr.contains("I0000") && !stderr.contains("absl::InitializeLog")
}

#[test]
fn plugin_logging_is_quiet_by_default() {
    let (stdout, stderr) = run_child("default", &[]);
    assert!(stdout.contains("at level warning"), "{stdout}");
    assert!(is_quiet(&stderr), "{stderr}");
}

#[test]
fn verbose_shows_the_plugin_info_lines() {
    let (stdout, stderr) = run_child("verbose", &[]);
    assert!(stdout.contains("at level info"), "{stdout}");
    assert!(
        stderr.contains("cpu_device_count set via create_options: 8"),
        "{stderr}"
    );
    assert!(stderr.contains("absl::InitializeLog"), "{stderr}");
}

#[test]
fn shardes_log_overrides_and_user_settings_are_kept() {
    let (_, stderr) = run_child("default", &[("SHARDES_LOG", "info")]);
    assert!(stderr.contains("I0000"), "{stderr}");
    // SHARDES_LOG wins over the program's choice.
    let (_, stderr) = run_child("verbose", &[("SHARDES_LOG", "error")]);
    assert!(is_quiet(&stderr), "{stderr}");
    // The user's own TSL setting is never overwritten.
    let (_, stderr) = run_child("default", &[("TF_CPP_MIN_LOG_LEVEL", "0")]);
    assert!(stderr.contains("I0000"), "{stderr}");
}
