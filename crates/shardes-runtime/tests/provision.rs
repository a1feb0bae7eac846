//! Provisioning the pinned CPU plugin into a fresh cache, from several threads at once.
//! Needs python3 with pip and access to the package index (~5-15 s, mostly download/unzip).

use std::io::Read;
use std::path::PathBuf;

use sha2::{Digest, Sha256};
use shardes_runtime::plugin::{cached_plugin_path, provision_into, SO_SHA256};
use shardes_runtime::{Plugin, RuntimeError};

fn sha256_hex(path: &std::path::Path) -> String {
    let mut f = std::fs::File::open(path).unwrap();
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

// One test function, because it changes the environment (SHARDES_PYTHON) for its first part
// and the second part must not see that.
#[test]
fn provisioning_fails_clearly_then_succeeds_concurrently() {
    // 1. Without a usable Python the error says what to run by hand.
    let broken = tempfile::tempdir().unwrap();
    std::env::set_var("SHARDES_PYTHON", "/nonexistent/python3");
    let err = provision_into(broken.path()).unwrap_err();
    std::env::remove_var("SHARDES_PYTHON");
    match &err {
        RuntimeError::Provision { manual, .. } => {
            assert!(
                manual.contains("pip download --no-deps xla-cpu-pjrt==0.0.1"),
                "{err}"
            );
            assert!(manual.contains("SHARDES_PJRT_PLUGIN"), "{err}");
        }
        other => panic!("expected a Provision error, got {other:?}"),
    }
    assert!(!cached_plugin_path(broken.path()).exists());

    // 2. Eight threads race to provision the same fresh cache.
    let cache = tempfile::tempdir().unwrap();
    let t = std::time::Instant::now();
    let paths: Vec<PathBuf> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..8)
            .map(|_| s.spawn(|| provision_into(cache.path())))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap().expect("provisioning"))
            .collect()
    });
    println!(
        "[measure] provisioning into a fresh cache from 8 threads: {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let want = cached_plugin_path(cache.path());
    assert!(paths.iter().all(|p| *p == want), "{paths:?}");
    assert_eq!(sha256_hex(&want), SO_SHA256);
    // Nothing but the plugin and the lock file is left behind (no partial files or scratch).
    let mut names: Vec<String> = std::fs::read_dir(want.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, [".lock", "xla_cpu_pjrt.so"]);
    // The provisioned file is a working plugin.
    let plugin = Plugin::load(&want).unwrap();
    assert_eq!(plugin.api_version().0, 0);
    // A second call is a no-op that returns the same file.
    assert_eq!(provision_into(cache.path()).unwrap(), want);
}

/// A pinned accelerator plugin provisions from the registry with its checksums, and loads
/// as a PJRT plugin on a machine without the accelerator (a client then fails with an
/// error, not a crash).
fn provision_and_load(p: shardes_runtime::plugin::PinnedPlugin) {
    use shardes_runtime::{Client, ClientOptions};
    let cache = tempfile::tempdir().unwrap();
    let t0 = std::time::Instant::now();
    let so = p
        .provision_into(cache.path())
        .unwrap_or_else(|e| panic!("{}: {e}", p.name));
    let provisioned = t0.elapsed();
    assert_eq!(so, p.cached_path(cache.path()));
    assert_eq!(sha256_hex(&so), p.so_sha256);
    let plugin = Plugin::load(&so).unwrap_or_else(|e| panic!("{}: {e}", p.name));
    println!(
        "{}: provisioned in {:.1} s, PJRT API {:?}",
        p.name,
        provisioned.as_secs_f64(),
        plugin.api_version()
    );
    match Client::new(plugin, ClientOptions::default()) {
        Ok(c) => println!("{}: client with {} devices", p.name, c.devices().len()),
        Err(e) => println!("{}: no client here: {e}", p.name),
    }
}

/// Downloads 192 MB: `cargo test -p shardes-runtime --release --test provision -- --ignored`.
#[test]
#[ignore]
fn cuda_plugin_provisions_with_its_pins_and_loads() {
    provision_and_load(shardes_runtime::plugin::CUDA);
}

/// Downloads 205 MB; without a TPU, libtpu spends minutes asking for cloud metadata.
#[test]
#[ignore]
fn tpu_plugin_provisions_with_its_pins_and_loads() {
    provision_and_load(shardes_runtime::plugin::TPU);
}
