//! The `config.toml` schema of `shardes run`, with errors that name the key and the fix.
//!
//! Unknown keys are refused with the nearest valid key; values are checked for type and
//! range before anything is compiled.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use shardes::hlo::es::optimizer::OPTIMIZER_KEYS;
use shardes::hlo::es::{
    EsError, EsSpec, How, OptimizerName, ShapingSpec, SpecError, StrategySpec, OPTIMIZER_NAMES,
};
use shardes::hlo::problems::qwen2::Layers;

mod dtype;
pub mod keys;
mod problem;
mod task;
pub use problem::{control, control_mjcf, quadratic, transformer_block, WeightsKey};
pub use task::{task_docs, task_keys, task_names, EvalConfig, Rates, TaskConfig, TaskSection};

/// A user-facing configuration error: one line saying what is wrong and a hint saying how to fix it.
#[derive(Debug, thiserror::Error)]
#[error("{message}\n  hint: {hint}")]
pub struct ConfigError {
    /// What is wrong (names the key or value).
    pub message: String,
    /// How to fix it.
    pub hint: String,
}

impl ConfigError {
    /// The error `message` with the fix `hint`: the CLI's one way to make a user-facing error.
    pub fn new(message: impl Into<String>, hint: impl Into<String>) -> ConfigError {
        ConfigError {
            message: message.into(),
            hint: hint.into(),
        }
    }
}

/// The whole run configuration.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// PJRT plugin: `cpu` (default: the provisioned CPU plugin), `cpu-jax` (a newer, faster
    /// CPU plugin, opt-in), `cuda`, `tpu`, or a path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plugin: Option<String>,
    /// CPU devices to simulate (ignored by plugins with real devices).
    #[serde(default = "default_devices")]
    pub devices: usize,
    /// The problem to train.
    pub problem: ProblemConfig,
    /// The evolution strategy.
    pub es: EsConfig,
    /// The run: seed, length, outputs.
    pub run: RunConfig,
    /// Fine-tuning on a reward from generated text (a `qwen2` problem without `data`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<TaskConfig>,
    /// Held-out evaluation of a `[task]` run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eval: Option<EvalConfig>,
}

/// `[problem]`: one variant per problem, chosen by `name`.
///
/// A variant's fields are the keys its problem reads ([`problem_reads`]): a key that the
/// named problem does not read is refused before deserializing, with that list. Absent
/// keys stay `None` rather than taking their defaults here, so the resolved config and
/// [`Config::trajectory_hash`] record what the user wrote.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "name", rename_all = "snake_case", deny_unknown_fields)]
pub enum ProblemConfig {
    /// `transformer_block`: one transformer block with a drawn batch.
    TransformerBlock {
        /// Model width (default 64).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        d_model: Option<usize>,
        /// Sequences per batch (default 8).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        batch: Option<usize>,
        /// Tokens per sequence (default 32).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        seq: Option<usize>,
    },
    /// `qwen2`: a checkpoint or a random preset fine-tuned on prompt/target pairs.
    // The field order is the serialized order, which the trajectory hash depends on.
    Qwen2 {
        /// Sequences per batch: the number of examples in `data`, which it must equal when
        /// given.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        batch: Option<usize>,
        /// Tokens per sequence (default: the longest example's prompt + target − 1).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        seq: Option<usize>,
        /// A Hugging Face checkpoint directory (`config.json`, `*.safetensors`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        checkpoint: Option<PathBuf>,
        /// A preset (`tiny`, `0.5b`, `1.5b`) with random parameters, instead of a checkpoint.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        size: Option<String>,
        /// A JSONL file, one example per line: `{"prompt": "...", "target": "..."}` (needs
        /// a tokenizer) or `{"prompt_ids": [...], "target_ids": [...]}`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        data: Option<PathBuf>,
        /// A `tokenizer.json` (default: the checkpoint's).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tokenizer: Option<PathBuf>,
        /// The forward's dtype, `f32` (default) or `bf16`; the master and the fitness stay
        /// f32.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        compute_dtype: Option<String>,
        /// How the decoder layers are emitted: `unrolled` (default) or `loop` (one `while`
        /// over the layer index: compile time flat in depth, the same tokens, losses equal
        /// to a few ulp).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        layers: Option<String>,
        /// A pretrained model by name (`smollm2-135m-instruct`, provisioned into the user
        /// cache through pip on first use), or the path of a `.gguf` file or a Hugging Face
        /// directory; instead of `checkpoint` and `size`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        model: Option<String>,
    },
    /// `control`: a tanh MLP policy on an environment rolled out inside the program.
    Control {
        /// The environment: `cartpole_balance`, `cartpole_swingup`, `pendulum`, `acrobot`
        /// or `mountain_car` (required).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        env: Option<String>,
        /// Episodes per member, the same reset states for every member (default 4).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        episodes: Option<usize>,
        /// Steps per episode (default 200).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        episode_length: Option<usize>,
        /// The policy's hidden layer sizes (default `[32, 32]`; `[]`: a linear policy).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        hidden: Option<Vec<usize>>,
        /// A MuJoCo model file (MJCF) simulated on the host instead of `env`
        /// (`shardes::host_control`; the conventions are `shardes::mjcf`'s).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mjcf: Option<PathBuf>,
    },
    /// `quadratic`: `½ (θ − θ*)ᵀ H (θ − θ*)` over `b [cols]` and `w (rows, cols)` with a
    /// known gradient (`shardes estimate` measures against it).
    Quadratic {
        /// Rows of `w` (default 32).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        rows: Option<usize>,
        /// Columns of `w` and the length of `b` (default 16).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cols: Option<usize>,
        /// The condition number of `H` (default 100).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        condition: Option<f64>,
    },
}

/// The problem names, in [`ProblemConfig`]'s order.
pub fn problems() -> &'static [&'static str] {
    keys::variants::<ProblemConfig>()
}

/// The `[problem]` keys the problem `name` reads besides `name`, in its variant's field
/// order; empty for an unknown name.
pub fn problem_reads(name: &str) -> &'static [&'static str] {
    keys::variant_fields::<ProblemConfig>(name)
}

/// Every `[problem]` key of any problem: `name`, then each variant's keys not listed yet.
fn problem_keys() -> Vec<&'static str> {
    let mut keys = vec![keys::TAG];
    for key in problems().iter().flat_map(|name| problem_reads(name)) {
        if !keys.contains(key) {
            keys.push(key);
        }
    }
    keys
}

/// Refuses an unknown problem name and a key the named problem does not read, from the
/// raw `[problem]` table (serde would only say "unknown variant" or "unknown field").
fn check_problem_table(table: &toml::Table) -> Result<(), ConfigError> {
    // A missing or mistyped name is left to serde, which names the type it expects.
    let Some(name) = table.get(keys::TAG).and_then(toml::Value::as_str) else {
        return Ok(());
    };
    let names = problems();
    if !names.contains(&name) {
        let hint = match nearest(name, names) {
            Some(n) => format!("did you mean \"{n}\"?"),
            None => format!("known problems: {}", names.join(", ")),
        };
        return Err(ConfigError::new(
            format!("problem.name: unknown problem \"{name}\""),
            hint,
        ));
    }
    let reads = problem_reads(name);
    let foreign = problem_keys()
        .into_iter()
        .find(|k| *k != keys::TAG && table.contains_key(*k) && !reads.contains(k));
    if let Some(key) = foreign {
        // The keys every problem reads first, then this one's own.
        let shared = |k: &&str| names.iter().all(|n| problem_reads(n).contains(k));
        let listed: Vec<&str> = reads
            .iter()
            .filter(|k| shared(k))
            .chain(reads.iter().filter(|k| !shared(k)))
            .copied()
            .collect();
        return Err(ConfigError::new(
            format!("problem.{key} does not apply to problem \"{name}\""),
            format!("remove it; {name} reads: {}", listed.join(", ")),
        ));
    }
    Ok(())
}

impl ProblemConfig {
    /// The problem's `name`.
    pub fn name(&self) -> &'static str {
        keys::name_of(self)
    }

    /// `d_model`, `batch` and `seq` as given (`None` where unset or not read).
    fn dims(&self) -> [(&'static str, Option<usize>); 3] {
        let (d_model, batch, seq) = match *self {
            ProblemConfig::TransformerBlock {
                d_model,
                batch,
                seq,
            } => (d_model, batch, seq),
            ProblemConfig::Qwen2 { batch, seq, .. } => (None, batch, seq),
            ProblemConfig::Control { .. } | ProblemConfig::Quadratic { .. } => (None, None, None),
        };
        [
            ("problem.d_model", d_model),
            ("problem.batch", batch),
            ("problem.seq", seq),
        ]
    }

    /// The checks serde cannot make: for qwen2 one of `checkpoint` and `size`, `data`
    /// (unless a `[task]` gives the prompts: `task`), a known dtype; for control a known
    /// environment and positive counts.
    fn check(&self, task: bool) -> Result<(), ConfigError> {
        if let ProblemConfig::Control { .. } = self {
            if control_mjcf(self, ShapingSpec::default())?.is_some() {
                return Ok(());
            }
            return control(self, ShapingSpec::default()).map(|_| ());
        }
        if let ProblemConfig::Quadratic { .. } = self {
            return quadratic(self).map(|_| ());
        }
        let ProblemConfig::Qwen2 {
            data,
            compute_dtype,
            layers,
            ..
        } = self
        else {
            return Ok(());
        };
        if let Some(l) = layers {
            Layers::parse(l).map_err(|_| {
                ConfigError::new(
                    format!("problem.layers: unknown layout \"{l}\""),
                    "use layers = \"unrolled\" (the default) or \"loop\"",
                )
            })?;
        }
        self.weights_key()?;
        match () {
            _ if data.is_none() && !task => Err(ConfigError::new(
                "problem \"qwen2\" needs problem.data",
                "add data = \"FILE.jsonl\" with one {\"prompt\": ..., \"target\": ...} per \
                 line, or a [task] section to train on a reward from generated text",
            )),
            _ => match compute_dtype.as_deref() {
                None | Some("f32") | Some("bf16") => Ok(()),
                Some(other) => Err(ConfigError::new(
                    format!("problem.compute_dtype: unknown dtype \"{other}\""),
                    "use \"f32\" or \"bf16\"",
                )),
            },
        }
    }
}

/// `[es]`: the library's [`EsSpec`], deserialized as it is (strategy, shaping and placement
/// through their own parsers; [`EsSpec::build`] checks the numbers).
pub type EsConfig = EsSpec;

/// `[run]`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RunConfig {
    /// `key = key(seed)`; params, batch and the ES state derive from it.
    #[serde(default)]
    pub seed: u64,
    /// Generations to run.
    pub generations: usize,
    /// Output directory: metrics.jsonl, checkpoints, the resolved config.
    #[serde(default = "default_out")]
    pub out: PathBuf,
    /// Write a checkpoint every this many generations (0: only at the end).
    #[serde(default = "default_checkpoint_every")]
    pub checkpoint_every: usize,
    /// Also write the per-generation scalars as TensorBoard event files under `out/tb/`.
    // Left out of the serialized config when off, so configs without it keep their hash.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tensorboard: bool,
}

fn default_devices() -> usize {
    8
}
fn default_out() -> PathBuf {
    PathBuf::from("runs/default")
}
fn default_checkpoint_every() -> usize {
    10
}

fn nearest<'a>(word: &str, candidates: &[&'a str]) -> Option<&'a str> {
    candidates
        .iter()
        .map(|c| (strsim::levenshtein(word, c), *c))
        .filter(|(d, c)| *d <= 3.max(c.len() / 3))
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

fn check_keys(table: &toml::Table, path: &str, valid: &[&str]) -> Result<(), ConfigError> {
    for key in table.keys() {
        if !valid.contains(&key.as_str()) {
            let full = if path.is_empty() {
                key.clone()
            } else {
                format!("{path}.{key}")
            };
            let hint = match nearest(key, valid) {
                Some(n) => format!("did you mean `{n}`? valid keys here: {}", valid.join(", ")),
                None => format!("valid keys here: {}", valid.join(", ")),
            };
            return Err(ConfigError::new(format!("unknown key `{full}`"), hint));
        }
    }
    Ok(())
}

/// A section's keys with the spans of their values.
type SpannedKeys = toml::Spanned<std::collections::BTreeMap<String, toml::Spanned<toml::Value>>>;

/// Where the value that serde refused in a tagged section (`[problem]`, `[task]`) is, when
/// `error_span` is the whole section's: a tagged enum is deserialized from a buffer, which
/// keeps no positions.
fn tagged_value_span(
    text: &str,
    table: &toml::Table,
    error_span: Option<std::ops::Range<usize>>,
) -> Option<std::ops::Range<usize>> {
    #[derive(Deserialize)]
    struct Spans {
        problem: Option<SpannedKeys>,
        task: Option<SpannedKeys>,
    }
    /// `[task.reward]` alone: a struct, which toml reads keeping the positions (only where
    /// it refuses a value is read).
    #[derive(Deserialize)]
    #[allow(dead_code)]
    struct Reward {
        task: RewardOf,
    }
    #[derive(Deserialize)]
    #[allow(dead_code)]
    struct RewardOf {
        reward: task::RewardConfig,
    }
    let spans: Spans = toml::from_str(text).ok()?;
    let error_span = error_span?;
    if let Some((_, span)) =
        refused_key::<ProblemConfig>(spans.problem.as_ref(), table.get("problem"), &error_span)
    {
        return Some(span);
    }
    let (key, span) =
        refused_key::<TaskConfig>(spans.task.as_ref(), table.get("task"), &error_span)?;
    if key == "reward" {
        return toml::from_str::<Reward>(text).err()?.span().or(Some(span));
    }
    Some(span)
}

/// The first key of `section` that `T` refuses when it is tried alone with the name, with
/// the span of its value, if `error_span` is the whole section's.
fn refused_key<'a, T: serde::de::DeserializeOwned>(
    spans: Option<&SpannedKeys>,
    section: Option<&'a toml::Value>,
    error_span: &std::ops::Range<usize>,
) -> Option<(&'a str, std::ops::Range<usize>)> {
    let spans = spans.filter(|s| s.span() == *error_span)?;
    let section = section?.as_table()?;
    let name = section.get(keys::TAG)?;
    let (key, _) = section.iter().find(|(key, value)| {
        let mut alone = toml::Table::new();
        alone.insert(keys::TAG.into(), name.clone());
        alone.insert((*key).clone(), (*value).clone());
        *key != keys::TAG && alone.try_into::<T>().is_err()
    })?;
    Some((key, spans.get_ref().get(key)?.span()))
}

/// An ES settings error as a config error: the library names the `[es]` key
/// ([`EsSpec::build`]) and says how to fix it.
pub fn es_error(e: EsError) -> ConfigError {
    let fix = e
        .fix()
        .unwrap_or_else(|| "change the [es] value it names".into());
    ConfigError::new(e.message(), fix)
}

/// A strategy that does not parse, as a config error naming `es.strategy`.
fn strategy_error(e: &SpecError) -> ConfigError {
    ConfigError::new(
        format!("es.strategy: {}", e.reason),
        format!(
            "valid strategies: {} (got \"{}\")",
            shardes::hlo::es::spec::STRATEGY_NAMES.join(", "),
            e.input
        ),
    )
}

/// The `[es]` names and numbers that serde would refuse with a less useful message: the
/// strategy, shaping and placement through their own parsers (the ones serde uses), with
/// the nearest valid shaping; floats beyond f32's range named as written, before they
/// become `inf`.
fn check_es_table(es: &toml::Table) -> Result<(), ConfigError> {
    if let Some(toml::Value::String(s)) = es.get("strategy") {
        s.parse::<StrategySpec>().map_err(|e| strategy_error(&e))?;
    }
    if let Some(toml::Value::String(s)) = es.get("shaping") {
        if let Err(e) = s.parse::<ShapingSpec>() {
            let valid = e.valid().join(", ");
            let hint = match nearest(s, e.valid()) {
                Some(n) => format!("did you mean \"{n}\"? valid: {valid}"),
                None => format!("valid shapings: {valid}"),
            };
            return Err(ConfigError::new(
                format!(
                    "es.shaping: unknown shaping \"{}\"",
                    shardes::hlo::es::spec::excerpt(s)
                ),
                hint,
            ));
        }
    }
    if let Some(toml::Value::String(s)) = es.get("how") {
        if let Err(e) = s.parse::<How>() {
            return Err(ConfigError::new(
                format!("es.how: {}", e.message()),
                e.fix(),
            ));
        }
    }
    if let Some(opt) = es.get("optimizer") {
        check_optimizer(opt)?;
    }
    for key in ["sigma", "lr"] {
        if let Some(toml::Value::Float(v)) = es.get(key) {
            if v.is_finite() && v.abs() > f64::from(f32::MAX) {
                return Err(ConfigError::new(
                    format!("es.{key} = {v:e} is beyond the float32 range (±3.4e38)"),
                    format!("set es.{key} to a small positive number, e.g. 0.01"),
                ));
            }
        }
    }
    Ok(())
}

/// `es.optimizer`, a name or a table, before serde: an unknown name or key with the nearest
/// valid one, a value of the wrong kind named by its key. What the optimizer needs (ClipUp's
/// `max_speed`) and the ranges are [`EsSpec::build`]'s.
fn check_optimizer(value: &toml::Value) -> Result<(), ConfigError> {
    let name = |s: &str| -> Result<(), ConfigError> {
        match s.parse::<OptimizerName>() {
            Ok(_) => Ok(()),
            Err(e) => {
                let valid = e.valid().join(", ");
                let hint = match nearest(s, e.valid()) {
                    Some(n) => format!("did you mean \"{n}\"? valid: {valid}"),
                    None => format!("valid optimizers: {valid}"),
                };
                Err(ConfigError::new(
                    format!("es.optimizer: unknown optimizer \"{}\"", e.input),
                    hint,
                ))
            }
        }
    };
    match value {
        toml::Value::String(s) => name(s),
        toml::Value::Table(t) => {
            check_keys(t, "es.optimizer", &OPTIMIZER_KEYS)?;
            match t.get("name") {
                Some(toml::Value::String(s)) => name(s)?,
                Some(_) => {
                    return Err(ConfigError::new(
                        "es.optimizer.name must be a string",
                        format!(
                            "write name = \"adam\" (valid: {})",
                            OPTIMIZER_NAMES.join(", ")
                        ),
                    ))
                }
                None => {
                    return Err(ConfigError::new(
                        "es.optimizer has no name",
                        format!("add name = \"...\", one of {}", OPTIMIZER_NAMES.join(", ")),
                    ))
                }
            }
            for (key, v) in t.iter().filter(|(k, _)| *k != "name") {
                let x = match v {
                    toml::Value::Float(x) => *x,
                    toml::Value::Integer(i) => *i as f64,
                    _ => {
                        return Err(ConfigError::new(
                            format!("es.optimizer.{key} must be a number"),
                            format!("write es.optimizer.{key} as a number, e.g. 0.9"),
                        ))
                    }
                };
                if x.is_finite() && x.abs() > f64::from(f32::MAX) {
                    return Err(ConfigError::new(
                        format!("es.optimizer.{key} = {x:e} is beyond the float32 range (±3.4e38)"),
                        format!("set es.optimizer.{key} to a float32 number"),
                    ));
                }
            }
            Ok(())
        }
        _ => Err(ConfigError::new(
            "es.optimizer must be an optimizer name or a table",
            format!(
                "write es.optimizer = \"adam\" (one of {}) or es.optimizer = {{ name = \"clipup\", \
                 max_speed = 0.3 }}",
                OPTIMIZER_NAMES.join(", ")
            ),
        )),
    }
}

/// Where `span` starts in `text`, for a message: ` at line L, column C (`the line`)`, the
/// line cut to 80 characters; empty without a span.
fn place(text: &str, span: Option<std::ops::Range<usize>>) -> String {
    let Some(span) = span else {
        return String::new();
    };
    let Some(before) = text.get(..span.start) else {
        return String::new();
    };
    let line_no = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    let line: String = text
        .lines()
        .nth(line_no - 1)
        .unwrap_or("")
        .trim()
        .chars()
        .take(80)
        .collect();
    format!(" at line {line_no}, column {column} (`{line}`)")
}

impl Config {
    /// Reads and validates a config file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            ConfigError::new(
                format!("cannot read config {}: {e}", path.display()),
                "pass the path of a TOML file, e.g. examples/quickstart.toml",
            )
        })?;
        Self::parse(&text)
    }

    /// Parses and validates config text.
    pub fn parse(text: &str) -> Result<Config, ConfigError> {
        let table: toml::Table = toml::from_str(text).map_err(|e| {
            ConfigError::new(
                format!(
                    "the config is not valid TOML{}: {}",
                    place(text, e.span()),
                    e.message()
                ),
                "fix the TOML syntax on that line (strings in double quotes, one key = value \
                 per line, [section] headers)",
            )
        })?;
        check_keys(&table, "", keys::fields::<Config>())?;
        let problem_keys = problem_keys();
        for (name, valid) in [
            ("problem", problem_keys.as_slice()),
            ("es", keys::fields::<EsConfig>()),
            ("run", keys::fields::<RunConfig>()),
        ] {
            match table.get(name) {
                Some(toml::Value::Table(t)) => check_keys(t, name, valid)?,
                Some(_) => {
                    return Err(ConfigError::new(
                        format!("`{name}` must be a table"),
                        format!("write it as a [{name}] section"),
                    ))
                }
                None => {
                    return Err(ConfigError::new(
                        format!("missing section [{name}]"),
                        "see examples/quickstart.toml for a complete config",
                    ))
                }
            }
        }
        if let Some(toml::Value::Table(t)) = table.get("problem") {
            check_problem_table(t)?;
        }
        if let Some(toml::Value::Table(t)) = table.get("es") {
            check_es_table(t)?;
            sigma::check_es_table(t)?;
            dtype::check_es_table(t)?;
        }
        for (name, v) in [("task", table.get("task")), ("eval", table.get("eval"))] {
            match v {
                Some(toml::Value::Table(t)) if name == "task" => TaskConfig::check_table(t)?,
                Some(toml::Value::Table(t)) => check_keys(t, name, keys::fields::<EvalConfig>())?,
                Some(_) => {
                    return Err(ConfigError::new(
                        format!("`{name}` must be a table"),
                        format!("write it as a [{name}] section"),
                    ))
                }
                None => {}
            }
        }
        let mut config: Config = toml::from_str(text).map_err(|e| {
            let msg = e.message().to_string();
            // serde names the expected type but not the key; the span points at the value,
            // so quote the line it is on.
            let place = place(
                text,
                tagged_value_span(text, &table, e.span()).or_else(|| e.span()),
            );
            ConfigError::new(
                format!("wrong value in the config{place}: {msg}"),
                "see examples/quickstart.toml for the type of each key",
            )
        })?;
        sigma::in_file_order(text, &mut config);
        config.validate()?;
        Ok(config)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        self.check_task()?;
        self.problem.check(self.task.is_some())?;
        let [d_model, batch, seq] = self.problem.dims();
        for (key, v) in [
            d_model,
            batch,
            seq,
            ("devices", Some(self.devices)),
            ("run.generations", Some(self.run.generations)),
        ] {
            if v == Some(0) {
                return Err(ConfigError::new(
                    format!("{key} = 0"),
                    format!("set {key} to at least 1"),
                ));
            }
        }
        self.es.build(self.devices).map_err(es_error)?;
        self.compute_dtype()?;
        Ok(())
    }

    /// `[task]` needs a `qwen2` problem that gives no teacher-forcing data; `[eval]` needs
    /// a `[task]`.
    fn check_task(&self) -> Result<(), ConfigError> {
        if let Some(e) = &self.eval {
            if self.task.is_none() {
                return Err(ConfigError::new(
                    "[eval] without a [task]",
                    "held-out evaluation scores generated text: add a [task] section, or \
                     remove [eval]",
                ));
            }
            e.check()?;
        }
        let Some(task) = &self.task else {
            return Ok(());
        };
        task.check()?;
        let ProblemConfig::Qwen2 {
            data, batch, seq, ..
        } = &self.problem
        else {
            return Err(ConfigError::new(
                format!("[task] with problem \"{}\"", self.problem.name()),
                "a [task] fine-tunes a language model: use [problem] name = \"qwen2\"",
            ));
        };
        for (key, set) in [
            ("data", data.is_some()),
            ("batch", batch.is_some()),
            ("seq", seq.is_some()),
        ] {
            if set {
                return Err(ConfigError::new(
                    format!("problem.{key} with a [task]"),
                    format!(
                        "problem.{key} is for teacher-forced training; a [task] run takes its \
                         prompts from the task (task.prompts, task.prompt_len, \
                         task.max_new_tokens): remove problem.{key}"
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The files whose contents determine the trajectory beside the config's values, by
    /// the key that names them: a qwen2 problem's data, tokenizer and checkpoint files
    /// (`config.json`, the `*.safetensors` and their index, `tokenizer.json`). The
    /// trajectory hash covers their paths; [`Config::input_digests`] their contents.
    pub fn input_files(&self) -> Vec<(String, PathBuf)> {
        let mut files = Vec::new();
        if let ProblemConfig::Qwen2 {
            checkpoint,
            data,
            tokenizer,
            model,
            ..
        } = &self.problem
        {
            // A model given by path is digested as a checkpoint is; a named one is pinned
            // by its checksum already.
            let checkpoint = checkpoint
                .clone()
                .or_else(|| model.as_ref().map(PathBuf::from).filter(|p| p.exists()));
            if let Some(file) = checkpoint.as_ref().filter(|c| c.is_file()) {
                files.push(("problem.checkpoint".to_string(), file.clone()));
            }
            if let Some(dir) = checkpoint.as_ref().filter(|c| c.is_dir()) {
                let mut in_dir: Vec<PathBuf> = std::fs::read_dir(dir)
                    .into_iter()
                    .flatten()
                    .flatten()
                    .map(|e| e.path())
                    .filter(|p| {
                        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
                        name == "config.json"
                            || name == "tokenizer.json"
                            || name.ends_with(".safetensors")
                            || name.ends_with(".safetensors.index.json")
                    })
                    .collect();
                in_dir.sort();
                files.extend(
                    in_dir
                        .into_iter()
                        .map(|p| ("problem.checkpoint".to_string(), p)),
                );
            }
            if let Some(t) = tokenizer {
                files.push(("problem.tokenizer".into(), t.clone()));
            }
            if let Some(d) = data {
                files.push(("problem.data".into(), d.clone()));
            }
        }
        if let Some(t) = &self.task {
            files.extend(t.input_files());
        }
        files.extend(sigma::input_files(&self.es));
        if let ProblemConfig::Control { mjcf: Some(m), .. } = &self.problem {
            files.push(("problem.mjcf".into(), m.clone()));
        }
        files
    }

    /// The sha256 of every [`Config::input_files`] file, by its path: stored with each
    /// checkpoint, so that a resume on changed data, tokenizer or weights is refused.
    pub fn input_digests(&self) -> Result<std::collections::BTreeMap<String, String>, ConfigError> {
        use sha2::{Digest, Sha256};
        use std::io::Read;
        let mut out = std::collections::BTreeMap::new();
        for (key, path) in self.input_files() {
            let read = || -> std::io::Result<String> {
                let mut f = std::fs::File::open(&path)?;
                let mut h = Sha256::new();
                let mut buf = vec![0u8; 1 << 20];
                loop {
                    let k = f.read(&mut buf)?;
                    if k == 0 {
                        break;
                    }
                    h.update(&buf[..k]);
                }
                Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
            };
            let digest = read().map_err(|e| {
                ConfigError::new(
                    format!("{key}: cannot read {}: {e}", path.display()),
                    format!("check that {key} names a readable file"),
                )
            })?;
            out.insert(path.display().to_string(), digest);
        }
        Ok(out)
    }

    /// A stable hash of the settings that determine the trajectory (everything but
    /// `run.generations`, `run.out`, `run.checkpoint_every`, `run.tensorboard` and `plugin`), so a
    /// resume can refuse an out directory that belongs to another run.
    pub fn trajectory_hash(&self) -> String {
        use sha2::{Digest, Sha256};
        let mut c = self.clone();
        c.run.generations = 0;
        c.run.out = PathBuf::new();
        c.run.checkpoint_every = 0;
        c.run.tensorboard = false;
        c.plugin = None;
        let text = serde_json::to_string(&c).unwrap_or_default();
        let digest = Sha256::digest(text.as_bytes());
        digest.iter().take(8).map(|b| format!("{b:02x}")).collect()
    }
}

pub mod sigma;
#[cfg(test)]
mod tests;
