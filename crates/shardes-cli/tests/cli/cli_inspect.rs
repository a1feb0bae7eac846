//! `shardes hlo`, `check` and `devices`.

use crate::common::*;
use shardes::runtime::{Client, CompileOptions};

/// The printed generation program compiles again through the runtime, runs, and returns
/// what the program signature promises; `--optimized` lists the partitioned program.
#[test]
fn hlo_output_compiles_again_and_optimized_lists_instructions() {
    let d = tempfile::tempdir().unwrap();
    let c = small_in(d.path());
    let (mlir, _) = ok(&["hlo", s(&c)]);
    assert!(mlir.contains("sdy.mesh"), "no mesh in:\n{mlir}");
    let client = Client::cpu(2).unwrap();
    let exe = client.compile(&mlir, &CompileOptions::new(2)).unwrap();
    // 6 leaves + generation + fitness.
    assert_eq!(exe.num_outputs(), 8);

    let (opt, _) = ok(&["hlo", s(&c), "--optimized"]);
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

/// `es.keep_noise_mib = 0` reaches the program: `tell` regenerates its noise, so the printed
/// program has more loops (one `while` per threefry draw) than with the default budget.
#[test]
fn keep_noise_mib_zero_makes_tell_regenerate() {
    let d = tempfile::tempdir().unwrap();
    let base = small_config(&d.path().join("out"), 2, 1);
    let whiles = |config: &str, name: &str| {
        let (mlir, _) = ok(&["hlo", s(&write(d.path(), name, config))]);
        mlir.matches("stablehlo.while").count()
    };
    let kept = whiles(&base, "kept.toml");
    let regen = whiles(
        &base.replace("how = \"B\"", "how = \"B\"\nkeep_noise_mib = 0"),
        "regen.toml",
    );
    assert!(
        kept < regen,
        "{kept} loops kept, {regen} with keep_noise_mib = 0"
    );
}

#[test]
fn check_exit_codes() {
    let d = tempfile::tempdir().unwrap();
    let (stdout, _) = ok(&["check", s(&small_in(d.path()))]);
    assert!(
        stdout.contains("ok: transformer_block reads all 6 leaves"),
        "{stdout}"
    );
    let bad = small_config(&d.path().join("out"), 2, 1).replace("how = \"B\"", "how = \"C\"");
    let c = write(d.path(), "bad.toml", &bad);
    let o = shardes(&["check", s(&c)]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).1.contains("es.how"));
}

#[test]
fn devices_lists_the_simulated_cpus() {
    let (stdout, _) = ok(&["devices", "--devices", "3"]);
    has_all(&stdout, &["platform   cpu", "devices    3", "plugin     /"]);
    assert_eq!(
        stdout.lines().filter(|l| l.contains(" cpu ")).count(),
        3,
        "{stdout}"
    );
}

/// Where the kernel gives transparent huge pages on request (`madvise`), the command runs
/// itself again with glibc's huge-page tunable and says so; `SHARDES_HUGE_PAGES=0` and a
/// user's own tunable keep it as it is. Elsewhere it says why not.
#[test]
fn devices_says_whether_large_allocations_get_huge_pages() {
    let mode =
        std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
    let line = |envs: &[(&str, &str)]| {
        let mut cmd = bin();
        cmd.args(["devices", "--devices", "1"])
            .env_remove("GLIBC_TUNABLES")
            .env_remove("SHARDES_HUGE_PAGES");
        for (k, v) in envs {
            cmd.env(k, v);
        }
        let (stdout, _) = exited(&cmd.output().expect("spawning shardes"), 0);
        stdout
            .lines()
            .find_map(|l| l.strip_prefix("huge pages "))
            .unwrap_or_else(|| panic!("no huge pages line in:\n{stdout}"))
            .to_string()
    };
    let default = line(&[]);
    if mode.contains("[madvise]") {
        assert!(
            default.starts_with("on (glibc.malloc.hugetlb=1"),
            "{default}"
        );
        let off = line(&[("SHARDES_HUGE_PAGES", "0")]);
        assert_eq!(off, "off (SHARDES_HUGE_PAGES=0)");
        let own = line(&[("GLIBC_TUNABLES", "glibc.malloc.hugetlb=0")]);
        assert_eq!(own, "off (GLIBC_TUNABLES sets glibc.malloc.hugetlb=0)");
    } else if mode.contains("[always]") {
        assert!(default.starts_with("on (the kernel"), "{default}");
    } else {
        assert!(default.starts_with("off ("), "{default}");
    }
}

/// `--plugin` with the path `devices` reported loads that plugin explicitly.
#[test]
fn devices_with_an_explicit_plugin_path() {
    let path = plugin_path(&ok(&["devices", "--devices", "2"]).0);
    let (stdout, _) = ok(&["devices", "--devices", "2", "--plugin", &path]);
    has_all(&stdout, &[&format!("plugin     {path}"), "devices    2"]);
}

#[test]
fn diag_reports_flat_rank_and_linear_depth_for_qwen2() {
    let d = tempfile::tempdir().unwrap();
    let data = "{\"prompt_ids\": [1, 2], \"target_ids\": [3, 4]}\n";
    let c = qwen2_ids_config(d.path(), "tiny", data);
    let json = d.path().join("diag.json");
    let flags = "--ranks 4 --depths 1 --json";
    let (stdout, _) = ok_flags("diag", &c, flags, &[s(&json)]);
    assert!(stdout.contains("layers"), "{stdout}");
    let v = json_file(&json);
    let e = v.as_array().expect("a list of entries");
    assert_eq!(e.len(), 3, "config, r = 4, 1 layer: {v}");
    let ops = |i: usize| e[i]["emitted_ops"].as_u64().unwrap();
    assert_eq!(e[1]["strategy"], "mirrored(lowrank(r=4))");
    assert_eq!(ops(0), ops(1), "op count must not grow with r");
    assert_eq!(e[2]["layers"], 1);
    assert!(
        ops(2) < ops(0),
        "1 layer has fewer ops than the tiny model's 2"
    );
    for x in e {
        assert!(x["compile_ms"].as_f64().unwrap() > 0.0);
        assert!(x["optimized_instructions"].as_u64().unwrap() > 0);
    }
}

/// `shardes bench` on the small config prints the table of the engine's report (these two
/// lines were checked on `BenchReport::table` in tests/bench_engine.rs before the table
/// moved to the CLI).
#[test]
fn bench_prints_the_table() {
    let d = tempfile::tempdir().unwrap();
    let text = small_config(&d.path().join("out"), 1, 1);
    let c = write(d.path(), "c.toml", &text);
    let flags = "--how AB --generations 3 --warmup 1 --per-dispatch 2 --gemm-size 64";
    let (table, _) = ok_flags("bench", &c, flags, &[]);
    has_all(&table, &["generation / inference", "ask + apply alone"]);
}

/// `--plugin cuda` finds the CUDA plugin where pip installs it (the `jax_plugins.xla_cuda12`
/// package of the Python environment), and without one says what to install. The "CUDA
/// plugin" here is the CPU plugin under the CUDA package's file name: this checks the
/// lookup, not CUDA.
#[test]
fn named_cuda_plugin_is_found_in_the_python_environment_or_explained() {
    let cpu = plugin_path(&text(&shardes(&["devices", "--devices", "1"])).0);
    // A hard link (not a symlink, which the loader would resolve back to the CPU path) on
    // the plugin's own file system, so nothing of its 250 MB is copied.
    let cpu = std::path::Path::new(&cpu);
    let site = tempfile::tempdir_in(cpu.parent().unwrap()).unwrap();
    let pkg = site.path().join("jax_plugins/xla_cuda12");
    std::fs::create_dir_all(&pkg).unwrap();
    write(
        &pkg,
        "__init__.py",
        "raise ImportError('must not be imported')\n",
    );
    std::fs::hard_link(cpu, pkg.join("xla_cuda_plugin.so"))
        .or_else(|_| std::fs::copy(cpu, pkg.join("xla_cuda_plugin.so")).map(|_| ()))
        .unwrap();
    let cache = tempfile::tempdir().unwrap();
    let o = bin()
        .args(["devices", "--plugin", "cuda"])
        .env("PYTHONPATH", site.path())
        .env("SHARDES_CACHE_DIR", cache.path())
        .env_remove("SHARDES_PJRT_CUDA")
        .output()
        .unwrap();
    let (stdout, stderr) = exited(&o, 0);
    let want = pkg.join("xla_cuda_plugin.so");
    assert!(
        stdout.contains(&format!("plugin     {}", want.display())),
        "{stdout}\n{stderr}"
    );

    // Nothing installed and no Python to provision with: exit 2 naming what it needs.
    let o = bin()
        .args(["devices", "--plugin", "cuda"])
        .env("SHARDES_PYTHON", "/nonexistent/python3")
        .env("SHARDES_CACHE_DIR", cache.path())
        .env_remove("SHARDES_PJRT_CUDA")
        .output()
        .unwrap();
    let (_, stderr) = exited(&o, 2);
    has_all(
        &stderr,
        &[
            "plugin = \"cuda\"",
            "jax-cuda12-pjrt==0.12.0.1",
            "NVIDIA driver",
        ],
    );
}

/// `devices --json` and `check --json` print one JSON object each, for scripts.
#[test]
fn devices_and_check_print_json_when_asked() {
    let v = json_out(&["devices", "--devices", "2", "--json"]);
    assert_eq!(v["device_count"], 2);
    assert_eq!(v["devices"].as_array().unwrap().len(), 2);
    assert_eq!(v["platform"], "cpu");
    assert!(v["plugin"].as_str().unwrap().ends_with(".so"));
    let quick = repo().join("examples/quickstart.toml");
    let v = json_out(&["check", s(&quick), "--json"]);
    assert_eq!(v["problem"], "transformer_block");
    assert_eq!(v["leaves"], 6);
    assert_eq!(v["findings"].as_array().unwrap().len(), 0);
}

/// The plugin path of `devices`'s output.
fn plugin_path(stdout: &str) -> String {
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("plugin     "))
        .expect("a plugin line")
        .to_string()
}
