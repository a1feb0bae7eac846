//! A bad plugin file is refused before `dlopen` with an error that names the file and the
//! fix, and never crashes the process (a truncated library used to kill it with SIGBUS).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use shardes_runtime::plugin::{self, CPU};
use shardes_runtime::{Client, Plugin, RuntimeError};

/// Loads `path`, which must be refused as not a plugin at all; returns the message.
fn not_a_plugin_message(path: &Path) -> String {
    let err = Plugin::load(path).unwrap_err();
    assert!(matches!(err, RuntimeError::NotAPlugin { .. }), "{err:?}");
    err.to_string()
}

/// Checks that `msg` says each of `parts`.
fn says(msg: &str, parts: &[&str]) {
    for part in parts {
        assert!(msg.contains(part), "{msg}");
    }
}

/// The provisioned CPU plugin (discovery as everywhere else).
fn real_plugin() -> PathBuf {
    plugin::locate(None).expect("a PJRT plugin (see shardes_runtime::plugin::locate)")
}

/// Writes the first `len` bytes of `src` to `dst`.
fn copy_prefix(src: &Path, dst: &Path, len: usize) {
    let mut head = vec![0u8; len];
    std::fs::File::open(src)
        .unwrap()
        .read_exact(&mut head)
        .unwrap();
    if let Some(dir) = dst.parent() {
        std::fs::create_dir_all(dir).unwrap();
    }
    std::fs::File::create(dst)
        .unwrap()
        .write_all(&head)
        .unwrap();
}

#[test]
fn truncated_copy_of_the_real_plugin_is_refused_without_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let so = dir.path().join("xla_cpu_pjrt.so");
    copy_prefix(&real_plugin(), &so, 1 << 20);
    let err = Plugin::load(&so).unwrap_err();
    match &err {
        RuntimeError::PluginTruncated { path, size, needed } => {
            assert_eq!(path, &so.canonicalize().unwrap());
            assert_eq!(*size, 1 << 20);
            assert!(*needed > *size, "{err}");
        }
        other => panic!("expected PluginTruncated, got {other:?}"),
    }
    let path = so.display().to_string();
    says(
        &err.to_string(),
        &[&path, "is truncated (1048576 bytes", "fix:"],
    );
}

#[test]
fn text_file_is_not_an_elf_shared_object() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("libnotes.so");
    std::fs::write(&p, "just some text, not a library\n".repeat(4000)).unwrap();
    let msg = not_a_plugin_message(&p);
    says(&msg, &["is not an ELF shared object", "libnotes.so"]);
}

#[test]
fn directory_is_refused_as_a_directory() {
    let dir = tempfile::tempdir().unwrap();
    let err = Plugin::load(dir.path()).unwrap_err();
    assert!(
        matches!(err, RuntimeError::PluginIsDirectory { .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("is a directory"), "{err}");
    // Discovery says the same for an explicit path or a config's `plugin = PATH`.
    for err in [
        plugin::locate(Some(dir.path())).unwrap_err(),
        plugin::resolve(dir.path().to_str().unwrap()).unwrap_err(),
    ] {
        assert!(err.to_string().contains("is a directory"), "{err}");
    }
}

#[test]
fn shared_library_without_the_entry_point_is_refused_before_loading() {
    let Some(lib) = [
        "/lib/x86_64-linux-gnu/libm.so.6",
        "/usr/lib/x86_64-linux-gnu/libm.so.6",
        "/lib64/libm.so.6",
        "/usr/lib64/libm.so.6",
        "/lib/x86_64-linux-gnu/libz.so.1",
    ]
    .into_iter()
    .map(Path::new)
    .find(|p| p.is_file()) else {
        eprintln!("skipped: no system shared library found in the usual places");
        return;
    };
    let msg = not_a_plugin_message(lib);
    says(&msg, &["does not export GetPjrtApi", "not a PJRT plugin"]);
}

#[test]
fn small_elf_fragment_is_refused() {
    // The real plugin's first 4 KiB: a valid ELF header, but far too short for a plugin.
    let dir = tempfile::tempdir().unwrap();
    let so = dir.path().join("fragment.so");
    copy_prefix(&real_plugin(), &so, 4096);
    let err = Plugin::load(&so).unwrap_err();
    assert!(err.to_string().contains("too small"), "{err}");
}

#[test]
fn damaged_cached_pinned_plugin_is_refused_with_the_fix() {
    let root = tempfile::tempdir().unwrap();
    let cached = CPU.cached_path(root.path());
    // Truncated: caught by the size alone, nothing is hashed.
    copy_prefix(&real_plugin(), &cached, 1 << 20);
    let err = Plugin::load(&cached).unwrap_err();
    assert!(matches!(err, RuntimeError::PluginDamaged { .. }), "{err:?}");
    says(
        &err.to_string(),
        &[
            "is truncated (1048576 bytes, expected 259284552)",
            "delete it and rerun to provision it again",
        ],
    );
    // Right size, wrong bytes (a sparse file of zeros): caught by the sha256.
    let f = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&cached)
        .unwrap();
    f.set_len(CPU.so_size.unwrap()).unwrap();
    drop(f);
    let err = Plugin::load(&cached).unwrap_err();
    says(&err.to_string(), &["its sha256 is", CPU.so_sha256]);
    // No stamp is written for a file that failed.
    let names: Vec<String> = std::fs::read_dir(cached.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["xla_cpu_pjrt.so"]);
}

/// The whole discovery path: a client on the default plugin, with the cache pointed at a
/// damaged copy, fails with the same message in a child process that exits normally.
#[test]
fn default_client_on_a_damaged_cache_fails_cleanly() {
    if std::env::var_os("SHARDES_TEST_CHILD").is_some() {
        // Child: print the error for the parent to read.
        match Client::cpu(1) {
            Ok(_) => println!("CHILD: client created"),
            Err(e) => println!("CHILD: {e}"),
        }
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let cached = CPU.cached_path(root.path());
    copy_prefix(&real_plugin(), &cached, 1 << 20);
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "default_client_on_a_damaged_cache_fails_cleanly",
            "--nocapture",
        ])
        .env("SHARDES_TEST_CHILD", "1")
        .env("SHARDES_CACHE_DIR", root.path())
        .env_remove("SHARDES_PJRT_PLUGIN")
        // Away from the checkout, so no `xla_extension/*.so` is found first.
        .current_dir(root.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "child died: {:?}\n{stdout}",
        out.status
    );
    assert!(
        stdout.contains("is truncated (1048576 bytes, expected 259284552)"),
        "{stdout}"
    );
}
