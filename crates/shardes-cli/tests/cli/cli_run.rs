//! `shardes run` end to end: the quickstart config, resume equivalence and Ctrl-C.

use crate::common::*;
use shardes::hlo::params::ParamTree;

/// The quickstart config, shortened to 4 generations and pointed at a temp dir: the
/// metrics file is well-formed, the mean loss falls, and the params file loads.
#[test]
fn quickstart_config_runs_and_loss_falls() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("qs");
    let cfg_text = std::fs::read_to_string(repo().join("examples/quickstart.toml")).unwrap();
    assert!(
        cfg_text.contains("generations = 30") && cfg_text.contains("out = \"runs/quickstart\"")
    );
    let cfg_text = cfg_text
        .replace("generations = 30", "generations = 4")
        .replace(
            "out = \"runs/quickstart\"",
            &format!("out = \"{}\"", out.display()),
        );
    let cfg = write(dir.path(), "quickstart.toml", &cfg_text);
    let o = shardes(&["run", cfg.to_str().unwrap()]);
    let (stdout, _) = exited(&o, 0);
    // Not a terminal: one plain line per generation.
    assert!(stdout.contains("gen 4/4 fitness mean"), "{stdout}");

    let m = metrics(&out);
    assert_eq!(m.len(), 4);
    for (i, r) in m.iter().enumerate() {
        assert_eq!(r.generation as usize, i);
        assert!(r.fitness_min <= r.fitness_mean && r.fitness_mean <= r.fitness_max);
        assert!(r.ms > 0.0);
    }
    // Generation 0 is the JAX reference's generation 0 (mean of its 256 fitness values;
    // the library matches them to 1e-5 relative per member, so the mean to 1e-5 too).
    let jax = shardes::io::SafetensorsFile::open(
        repo().join("../shared/testdata/quickstart_gen0.safetensors"),
    )
    .unwrap()
    .f32("fitness")
    .unwrap();
    let jax_mean = jax.data().iter().map(|&f| f64::from(f)).sum::<f64>() / jax.len() as f64;
    let rel = (m[0].fitness_mean - jax_mean).abs() / jax_mean;
    assert!(
        rel <= 1e-5,
        "generation 0 mean {} vs JAX {jax_mean}",
        m[0].fitness_mean
    );
    // Every generation after it must be lower.
    for w in m.windows(2) {
        assert!(
            w[1].fitness_mean < w[0].fitness_mean,
            "mean loss did not fall: {m:?}"
        );
    }

    let st = state(&out);
    assert_eq!(st["generation"], 4);
    assert_eq!(st["key"], serde_json::json!([0, 0]));
    let template =
        shardes::hlo::problems::transformer_block::init(shardes::hlo::prng::key(0).unwrap(), 64)
            .unwrap();
    let p = shardes::io::read_params(out.join("params.safetensors"), &template).unwrap();
    assert_eq!(p.leaf_paths(), template.leaf_paths());
    assert_ne!(p, template, "the parameters did not move");
    // The resolved config is a valid config of the same run.
    let resolved = std::fs::read_to_string(out.join("config.toml")).unwrap();
    assert!(resolved.contains("checkpoint_every = 10"), "{resolved}");
}

fn load_params(out: &std::path::Path) -> ParamTree {
    shardes::io::read_params_inferred(out.join("params.safetensors")).unwrap()
}

/// 4 generations in one go (checkpoints at 2 and 4) against 2 generations then `--resume`
/// to 4: parameters bit-identical, metrics identical except `ms`.
#[test]
fn resume_yields_the_uninterrupted_trajectory() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a");
    let b = dir.path().join("b");
    let cfg_a = write(dir.path(), "a.toml", &small_config(&a, 4, 2));
    let cfg_b2 = write(dir.path(), "b2.toml", &small_config(&b, 2, 2));
    let cfg_b4 = write(dir.path(), "b4.toml", &small_config(&b, 4, 2));

    let o = shardes(&["run", cfg_a.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{:?}", text(&o));
    let o = shardes(&["run", cfg_b2.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{:?}", text(&o));
    assert_eq!(state(&b)["generation"], 2);
    // Metrics past the checkpoint must be dropped on resume: fake a generation that the
    // checkpoint does not contain.
    let fake =
        r#"{"generation":2,"fitness_mean":9.0,"fitness_min":9.0,"fitness_max":9.0,"ms":1.0}"#;
    let mut mtext = std::fs::read_to_string(b.join("metrics.jsonl")).unwrap();
    mtext.push_str(fake);
    mtext.push('\n');
    std::fs::write(b.join("metrics.jsonl"), mtext).unwrap();

    let o = shardes(&["run", cfg_b4.to_str().unwrap(), "--resume"]);
    let (stdout, _) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{:?}", text(&o));
    assert!(stdout.contains("resuming at generation 2"), "{stdout}");

    assert_eq!(state(&a)["generation"], 4);
    assert_eq!(state(&b)["generation"], 4);
    let (pa, pb) = (load_params(&a), load_params(&b));
    for ((path, x), (_, y)) in pa.leaves().into_iter().zip(pb.leaves()) {
        let xb: Vec<u32> = x.data().iter().map(|v| v.to_bits()).collect();
        let yb: Vec<u32> = y.data().iter().map(|v| v.to_bits()).collect();
        assert_eq!(xb, yb, "leaf {path} differs after resume");
    }
    let (ma, mb) = (metrics(&a), metrics(&b));
    assert_eq!(ma.len(), 4);
    assert_eq!(mb.len(), 4);
    for (x, y) in ma.iter().zip(&mb) {
        assert_eq!(
            (x.generation, x.fitness_mean, x.fitness_min, x.fitness_max),
            (y.generation, y.fitness_mean, y.fitness_min, y.fitness_max)
        );
    }

    // Running the same config again without --resume is refused and changes nothing; with
    // --force it starts over, moving the old run aside, and says so.
    let before = std::fs::read(a.join("state.json")).unwrap();
    refused(
        &["run", cfg_a.to_str().unwrap()],
        "holds a checkpoint of this config at generation 4",
        "--resume",
    );
    assert_eq!(std::fs::read(a.join("state.json")).unwrap(), before);
    let o = shardes(&["run", cfg_a.to_str().unwrap(), "--force"]);
    assert_eq!(o.status.code(), Some(0), "{:?}", text(&o));
    let moved = format!(
        "held a checkpoint at generation 4; moved it to {}, starting over",
        a.join("previous").display()
    );
    assert!(text(&o).0.contains(&moved), "{:?}", text(&o));
    assert_eq!(
        std::fs::read(a.join("previous/state.json")).unwrap(),
        before
    );
    assert_eq!(metrics(&a).len(), 4);
    assert_eq!(
        load_params(&a),
        pb,
        "a rerun from scratch must reproduce the run"
    );

    // Resuming a finished run has nothing to do and changes nothing.
    let o = shardes(&["run", cfg_b4.to_str().unwrap(), "--resume"]);
    assert_eq!(o.status.code(), Some(0), "{:?}", text(&o));
    assert!(text(&o).0.contains("nothing to do"));
    assert_eq!(metrics(&b).len(), 4);
}

/// SIGINT finishes the current generation, writes a checkpoint that matches the metrics,
/// and exits 130. The out dir starts out holding another config's run, which `--force`
/// overrides.
#[test]
fn ctrl_c_checkpoints_and_exits_130() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("int");
    foreign_state(&out, 7);
    let cfg = write(dir.path(), "int.toml", &small_config(&out, 1_000_000, 0));
    let mut child = bin()
        .args(["run", cfg.to_str().unwrap(), "--force"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_metrics(&out, 3, &mut child);
    let pid = i32::try_from(child.id()).unwrap();
    // SAFETY: sending a signal to our own child process.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGINT) }, 0);
    let o = child.wait_with_output().unwrap();
    let (stdout, _) = exited(&o, 130);
    assert!(
        stdout.contains("interrupted: checkpoint at generation"),
        "{stdout}"
    );
    let st = state(&out);
    let g = st["generation"].as_u64().unwrap();
    assert!(g >= 3);
    assert_ne!(st["config_hash"], "0123456789abcdef");
    // Every generation run is in the metrics, and the checkpoint is after the last of them.
    assert_eq!(metrics(&out).len() as u64, g);
    let p = load_params(&out);
    assert_eq!(p.num_leaves(), 6);
}
