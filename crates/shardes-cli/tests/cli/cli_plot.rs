//! `shardes plot` and `shardes completions` end to end.
//!
//! The SVG is parsed as XML and its text nodes are read; the PNG is decoded and its size
//! checked. Exact: every assertion is on names, sizes and exit codes, no pixel tolerance.

use std::path::Path;

use crate::common::*;

/// Every text node of an SVG file, trimmed; panics unless it parses as XML with an `svg` root.
fn svg_texts(path: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap();
    let doc = roxmltree::Document::parse(&text)
        .unwrap_or_else(|e| panic!("{} is not XML: {e}", path.display()));
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    doc.descendants()
        .filter(|n| n.has_tag_name("text"))
        .filter_map(|n| n.text())
        .map(|t| t.trim().to_string())
        .collect()
}

/// Writes `dir/metrics.jsonl` with `n` generations of a falling curve (scaled by `k`).
fn synthetic_run(dir: &Path, n: u32, k: f64) {
    std::fs::create_dir_all(dir).unwrap();
    let mut text = String::new();
    for g in 0..n {
        let m = k / (1.0 + f64::from(g));
        text.push_str(&format!(
            "{{\"generation\":{g},\"fitness_mean\":{m},\"fitness_min\":{},\"fitness_max\":{},\"ms\":{}}}\n",
            m * 0.9,
            m * 1.2,
            10.0 + f64::from(g % 3)
        ));
    }
    std::fs::write(dir.join("metrics.jsonl"), text).unwrap();
}

fn succeeded(o: &std::process::Output) -> String {
    let (stdout, stderr) = text(o);
    assert_eq!(
        o.status.code(),
        Some(0),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    stdout
}

#[test]
fn plot_of_a_finished_run_is_an_svg_naming_its_curves() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let cfg = write(dir.path(), "c.toml", &small_config(&out, 3, 0));
    succeeded(&shardes(&["run", cfg.to_str().unwrap()]));
    let stdout = succeeded(&shardes(&["plot", out.to_str().unwrap()]));
    let svg = out.join("curves.svg");
    assert!(stdout.contains(&svg.display().to_string()), "{stdout}");
    let texts = svg_texts(&svg);
    for want in ["fitness", "ms / generation", "generation", "fitness mean"] {
        assert!(
            texts.iter().any(|t| t.contains(want)),
            "no {want:?} in {texts:?}"
        );
    }
    // No eval.jsonl: no eval panel.
    assert!(!texts.iter().any(|t| t.contains("held-out")), "{texts:?}");
}

#[test]
fn png_decodes_with_the_plot_size() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("r");
    synthetic_run(&run, 20, 1.0);
    let png_path = dir.path().join("curves.png");
    succeeded(&shardes(&[
        "plot",
        run.to_str().unwrap(),
        "--output",
        png_path.to_str().unwrap(),
    ]));
    let decoder = png::Decoder::new(std::fs::File::open(&png_path).unwrap());
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).unwrap();
    // Two panels of 1000 x 340 (no eval.jsonl).
    assert_eq!((info.width, info.height), (1000, 680));
    let pixels = &buf[..info.buffer_size()];
    let dark = pixels
        .chunks(3)
        .filter(|p| p.iter().all(|&c| c < 80))
        .count();
    // Text and axes are drawn (the embedded font renders): many near-black pixels.
    assert!(dark > 2000, "only {dark} dark pixels");
}

#[test]
fn two_runs_overlay_with_one_legend_entry_each() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("es_mirrored");
    let b = dir.path().join("es_plain");
    synthetic_run(&a, 30, 1.0);
    synthetic_run(&b, 25, 2.0);
    std::fs::write(
        a.join("eval.jsonl"),
        "{\"generation\":0,\"mean_reward\":0.1,\"accuracy\":0.0,\"n\":8}\n\
         {\"generation\":10,\"mean_reward\":0.4,\"accuracy\":0.25,\"split\":\"test\"}\n",
    )
    .unwrap();
    let svg = dir.path().join("both.svg");
    succeeded(&shardes(&[
        "plot",
        a.to_str().unwrap(),
        b.to_str().unwrap(),
        "-o",
        svg.to_str().unwrap(),
    ]));
    let texts = svg_texts(&svg);
    for name in ["es_mirrored", "es_plain"] {
        assert_eq!(
            texts.iter().filter(|t| *t == name).count(),
            1,
            "{name} should be one legend entry: {texts:?}"
        );
    }
    assert!(texts.iter().any(|t| t.contains("held-out")), "{texts:?}");
    let height = roxmltree::Document::parse(&std::fs::read_to_string(&svg).unwrap())
        .unwrap()
        .root_element()
        .attribute("height")
        .map(str::to_string);
    assert_eq!(height.as_deref(), Some("1020"), "three panels");
}

#[test]
fn several_runs_default_to_curves_svg_in_the_current_directory() {
    let dir = tempfile::tempdir().unwrap();
    synthetic_run(&dir.path().join("a"), 5, 1.0);
    synthetic_run(&dir.path().join("b"), 5, 1.0);
    let o = bin()
        .current_dir(dir.path())
        .args(["plot", "a", "b"])
        .output()
        .unwrap();
    succeeded(&o);
    let texts = svg_texts(&dir.path().join("curves.svg"));
    assert!(texts.iter().any(|t| t == "a") && texts.iter().any(|t| t == "b"));
    assert!(!dir.path().join("a/curves.svg").exists());
}

#[test]
fn non_finite_values_and_a_cut_line_are_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("r");
    std::fs::create_dir_all(&run).unwrap();
    std::fs::write(
        run.join("metrics.jsonl"),
        "{\"generation\":0,\"fitness_mean\":1.0,\"fitness_min\":0.5,\"fitness_max\":2.0,\"ms\":3.0}\n\
         {\"generation\":1,\"fitness_mean\":\"NaN\",\"fitness_min\":\"-inf\",\"fitness_max\":\"inf\",\"ms\":null}\n\
         {\"generation\":2,\"fitness_mean\":0.8,\"fitness_min\":0.4,\"fitness_max\":1.0,\"ms\":3.5,\"extra\":[1]}\n\
         {\"generation\":3,\"fitn",
    )
    .unwrap();
    let o = shardes(&["plot", run.to_str().unwrap()]);
    succeeded(&o);
    let (_, stderr) = text(&o);
    assert!(stderr.contains("line 4"), "{stderr}");
    svg_texts(&run.join("curves.svg"));
}

#[test]
fn missing_or_empty_metrics_are_user_errors() {
    let dir = tempfile::tempdir().unwrap();
    // A directory `name` holding `metrics` as its metrics.jsonl, if any.
    let run_dir = |name: &str, metrics: Option<&str>| {
        let d = dir.path().join(name);
        std::fs::create_dir_all(&d).unwrap();
        if let Some(text) = metrics {
            write(&d, "metrics.jsonl", text);
        }
        d
    };
    let missing = dir.path().join("nope");
    refused(&["plot", s(&missing)], "does not exist", "run.out");
    let no_metrics = run_dir("empty_dir", None);
    let what = "has no metrics.jsonl";
    refused(&["plot", s(&no_metrics)], what, "shardes run");
    let empty = run_dir("empty", Some(""));
    refused(&["plot", s(&empty)], "metrics.jsonl is empty", "first");
    write(&empty, "metrics.jsonl", "\n  \n");
    refused(&["plot", s(&empty)], "metrics.jsonl is empty", "first");
    let garbage = run_dir("garbage", Some("not json\n{\"fitness_mean\":1}\n"));
    let (what, hint) = ("metrics.jsonl line 1: not JSON", "JSON object");
    refused(&["plot", s(&garbage)], what, hint);
    // A bad run among good ones fails the whole plot and writes nothing.
    let good = dir.path().join("good");
    synthetic_run(&good, 3, 1.0);
    let target = dir.path().join("o.svg");
    let (good, empty) = (s(&good), s(&empty));
    refused(
        &["plot", good, empty, "-o", s(&target)],
        "is empty",
        "first",
    );
    assert!(!target.exists());
    let jpg = dir.path().join("o.jpg");
    let (what, hint) = ("no .svg or .png extension", "curves.png");
    refused(&["plot", good, "-o", s(&jpg)], what, hint);
}

#[test]
fn bash_completions_name_the_subcommands() {
    let o = shardes(&["completions", "bash"]);
    let stdout = succeeded(&o);
    // The top level's word list is the one `opts="..."` line that offers `--version`.
    let top = stdout
        .lines()
        .find(|l| l.trim_start().starts_with("opts=") && l.contains("--version"))
        .unwrap_or_else(|| panic!("no top-level word list in:\n{stdout}"));
    let words: Vec<&str> = top
        .trim()
        .trim_start_matches("opts=")
        .trim_matches('"')
        .split(' ')
        .collect();
    for sub in [
        "run",
        "hlo",
        "devices",
        "check",
        "bench",
        "diag",
        "plot",
        "completions",
    ] {
        assert!(words.contains(&sub), "no {sub} in {top:?}");
    }
    assert!(
        stdout.contains("complete -F"),
        "not a bash completion script"
    );
    for shell in ["zsh", "fish", "elvish", "powershell"] {
        let o = shardes(&["completions", shell]);
        assert!(!succeeded(&o).is_empty(), "{shell}: empty");
    }
    let o = shardes(&["completions", "tcsh"]);
    assert_eq!(o.status.code(), Some(2));
}
