//! `shardes check` and `shardes diag` on the configs whose runs have no loss program: a
//! `[task]` (reward fine-tuning: decode, score on the host, tell) and a control problem on
//! an MJCF model (episodes on the host). Through the real plugin: `check` validates and
//! prints what a run would do without compiling, `diag` compiles the run's programs, and a
//! bad config is still a one-line error naming the key (exit 2). Also the forms a bad
//! qwen2 `problem.size` lists, each of which is accepted, by loss and `[task]` configs.

use std::path::Path;

use crate::common::*;

/// A target_token reward config (2 devices, n = 4, two prompts of 4 token ids, 4 new tokens
/// each, 3 generations); `extra` goes into `[task]`.
fn target_token(out: &Path, extra: &str, eval: bool) -> String {
    TargetToken {
        task: extra,
        eval: if eval {
            "[eval]\nevery = 2\nprompts = 2"
        } else {
            ""
        },
        run: "seed = 0\ngenerations = 3",
        ..TargetToken::default()
    }
    .config(out)
}

/// `checkpoint = ` the tiny Qwen2 fixture (a `[problem]` line).
fn fixture_checkpoint() -> String {
    let fixture = repo().join("tests/fixtures/qwen2_tiny");
    format!("checkpoint = \"{}\"", fixture.display())
}

#[test]
fn check_on_the_countdown_example_prints_what_a_run_would_do() {
    let (stdout, _) = exited(&at_repo(&["check", "examples/countdown_tiny.toml"]), 0);
    has_all(
        &stdout,
        &[
        "ok: qwen2 (random tiny, 2 layers, d 32, vocab 128) decoding; reads all 26 leaves, \
         every 2-D leaf through a seam",
        "population: mirrored(lowrank(r=1)) n = 32 on 8 device(s) (4 per device, member chunk 4), \
         sigma 0.01, lr 0.01, shaping centered_ranks",
        "decode: greedy, 32 members x 4 prompts = 128 rows of prompt_len 24 + max_new_tokens 24 \
         = 48 positions (no max_position_embeddings to check them against); eos [1], pad 1",
        "task: countdown, 4 prompts per generation",
        "at most 3072 tokens generated per generation",
        "first prompt: \"numbers ",
        "tokenizer: examples/countdown_tokenizer.json; chat: off",
        "eval: 16 held-out prompts",
        "at generations 0, 5, 10 (3 evaluations), 3 samples each, to \
         runs/countdown_tiny/eval.jsonl",
        "programs: decode and tell, and the held-out decode",
        ],
    );
    let o = at_repo(&["check", "--json", "examples/countdown_tiny.toml"]);
    assert_eq!(o.status.code(), Some(0));
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).expect("one JSON object");
    assert_eq!(doc["task"], "countdown");
    assert_eq!(doc["leaves"], 26);
    assert_eq!(doc["findings"].as_array().map(Vec::len), Some(0));
    assert_eq!(doc["decode"]["rows"], 128);
    assert_eq!(doc["decode"]["eos"], serde_json::json!([1]));
    assert_eq!(doc["eval_prompts"], 16);
}

#[test]
fn check_on_a_checkpoint_task_reads_its_positions_and_ids() {
    let dir = tempfile::tempdir().unwrap();
    let config = target_token(&dir.path().join("out"), "", false)
        .replace("size = \"tiny\"", &fixture_checkpoint());
    let (stdout, _) = ok(&["check", s(&write(dir.path(), "t.toml", &config))]);
    // The fixture: max_position_embeddings 64, eos and pad 0 (generation_config.json).
    has_all(
        &stdout,
        &[
            "= 8 positions of the model's 64; eos [0], pad 0",
            "eval: none (no [eval] section)",
            "programs: decode and tell (",
        ],
    );
}

#[test]
fn bad_task_configs_exit_2_naming_the_key_in_check_and_diag() {
    let dir = tempfile::tempdir().unwrap();
    let checkpoint = fixture_checkpoint();
    let out = dir.path().join("out");
    let countdown = example("countdown_tiny.toml").replace(
        "examples/countdown_tokenizer.json",
        &repo()
            .join("examples/countdown_tokenizer.json")
            .display()
            .to_string(),
    );
    let cases: Vec<(String, &str)> = vec![
        // A countdown prompt of "numbers a b c target t answer" needs more than 4 tokens.
        (
            countdown.replace("prompt_len = 24", "prompt_len = 4"),
            "task.prompt_len = 4: training prompt 0 has",
        ),
        (
            target_token(&out, "", false).replace("prompt_len = 4", "prompt_len = 3"),
            "task.prompt_len = 3",
        ),
        // 40 + 40 > the fixture's 64 positions.
        (
            target_token(&out, "", false)
                .replace("size = \"tiny\"", &checkpoint)
                .replace("prompt_len = 4", "prompt_len = 40")
                .replace("max_new_tokens = 4", "max_new_tokens = 40"),
            "task.prompt_len + task.max_new_tokens = 80 exceeds the model's 64 positions",
        ),
        (
            countdown.replace("eos = [1]", "eos = [1]\nchat = true"),
            "task.chat = true needs a pretrained model",
        ),
        (
            target_token(&out, "chat = true", false).replace("size = \"tiny\"", &checkpoint),
            "has no chat template",
        ),
        (
            countdown.replace("tokenizer = ", "# tokenizer = "),
            "task \"countdown\" has text prompts but the problem has no tokenizer",
        ),
        (
            target_token(&out, "eos = [128]", false),
            "task.eos: id 128 is not below the vocabulary size 128",
        ),
        (
            target_token(&out, "", false).replace("size = \"tiny\"", "size = \"huge\""),
            "problem.size",
        ),
        (
            target_token(&out, "", true).replace("prompts = 2\n[run]", "prompts = 0\n[run]"),
            "eval.prompts = 0",
        ),
    ];
    for (i, (config, want)) in cases.iter().enumerate() {
        let cfg = write(dir.path(), &format!("bad{i}.toml"), config);
        for sub in ["check", "diag"] {
            let o = shardes(&[sub, cfg.to_str().unwrap()]);
            let (stdout, stderr) = text(&o);
            assert_eq!(
                o.status.code(),
                Some(2),
                "{sub} case {i}: {stdout}\n{stderr}"
            );
            assert!(
                stderr.contains(want),
                "{sub} case {i}: want {want:?}:\n{stderr}"
            );
            assert!(stderr.contains("hint: "), "{sub} case {i}: {stderr}");
        }
    }
    // A [task] config's bad size lists every form a loss config accepts, dimensions too.
    let cfg = write(dir.path(), "bad_size.toml", &cases[7].0);
    let (_, stderr) = text(&shardes(&["check", cfg.to_str().unwrap()]));
    assert!(
        stderr.contains("\"qwen2.5-1.5b\"")
            && stderr.contains("\"vocab=4096,d=256,ffn=1024,layers=4,heads=4,kv=2\""),
        "{stderr}"
    );
}

/// A 1-layer d = 16 model over 64 tokens: 3408 parameters in 14 leaves (embedding 64·16 =
/// 1024; the layer's q 16·16 + 16, k and v 8·16 + 8 each (kv 1 head of 8), o 16·16, gate,
/// up and down 32·16 each, two norms of 16: 2368; the final norm 16).
const CUSTOM: &str = "vocab=64,d=16,ffn=32,layers=1,heads=2,kv=1";

#[test]
fn a_task_config_decodes_a_custom_dimensions_model_in_check_and_run() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let config = target_token(&out, "", true)
        .replace("size = \"tiny\"", &format!("size = \"{CUSTOM}\""))
        .replace("generations = 3", "generations = 2");
    let cfg = write(dir.path(), "custom.toml", &config);
    let (stdout, _) = ok(&["check", s(&cfg)]);
    assert!(
        stdout.starts_with(&format!(
            "ok: qwen2 (random {CUSTOM}, 1 layers, d 16, vocab 64) decoding; reads all 14 leaves"
        )),
        "{stdout}"
    );
    let (stdout, _) = ok(&["run", s(&cfg)]);
    assert!(
        stdout.contains("decoding: 3408 parameters in 14 leaves"),
        "{stdout}"
    );
    let lines = |name: &str| json_lines(&out.join(name)).len();
    assert_eq!(lines("metrics.jsonl"), 2);
    // Generations 0 and 2 (every = 2, and the last).
    assert_eq!(lines("eval.jsonl"), 2);
    assert!(out.join("params.safetensors").is_file());
    // A bad dimension in a [task] config is the loss config's error.
    let bad = config.replace(CUSTOM, "vocab=64,d=17").replace(
        &out.display().to_string(),
        &dir.path().join("bad_out").display().to_string(),
    );
    let cfg = write(dir.path(), "bad.toml", &bad);
    for sub in ["check", "run"] {
        let o = shardes(&[sub, cfg.to_str().unwrap()]);
        let (_, stderr) = text(&o);
        assert_eq!(o.status.code(), Some(2), "{sub}: {stderr}");
        assert!(
            stderr.contains("problem.size = \"vocab=64,d=17\"") && stderr.contains("hint: "),
            "{sub}: {stderr}"
        );
    }
}

#[test]
fn diag_compiles_the_programs_of_a_reward_run() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let cfg = write(dir.path(), "t.toml", &target_token(&out, "", true));
    let json = dir.path().join("diag.json");
    let (stdout, _) = ok(&["diag", s(&cfg), "--json", s(&json)]);
    assert!(
        stdout.starts_with(
            "mirrored(lowrank(r=1)), n=4 devices=2: qwen2 (random tiny, 2 layers, d 32, vocab \
             128) decoding"
        ),
        "{stdout}"
    );
    has_all(
        &stdout,
        &[
            "program                      layers",
            "emitted ops by kind (decode):",
            "memory (decode): arguments",
            "memory (tell): arguments",
            "memory (eval): arguments",
            "host peak RSS after compiling every program: ",
        ],
    );
    let rows: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("decode ") || l.starts_with("tell ") || l.starts_with("eval "))
        .collect();
    assert_eq!(rows.len(), 3, "{stdout}");
    assert!(rows[2].starts_with("eval (plain)"), "{stdout}");
    let entries: Vec<serde_json::Value> = serde_json::from_value(json_file(&json)).unwrap();
    let names: Vec<&str> = entries
        .iter()
        .map(|e| e["program"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["decode", "tell", "eval"]);
    for e in &entries {
        assert!(e["compile_ms"].as_f64().unwrap() > 0.0, "{e}");
        assert!(e["optimized_instructions"].as_u64().unwrap() > 0, "{e}");
        assert!(e["emitted_ops"].as_u64().unwrap() > 0, "{e}");
    }
    // The decode reads every member's noise and the tokens: it emits a while loop over
    // the new tokens; the tell's update is a collective over the two devices.
    assert!(
        entries[0]["emitted_by_kind"]["stablehlo.while"]
            .as_u64()
            .unwrap()
            > 0
    );
    assert!(!entries[1]["collectives"].as_object().unwrap().is_empty());
    // Without [eval] the run compiles no held-out decode.
    let cfg = write(dir.path(), "t2.toml", &target_token(&out, "", false));
    let (stdout, _) = ok(&["diag", s(&cfg)]);
    assert!(!stdout.contains("memory (eval)"), "{stdout}");
}

#[test]
fn check_and_diag_on_the_mujoco_examples() {
    let at_repo_ok = |args: &[&str]| exited(&at_repo(args), 0).0;
    let stdout = at_repo_ok(&["check", "examples/cartpole_mujoco.toml"]);
    has_all(
        &stdout,
        &[
            "ok: control examples/mujoco/cartpole.xml (MuJoCo, ",
            "its policy step reads all 4 leaves, every 2-D leaf through a seam",
            "population: mirrored(lowrank(r=1)) n = 64 on 8 device(s)",
            "episodes: 64 members x 8 episodes of at most 500 steps per generation",
            "policy: widths [4, 16, 1]",
            "programs: policy step and tell",
        ],
    );
    let stdout = at_repo_ok(&["check", "examples/reacher_mujoco.toml"]);
    assert!(stdout.contains("policy: widths [8, 16, 2]"), "{stdout}");
    let stdout = at_repo_ok(&["diag", "examples/cartpole_mujoco.toml"]);
    has_all(
        &stdout,
        &[
            "emitted ops by kind (policy step):",
            "memory (policy step): arguments",
            "memory (tell): arguments",
            "host peak RSS after compiling every program: ",
        ],
    );
    assert!(
        stdout.lines().any(|l| l.starts_with("policy step ")),
        "{stdout}"
    );
}

/// A qwen2 config of `size` on the example data (tokenized by the fixture's tokenizer).
fn sized(size: &str) -> String {
    format!(
        "[problem]\nname = \"qwen2\"\nsize = \"{size}\"\ntokenizer = \"{}\"\ndata = \"{}\"\n{}\
         [run]\ngenerations = 1\n",
        repo()
            .join("tests/fixtures/qwen2_tiny/tokenizer.json")
            .display(),
        repo().join("examples/qwen2_tiny.jsonl").display(),
        mirrored_es(16, 0.01, 0.01)
    )
}

#[test]
fn a_bad_qwen2_size_lists_every_accepted_form_and_each_is_accepted() {
    let forms = [
        "tiny",
        "0.5b",
        "qwen2.5-0.5b",
        "1.5b",
        "qwen2.5-1.5b",
        "vocab=4096,d=256,ffn=1024,layers=4,heads=4,kv=2",
    ];
    let dir = tempfile::tempdir().unwrap();
    for bad in ["huge", "vocab=128,dd=32", "vocab=128,d=33"] {
        let cfg = write(dir.path(), "bad.toml", &sized(bad));
        let o = shardes(&["check", cfg.to_str().unwrap()]);
        let (_, stderr) = text(&o);
        assert_eq!(o.status.code(), Some(2), "{bad}: {stderr}");
        assert!(stderr.contains("problem.size"), "{bad}: {stderr}");
        let hint = stderr
            .lines()
            .find(|l| l.trim_start().starts_with("hint:"))
            .unwrap_or_else(|| panic!("{bad}: no hint in {stderr}"));
        for form in forms {
            assert!(
                hint.contains(&format!("\"{form}\"")),
                "{bad}: {form} not in {hint}"
            );
        }
        for key in [
            "vocab",
            "d",
            "ffn",
            "layers",
            "heads",
            "kv",
            "problem.checkpoint",
        ] {
            assert!(hint.contains(key), "{bad}: {key} not in {hint}");
        }
    }
    // Every form the hint names is one the parser accepts.
    for form in forms {
        let cfg = write(dir.path(), "ok.toml", &sized(form));
        let (stdout, _) = ok(&["check", s(&cfg)]);
        assert!(
            stdout.starts_with("ok: qwen2 reads all"),
            "{form}: {stdout}"
        );
    }
}

/// The committed reward config at Qwen2.5-0.5B shapes (docs/performance.md measures its
/// programs with `diag`) stays valid; `check` reads no parameter, so this is quick.
#[test]
fn the_0_5b_reward_bench_config_checks() {
    let (stdout, _) = exited(&at_repo(&["check", "benches/reward_0_5b.toml"]), 0);
    assert!(
        stdout.starts_with(
            "ok: qwen2 (random 0.5b, 24 layers, d 896, vocab 151936) decoding; reads all 290 \
             leaves"
        ),
        "{stdout}"
    );
    // A decode's members are one batch where the memory allows (es::ChunkPolicy::Batch):
    // all 8 here (2.7 MiB each against es::BATCH_BYTES).
    has_all(
        &stdout,
        &[
            "n = 8 on 1 device(s) (8 per device, member chunk 8)",
            "8 members x 2 prompts = 16 rows of prompt_len 16 + max_new_tokens 16",
        ],
    );
}
