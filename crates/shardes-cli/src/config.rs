//! The `config.toml` schema of `shardes run`, with errors that name the key and the fix.
//!
//! Unknown keys are refused with the nearest valid key; values are checked for type and
//! range before anything is compiled.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use shardes::hlo::es::{StrategySpec, KEEP_NOISE_BYTES};

/// A user-facing configuration error: one line saying what is wrong and a hint saying how to fix it.
#[derive(Debug, thiserror::Error)]
#[error("{message}\n  hint: {hint}")]
pub struct ConfigError {
    /// What is wrong (names the key or value).
    pub message: String,
    /// How to fix it.
    pub hint: String,
}

fn cfg_err(message: impl Into<String>, hint: impl Into<String>) -> ConfigError {
    ConfigError {
        message: message.into(),
        hint: hint.into(),
    }
}

/// The whole run configuration.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// PJRT plugin: `cpu` (default: the provisioned CPU plugin), `cuda`, `tpu`, or a path.
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
}

/// `[problem]`.
///
/// `transformer_block` reads `d_model`, `batch` and `seq`. `qwen2` reads `checkpoint` (a
/// Hugging Face directory) or `size` (random init), `data` (JSONL of prompt/target pairs),
/// optional `tokenizer`, `compute_dtype`, `batch` and `seq`. A key that the named problem
/// does not read is refused.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ProblemConfig {
    /// Problem name: `transformer_block` or `qwen2`.
    pub name: String,
    /// Model width (transformer_block; default 64).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub d_model: Option<usize>,
    /// Sequences per batch (transformer_block: default 8; qwen2: the number of examples
    /// in `data`, which it must equal when given).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<usize>,
    /// Tokens per sequence (transformer_block: default 32; qwen2: default the longest
    /// example's prompt + target − 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq: Option<usize>,
    /// qwen2: a Hugging Face checkpoint directory (`config.json`, `*.safetensors`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<PathBuf>,
    /// qwen2: a preset (`tiny`, `0.5b`, `1.5b`) with random parameters, instead of a checkpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<String>,
    /// qwen2: a JSONL file, one example per line: `{"prompt": "...", "target": "..."}`
    /// (needs a tokenizer) or `{"prompt_ids": [...], "target_ids": [...]}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<PathBuf>,
    /// qwen2: a `tokenizer.json` (default: the checkpoint's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokenizer: Option<PathBuf>,
    /// qwen2: the forward's dtype, `f32` (default) or `bf16`; the master and the fitness stay f32.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_dtype: Option<String>,
}

impl ProblemConfig {
    /// transformer_block's model width.
    pub fn d_model(&self) -> usize {
        self.d_model.unwrap_or(64)
    }

    /// transformer_block's sequences per batch.
    pub fn batch(&self) -> usize {
        self.batch.unwrap_or(8)
    }

    /// transformer_block's tokens per sequence.
    pub fn seq(&self) -> usize {
        self.seq.unwrap_or(32)
    }

    fn check_keys_for_problem(&self) -> Result<(), ConfigError> {
        let given = [
            ("d_model", self.d_model.is_some()),
            ("checkpoint", self.checkpoint.is_some()),
            ("size", self.size.is_some()),
            ("data", self.data.is_some()),
            ("tokenizer", self.tokenizer.is_some()),
            ("compute_dtype", self.compute_dtype.is_some()),
        ];
        let reads: &[&str] = match self.name.as_str() {
            "qwen2" => &["checkpoint", "size", "data", "tokenizer", "compute_dtype"],
            _ => &["d_model"],
        };
        if let Some((key, _)) = given.iter().find(|(k, g)| *g && !reads.contains(k)) {
            return Err(cfg_err(
                format!("problem.{key} does not apply to problem \"{}\"", self.name),
                format!(
                    "remove it; {} reads: batch, seq, {}",
                    self.name,
                    reads.join(", ")
                ),
            ));
        }
        if self.name != "qwen2" {
            return Ok(());
        }
        match (&self.checkpoint, &self.size) {
            (Some(_), Some(_)) => Err(cfg_err(
                "problem.checkpoint and problem.size are both set",
                "keep one: checkpoint = \"DIR\" loads a model, size = \"tiny\" draws one at random",
            )),
            (None, None) => Err(cfg_err(
                "problem \"qwen2\" needs problem.checkpoint or problem.size",
                "add checkpoint = \"DIR\" (a Hugging Face directory) or size = \"tiny\", \"0.5b\" or \"1.5b\"",
            )),
            _ if self.data.is_none() => Err(cfg_err(
                "problem \"qwen2\" needs problem.data",
                "add data = \"FILE.jsonl\" with one {\"prompt\": ..., \"target\": ...} per line",
            )),
            _ => match self.compute_dtype.as_deref() {
                None | Some("f32") | Some("bf16") => Ok(()),
                Some(other) => Err(cfg_err(
                    format!("problem.compute_dtype: unknown dtype \"{other}\""),
                    "use \"f32\" or \"bf16\"",
                )),
            },
        }
    }
}

/// `[es]`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct EsConfig {
    /// Strategy, e.g. `mirrored(lowrank(r=1))`.
    #[serde(default = "default_strategy")]
    pub strategy: String,
    /// Population size.
    pub n: usize,
    /// Noise scale.
    pub sigma: f32,
    /// Learning rate.
    pub lr: f32,
    /// Fitness shaping: `centered_ranks`, `centered`, `group_relative` or `none`.
    #[serde(default = "default_shaping")]
    pub shaping: String,
    /// Where the update is contracted: `B` (per device, then all-reduce) or `A` (everywhere).
    #[serde(default = "default_how")]
    pub how: String,
    /// Members evaluated together per loop step on each device (default: chosen by memory).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member_chunk: Option<usize>,
    /// MiB of noise per device that `how = "B"` keeps from `apply` for `tell` (default 16;
    /// 0 always regenerates it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_noise_mib: Option<usize>,
}

impl EsConfig {
    /// The noise budget in bytes for `ShardedES::with_keep_noise_bytes`.
    pub fn keep_noise_bytes(&self) -> usize {
        self.keep_noise_mib
            .map_or(KEEP_NOISE_BYTES, |m| m.saturating_mul(1 << 20))
    }
}

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
}

fn default_devices() -> usize {
    8
}
fn default_strategy() -> String {
    "mirrored(lowrank(r=1))".into()
}
fn default_shaping() -> String {
    "centered_ranks".into()
}
fn default_how() -> String {
    "B".into()
}
fn default_out() -> PathBuf {
    PathBuf::from("runs/default")
}
fn default_checkpoint_every() -> usize {
    10
}

/// Valid keys per table, for unknown-key suggestions. Keep in sync with the structs above;
/// `every_listed_es_and_run_key_deserializes` checks the `[es]` and `[run]` lists.
const TOP_KEYS: &[&str] = &["plugin", "devices", "problem", "es", "run"];
const PROBLEM_KEYS: &[&str] = &[
    "name",
    "d_model",
    "batch",
    "seq",
    "checkpoint",
    "size",
    "data",
    "tokenizer",
    "compute_dtype",
];
const ES_KEYS: &[&str] = &[
    "strategy",
    "n",
    "sigma",
    "lr",
    "shaping",
    "how",
    "member_chunk",
    "keep_noise_mib",
];
const RUN_KEYS: &[&str] = &["seed", "generations", "out", "checkpoint_every"];

/// Shapings the CLI accepts.
pub const SHAPINGS: &[&str] = &["centered_ranks", "centered", "group_relative", "none"];
/// Problems the CLI knows.
pub const PROBLEMS: &[&str] = &["transformer_block", "qwen2"];

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
            return Err(cfg_err(format!("unknown key `{full}`"), hint));
        }
    }
    Ok(())
}

impl Config {
    /// Reads and validates a config file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            cfg_err(
                format!("cannot read config {}: {e}", path.display()),
                "pass the path of a TOML file, e.g. examples/quickstart.toml",
            )
        })?;
        Self::parse(&text)
    }

    /// Parses and validates config text.
    pub fn parse(text: &str) -> Result<Config, ConfigError> {
        let table: toml::Table = toml::from_str(text).map_err(|e| {
            cfg_err(
                format!("the config is not valid TOML: {}", e.message()),
                "check the line the TOML parser names",
            )
        })?;
        check_keys(&table, "", TOP_KEYS)?;
        for (name, valid) in [
            ("problem", PROBLEM_KEYS),
            ("es", ES_KEYS),
            ("run", RUN_KEYS),
        ] {
            match table.get(name) {
                Some(toml::Value::Table(t)) => check_keys(t, name, valid)?,
                Some(_) => {
                    return Err(cfg_err(
                        format!("`{name}` must be a table"),
                        format!("write it as a [{name}] section"),
                    ))
                }
                None => {
                    return Err(cfg_err(
                        format!("missing section [{name}]"),
                        "see examples/quickstart.toml for a complete config",
                    ))
                }
            }
        }
        let config: Config = toml::from_str(text).map_err(|e| {
            let msg = e.message().to_string();
            // serde names the expected type but not the key; the span points at the value,
            // so quote the line it is on.
            let place = e
                .span()
                .and_then(|span| {
                    let start = text.get(..span.start)?;
                    let line_no = start.matches('\n').count() + 1;
                    let line = text.lines().nth(line_no - 1)?.trim();
                    Some(format!(" at line {line_no} (`{line}`)"))
                })
                .unwrap_or_default();
            cfg_err(
                format!("wrong value in the config{place}: {msg}"),
                "see examples/quickstart.toml for the type of each key",
            )
        })?;
        config.validate()?;
        Ok(config)
    }

    /// The strategy, parsed.
    pub fn strategy(&self) -> Result<StrategySpec, ConfigError> {
        self.es
            .strategy
            .parse()
            .map_err(|e: shardes::hlo::es::SpecError| {
                cfg_err(
                    format!("es.strategy: {}", e.reason),
                    format!(
                        "valid strategies: {} (got \"{}\")",
                        shardes::hlo::es::spec::STRATEGY_NAMES.join(", "),
                        e.input
                    ),
                )
            })
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if !PROBLEMS.contains(&self.problem.name.as_str()) {
            let hint = match nearest(&self.problem.name, PROBLEMS) {
                Some(n) => format!("did you mean \"{n}\"?"),
                None => format!("known problems: {}", PROBLEMS.join(", ")),
            };
            return Err(cfg_err(
                format!("problem.name: unknown problem \"{}\"", self.problem.name),
                hint,
            ));
        }
        self.problem.check_keys_for_problem()?;
        for (key, v) in [
            ("problem.d_model", self.problem.d_model.unwrap_or(1)),
            ("problem.batch", self.problem.batch.unwrap_or(1)),
            ("problem.seq", self.problem.seq.unwrap_or(1)),
            ("devices", self.devices),
            ("es.n", self.es.n),
            ("run.generations", self.run.generations),
        ] {
            if v == 0 {
                return Err(cfg_err(
                    format!("{key} = 0"),
                    format!("set {key} to at least 1"),
                ));
            }
        }
        let strategy = self.strategy()?;
        if !SHAPINGS.contains(&self.es.shaping.as_str()) {
            let hint = match nearest(&self.es.shaping, SHAPINGS) {
                Some(n) => format!("did you mean \"{n}\"? valid: {}", SHAPINGS.join(", ")),
                None => format!("valid shapings: {}", SHAPINGS.join(", ")),
            };
            return Err(cfg_err(
                format!("es.shaping: unknown shaping \"{}\"", self.es.shaping),
                hint,
            ));
        }
        if !matches!(self.es.how.as_str(), "A" | "B" | "a" | "b") {
            return Err(cfg_err(
                format!("es.how: unknown placement \"{}\"", self.es.how),
                "use \"B\" (contract per device, then all-reduce) or \"A\" (gather weights, contract everywhere)",
            ));
        }
        if !(self.es.sigma.is_finite() && self.es.sigma > 0.0) {
            return Err(cfg_err(
                format!("es.sigma = {} is not a finite number > 0", self.es.sigma),
                "set es.sigma to a small positive number, e.g. 0.01",
            ));
        }
        if !self.es.lr.is_finite() {
            return Err(cfg_err(
                format!("es.lr = {} is not finite", self.es.lr),
                "set es.lr to a finite number, e.g. 0.01",
            ));
        }
        let pairing = strategy.pairing();
        let per = self.devices * pairing;
        if !self.es.n.is_multiple_of(per) {
            let lower = (self.es.n / per).max(1) * per;
            let upper = (self.es.n / per + 1) * per;
            return Err(cfg_err(
                format!(
                    "es.n = {} is not divisible by devices ({}) × pairing ({pairing} for {strategy})",
                    self.es.n, self.devices
                ),
                format!("set es.n to a multiple of {per}, e.g. {lower} or {upper}"),
            ));
        }
        if let Some(0) = self.es.member_chunk {
            return Err(cfg_err(
                "es.member_chunk = 0",
                "set es.member_chunk to at least 1",
            ));
        }
        Ok(())
    }

    /// A stable hash of the settings that determine the trajectory (everything but
    /// `run.generations`, `run.out`, `run.checkpoint_every` and `plugin`), so a resume can refuse
    /// an out directory that belongs to another run.
    pub fn trajectory_hash(&self) -> String {
        use sha2::{Digest, Sha256};
        let mut c = self.clone();
        c.run.generations = 0;
        c.run.out = PathBuf::new();
        c.run.checkpoint_every = 0;
        c.plugin = None;
        let text = serde_json::to_string(&c).unwrap_or_default();
        let digest = Sha256::digest(text.as_bytes());
        digest.iter().take(8).map(|b| format!("{b:02x}")).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const QUICK: &str = r#"
devices = 8
[problem]
name = "transformer_block"
d_model = 64
batch = 8
seq = 32
[es]
strategy = "mirrored(lowrank(r=1))"
n = 256
sigma = 0.01
lr = 0.01
shaping = "centered_ranks"
how = "B"
[run]
seed = 0
generations = 30
out = "runs/quickstart"
checkpoint_every = 10
"#;

    #[test]
    fn every_listed_es_and_run_key_deserializes() {
        let text = QUICK.replace(
            "how = \"B\"",
            "how = \"B\"\nmember_chunk = 8\nkeep_noise_mib = 4",
        );
        let c = Config::parse(&text).expect("every [es] key set");
        assert_eq!(c.es.member_chunk, Some(8));
        assert_eq!(c.es.keep_noise_bytes(), 4 << 20);
        let table: toml::Table = toml::from_str(&text).expect("toml");
        for (name, keys) in [("es", ES_KEYS), ("run", RUN_KEYS)] {
            let set = table[name].as_table().expect("table");
            for k in keys {
                assert!(
                    set.contains_key(*k),
                    "{name}.{k} is listed but not exercised here"
                );
            }
            assert_eq!(set.len(), keys.len(), "[{name}] sets a key the list lacks");
        }
        // Unset, the library's default budget.
        let plain = Config::parse(QUICK).expect("quickstart");
        assert_eq!(plain.es.keep_noise_bytes(), KEEP_NOISE_BYTES);
    }

    #[test]
    fn quickstart_parses() {
        let c = Config::parse(QUICK).unwrap();
        assert_eq!(c.es.n, 256);
        assert_eq!(c.strategy().unwrap().pairing(), 2);
    }

    fn err(text: &str) -> String {
        Config::parse(text).unwrap_err().to_string()
    }

    #[test]
    fn unknown_key_names_the_nearest() {
        let e = err(&QUICK.replace("sigma = 0.01", "sigmaa = 0.01"));
        assert!(e.contains("unknown key `es.sigmaa`"), "{e}");
        assert!(e.contains("did you mean `sigma`"), "{e}");
    }

    #[test]
    fn wrong_type_is_reported() {
        let e = err(&QUICK.replace("n = 256", "n = \"many\""));
        assert!(e.contains("wrong value"), "{e}");
        assert!(e.contains("(`n = \"many\"`)"), "{e}");
    }

    #[test]
    fn indivisible_population_names_the_numbers() {
        let e = err(&QUICK.replace("n = 256", "n = 100"));
        assert!(e.contains("es.n = 100"), "{e}");
        assert!(e.contains("multiple of 16"), "{e}");
    }

    #[test]
    fn unknown_strategy_and_shaping() {
        let e = err(&QUICK.replace("mirrored(lowrank(r=1))", "lowrnk"));
        assert!(e.contains("unknown strategy"), "{e}");
        let e = err(&QUICK.replace("\"centered_ranks\"", "\"centred_ranks\""));
        assert!(e.contains("did you mean \"centered_ranks\""), "{e}");
    }

    #[test]
    fn bad_sigma_and_how() {
        assert!(err(&QUICK.replace("sigma = 0.01", "sigma = -1.0")).contains("es.sigma"));
        assert!(err(&QUICK.replace("how = \"B\"", "how = \"C\"")).contains("es.how"));
    }

    #[test]
    fn hash_ignores_run_length_but_not_sigma() {
        let a = Config::parse(QUICK).unwrap();
        let b = Config::parse(&QUICK.replace("generations = 30", "generations = 5")).unwrap();
        let c = Config::parse(&QUICK.replace("sigma = 0.01", "sigma = 0.02")).unwrap();
        assert_eq!(a.trajectory_hash(), b.trajectory_hash());
        assert_ne!(a.trajectory_hash(), c.trajectory_hash());
    }
}
