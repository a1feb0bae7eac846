//! `shardes hlo` on a `[task]` (reward) config: the programs a reward run compiles (the
//! decode of every member by default; the tell, the held-out decode or all of them with
//! `--program`), through the same builders as `diag` and the run, and `--program` refused
//! where it does not apply (exit 2).

use std::path::{Path, PathBuf};

use crate::common::*;

/// A target_token reward config on 2 devices, n = 4: two prompts of 4 token ids, 4 new
/// tokens, with or without an `[eval]`, written to `dir/t.toml` (writing to `dir/o`).
fn reward_config(dir: &Path, eval: bool) -> PathBuf {
    let config = TargetToken {
        eval: if eval {
            "[eval]\nevery = 1\nprompts = 2"
        } else {
            ""
        },
        run: "generations = 1",
        ..TargetToken::default()
    }
    .config(&dir.join("o"));
    write(dir, "t.toml", &config)
}

/// `shardes hlo CONFIG [args]`'s output after checking that it exited 0.
fn hlo(cfg: &Path, args: &[&str]) -> String {
    let mut all = vec!["hlo", s(cfg)];
    all.extend(args);
    ok(&all).0
}

/// The program names of `hlo --program all`'s output, in order.
fn program_names(all: &str) -> Vec<&str> {
    all.lines()
        .filter_map(|l| l.strip_prefix("// program: "))
        .collect()
}

/// The 2-device mesh over "pop" every program declares.
const MESH: &str = "sdy.mesh @mesh = <[\"pop\"=2]>";

/// The line of `text` that opens `@main`.
fn main_line(text: &str) -> &str {
    text.lines()
        .find(|l| l.trim_start().starts_with("func.func public @main("))
        .unwrap_or_else(|| panic!("no @main in:\n{text}"))
}

#[test]
fn hlo_prints_the_decode_program_of_a_reward_config() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = reward_config(dir.path(), true);
    let stdout = hlo(&cfg, &[]);
    assert!(stdout.contains(MESH), "{stdout}");
    // One program, the decode: it takes the prompt batch and its lengths and returns each
    // member's tokens [n, B, max_new] and lengths [n, B], sharded over "pop".
    assert_eq!(stdout.matches("func.func public @main(").count(), 1);
    assert!(
        !stdout.contains("// program:"),
        "one program needs no name line"
    );
    let main = main_line(&stdout);
    for want in [
        "%prompt: tensor<2x4xi32>",
        "%lens: tensor<2xi32>",
        "-> (tensor<4x2x4xi32> {sdy.sharding = #sdy.sharding<@mesh, [{\"pop\"}, {}, {}]>}, \
         tensor<4x2xi32> {sdy.sharding = #sdy.sharding<@mesh, [{\"pop\"}, {}]>})",
    ] {
        assert!(main.contains(want), "missing {want:?} in {main}");
    }
    // `--program decode` is the default.
    assert_eq!(hlo(&cfg, &["--program", "decode"]), stdout);
}

#[test]
fn hlo_program_selects_the_tell_the_eval_or_all_of_a_reward_run() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = reward_config(dir.path(), true);
    let all = hlo(&cfg, &["--program", "all"]);
    let names = program_names(&all);
    assert_eq!(names, ["decode", "tell", "eval"]);
    let sections: Vec<&str> = all.split("// program: ").skip(1).collect();
    for (name, section) in names.iter().zip(&sections) {
        assert!(section.contains(MESH), "{name}: no mesh");
        let main = main_line(section);
        let want = match *name {
            // The tell reads the fitness of every member.
            "tell" => "%fitness: tensor<4xf32>",
            // The held-out decode: one member per device, the same prompt batch.
            "eval" => "-> (tensor<2x2x4xi32>",
            _ => "-> (tensor<4x2x4xi32>",
        };
        assert!(main.contains(want), "{name}: missing {want:?} in {main}");
    }
    // Each alone prints its section of `all`.
    for (name, section) in names.iter().zip(&sections) {
        let one = hlo(&cfg, &["--program", name]);
        let body = section.split_once('\n').map_or("", |(_, b)| b);
        // `text` drops the final newline.
        assert_eq!(one.trim_end(), body.trim_end(), "{name}");
    }
    // XLA's optimized tell, compiled for the config's 2 partitions.
    let opt = hlo(&cfg, &["--program", "tell", "--optimized"]);
    let head = "// tell: optimized for 2 partitions; shapes are per device";
    assert!(opt.starts_with(head), "{opt}");
    assert!(opt.contains(" (entry) {"), "{opt}");
}

#[test]
fn hlo_program_is_refused_where_it_does_not_apply() {
    let dir = tempfile::tempdir().unwrap();
    let no_eval = reward_config(dir.path(), false);
    let loss = write(
        dir.path(),
        "l.toml",
        &small_config(&dir.path().join("o"), 1, 0),
    );
    for (cfg, program, want) in [
        (&no_eval, "eval", "--program eval: the config has no [eval]"),
        (
            &loss,
            "tell",
            "--program tell: only a [task] config has several programs",
        ),
    ] {
        let (_, stderr) = exited(&shardes(&["hlo", s(cfg), "--program", program]), 2);
        has_all(&stderr, &[want, "hint: "]);
    }
    // Without [eval] `all` is the decode and the tell.
    let all = hlo(&no_eval, &["--program", "all"]);
    assert_eq!(program_names(&all), ["decode", "tell"]);
    // A bogus name is a usage error.
    let o = shardes(&["hlo", s(&no_eval), "--program", "loss"]);
    assert_eq!(o.status.code(), Some(2));
}
