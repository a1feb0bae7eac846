//! `es.optimizer` from the config: a run resumed from a checkpoint mid-run is bit-identical
//! to the uninterrupted one (parameters and optimizer state), `sgd` writes the checkpoint it
//! always has, and bad optimizer settings exit 2 naming the key.

use crate::common::*;

/// `small_config` with the `[es]` lines `optimizer` added.
fn config(out: &std::path::Path, generations: usize, every: usize, optimizer: &str) -> String {
    small_config(out, generations, every)
        .replace("how = \"B\"\n", &format!("how = \"B\"\n{optimizer}\n"))
}

/// The bytes of the per-generation files `state.json` names (parameters, optimizer state).
fn checkpoint_files(out: &std::path::Path) -> (Vec<u8>, Option<Vec<u8>>) {
    let st = state(out);
    let params = std::fs::read(out.join(st["params_file"].as_str().unwrap())).unwrap();
    let opt = st["optimizer_file"]
        .as_str()
        .map(|f| std::fs::read(out.join(f)).unwrap());
    (params, opt)
}

#[test]
fn resuming_mid_run_gives_the_uninterrupted_run_for_every_optimizer() {
    for optimizer in [
        "optimizer = { name = \"adam\", weight_decay = 0.01 }",
        "optimizer = \"momentum\"",
        // The section form, last in [es].
        "[es.optimizer]\nname = \"clipup\"\nmax_speed = 0.05",
    ] {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        let cfg_a = write(dir.path(), "a.toml", &config(&a, 5, 0, optimizer));
        let cfg_b2 = write(dir.path(), "b2.toml", &config(&b, 2, 0, optimizer));
        let cfg_b5 = write(dir.path(), "b5.toml", &config(&b, 5, 0, optimizer));
        ok(&["run", s(&cfg_a)]);
        ok(&["run", s(&cfg_b2)]);
        assert_eq!(state(&b)["generation"], 2, "{optimizer}");
        let (stdout, _) = ok(&["run", s(&cfg_b5), "--resume"]);
        assert!(stdout.contains("resuming at generation 2"), "{stdout}");
        let (pa, oa) = checkpoint_files(&a);
        let (pb, ob) = checkpoint_files(&b);
        assert!(
            oa.is_some(),
            "{optimizer}: no optimizer file in {:?}",
            state(&a)
        );
        assert!(pa == pb, "{optimizer}: parameters differ after resume");
        assert!(
            oa == ob,
            "{optimizer}: optimizer state differs after resume"
        );
        let (ma, mb) = (metrics(&a), metrics(&b));
        assert_eq!(mb.len(), 5);
        for (x, y) in ma.iter().zip(&mb) {
            assert_eq!(
                (x.generation, x.fitness_mean, x.fitness_min, x.fitness_max),
                (y.generation, y.fitness_mean, y.fitness_min, y.fitness_max),
                "{optimizer}"
            );
        }
        // Only the checkpoint's optimizer file is left, and the resolved config runs the same
        // optimizer again.
        let files: Vec<String> = std::fs::read_dir(&b)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("optimizer."))
            .collect();
        assert_eq!(files.len(), 1, "{files:?}");
        let resolved = std::fs::read_to_string(b.join("config.toml")).unwrap();
        assert!(resolved.contains("optimizer"), "{resolved}");
        let again = write(dir.path(), "again.toml", &resolved);
        let stdout = ok(&["run", s(&again), "--resume"]).0;
        assert!(stdout.contains("nothing to do"), "{optimizer}: {stdout}");
    }
}

#[test]
fn sgd_checkpoints_hold_no_optimizer_state() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("sgd");
    let text = config(&out, 1, 0, "optimizer = \"sgd\"");
    ok(&["run", s(&write(dir.path(), "sgd.toml", &text))]);
    let text = std::fs::read_to_string(out.join("state.json")).unwrap();
    assert!(!text.contains("optimizer"), "{text}");
    // Written out as the default, the optimizer is left out of the resolved config, so it
    // hashes as a config without the key.
    let resolved = std::fs::read_to_string(out.join("config.toml")).unwrap();
    assert!(!resolved.contains("optimizer"), "{resolved}");
    let plain = write(dir.path(), "plain.toml", &small_config(&out, 1, 0));
    let (stdout, _) = ok(&["run", s(&plain), "--resume"]);
    assert!(stdout.contains("nothing to do"), "{stdout}");
}

#[test]
fn bad_optimizer_settings_name_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("never");
    for (optimizer, what, hint) in [
        (
            "optimizer = \"adm\"",
            "es.optimizer: unknown optimizer \"adm\"",
            "did you mean \"adam\"? valid: sgd, momentum, adam, clipup",
        ),
        (
            "optimizer = \"clipup\"",
            "es.optimizer.max_speed: clipup needs its max speed",
            "max_speed = 0.3",
        ),
        (
            "[es.optimizer]\nname = \"adam\"\nbeta1 = 0.9",
            "unknown key `es.optimizer.beta1`",
            "did you mean `b1`?",
        ),
        (
            "optimizer = { name = \"momentum\", b1 = 0.9 }",
            "es.optimizer.b1 is not a setting of momentum",
            "momentum reads: momentum, weight_decay",
        ),
        (
            "optimizer = { name = \"momentum\", momentum = 1.0 }",
            "es.optimizer.momentum = 1 is not in [0, 1)",
            "es.optimizer.momentum",
        ),
        (
            "optimizer = { name = \"clipup\", max_speed = -1 }",
            "es.optimizer.max_speed = -1 is not a finite number > 0",
            "es.optimizer.max_speed",
        ),
        (
            "optimizer = { max_speed = 0.3 }",
            "es.optimizer has no name",
            "sgd, momentum, adam, clipup",
        ),
        (
            "optimizer = { name = \"adam\", eps = \"small\" }",
            "es.optimizer.eps must be a number",
            "es.optimizer.eps",
        ),
        (
            "optimizer = 3",
            "es.optimizer must be an optimizer name or a table",
            "max_speed = 0.3",
        ),
    ] {
        let cfg = write(dir.path(), "bad.toml", &config(&out, 1, 0, optimizer));
        refused(&["run", cfg.to_str().unwrap()], what, hint);
        assert!(
            !out.exists(),
            "{optimizer}: the refusal wrote {}",
            out.display()
        );
    }
}
