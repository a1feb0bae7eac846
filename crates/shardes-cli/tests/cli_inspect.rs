//! `shardes hlo`, `check` and `devices`.

mod common;

use common::*;
use shardes::runtime::{Client, CompileOptions};

/// The printed generation program compiles again through the runtime, runs, and returns
/// what the program signature promises; `--optimized` lists the partitioned program.
#[test]
fn hlo_output_compiles_again_and_optimized_lists_instructions() {
    let d = tempfile::tempdir().unwrap();
    let c = write(
        d.path(),
        "c.toml",
        &small_config(&d.path().join("out"), 2, 1),
    );
    let o = shardes(&["hlo", c.to_str().unwrap()]);
    let (mlir, stderr) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{stderr}");
    assert!(mlir.contains("sdy.mesh"), "no mesh in:\n{mlir}");
    let client = Client::cpu(2).unwrap();
    let exe = client.compile(&mlir, &CompileOptions::new(2)).unwrap();
    // 6 leaves + generation + fitness.
    assert_eq!(exe.num_outputs(), 8);

    let o = shardes(&["hlo", c.to_str().unwrap(), "--optimized"]);
    let (opt, stderr) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{stderr}");
    assert!(opt.contains("(entry) {"), "{opt}");
    // how = B on 2 devices: each device contracts its own members, then all-reduces each
    // (16, 16) leaf; the fitness is split, 16 members per device.
    // (XLA may combine them into one tuple-shaped all-reduce.)
    assert!(
        opt.lines()
            .any(|l| l.contains(" = all-reduce ") && l.contains("f32[16,16]")),
        "{opt}"
    );
    assert!(
        opt.contains("u32[], f32[16])"),
        "fitness not split in:\n{opt}"
    );
    assert!(opt.contains("= parameter f32[16,16]"), "{opt}");
    // Every instruction line is `name = opcode shape`.
    for line in opt.lines().filter(|l| l.starts_with("  ")) {
        let (_, rhs) = line.split_once(" = ").expect(line);
        assert!(rhs.split_whitespace().count() >= 2, "{line}");
    }
}

#[test]
fn check_exit_codes() {
    let d = tempfile::tempdir().unwrap();
    let c = write(
        d.path(),
        "c.toml",
        &small_config(&d.path().join("out"), 2, 1),
    );
    let o = shardes(&["check", c.to_str().unwrap()]);
    let (stdout, stderr) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("ok: transformer_block reads all 6 leaves"),
        "{stdout}"
    );
    let bad = small_config(&d.path().join("out"), 2, 1).replace("how = \"B\"", "how = \"C\"");
    let c = write(d.path(), "bad.toml", &bad);
    let o = shardes(&["check", c.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).1.contains("es.how"));
}

#[test]
fn devices_lists_the_simulated_cpus() {
    let o = shardes(&["devices", "--devices", "3"]);
    let (stdout, stderr) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{stderr}");
    assert!(stdout.contains("platform   cpu"), "{stdout}");
    assert!(stdout.contains("devices    3"), "{stdout}");
    assert!(stdout.contains("plugin     /"), "{stdout}");
    assert_eq!(
        stdout.lines().filter(|l| l.contains(" cpu ")).count(),
        3,
        "{stdout}"
    );
}

/// `--plugin` with the path `devices` reported loads that plugin explicitly.
#[test]
fn devices_with_an_explicit_plugin_path() {
    let o = shardes(&["devices", "--devices", "2"]);
    let (stdout, stderr) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{stderr}");
    let path = stdout
        .lines()
        .find_map(|l| l.strip_prefix("plugin     "))
        .expect("a plugin line")
        .to_string();
    let o = shardes(&["devices", "--devices", "2", "--plugin", &path]);
    let (stdout, stderr) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{stderr}");
    assert!(stdout.contains(&format!("plugin     {path}")), "{stdout}");
    assert!(stdout.contains("devices    2"), "{stdout}");
}
