//! The config keys of per-leaf σ and frozen leaves: `[es.sigma_leaves]` (glob patterns over
//! leaf paths to σ, first match in file order wins), `es.sigma_separable` (a safetensors
//! file of `<leaf>.p` and `<leaf>.q` vectors) and `es.freeze` (globs). The library resolves
//! them against the leaves ([`ShardedES::leaf_scales`]); this file keeps the file order,
//! reads the separable file and turns the library's errors into config errors.

use std::collections::BTreeMap;
use std::path::PathBuf;

use shardes::hlo::es::{EsSpec, LeafInfo, ShardedES};

use super::{es_error, Config, ConfigError};

/// What serde would refuse with a less useful message: `sigma_leaves` not a table of
/// numbers, or a σ beyond f32's range (named as written, before it becomes `inf`).
pub(crate) fn check_es_table(es: &toml::Table) -> Result<(), ConfigError> {
    let Some(table) = es.get("sigma_leaves") else {
        return Ok(());
    };
    let Some(table) = table.as_table() else {
        return Err(ConfigError::new(
            "es.sigma_leaves must be a table of glob patterns to σ",
            "write it as [es.sigma_leaves] with lines like \"layers.*.wq\" = 0.02 (quoted \
             patterns)",
        ));
    };
    for (pattern, value) in table {
        let key = format!("es.sigma_leaves.\"{pattern}\"");
        let v = match value {
            toml::Value::Float(v) => *v,
            toml::Value::Integer(i) => *i as f64,
            other => {
                return Err(ConfigError::new(
                    format!("{key} = {other} is not a number"),
                    format!("set {key} to a small positive number, e.g. 0.01"),
                ))
            }
        };
        if v.is_finite() && v.abs() > f64::from(f32::MAX) {
            return Err(ConfigError::new(
                format!("{key} = {v:e} is beyond the float32 range (±3.4e38)"),
                format!("set {key} to a small positive number, e.g. 0.01"),
            ));
        }
    }
    Ok(())
}

/// Puts `es.sigma_leaves` back in the order of `text` (serde reads a TOML table sorted by
/// key; the first match wins in file order).
pub(crate) fn in_file_order(text: &str, config: &mut Config) {
    #[derive(serde::Deserialize)]
    struct Es {
        #[serde(default)]
        sigma_leaves: BTreeMap<String, toml::Spanned<toml::Value>>,
    }
    #[derive(serde::Deserialize)]
    struct Top {
        es: Es,
    }
    let Ok(top) = toml::from_str::<Top>(text) else {
        return;
    };
    let at = |pattern: &str| {
        top.es
            .sigma_leaves
            .get(pattern)
            .map_or(usize::MAX, |v| v.span().start)
    };
    config.es.sigma_leaves.0.sort_by_key(|(p, _)| at(p));
}

/// The file `es.sigma_separable` names, for the resume check of the inputs' digests.
pub(crate) fn input_files(es: &EsSpec) -> Vec<(String, PathBuf)> {
    es.sigma_separable
        .iter()
        .map(|p| ("es.sigma_separable".to_string(), p.clone()))
        .collect()
}

/// `es` with the separable σ of `spec.sigma_separable`, if set: each 2-D leaf's `p` and `q`
/// are the 1-D f32 tensors `<leaf>.p` and `<leaf>.q`.
pub fn with_separable(es: ShardedES, spec: &EsSpec) -> Result<ShardedES, ConfigError> {
    let Some(path) = &spec.sigma_separable else {
        return Ok(es);
    };
    let key = "es.sigma_separable";
    let file = shardes::io::SafetensorsFile::open(path).map_err(|e| {
        ConfigError::new(
            format!("{key}: {e}"),
            "point es.sigma_separable at a safetensors file with f32 tensors <leaf>.p and \
             <leaf>.q",
        )
    })?;
    let hint = "name the tensors <leaf path>.p (one σ factor per row) and <leaf path>.q (one \
                per column), 1-D f32";
    let mut leaves: BTreeMap<String, (Vec<f32>, Vec<f32>)> = BTreeMap::new();
    for name in file.names() {
        let Some((leaf, part)) = name
            .rsplit_once('.')
            .filter(|(_, part)| *part == "p" || *part == "q")
        else {
            return Err(ConfigError::new(
                format!("{key}: tensor \"{name}\" is not <leaf>.p or <leaf>.q"),
                hint,
            ));
        };
        let a = file
            .f32(&name)
            .map_err(|e| ConfigError::new(format!("{key}: {e}"), hint))?;
        if a.ndim() != 1 {
            return Err(ConfigError::new(
                format!(
                    "{key}: tensor \"{name}\" has shape {:?}, not 1-D",
                    a.shape()
                ),
                hint,
            ));
        }
        let entry = leaves.entry(leaf.to_string()).or_default();
        if part == "p" {
            entry.0 = a.data().to_vec();
        } else {
            entry.1 = a.data().to_vec();
        }
    }
    if let Some((leaf, (p, _))) = leaves
        .iter()
        .find(|(_, (p, q))| p.is_empty() || q.is_empty())
    {
        let missing = if p.is_empty() { "p" } else { "q" };
        return Err(ConfigError::new(
            format!("{key}: leaf \"{leaf}\" has no tensor \"{leaf}.{missing}\""),
            hint,
        ));
    }
    es.with_sigma_separable(leaves).map_err(es_error)
}

/// Resolves the per-leaf settings against the problem's leaves, so that a pattern matching
/// no leaf (or a separable σ of the wrong shape) is a config error before anything compiles.
pub fn check_leaves(es: &ShardedES, leaves: &[LeafInfo]) -> Result<(), ConfigError> {
    es.leaf_scales(leaves).map(|_| ()).map_err(es_error)
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = "devices = 2\n[problem]\nname = \"transformer_block\"\n[es]\nn = 32\n\
                        sigma = 0.01\nlr = 0.01\n[run]\ngenerations = 3\n";

    fn parse(extra: &str) -> Result<Config, String> {
        Config::parse(&format!("{BASE}{extra}")).map_err(|e| e.to_string())
    }

    #[test]
    fn patterns_keep_the_file_order_and_write_it_back() {
        let c = parse("[es.sigma_leaves]\n\"z*\" = 0.1\n\"a*\" = 0.2\n\"m\" = 3\n").unwrap();
        let want = vec![
            ("z*".to_string(), 0.1f32),
            ("a*".to_string(), 0.2),
            ("m".to_string(), 3.0),
        ];
        assert_eq!(c.es.sigma_leaves.0, want);
        // The resolved config is written in the same order and reads back the same.
        let text = toml::to_string_pretty(&c).unwrap();
        let again = Config::parse(&text).unwrap();
        assert_eq!(again.es.sigma_leaves.0, want);
        assert_eq!(again.trajectory_hash(), c.trajectory_hash());
        // An inline table is ordered the same way.
        let c = parse("").unwrap();
        assert!(c.es.sigma_leaves.is_empty());
        let inline = Config::parse(&BASE.replace(
            "lr = 0.01",
            "lr = 0.01\nsigma_leaves = { \"q\" = 0.5, \"b\" = 0.25 }",
        ))
        .unwrap();
        assert_eq!(
            inline.es.sigma_leaves.0,
            vec![("q".to_string(), 0.5), ("b".to_string(), 0.25)]
        );
    }

    #[test]
    fn the_keys_enter_the_trajectory_hash_only_when_set() {
        let plain = parse("").unwrap();
        let freeze =
            Config::parse(&BASE.replace("lr = 0.01", "lr = 0.01\nfreeze = [\"w*\"]")).unwrap();
        let table = parse("[es.sigma_leaves]\n\"w*\" = 0.02\n").unwrap();
        let other = parse("[es.sigma_leaves]\n\"w*\" = 0.03\n").unwrap();
        let hashes = [&plain, &freeze, &table, &other].map(|c| c.trajectory_hash());
        for i in 0..4 {
            for j in 0..i {
                assert_ne!(hashes[i], hashes[j], "{i} {j}");
            }
        }
        // Unset, the resolved config has none of the keys (old hashes stay valid).
        let text = toml::to_string(&plain).unwrap();
        for k in ["freeze", "sigma_separable", "sigma_leaves"] {
            assert!(!text.contains(k), "{text}");
        }
    }

    #[test]
    fn bad_values_name_their_key() {
        let cases = [
            (
                "[es.sigma_leaves]\n\"w*\" = -1.0\n",
                "es.sigma_leaves.\"w*\" = -1",
            ),
            (
                "[es.sigma_leaves]\n\"w*\" = nan\n",
                "es.sigma_leaves.\"w*\" = NaN",
            ),
            (
                "[es.sigma_leaves]\n\"w*\" = 1e39\n",
                "es.sigma_leaves.\"w*\" = 1e39",
            ),
            (
                "[es.sigma_leaves]\n\"w*\" = \"big\"\n",
                "es.sigma_leaves.\"w*\" = \"big\"",
            ),
            (
                "[es.sigma_leaves]\n\"[w\" = 0.1\n",
                "es.sigma_leaves: \"[w\" is not a glob",
            ),
        ];
        for (extra, want) in cases {
            let e = parse(extra).unwrap_err();
            assert!(e.contains(want), "{extra}: {e}");
        }
        let e = Config::parse(&BASE.replace("lr = 0.01", "lr = 0.01\nsigma_leaves = 3"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("es.sigma_leaves must be a table"), "{e}");
        let e = Config::parse(&BASE.replace("lr = 0.01", "lr = 0.01\nfreeze = [\"[x\"]"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("es.freeze: \"[x\" is not a glob"), "{e}");
    }
}
