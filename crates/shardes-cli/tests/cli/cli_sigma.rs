//! `[es.sigma_leaves]`, `es.sigma_separable` and `es.freeze` from the command line: a run
//! with all three resumes bit-identically and leaves the frozen leaf as it was drawn; a
//! resume with a changed table or a changed separable file is refused; bad values, patterns
//! that match no leaf and bad files exit 2 naming the key before anything compiles.

use std::path::Path;

use crate::common::*;
use shardes::hlo::params::{Array, ParamTree};
use shardes::hlo::prng::key;
use shardes::hlo::problems::transformer_block::TransformerBlock;

/// `small_config` with `es` lines added to `[es]` and a `[es.sigma_leaves]` table.
fn config(out: &Path, generations: usize, es: &str, table: &str) -> String {
    small_config(out, generations, 2)
        .replace("how = \"B\"\n", &format!("how = \"B\"\n{es}"))
        .replace("[run]", &format!("[es.sigma_leaves]\n{table}[run]"))
}

/// A separable σ file for the (16, 16) leaf `wq`, its values offset by `shift`.
fn separable_file(path: &Path, shift: f32) {
    let v = |at: f32| -> Array {
        let data = (0..16).map(|i| 0.005 + 0.001 * (i as f32 + at)).collect();
        Array::new(vec![16], data).unwrap()
    };
    let (p, q) = (v(shift), v(3.0));
    shardes::io::write_named(path, &[("wq.p", &p), ("wq.q", &q)]).unwrap();
}

fn params(out: &Path) -> ParamTree {
    shardes::io::read_params_inferred(out.join("params.safetensors")).unwrap()
}

fn run(args: &[&str]) {
    let o = shardes(args);
    exited(&o, 0);
}

const TABLE: &str = "\"w_*\" = 0.02\n\"w*\" = 0.005\n";

#[test]
fn per_leaf_sigma_separable_and_freeze_run_and_resume_bit_identically() {
    let dir = tempfile::tempdir().unwrap();
    let sep = dir.path().join("sigma.safetensors");
    separable_file(&sep, 0.0);
    let es = format!(
        "freeze = [\"wk\"]\nsigma_separable = \"{}\"\n",
        sep.display()
    );
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    let cfg_a = write(dir.path(), "a.toml", &config(&a, 4, &es, TABLE));
    let cfg_b2 = write(dir.path(), "b2.toml", &config(&b, 2, &es, TABLE));
    let cfg_b4 = write(dir.path(), "b4.toml", &config(&b, 4, &es, TABLE));
    run(&["run", cfg_a.to_str().unwrap()]);
    run(&["run", cfg_b2.to_str().unwrap()]);
    let o = shardes(&["run", cfg_b4.to_str().unwrap(), "--resume"]);
    let (stdout, _) = exited(&o, 0);
    assert!(stdout.contains("resuming at generation 2"), "{stdout}");
    let initial = TransformerBlock {
        d_model: 16,
        batch: 2,
        seq: 4,
    }
    .init(key(3).unwrap())
    .unwrap();
    let (pa, pb) = (params(&a), params(&b));
    for (((path, x), (_, y)), (_, x0)) in pa
        .leaves()
        .into_iter()
        .zip(pb.leaves())
        .zip(initial.leaves())
    {
        let bits = |a: &Array| a.data().iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(x), bits(y), "{path}: resumed run differs");
        if path == "wk" {
            assert_eq!(bits(x), bits(x0), "frozen wk moved");
        } else {
            assert_ne!(bits(x), bits(x0), "{path} did not move");
        }
    }
    // The resolved config keeps the table in file order.
    let resolved = std::fs::read_to_string(a.join("config.toml")).unwrap();
    let first = resolved.find("\"w_*\"").expect("w_* written");
    let second = resolved.find("\"w*\"").expect("w* written");
    assert!(first < second, "{resolved}");
}

#[test]
fn resume_refuses_a_changed_table_or_separable_file() {
    let dir = tempfile::tempdir().unwrap();
    let sep = dir.path().join("sigma.safetensors");
    separable_file(&sep, 0.0);
    let es = format!("sigma_separable = \"{}\"\n", sep.display());
    let out = dir.path().join("out");
    let cfg = write(dir.path(), "a.toml", &config(&out, 2, &es, TABLE));
    run(&["run", cfg.to_str().unwrap()]);
    let more = write(dir.path(), "b.toml", &config(&out, 4, &es, TABLE));
    // Another σ for a pattern, or the patterns in another order: another run.
    for table in [
        "\"w_*\" = 0.03\n\"w*\" = 0.005\n",
        "\"w*\" = 0.005\n\"w_*\" = 0.02\n",
    ] {
        let other = write(dir.path(), "c.toml", &config(&out, 4, &es, table));
        refused(
            &["run", other.to_str().unwrap(), "--resume"],
            "holds a run of another config",
            "resume with the config that started it",
        );
    }
    // The same config over another file.
    separable_file(&sep, 1.0);
    refused(
        &["run", more.to_str().unwrap(), "--resume"],
        &format!(
            "--resume: {} changed since the checkpoint was written",
            sep.display()
        ),
        "resume with the files the run started with",
    );
    separable_file(&sep, 0.0);
    run(&["run", more.to_str().unwrap(), "--resume"]);
}

#[test]
fn bad_sigma_keys_exit_2_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let leaves = "the leaves are: w_down, w_up, wk, wo, wq, wv";
    let cases: [(&str, &str, String, &str); 6] = [
        (
            "",
            "\"layers.*.wq\" = 0.1\n",
            format!("es.sigma_leaves: pattern \"layers.*.wq\" matches no leaf; {leaves}"),
            "fix or remove the pattern",
        ),
        (
            "freeze = [\"model.embed_tokens.weight\"]\n",
            "",
            format!("es.freeze: pattern \"model.embed_tokens.weight\" matches no leaf; {leaves}"),
            "fix or remove the pattern",
        ),
        (
            "",
            "\"w*\" = nan\n",
            "es.sigma_leaves.\"w*\" = NaN is not a finite number > 0".into(),
            "es.sigma_leaves.\"w*\"",
        ),
        (
            "",
            "\"wq\" = -0.5\n",
            "es.sigma_leaves.\"wq\" = -0.5 is not a finite number > 0".into(),
            "small positive",
        ),
        (
            "freeze = [\"w*\"]\n",
            "",
            "es.freeze freezes every leaf".into(),
            "at least one leaf",
        ),
        (
            "sigma_separable = \"/nonexistent/sigma.safetensors\"\n",
            "",
            "es.sigma_separable: ".into(),
            "safetensors file",
        ),
    ];
    for (es, table, what, hint) in cases {
        let cfg = write(dir.path(), "bad.toml", &config(&out, 1, es, table));
        refused(&["run", cfg.to_str().unwrap()], &what, hint);
        refused(&["hlo", cfg.to_str().unwrap()], &what, hint);
        assert!(!out.exists(), "{what}: the out directory was created");
    }
    // A separable file for a leaf of another shape, or with a stray tensor.
    let sep = dir.path().join("sigma.safetensors");
    let v = |n: usize| Array::new(vec![n], vec![0.01; n]).unwrap();
    let es = format!("sigma_separable = \"{}\"\n", sep.display());
    let cfg = write(dir.path(), "sep.toml", &config(&out, 1, &es, ""));
    shardes::io::write_named(&sep, &[("wq.p", &v(16)), ("wq.q", &v(15))]).unwrap();
    refused(
        &["run", cfg.to_str().unwrap()],
        "es.sigma_separable: leaf \"wq\" is (16, 16) but p has 16 entries and q 15",
        "q of length 16",
    );
    shardes::io::write_named(&sep, &[("wq.p", &v(16)), ("wq.r", &v(16))]).unwrap();
    refused(
        &["run", cfg.to_str().unwrap()],
        "es.sigma_separable: tensor \"wq.r\" is not <leaf>.p or <leaf>.q",
        "<leaf path>.p",
    );
    shardes::io::write_named(&sep, &[("wq.p", &v(16))]).unwrap();
    refused(
        &["run", cfg.to_str().unwrap()],
        "es.sigma_separable: leaf \"wq\" has no tensor \"wq.q\"",
        "<leaf path>.q",
    );
}
