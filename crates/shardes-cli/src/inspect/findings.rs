//! How `shardes check` reports what tracing a model found (leaves it never reads, 2-D
//! leaves read without a seam), the same way for loss, `[task]` and MJCF configs.

use shardes::hlo::es::Finding;

use crate::out::{outln, Stdout};

/// The findings as JSON objects with `path` and `message`.
pub fn to_json(findings: &[Finding]) -> Vec<serde_json::Value> {
    findings
        .iter()
        .map(|f| serde_json::json!({"path": f.path, "message": f.message}))
        .collect()
}

/// Prints `ok` when there are no findings; otherwise one `path: message` line per finding
/// and their count, followed by `count_suffix` (e.g. `" in qwen2, n = 8"`).
pub fn print(out: &mut Stdout, findings: &[Finding], ok: &str, count_suffix: &str) {
    if findings.is_empty() {
        outln!(out, "{ok}");
        return;
    }
    for f in findings {
        outln!(out, "{}: {}", f.path, f.message);
    }
    outln!(out, "{} finding(s){count_suffix}", findings.len());
}
