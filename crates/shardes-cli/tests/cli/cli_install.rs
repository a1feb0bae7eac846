//! What `cargo install` and `cargo package` rely on: the binary works outside the
//! repository, and every crate's manifest has what a registry needs to publish it.
//!
//! `.ci/run` runs `cargo package --workspace --no-verify` itself; these checks name a
//! missing field without running cargo inside a test.

use std::path::Path;

use crate::common::*;

/// The plugin is located (or provisioned) in the per-user cache, not through the
/// repository: the command runs from any directory, as an installed `shardes` does.
#[test]
fn the_binary_runs_outside_the_repository() {
    let dir = tempfile::tempdir().unwrap();
    let o = bin()
        .current_dir(dir.path())
        .arg("devices")
        .output()
        .unwrap();
    let (stdout, stderr) = text(&o);
    assert!(o.status.success(), "{stdout}\n{stderr}");
    let plugin = stdout
        .lines()
        .find_map(|l| l.strip_prefix("plugin"))
        .unwrap_or_else(|| panic!("no plugin line:\n{stdout}"))
        .trim();
    let repo = repo().canonicalize().unwrap();
    assert!(
        !Path::new(plugin).starts_with(&repo),
        "{plugin} is inside the repository"
    );
}

fn manifest(path: &Path) -> toml::Table {
    let text = std::fs::read_to_string(path).unwrap();
    toml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Each published package needs a description and a license (crates.io refuses it
/// otherwise) and a README; each non-dev path dependency needs a version, which is what
/// the published manifest keeps.
#[test]
fn every_crate_has_the_metadata_a_registry_needs() {
    let root = repo();
    let workspace = manifest(&root.join("Cargo.toml"));
    let ws = workspace["workspace"].as_table().unwrap();
    let ws_package = ws["package"].as_table().unwrap();
    let ws_deps = ws["dependencies"].as_table().unwrap();
    let members: Vec<&str> = ws["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_str().unwrap())
        .collect();
    assert_eq!(members.len(), 4, "shardes-cli, -hlo, -runtime and -mujoco");
    for dir in std::iter::once(".").chain(members) {
        let path = root.join(dir).join("Cargo.toml");
        let m = manifest(&path);
        let package = m["package"].as_table().unwrap();
        let name = package["name"].as_str().unwrap();
        for field in ["description", "license", "readme", "version", "edition"] {
            let value = match package.get(field) {
                Some(toml::Value::Table(t)) if t.get("workspace") == Some(&true.into()) => {
                    ws_package.get(field)
                }
                other => other,
            };
            assert!(
                value
                    .and_then(toml::Value::as_str)
                    .is_some_and(|s| !s.is_empty()),
                "{name}: package.{field} is missing"
            );
        }
        for table in ["dependencies", "build-dependencies"] {
            let Some(deps) = m.get(table).and_then(toml::Value::as_table) else {
                continue;
            };
            for (dep, spec) in deps {
                let spec = match spec.get("workspace") {
                    Some(toml::Value::Boolean(true)) => &ws_deps[dep],
                    _ => spec,
                };
                if spec.get("path").is_some() {
                    assert!(
                        spec.get("version").is_some(),
                        "{name}: {table}.{dep} is a path dependency without a version"
                    );
                }
            }
        }
    }
}
