//! Reward fine-tuning from the CLI (`[task]`, `[eval]`), through the real plugin: a tiny
//! random Qwen2 learns a reward, a killed sampled run resumes bit for bit (parameters,
//! metrics, eval lines), the Countdown example runs end to end, and bad task input is a
//! clear error; `shardes eval` reproduces the run's evaluations; a reward program
//! (`reward_command`) and `shardes export` (`export`) end to end. One test binary: each
//! binary links the whole CLI.

use std::path::Path;

use crate::common::*;

/// A target_token run of a tiny random Qwen2: the reward is the share of token 7 in each
/// completion of 8 tokens.
fn target_token(out: &Path, generations: usize, every: usize, extra: &str) -> String {
    TargetToken {
        devices: 8,
        n: 64,
        prompts: 4,
        max_new_tokens: 8,
        es: "shaping = \"centered_ranks\"",
        task: extra,
        eval: &format!("[eval]\nevery = {every}\nprompts = 16"),
        run: &format!("seed = 0\ngenerations = {generations}\ncheckpoint_every = {every}"),
        ..TargetToken::default()
    }
    .config(out)
}

/// `extra` of every metrics line, in order.
fn extras(out: &Path) -> Vec<serde_json::Value> {
    let lines = json_lines(&out.join("metrics.jsonl"));
    lines.into_iter().map(|l| l["extra"].clone()).collect()
}

/// [`extras`] without the timings.
fn untimed_extras(out: &Path) -> Vec<serde_json::Value> {
    let mut v = extras(out);
    for x in &mut v {
        let o = x.as_object_mut().unwrap();
        o.remove("tok/s");
        o.remove("host_share");
    }
    v
}

fn evals(out: &Path) -> Vec<serde_json::Value> {
    let path = out.join("eval.jsonl");
    if path.exists() {
        json_lines(&path)
    } else {
        Vec::new()
    }
}

fn run(config: &Path) -> std::process::Output {
    shardes(&["run", s(config)])
}

/// Runs `config` (writing `out`), kills it once `after` generations are in its metrics,
/// and resumes it to the end (`generations`); the generation of the checkpoint it resumed
/// from.
fn kill_and_resume(config: &Path, out: &Path, after: usize, generations: u64) -> u64 {
    let mut child = bin()
        .args(["run", s(config)])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    wait_for_metrics(out, after, &mut child);
    child.kill().unwrap();
    child.wait().unwrap();
    let at = state(out)["generation"].as_u64().unwrap();
    assert!(at < generations, "the kill came after the end");
    ok(&["run", s(config), "--resume"]);
    at
}

/// Stated up front: from a mean reward at or below 0.1 in generation 0 (a random model
/// emits token 7 about 1 time in 128), the population's mean reward reaches 0.5 by
/// generation 30 and the held-out greedy reward rises above its start. Measured: 0.00 at
/// generation 1, 0.96 at 30; held out 0 at 0, 1.0 at 30.
#[test]
fn a_tiny_model_learns_a_token_reward() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let cfg = write(dir.path(), "tt.toml", &target_token(&out, 30, 10, ""));
    let (stdout, _) = exited(&run(&cfg), 0);
    has_all(&stdout, &["reward", "tok/s", "eval gen 0:"]);
    let x = extras(&out);
    assert_eq!(x.len(), 30);
    let reward = |i: usize| x[i]["reward"].as_f64().unwrap();
    assert!(reward(0) <= 0.1, "{:?}", x[0]);
    assert!(reward(29) >= 0.5, "generation 30: {:?}", x[29]);
    for k in ["accuracy", "format", "tok/s"] {
        assert!(x[29][k].as_f64().is_some(), "{k}: {:?}", x[29]);
    }
    let e = evals(&out);
    let gens: Vec<u64> = e
        .iter()
        .map(|r| r["generation"].as_u64().unwrap())
        .collect();
    assert_eq!(gens, vec![0, 10, 20, 30]);
    let held = |i: usize| e[i]["mean_reward"].as_f64().unwrap();
    assert!(held(3) > held(0), "{e:?}");
    assert_eq!(e[0]["l2_from_init"].as_f64(), Some(0.0));
    assert!(e[3]["l2_from_init"].as_f64().unwrap() > 0.0);
    assert_eq!(e[0]["samples"].as_array().unwrap().len(), 3);

    // `shardes generate` decodes the held-out prompts with the trained parameters.
    let params = out.join("params.safetensors");
    let (stdout, _) = ok(&[
        "generate",
        s(&cfg),
        "--params",
        s(&params),
        "--split",
        "test",
        "--count",
        "16",
    ]);
    assert_eq!(stdout.matches("### completion").count(), 16, "{stdout}");
    let mean: f64 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("mean reward "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no mean reward line in {stdout}"));
    assert!(mean >= 0.5, "{stdout}");

    // `shardes eval --compare` decodes the held-out prompts with the run's own evaluation
    // program: its per-prompt rewards average exactly to eval.jsonl's first and last lines.
    let (stdout, _) = ok(&["eval", s(&out), "--compare", "--count", "16"]);
    has_all(
        &stdout,
        &["base ", "tuned ", "diff ", "(generation 30)", "mean reward"],
    );
    let lines = json_lines(&out.join("eval-completions.jsonl"));
    assert_eq!(lines.len(), 32);
    let mean_of = |model: &str| {
        let r: Vec<f64> = lines
            .iter()
            .filter(|l| l["model"] == model)
            .map(|l| l["reward"].as_f64().unwrap())
            .collect();
        assert_eq!(r.len(), 16, "{model}");
        r.iter().sum::<f64>() / 16.0
    };
    assert_eq!(mean_of("base"), held(0), "{stdout}");
    assert_eq!(mean_of("tuned"), held(3), "{stdout}");
    // Parameters of a run of another model (another seed's random weights) are refused.
    let other = write(
        dir.path(),
        "other.toml",
        &target_token(&out, 30, 10, "").replace("seed = 0", "seed = 5"),
    );
    let (_, stderr) = exited(&shardes(&["eval", s(&other), "--params", s(&params)]), 2);
    assert!(stderr.contains("another model"), "{stderr}");
}

/// Sampled decoding (temperature 0.8) with fresh prompts every generation, killed after
/// generation 7 and resumed from its checkpoint at 6: the same parameters (bytes), the
/// same metrics (but the timings) and the same eval lines as an uninterrupted run.
#[test]
fn a_killed_sampled_run_resumes_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    let sampled = "temperature = 0.8\ntop_p = 0.9";
    let whole = dir.path().join("whole");
    let cfg = write(dir.path(), "a.toml", &target_token(&whole, 12, 3, sampled));
    exited(&run(&cfg), 0);

    let cut = dir.path().join("cut");
    let cfg = write(dir.path(), "b.toml", &target_token(&cut, 12, 3, sampled));
    let at = kill_and_resume(&cfg, &cut, 7, 12);

    assert_eq!(
        std::fs::read(whole.join("params.safetensors")).unwrap(),
        std::fs::read(cut.join("params.safetensors")).unwrap(),
        "parameters differ after the resume from generation {at}"
    );
    assert_eq!(untimed_extras(&whole), untimed_extras(&cut));
    let fit = |m: Vec<Metric>| -> Vec<(u32, f64, f64, f64)> {
        m.into_iter()
            .map(|m| (m.generation, m.fitness_mean, m.fitness_min, m.fitness_max))
            .collect()
    };
    assert_eq!(fit(metrics(&whole)), fit(metrics(&cut)));
    assert_eq!(evals(&whole), evals(&cut));
    assert_eq!(evals(&whole).len(), 5, "evals at 0, 3, 6, 9, 12");
}

/// The shipped Countdown example, shortened to 2 generations: decode, grade, tell and the
/// held-out evaluation run end to end.
#[test]
fn the_countdown_example_runs_end_to_end() {
    let dir = tempfile::tempdir().unwrap();
    let text = example("countdown_tiny.toml");
    let tok = repo().join("examples/countdown_tokenizer.json");
    let out = dir.path().join("out");
    let text = text
        .replace("generations = 10", "generations = 2")
        .replace(
            "\"examples/countdown_tokenizer.json\"",
            &format!("\"{}\"", tok.display()),
        )
        .replace("\"runs/countdown_tiny\"", &format!("\"{}\"", out.display()));
    let cfg = write(dir.path(), "cd.toml", &text);
    let (stdout, _) = exited(&run(&cfg), 0);
    assert!(stdout.contains("eval gen 2:"), "{stdout}");
    let e = evals(&out);
    assert_eq!(e.len(), 2);
    let sample = &e[0]["samples"][0];
    assert!(
        sample["prompt"].as_str().unwrap().starts_with("numbers "),
        "{sample}"
    );
    assert_eq!(state(&out)["generation"], 2);

    // One prompt of one's own, graded by nothing (no split asked).
    let prompt = "numbers 3 5 7 target 15 answer";
    let generate = [
        "generate",
        s(&cfg),
        "--prompt",
        prompt,
        "--max-new-tokens",
        "6",
    ];
    let (stdout, _) = ok(&generate);
    has_all(
        &stdout,
        &[
            "### prompt 0\nnumbers 3 5 7 target 15 answer",
            "### completion 0 (",
        ],
    );
}

/// Bad task input: each a config error (exit 2) naming the problem and the fix.
#[test]
fn bad_task_input_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = repo().join("tests/fixtures/qwen2_tiny");
    let base = |task: &str| {
        format!(
            "devices = 1\n[problem]\nname = \"qwen2\"\ncheckpoint = \"{}\"\n{}[task]\n{task}\n\
             [run]\ngenerations = 1\nout = \"{}\"\n",
            fixture.display(),
            mirrored_es(4, 0.01, 0.01),
            dir.path().join("out").display()
        )
    };
    let empty = write(dir.path(), "empty.jsonl", "\n\n");
    let bad = write(
        dir.path(),
        "bad.jsonl",
        "{\"prompt\": \"a\", \"answer\": \"1\"}\n{\"prompt\": \"b\"\n",
    );
    let cases = [
        (
            format!("name = \"jsonl\"\ntrain = \"{}\"", empty.display()),
            "is empty",
            "task.train",
        ),
        (
            format!("name = \"jsonl\"\ntrain = \"{}\"", bad.display()),
            "bad.jsonl:2:",
            "task.train",
        ),
        (
            "name = \"countdown\"\nchat = true".to_string(),
            "chat template",
            "task.chat = false",
        ),
        (
            "name = \"countdown\"\nprompt_len = 60\nmax_new_tokens = 16".to_string(),
            "exceeds the model's 64 positions",
            "lower task.prompt_len",
        ),
        (
            "name = \"countdown\"\nprompt_len = 8\nmax_new_tokens = 4".to_string(),
            "task.prompt_len = 8",
            "raise task.prompt_len",
        ),
    ];
    for (task, what, hint) in cases {
        let cfg = write(dir.path(), "bad.toml", &base(&task));
        refused(&["run", cfg.to_str().unwrap(), "--force"], what, hint);
    }
}

/// A reward run with adam (issue #16's optimizers): its state goes into the checkpoint, and
/// a run stopped at generation 3 and resumed ends with the bytes of an uninterrupted run,
/// with the same metrics and eval lines. Without the moments the resumed steps would
/// differ, and the parameters differ from sgd's.
// Reward runs resume bit for bit in the default tier (the sampled run above), and so do
// loss runs with every optimizer (`cli_optimizer.rs`); adam in a reward run, about 60 s
// here, runs in the slow tier.
#[test]
#[ignore = "slow tier"]
fn slow_a_reward_run_with_adam_resumes_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    let adam = "\noptimizer = \"adam\"";
    // `extra` lands in [task]: the optimizer goes under [es], after the shaping.
    let config = |out: &Path, generations: usize, optimizer: &str| {
        target_token(out, generations, 3, "")
            .replace("n = 64", "n = 32")
            .replace(
                "shaping = \"centered_ranks\"",
                &format!("shaping = \"centered_ranks\"{optimizer}"),
            )
    };
    let whole = dir.path().join("whole");
    exited(
        &run(&write(dir.path(), "w.toml", &config(&whole, 6, adam))),
        0,
    );
    assert!(
        state(&whole)["optimizer_file"].as_str().is_some(),
        "{}",
        state(&whole)
    );
    let cut = dir.path().join("cut");
    exited(
        &run(&write(dir.path(), "c.toml", &config(&cut, 3, adam))),
        0,
    );
    let cfg = write(dir.path(), "c.toml", &config(&cut, 6, adam));
    let (stdout, _) = ok(&["run", s(&cfg), "--resume"]);
    assert!(stdout.contains("resuming at generation 3"), "{stdout}");
    let bytes = |out: &Path| std::fs::read(out.join("params.safetensors")).unwrap();
    assert_eq!(bytes(&whole), bytes(&cut), "parameters after the resume");
    assert_eq!(untimed_extras(&whole), untimed_extras(&cut));
    assert_eq!(evals(&whole), evals(&cut));

    let sgd = dir.path().join("sgd");
    exited(&run(&write(dir.path(), "s.toml", &config(&sgd, 6, ""))), 0);
    assert_ne!(bytes(&whole), bytes(&sgd), "adam stepped as sgd");
}

/// `layers = "loop"` holds the layers' leaves as `[L, …]` stacks on the devices and cuts
/// them back into Hugging Face's per-layer tensors for the checkpoint: a looped reward run
/// (unpaired low rank, greedy decoding, 8 devices) writes the same parameter bytes as the
/// unrolled one, and killed after generation 4 and resumed from its checkpoint it writes
/// them again.
#[test]
fn a_looped_reward_run_checkpoints_per_layer_and_resumes_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    let looped = |out: &Path| {
        target_token(out, 6, 2, "")
            .replace("size = \"tiny\"", "size = \"tiny\"\nlayers = \"loop\"")
            .replace("mirrored(lowrank(r=1))", "lowrank(r=1)")
    };
    let unrolled = dir.path().join("unrolled");
    let cfg = write(
        dir.path(),
        "u.toml",
        &target_token(&unrolled, 6, 2, "").replace("mirrored(lowrank(r=1))", "lowrank(r=1)"),
    );
    exited(&run(&cfg), 0);
    let whole = dir.path().join("whole");
    let cfg = write(dir.path(), "w.toml", &looped(&whole));
    exited(&run(&cfg), 0);
    let params = |out: &Path| std::fs::read(out.join("params.safetensors")).unwrap();
    assert_eq!(
        params(&whole),
        params(&unrolled),
        "looped and unrolled parameters differ"
    );
    let names: Vec<String> = shardes::io::read_params_inferred(whole.join("params.safetensors"))
        .unwrap()
        .leaves()
        .into_iter()
        .map(|(p, _)| p)
        .collect();
    assert!(
        names
            .iter()
            .any(|p| p == "model.layers.1.mlp.up_proj.weight"),
        "{names:?}"
    );
    assert!(!names.iter().any(|p| p.contains("stack")), "{names:?}");

    let cut = dir.path().join("cut");
    let cfg = write(dir.path(), "c.toml", &looped(&cut));
    let at = kill_and_resume(&cfg, &cut, 4, 6);
    assert_eq!(
        params(&whole),
        params(&cut),
        "parameters differ after the resume from generation {at}"
    );
    assert_eq!(extras(&whole).len(), extras(&cut).len());
}

mod reward_command {
    //! `[task.reward]` from the command line: the shipped `examples/jsonl_reward.toml` runs with
    //! a reward program whose rewards are checked exactly (a fixture program hashes each
    //! completion's text, which the eval log shows), and a program that keeps dying stops the
    //! run (exit 1) with its stderr in the message, leaving a checkpoint that resumes.

    use std::path::{Path, PathBuf};
    use std::process::Output;

    use crate::common::*;
    use sha2::{Digest, Sha256};

    fn fixture() -> PathBuf {
        repo().join("tests/fixtures/reward/fixture.py")
    }

    /// The shipped example with `generations`, a checkpoint every generation, `out`, and
    /// `command` as the reward program.
    fn config(
        dir: &Path,
        out: &Path,
        generations: usize,
        command: &[String],
        restarts: u32,
    ) -> PathBuf {
        let text = example("jsonl_reward.toml");
        let cmd = serde_json::to_string(command).unwrap();
        let text = text
            .replace("generations = 10", &format!("generations = {generations}"))
            .replace("checkpoint_every = 5", "checkpoint_every = 1")
            .replace("\"runs/jsonl_reward\"", &format!("\"{}\"", out.display()))
            .replace("[\"python3\", \"examples/reward.py\"]", &cmd)
            .replace("restarts = 3", &format!("restarts = {restarts}"));
        assert!(text.contains(&cmd), "the example's command line changed");
        write(dir, "reward.toml", &text)
    }

    fn run(cfg: &Path, resume: bool) -> Output {
        let mut args = vec!["run", s(cfg)];
        if resume {
            args.push("--resume");
        }
        at_repo(&args)
    }

    fn hashed(text: &str) -> f64 {
        let d = Sha256::digest(text.as_bytes());
        let hex: String = d.iter().map(|b| format!("{b:02x}")).collect();
        f64::from(u32::from_str_radix(&hex[..5], 16).unwrap())
    }

    fn python(args: &[&str]) -> Vec<String> {
        let mut v = vec!["python3".to_string(), fixture().display().to_string()];
        v.extend(args.iter().map(|s| s.to_string()));
        v
    }

    /// A run killed outright (SIGKILL: no drop, no signal handler) while its reward program
    /// is waiting takes the program along: the parent-death signal
    /// (`shardes_runtime::child::end_with_parent`) ends it.
    #[test]
    fn a_run_killed_outright_takes_its_reward_program_along() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("killed");
        // A marker argument no other test's program has, to find this one among the
        // processes.
        let marker = dir.path().join("marker");
        // `hang` sleeps without reading: the closed stdin does not end it, a signal must.
        let mut command = python(&["hang"]);
        command.push(marker.display().to_string());
        let cfg = config(dir.path(), &out, 2, &command, 0);
        let cfg_text = std::fs::read_to_string(&cfg)
            .unwrap()
            .replace("timeout_s = 30", "timeout_s = 600");
        std::fs::write(&cfg, cfg_text).unwrap();
        let mut child = bin()
            .current_dir(repo())
            .args(["run", cfg.to_str().unwrap()])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let needle = marker.display().to_string();
        let find = || -> Option<u32> {
            std::fs::read_dir("/proc").ok()?.find_map(|e| {
                let e = e.ok()?;
                let pid: u32 = e.file_name().to_str()?.parse().ok()?;
                let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
                String::from_utf8_lossy(&cmd)
                    .contains(needle.as_str())
                    .then_some(pid)
            })
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
        let program = loop {
            if let Some(pid) = find() {
                break pid;
            }
            assert!(
                child.try_wait().unwrap().is_none(),
                "the run ended before its reward program started"
            );
            assert!(std::time::Instant::now() < deadline, "no reward program");
            std::thread::sleep(std::time::Duration::from_millis(100));
        };
        child.kill().unwrap();
        child.wait().unwrap();
        let gone = |pid: u32| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .map_or(true, |s| s.split_whitespace().nth(2) == Some("Z"))
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !gone(program) {
            assert!(
                std::time::Instant::now() < deadline,
                "reward program {program} outlived the killed run"
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }

    /// The shipped example as it is (examples/reward.py), shortened to 2 generations: finite
    /// rewards, nothing contained. (The default tier checks examples/reward.py against the
    /// built-in reward in tests/reward_command.rs and runs this config with another program.)
    #[test]
    #[ignore = "slow: a second run of the tiny model; the default tier runs the same config"]
    fn slow_the_shipped_reward_example_runs() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("example");
        let text = example("jsonl_reward.toml")
            .replace("generations = 10", "generations = 2")
            .replace("\"runs/jsonl_reward\"", &format!("\"{}\"", out.display()));
        let cfg = write(dir.path(), "example.toml", &text);
        exited(&run(&cfg, false), 0);
        for m in json_lines(&out.join("metrics.jsonl")) {
            let r = m["extra"]["reward"].as_f64().unwrap();
            assert!(
                r.is_finite() && m["extra"].get("contained").is_none(),
                "{m}"
            );
        }
    }

    /// A program whose reward is a hash of the completion: the eval samples (the unperturbed
    /// parameters' completions) carry exactly that, and the training rewards are large, never
    /// contained.
    #[test]
    fn the_example_runs_with_a_reward_program_and_its_rewards_are_exact() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("hash");
        let cfg = config(dir.path(), &out, 2, &python(&["hash"]), 0);
        exited(&run(&cfg, false), 0);
        let evals = json_lines(&out.join("eval.jsonl"));
        assert_eq!(evals.len(), 2);
        for e in &evals {
            assert_eq!(e["contained"], 0);
            for s in e["samples"].as_array().unwrap() {
                let text = s["completion"].as_str().unwrap();
                assert_eq!(s["reward"].as_f64().unwrap(), hashed(text), "{s}");
            }
        }
        for m in json_lines(&out.join("metrics.jsonl")) {
            assert!(m["extra"]["reward"].as_f64().unwrap() > 1.0, "{m}");
            assert!(m["extra"].get("contained").is_none(), "{m}");
        }
    }

    #[test]
    fn a_reward_program_that_keeps_dying_stops_the_run_and_the_checkpoint_resumes() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let counter = dir.path().join("count");
        // n = 16 members × 2 prompts = 32 requests a generation, and 1 held-out prompt at
        // generation 0: generations 0 and 1 are scored, generation 2's program dies, its
        // restart dies too (generation 2 is contained), and generation 3 needs a second
        // restart that restarts = 1 does not allow.
        let limit = (1 + 2 * 32).to_string();
        let cmd = python(&["dies_after", &limit, counter.to_str().unwrap()]);
        let cfg = config(dir.path(), &out, 6, &cmd, 1);
        let (_, stderr) = exited(&run(&cfg, false), 1);
        assert!(
            stderr.contains("giving up after 65 requests")
                && stderr.contains("task.reward.restarts"),
            "{stderr}"
        );
        assert!(stderr.contains("running generation 3"), "{stderr}");
        let m = json_lines(&out.join("metrics.jsonl"));
        assert_eq!(m.len(), 3);
        assert_eq!(m[2]["extra"]["contained"].as_f64(), Some(32.0));
        assert_eq!(state(&out)["generation"], 3);

        // The checkpoint resumes once the program works again (its count starts over; the
        // same command, since the reward is part of the trajectory's config).
        std::fs::remove_file(&counter).unwrap();
        let cfg = config(dir.path(), &out, 4, &cmd, 1);
        exited(&run(&cfg, true), 0);
        assert_eq!(state(&out)["generation"], 4);
    }

    #[test]
    fn a_missing_reward_program_is_a_config_error_naming_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let cfg = config(dir.path(), &out, 1, &["/no/such/reward".to_string()], 0);
        let (_, stderr) = exited(&run(&cfg, false), 2);
        assert!(
            stderr.contains("task.reward.command") && stderr.contains("/no/such/reward"),
            "{stderr}"
        );
        assert!(!at_repo(&["check", s(&cfg)]).status.success());
    }
}

mod export {
    //! `shardes export` end to end: a two-generation run of the tiny Qwen2 checkpoint exported
    //! as a Hugging Face directory and a GGUF file, each loading back to the run's parameters
    //! (bit for bit in f32; Q8_0 within a step of its block), and every refusal with its hint.

    use std::path::{Path, PathBuf};

    use crate::common::*;

    const DATA: &str = r#"{"prompt": "low rank noise", "target": "is never"}
    "#;

    /// A config of a 2-generation loss run on the tiny Qwen2 checkpoint, and its run directory
    /// (run once).
    fn run(dir: &Path) -> (PathBuf, PathBuf) {
        let data = write(dir, "d.jsonl", DATA);
        let out = dir.join("run");
        let text = format!(
            "devices = 1\n[problem]\nname = \"qwen2\"\ncheckpoint = \"{}\"\ndata = \"{}\"\n{}\
             [run]\ngenerations = 2\nout = \"{}\"\n",
            repo().join("tests/fixtures/qwen2_tiny").display(),
            data.display(),
            mirrored_es(4, 0.01, 0.01),
            out.display()
        );
        let config = write(dir, "q.toml", &text);
        ok(&["run", s(&config)]);
        (config, out)
    }

    #[test]
    fn a_run_exports_to_both_formats_and_loads_back() {
        let d = tempfile::tempdir().unwrap();
        let (config, out) = run(d.path());
        let hf = d.path().join("hf");
        let gguf = d.path().join("m.gguf");
        let o = shardes(&["export", s(&out), "--hf", s(&hf), "--gguf", s(&gguf)]);
        let (stdout, _) = exited(&o, 0);
        assert!(stdout.contains("26 tensors"), "{stdout}");
        assert!(
            stdout.contains(&format!("wrote {} (Hugging Face directory)", hf.display())),
            "{stdout}"
        );
        assert!(
            stdout.contains("model.safetensors") && stdout.contains("bytes"),
            "{stdout}"
        );
        assert!(
            stdout.contains(&format!("wrote {} (GGUF file)", gguf.display())),
            "{stdout}"
        );

        let trained = shardes::io::read_params_inferred(out.join("params.safetensors")).unwrap();
        let (_, fixture) =
            shardes::pretrained::load(&repo().join("tests/fixtures/qwen2_tiny")).unwrap();
        for path in [&hf, &gguf] {
            let (info, back) = shardes::pretrained::load(path).unwrap();
            assert_eq!(info.family, "qwen2");
            for (name, a) in back.leaves() {
                let want = trained.get(&name).unwrap();
                assert_eq!(a.data(), want.data(), "{}: {name}", path.display());
            }
            // The run moved the weights: the export is not the starting checkpoint.
            assert!(back
                .leaves()
                .iter()
                .zip(fixture.leaves())
                .any(|((_, a), (_, b))| a.data() != b.data()));
        }

        // Again without --force: refused, nothing changed; with it, replaced (bf16, Q8_0).
        refused(
            &["export", s(&out), "--hf", s(&hf)],
            "already exists",
            "--force",
        );
        refused(
            &["export", s(&out), "--gguf", s(&gguf)],
            "already exists",
            "--force",
        );
        let o = shardes(&[
            "export",
            s(&out),
            "--hf",
            s(&hf),
            "--dtype",
            "bf16",
            "--gguf",
            s(&gguf),
            "--gguf-type",
            "Q8_0",
            "--force",
        ]);
        let (stdout, _) = exited(&o, 0);
        assert!(
            stdout.contains("bf16") && stdout.contains("Q8_0"),
            "{stdout}"
        );
        let f = shardes::gguf::GgufFile::open(&gguf).unwrap();
        assert_eq!(f.get_u64("general.file_type").unwrap(), 7);

        // A config file with --params is the same export.
        let other = d.path().join("again.gguf");
        let o = shardes(&[
            "export",
            s(&config),
            "--params",
            s(&out.join("params.safetensors")),
            "--gguf",
            s(&other),
        ]);
        exited(&o, 0);
        let (_, back) = shardes::pretrained::load(&other).unwrap();
        assert_eq!(
            back.get("model.norm.weight").unwrap().data(),
            trained.get("model.norm.weight").unwrap().data()
        );
    }

    #[test]
    fn bad_exports_are_refused_with_a_hint() {
        let d = tempfile::tempdir().unwrap();
        let (config, out) = run(d.path());
        let target = d.path().join("x.gguf");
        refused(
            &["export", s(&out)],
            "neither --hf nor --gguf",
            "--hf OUT_DIR",
        );
        refused(
            &["export", s(&config), "--gguf", s(&target)],
            "export needs the parameters",
            "--params",
        );
        refused(
            &["export", s(d.path()), "--gguf", s(&target)],
            "no config.toml",
            "shardes run",
        );
        let file = write(d.path(), "a_file", "x");
        refused(
            &["export", s(&out), "--gguf", s(&file.join("m.gguf"))],
            "is a file, not a directory",
            "directory you can write to",
        );
        // Parameters of another model name the tensor that does not fit.
        let llama = repo().join("tests/fixtures/llama_tiny/model.safetensors");
        refused(
            &[
                "export",
                s(&out),
                "--params",
                s(&llama),
                "--gguf",
                s(&target),
            ],
            "lm_head.weight",
            "--params",
        );
        refused(
            &["export", s(&out), "--gguf", s(&target), "--hf", s(&target)],
            "both name",
            "different paths",
        );
        assert!(!target.exists());
    }
}
