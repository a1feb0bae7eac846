//! `shardes::gguf` against `tests/fixtures/gguf/types.gguf`, written by the `gguf` Python
//! package (`tools/gguf_fixture.py`), and against damaged copies of it.
//!
//! Tolerance: none. Every dequantized value must have the bits of
//! `gguf.quants.dequantize`'s (in `types.json`), and every metadata value must be equal.
//! Damaged files must give an error whose message names the file and the fault; none
//! may panic.
//!
//! One test also opens SmolLM2-135M-Instruct (`SHARDES_TEST_GGUF`, else the named model,
//! provisioned once into the user cache) and dequantizes all of it, printing the time taken.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;
use shardes::gguf::{dequantize, GgmlType, GgufError, GgufFile, MetaValue};

use crate::support::says;

fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gguf")
}

fn fixture_bytes() -> Vec<u8> {
    std::fs::read(fixture_dir().join("types.gguf")).unwrap()
}

fn expected() -> Value {
    let text = std::fs::read_to_string(fixture_dir().join("types.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// Writes `bytes` to a temporary `bad.gguf` and opens it.
fn open_bytes(bytes: &[u8]) -> Result<GgufFile, GgufError> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.gguf");
    std::fs::write(&path, bytes).unwrap();
    GgufFile::open(&path)
}

/// The error opening `bytes`, as text; asserts it names the file and each of `parts`.
#[track_caller]
fn open_err(bytes: &[u8], parts: &[&str]) -> String {
    let message = match open_bytes(bytes) {
        Ok(_) => panic!("opened a file that should fail with {parts:?}"),
        Err(e) => e.to_string(),
    };
    assert!(
        message.contains("bad.gguf"),
        "the file is not named: {message}"
    );
    for part in parts {
        assert!(message.contains(part), "`{part}` is not in: {message}");
    }
    message
}

/// The offset of `needle`, which must occur in `bytes` exactly once.
#[track_caller]
pub(crate) fn find_once(bytes: &[u8], needle: &[u8]) -> usize {
    let hits: Vec<usize> = bytes
        .windows(needle.len())
        .enumerate()
        .filter(|(_, w)| *w == needle)
        .map(|(i, _)| i)
        .collect();
    assert_eq!(
        hits.len(),
        1,
        "{:?} occurs {} times",
        String::from_utf8_lossy(needle),
        hits.len()
    );
    hits[0]
}

/// The byte just after the GGUF string `s` (its u64 length, then its bytes).
fn after_string(bytes: &[u8], s: &str) -> usize {
    let mut needle = (s.len() as u64).to_le_bytes().to_vec();
    needle.extend(s.as_bytes());
    find_once(bytes, &needle) + needle.len()
}

/// Where the table entry of tensor `name` keeps its dimension count; its dims follow,
/// then its type (u32) and offset (u64).
fn tensor_entry(bytes: &[u8], name: &str) -> usize {
    after_string(bytes, name)
}

fn n_dims_at(bytes: &[u8], entry: usize) -> usize {
    u32::from_le_bytes(bytes[entry..entry + 4].try_into().unwrap()) as usize
}

fn type_at(bytes: &[u8], entry: usize) -> usize {
    entry + 4 + 8 * n_dims_at(bytes, entry)
}

fn offset_at(bytes: &[u8], entry: usize) -> usize {
    type_at(bytes, entry) + 4
}

fn put_u32(bytes: &mut [u8], at: usize, v: u32) {
    bytes[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn put_u64(bytes: &mut [u8], at: usize, v: u64) {
    bytes[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

fn get_u64(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap())
}

#[test]
fn every_tensor_matches_the_gguf_package_bit_for_bit() {
    let file = GgufFile::open(fixture_dir().join("types.gguf")).unwrap();
    let want = expected();
    assert_eq!(file.version(), 3);
    assert_eq!(file.alignment(), 64);
    let tensors = want["tensors"].as_array().unwrap();
    assert_eq!(file.tensors().len(), tensors.len());
    for (t, w) in file.tensors().iter().zip(tensors) {
        let name = w["name"].as_str().unwrap();
        assert_eq!(t.name, name, "file order");
        assert_eq!(file.tensor(name), Some(t));
        assert_eq!(t.ggml_type.name(), w["type"].as_str().unwrap(), "{name}");
        let dims: Vec<u64> = serde_json::from_value(w["dims"].clone()).unwrap();
        let shape: Vec<usize> = serde_json::from_value(w["shape"].clone()).unwrap();
        assert_eq!((&t.dims, t.shape()), (&dims, shape.clone()), "{name}");
        assert_eq!(t.n_elements(), shape.iter().product::<usize>() as u64);
        assert_eq!(t.offset % 64, 0, "{name}");
        assert_eq!(file.data(t).len() as u64, t.n_bytes, "{name}");

        let got = file.dequantize(t).unwrap();
        let values = w["values"].as_array().unwrap();
        assert_eq!(got.len(), values.len(), "{name}");
        for (i, (g, v)) in got.iter().zip(values).enumerate() {
            // The JSON holds each f32's exact f64 widening, so the cast is exact.
            let v = v.as_f64().unwrap() as f32;
            assert_eq!(g.to_bits(), v.to_bits(), "{name}[{i}]: {g} vs {v}");
        }
        let free = dequantize(t.ggml_type, file.data(t), got.len()).unwrap();
        assert_eq!(free, got, "{name}");
    }
    assert!(file.tensor("missing").is_none());
}

/// Asserts `got` is the value `want` (`{"type", "value"}` or `{"type": "array", "items"}`).
#[track_caller]
fn check_value(key: &str, got: &MetaValue, want: &Value) {
    assert_eq!(got.type_name(), want["type"].as_str().unwrap(), "{key}");
    let v = &want["value"];
    let same = match got {
        MetaValue::U8(g) => Some(u64::from(*g)) == v.as_u64(),
        MetaValue::U16(g) => Some(u64::from(*g)) == v.as_u64(),
        MetaValue::U32(g) => Some(u64::from(*g)) == v.as_u64(),
        MetaValue::U64(g) => Some(*g) == v.as_u64(),
        MetaValue::I8(g) => Some(i64::from(*g)) == v.as_i64(),
        MetaValue::I16(g) => Some(i64::from(*g)) == v.as_i64(),
        MetaValue::I32(g) => Some(i64::from(*g)) == v.as_i64(),
        MetaValue::I64(g) => Some(*g) == v.as_i64(),
        MetaValue::F32(g) => Some(g.to_bits()) == v.as_f64().map(|v| (v as f32).to_bits()),
        MetaValue::F64(g) => Some(g.to_bits()) == v.as_f64().map(f64::to_bits),
        MetaValue::Bool(g) => Some(*g) == v.as_bool(),
        MetaValue::String(g) => Some(g.as_str()) == v.as_str(),
        MetaValue::Array(items) => {
            let want_items = want["items"].as_array().unwrap();
            assert_eq!(items.len(), want_items.len(), "{key}");
            for (g, w) in items.iter().zip(want_items) {
                check_value(key, g, w);
            }
            true
        }
    };
    assert!(same, "{key}: {got:?} vs {want}");
}

#[test]
fn metadata_matches_and_typed_getters_convert() {
    let file = GgufFile::open(fixture_dir().join("types.gguf")).unwrap();
    let want = expected();
    let want = want["metadata"].as_object().unwrap();
    assert_eq!(file.metadata().len(), want.len());
    for (key, w) in want {
        let got = file.get(key).unwrap_or_else(|| panic!("{key} is missing"));
        check_value(key, got, w);
    }

    assert_eq!(file.get_str("general.architecture").unwrap(), "test");
    assert_eq!(file.get_str("test.string").unwrap(), "héllo, gguf");
    assert_eq!(file.get_str("test.empty").unwrap(), "");
    assert_eq!(file.get_u64("test.u8").unwrap(), 200);
    assert_eq!(
        file.get_u64("test.u64").unwrap(),
        18_000_000_000_000_000_000
    );
    assert_eq!(file.get_u64("general.alignment").unwrap(), 64);
    assert_eq!(file.get_f64("test.f32").unwrap(), f64::from(0.1f32));
    assert_eq!(file.get_f64("test.f64").unwrap(), 0.1);
    assert_eq!(file.get_f64("test.i16").unwrap(), -30000.0);
    assert!(file.get_bool("test.true").unwrap());
    assert!(!file.get_bool("test.false").unwrap());
    assert_eq!(
        file.get_str_array("test.strings").unwrap(),
        ["a b", "ĠParis", "", "<|im_end|>"]
    );
    assert_eq!(
        file.get_i64_array("test.ints").unwrap(),
        [1, -2, 3, 2_147_483_647]
    );
    assert_eq!(file.get_i64_array("test.bytes").unwrap(), [0, 1, 255]);

    let message = |e: GgufError| e.to_string();
    let e = message(file.get_u64("test.i8").unwrap_err());
    says(&e, &["`test.i8` holds i8 -100, not a non-negative integer"]);
    let e = message(file.get_str("nope").unwrap_err());
    says(&e, &["types.gguf", "`nope` is missing"]);
    let e = message(file.get_f64("test.string").unwrap_err());
    says(&e, &["holds string \"héllo, gguf\", not a number"]);
    let e = message(file.get_bool("test.u8").unwrap_err());
    says(&e, &["holds u8 200, not a bool"]);
    let e = message(file.get_str_array("test.ints").unwrap_err());
    says(&e, &["holds array of 4 i32, not an array of strings"]);
    let e = message(file.get_i64_array("test.u64s").unwrap_err());
    says(&e, &["array of 2 u64, not an array of integers that fit"]);
    let e = message(file.get_i64_array("test.nested").unwrap_err());
    says(&e, &["array of 2 array"]);
}

#[test]
fn other_types_read_as_bytes_but_do_not_dequantize() {
    // IQ4_NL (20) has Q4_0's block of 32 values in 18 bytes, so the table stays valid.
    let mut bytes = fixture_bytes();
    let entry = tensor_entry(&bytes, "t.q4_0");
    let ty = type_at(&bytes, entry);
    put_u32(&mut bytes, ty, 20);
    let file = open_bytes(&bytes).unwrap();
    let t = file.tensor("t.q4_0").unwrap();
    assert_eq!(t.ggml_type, GgmlType::Other(20));
    assert_eq!(file.data(t).len(), 36);
    let e = file.dequantize(t).unwrap_err().to_string();
    for part in ["bad.gguf", "`t.q4_0`", "IQ4_NL", "supported: F32", "Q6_K"] {
        assert!(e.contains(part), "`{part}` is not in: {e}");
    }

    // A TensorInfo of another file is refused, not read out of bounds.
    let other = GgufFile::open(fixture_dir().join("types.gguf")).unwrap();
    let mut foreign = other.tensor("t.q6_k").unwrap().clone();
    foreign.offset = u64::MAX - 10;
    assert!(other.data(&foreign).is_empty());
    let e = other.dequantize(&foreign).unwrap_err().to_string();
    says(&e, &["not one of"]);
}

#[test]
fn cut_files_are_errors_naming_the_cut() {
    let bytes = fixture_bytes();
    let file = GgufFile::open(fixture_dir().join("types.gguf")).unwrap();
    let data_start = file.data_start() as usize;
    let data_end = file
        .tensors()
        .iter()
        .map(|t| (t.offset + t.n_bytes) as usize)
        .max()
        .unwrap();
    let mut cuts: Vec<usize> = (0..data_start).step_by(97).collect();
    cuts.extend([1, 3, 4, 23, data_start - 1, data_start, data_start + 1]);
    cuts.extend([(data_start + data_end) / 2, data_end - 1]);
    for cut in cuts {
        let e = open_err(&bytes[..cut], &["truncated"]);
        if cut < 4 {
            says(&e, &["the magic at byte 0"]);
        }
    }
    // The padding after the last tensor is not needed.
    assert!(open_bytes(&bytes[..data_end]).is_ok());
}

#[test]
fn header_faults_are_errors() {
    let bytes = fixture_bytes();

    let mut b = bytes.clone();
    b[..4].copy_from_slice(b"GGML");
    open_err(&b, &["not a GGUF file", "rather than the magic"]);

    let mut b = bytes.clone();
    put_u32(&mut b, 4, 1);
    open_err(&b, &["version 1;", "only versions 2 and 3", "pre-release"]);
    put_u32(&mut b, 4, 4);
    open_err(&b, &["version 4;", "only versions 2 and 3"]);
    put_u32(&mut b, 4, 3u32.swap_bytes());
    open_err(&b, &["big-endian"]);
    // Version 2 has version 3's layout.
    put_u32(&mut b, 4, 2);
    assert_eq!(open_bytes(&b).unwrap().version(), 2);

    let mut b = bytes.clone();
    put_u64(&mut b, 8, 1 << 60);
    open_err(&b, &["1152921504606846976 tensor-table entries", "byte 24"]);
    let mut b = bytes.clone();
    put_u64(&mut b, 16, 1 << 60);
    open_err(&b, &["1152921504606846976 metadata entries", "truncated"]);
    let mut b = bytes.clone();
    put_u64(&mut b, 16, u64::MAX);
    open_err(&b, &["18446744073709551615 metadata entries"]);
}

#[test]
fn metadata_faults_are_errors() {
    let bytes = fixture_bytes();

    // A string length past the end: the value of `test.string` (type, then length).
    let mut b = bytes.clone();
    let at = after_string(&b, "test.string") + 4;
    put_u64(&mut b, at, 1 << 40);
    open_err(
        &b,
        &[
            "value of metadata key `test.string` (1099511627776 bytes)",
            "truncated",
        ],
    );
    // ... and a key's length.
    let mut b = bytes.clone();
    let at = after_string(&b, "test.u16") - "test.u16".len() - 8;
    put_u64(&mut b, at, u64::MAX);
    open_err(&b, &["the key of metadata entry #"]);

    // An array count past the end (item type, then count), and one whose byte count
    // overflows.
    let mut b = bytes.clone();
    let at = after_string(&b, "test.strings") + 8;
    assert_eq!(get_u64(&b, at), 4);
    put_u64(&mut b, at, 1 << 40);
    open_err(
        &b,
        &["the 1099511627776 items of metadata key `test.strings`"],
    );
    put_u64(&mut b, at, 1 << 62);
    open_err(&b, &["items of metadata key `test.strings`", "truncated"]);

    let mut b = bytes.clone();
    let at = after_string(&b, "test.u8");
    put_u32(&mut b, at, 13);
    open_err(&b, &["`test.u8` has value type id 13"]);
    let mut b = bytes.clone();
    let at = after_string(&b, "test.ints");
    put_u32(&mut b, at + 4, 99);
    open_err(&b, &["`test.ints` has value type id 99"]);

    let mut b = bytes.clone();
    let at = after_string(&b, "test.true") + 4;
    b[at] = 2;
    open_err(&b, &["`test.true` holds the bool byte 2"]);

    let mut b = bytes.clone();
    let at = after_string(&b, "general.alignment") + 4;
    put_u32(&mut b, at, 48);
    open_err(&b, &["general.alignment is u32 48", "power of two"]);

    // Non-UTF-8 in a value and in a key.
    let mut b = bytes.clone();
    let at = after_string(&b, "test.string") + 4 + 8;
    b[at] = 0xFF;
    open_err(
        &b,
        &["the value of metadata key `test.string`", "not valid UTF-8"],
    );
    let mut b = bytes.clone();
    let at = after_string(&b, "test.u16") - 1;
    b[at] = 0xC3;
    open_err(&b, &["the key of metadata entry #", "not valid UTF-8"]);

    let mut b = bytes.clone();
    let at = after_string(&b, "test.i8") - "test.i8".len();
    b[at..at + 7].copy_from_slice(b"test.u8");
    open_err(&b, &["key `test.u8` appears twice"]);
}

#[test]
fn tensor_table_faults_are_errors() {
    let bytes = fixture_bytes();
    let entry = |b: &[u8], name| tensor_entry(b, name);

    let mut b = bytes.clone();
    let at = entry(&b, "t.q4_0");
    let ty = type_at(&b, at);
    put_u32(&mut b, ty, 99);
    open_err(
        &b,
        &["`t.q4_0` has ggml type id 99, which is not a known ggml type"],
    );
    // Ids ggml removed are unknown too.
    let ty = type_at(&b, at);
    put_u32(&mut b, ty, 4);
    open_err(&b, &["ggml type id 4,"]);

    let mut b = bytes.clone();
    let at = entry(&b, "t.q8_0");
    put_u64(&mut b, at + 4 + 8, 0);
    open_err(&b, &["`t.q8_0` has a zero dimension", "[64, 0]"]);

    let mut b = bytes.clone();
    let at = entry(&b, "t.f32");
    put_u32(&mut b, at, 5);
    open_err(&b, &["`t.f32` has 5 dimensions", "at most 4"]);

    let mut b = bytes.clone();
    let at = entry(&b, "t.f32");
    put_u64(&mut b, at + 4, 1 << 32);
    put_u64(&mut b, at + 12, 1 << 32);
    open_err(&b, &["`t.f32`", "overflows 64 bits"]);

    // Rows that do not fill whole blocks.
    for (tensor, row, what) in [
        (
            "t.q8_0",
            48,
            "rows of 48 values, not a multiple of Q8_0's block of 32",
        ),
        (
            "t.q6_k",
            128,
            "rows of 128 values, not a multiple of Q6_K's block of 256",
        ),
    ] {
        let mut b = bytes.clone();
        let at = entry(&b, tensor);
        put_u64(&mut b, at + 4, row);
        open_err(&b, &[what]);
    }

    let mut b = bytes.clone();
    let at = offset_at(&b, entry(&b, "t.q8_0"));
    let old = get_u64(&b, at);
    put_u64(&mut b, at, old + 32);
    open_err(
        &b,
        &[
            "`t.q8_0` starts at offset",
            "not a multiple of the alignment 64",
        ],
    );

    let mut b = bytes.clone();
    let at = offset_at(&b, entry(&b, "t.q6_k"));
    let old = get_u64(&b, at);
    put_u64(&mut b, at, old + 64 * 100);
    open_err(&b, &["`t.q6_k` needs bytes", "truncated"]);
    put_u64(&mut b, at, u64::MAX - 63);
    open_err(&b, &["`t.q6_k` needs bytes", "truncated"]);

    let mut b = bytes.clone();
    let q4_0 = get_u64(&b, offset_at(&b, entry(&b, "t.q4_0")));
    let at = offset_at(&b, entry(&b, "t.q4_1"));
    put_u64(&mut b, at, q4_0);
    open_err(&b, &["tensors `t.q4_0`", "and `t.q4_1`", "overlap"]);

    let mut b = bytes.clone();
    let at = entry(&b, "t.q5_0") - "t.q5_0".len();
    b[at..at + 6].copy_from_slice(b"t.q4_0");
    open_err(&b, &["tensor `t.q4_0` appears twice"]);

    let mut b = bytes.clone();
    let at = entry(&b, "t.bf16") - 1;
    b[at] = 0xFF;
    open_err(&b, &["the name of tensor #2", "not valid UTF-8"]);

    let mut b = bytes.clone();
    let at = entry(&b, "t.bf16") - "t.bf16".len() - 8;
    put_u64(&mut b, at, 1 << 50);
    open_err(
        &b,
        &[
            "the name of tensor #2 (1125899906842624 bytes)",
            "truncated",
        ],
    );
}

/// A small deterministic generator for the property tests (splitmix64).
fn next(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[test]
fn no_cut_or_flipped_byte_panics() {
    let bytes = fixture_bytes();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cut.gguf");
    // Every cut is an error or (in the trailing padding) a file; none panics.
    for i in 0..200 {
        let cut = i * bytes.len() / 200;
        std::fs::write(&path, &bytes[..cut]).unwrap();
        let _ = GgufFile::open(&path);
    }
    // Damaged bytes anywhere in the header and tables: open, and dequantize what opens.
    let file = GgufFile::open(fixture_dir().join("types.gguf")).unwrap();
    let tables = file.data_start();
    let mut state = 7;
    let mut opened = 0;
    for _ in 0..300 {
        let mut b = bytes.clone();
        for _ in 0..1 + next(&mut state) % 3 {
            let at = (next(&mut state) % tables) as usize;
            b[at] = next(&mut state) as u8;
        }
        std::fs::write(&path, &b).unwrap();
        if let Ok(file) = GgufFile::open(&path) {
            opened += 1;
            for t in file.tensors() {
                if let Ok(values) = file.dequantize(t) {
                    assert_eq!(values.len() as u64, t.n_elements());
                }
            }
        }
    }
    eprintln!("{opened} of 300 damaged files still opened");
}

#[test]
fn smollm2_opens_and_dequantizes() {
    // SHARDES_TEST_GGUF, else the named model, provisioned once into the user cache.
    let path = match std::env::var_os("SHARDES_TEST_GGUF") {
        Some(p) => PathBuf::from(p),
        None => shardes::models::resolve_model("smollm2-135m-instruct")
            .unwrap_or_else(|e| panic!("provision SmolLM2: {e}"))
            .path()
            .to_path_buf(),
    };
    let start = Instant::now();
    let file = GgufFile::open(&path).unwrap();
    let opened = start.elapsed();
    assert_eq!(file.tensors().len(), 272);
    assert_eq!(file.get_str("general.architecture").unwrap(), "llama");
    assert_eq!(file.get_u64("llama.block_count").unwrap(), 30);
    assert_eq!(
        file.get_str_array("tokenizer.ggml.tokens").unwrap().len(),
        49152
    );
    let embed = file.tensor("token_embd.weight").unwrap();
    assert_eq!(embed.ggml_type, GgmlType::Q8_0);
    assert_eq!(embed.shape(), [49152, 576]);

    let (mut values, mut bytes, mut took) = (0u64, 0u64, Duration::ZERO);
    for t in file.tensors() {
        let start = Instant::now();
        let v = file.dequantize(t).unwrap();
        took += start.elapsed();
        assert!(v.iter().all(|x| x.is_finite()), "{}", t.name);
        values += v.len() as u64;
        bytes += t.n_bytes;
    }
    assert_eq!(values, 134_515_008);
    eprintln!(
        "{}: opened in {:.3} s; dequantized {values} values from {:.1} MB in {:.3} s",
        path.display(),
        opened.as_secs_f64(),
        bytes as f64 / 1e6,
        took.as_secs_f64()
    );
}
