//! No Rust source file in the workspace runs past 900 lines (issue #38). Past that a file
//! holds more than one idea and is hard to review as a whole; the limit has no exemptions, so
//! generated code is held to it too (the PJRT and MuJoCo bindings are cut into parts by
//! `tools/split_bindings.py`, called from their generators). Reads the files as text: no
//! PJRT, milliseconds.

use std::fs;
use std::path::{Path, PathBuf};

const MAX_LINES: usize = 900;

/// The folders that hold the workspace's Rust sources, below the repository root: every
/// crate's `src` and `tests` (and anything else under `crates/`), the root crate's, benches,
/// tools, the example and the validation harness.
const ROOTS: &[&str] = &[
    "src",
    "crates",
    "tests",
    "benches",
    "tools",
    "examples",
    "validation",
];

/// Every `.rs` file below `dir`, build outputs and hidden folders (`target`, a `.venv`)
/// aside.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return; // a root the checkout lacks (benches without .rs, say) holds nothing
    };
    for entry in entries {
        let path = entry.expect("read a directory entry").path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if path.is_dir() {
            if !name.starts_with('.') && name != "target" {
                rust_files(&path, out);
            }
        } else if name.ends_with(".rs") {
            out.push(path);
        }
    }
}

#[test]
fn no_rust_source_file_is_over_900_lines() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in ROOTS {
        rust_files(&root.join(dir), &mut files);
    }
    // A walk that found nothing would pass for the wrong reason.
    assert!(
        files.iter().any(|f| f.ends_with("src/lib.rs")) && files.len() > 50,
        "the walk from {} found only {} .rs files",
        root.display(),
        files.len()
    );

    let mut long: Vec<(usize, String)> = files
        .iter()
        .map(|f| {
            let text = fs::read_to_string(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
            let name = f.strip_prefix(root).unwrap_or(f).display().to_string();
            (text.lines().count(), name)
        })
        .filter(|(lines, _)| *lines > MAX_LINES)
        .collect();
    long.sort_by(|a, b| b.cmp(a));
    assert!(
        long.is_empty(),
        "{} .rs file(s) over {MAX_LINES} lines (issue #38); split each into modules (generated \
         bindings: add a part to the generator's PARTS):\n{}",
        long.len(),
        long.iter()
            .map(|(lines, name)| format!("  {name}: {lines} lines"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}
