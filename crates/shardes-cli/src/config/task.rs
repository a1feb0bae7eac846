//! `[task]` and `[eval]`: fine-tuning a language model on a reward from what each member
//! generates (a `qwen2` problem).
//!
//! ```toml
//! [task]
//! name = "countdown"       # countdown | jsonl | target_token
//! prompts = 8              # training prompts per generation (each member decodes all)
//! prompt_len = 160         # prompt tokens the program holds (longer prompts are refused)
//! max_new_tokens = 128     # tokens each completion may generate
//! chat = true              # wrap prompts with the checkpoint's chat template
//!
//! [task.reward]           # optional, text tasks: a reward program instead of the built-in
//! command = ["python3", "examples/reward.py"]
//! timeout_s = 30           # seconds to wait for each answer (a missing one is contained)
//! restarts = 3             # restarts of the program over the run, then the run stops
//!
//! [eval]
//! every = 10               # held-out evaluation every this many generations (0: start and end)
//! prompts = 64             # held-out prompts per evaluation
//! ```
//!
//! This module holds what is the same for every task: the keys every task reads, the
//! reward program, `[eval]` and the checks of the raw table. What is a task's own lives in
//! one module per task (`task/<name>.rs`, `countdown.rs` the fullest): its keys, declared
//! with `own_keys!` (each key's doc comment is what `shardes init` writes above it), and
//! its [`OwnKeys`] impl (its checks, its input files, how it is built, what its reward
//! means). Its `mod` line and the [`TaskConfig`] variant naming its keys are all a task
//! adds here.

use std::ops::Deref;
use std::path::PathBuf;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use shardes::finetune::RewardTask;
use shardes::tasks::command::RewardCommand;

use super::keys::{self, TAG};
use super::{nearest, ConfigError};

/// Declares a task's own keys: a struct whose every key is an `Option`, refused when the
/// task does not read it, unset when absent and not written when unset (so that the
/// resolved config and the trajectory hash record what the user wrote), and what `shardes
/// init` writes for each ([`KeyDocs`]): the key's doc comment above it, then the key set
/// to a starting value (`= needed(literal)`, a key without a default) or commented out
/// with an example (`= optional(literal)`). A key without a doc comment does not compile
/// ("no rules expected keyword `pub`").
macro_rules! own_keys {
    (
        $(#[doc = $about:literal])*
        pub struct $name:ident {
            $(
                $(#[doc = $doc:literal])+
                pub $key:ident: Option<$ty:ty> = $shown:ident($value:literal),
            )*
        }
    ) => {
        $(#[doc = $about])*
        #[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq, Default)]
        #[serde(deny_unknown_fields)]
        pub struct $name {
            $(
                $(#[doc = $doc])*
                #[serde(default, skip_serializing_if = "Option::is_none")]
                pub $key: Option<$ty>,
            )*
        }

        impl $crate::config::task::KeyDocs for $name {
            fn docs(&self) -> &'static [$crate::config::task::KeyDoc] {
                use $crate::config::task::KeyDoc;
                const DOCS: &[KeyDoc] = &[
                    $(KeyDoc::$shown(stringify!($key), concat!($($doc, "\n",)+), $value),)*
                ];
                DOCS
            }
        }
    };
}

// One module per task: its keys (`own_keys!`) and its `OwnKeys` impl.
mod countdown;
mod jsonl;
mod target_token;

/// Declares [`TaskConfig`] with its one match over the tasks ([`TaskConfig::parts`]), so
/// that a task's variant is one line of the invocation below, and no other code lists the
/// tasks.
macro_rules! tasks {
    (
        $(#[$attr:meta])*
        pub enum TaskConfig {
            $($(#[doc = $doc:literal])* $variant:ident($keys:ty),)*
        }
    ) => {
        $(#[$attr])*
        #[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
        #[serde(tag = "name", rename_all = "snake_case")]
        pub enum TaskConfig {
            $($(#[doc = $doc])* $variant(TaskSection<$keys>),)*
        }

        impl TaskConfig {
            /// The task's section as the code that is the same for every task reads it:
            /// the one match over the tasks.
            fn parts(&self) -> Parts<'_> {
                match self {
                    $(TaskConfig::$variant(s) => s.parts(),)*
                }
            }
        }
    };
}

tasks! {
    /// `[task]`: one variant per task, chosen by `name`, so that a task's name and its keys
    /// are one definition. Each holds the settings every task reads, the task's own keys
    /// and the reward program, written in that order (the order earlier builds wrote, which
    /// the trajectory hash depends on).
    ///
    /// A key that the named task does not read is refused before serde, with the list of
    /// keys it does read ([`TaskConfig::check_table`]). Unset keys stay `None` (the resolved
    /// config and the trajectory hash record what the user wrote); the accessors give the
    /// defaults.
    ///
    /// A task's own keys, what they build and what its reward means are its module's
    /// (`config/task/<name>.rs`, an [`OwnKeys`] impl).
    pub enum TaskConfig {
        /// `countdown`: TinyZero's arithmetic puzzles.
        Countdown(countdown::CountdownKeys),
        /// `jsonl`: prompts and answers from JSONL files.
        Jsonl(jsonl::JsonlKeys),
        /// `target_token`: random prompts, rewarded by how often one token id is generated.
        TargetToken(target_token::TargetTokenKeys),
    }
}

/// The `[task]` section of a task whose own keys are `K`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct TaskSection<K> {
    /// The keys every task reads.
    #[serde(flatten)]
    pub settings: TaskSettings,
    /// The task's own keys.
    #[serde(flatten)]
    pub own: K,
    /// `[task.reward]`: a reward program instead of the task's built-in reward.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reward: Option<RewardConfig>,
}

/// The `[task]` keys every task reads ([`TaskConfig`]'s accessors give the defaults).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct TaskSettings {
    /// Training prompts per generation (default 8).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompts: Option<usize>,
    /// Prompt tokens the decoding program holds (default 128).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_len: Option<usize>,
    /// Tokens generated per completion at most (default 64).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_new_tokens: Option<usize>,
    /// Wrap prompts with the checkpoint's chat template (default false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat: Option<bool>,
    /// A system message for the chat template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<String>,
    /// Text that starts the model's reply: appended to every prompt (after the chat
    /// template) and put before every completion when it is rewarded, as TinyZero starts
    /// Qwen's turn with `Let me solve this step by step.\n<think>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_prefix: Option<String>,
    /// Sampling temperature; 0 (the default) decodes greedily.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    /// Nucleus sampling's mass (default 1: off); only with a temperature above 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f64>,
    /// End-of-sequence ids (default: `generation_config.json`'s, else `config.json`'s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eos: Option<Vec<u32>>,
}

/// What a task's own keys tell the code that is the same for every task: everything the
/// CLI knows of one task, implemented in its module beside its keys.
pub trait OwnKeys: KeyDocs {
    /// Whether the completions are text, which `[task.reward]` may score (else token ids).
    fn text(&self) -> bool {
        true
    }
    /// The checks serde cannot make.
    fn check(&self) -> Result<(), ConfigError> {
        Ok(())
    }
    /// The files whose contents the trajectory depends on, by key.
    fn input_files(&self) -> Vec<(String, PathBuf)> {
        Vec::new()
    }
    /// The library's task these keys configure; `vocab` is the model's vocabulary, and
    /// `command` the reward program of `[task.reward]` that scores a text task's
    /// completions instead of its built-in reward.
    fn build(&self, vocab: usize, command: Option<RewardCommand>) -> Built;
    /// Which rates the built-in reward defines beside the mean (default: none).
    fn rates(&self) -> Rates {
        Rates::default()
    }
}

/// The value of `task.{key}`, which the task `task` needs (a key without a default), or the
/// error that says so with `hint`.
pub fn required<'a, T>(
    value: &'a Option<T>,
    task: &str,
    key: &str,
    hint: &str,
) -> Result<&'a T, ConfigError> {
    value
        .as_ref()
        .ok_or_else(|| ConfigError::new(format!("task \"{task}\" needs task.{key}"), hint))
}

/// What [`OwnKeys::build`] gives: the task, or what to change in `[task]`.
pub type Built = Result<Box<dyn RewardTask>, ConfigError>;

/// What `shardes init` writes for each of a task's own keys, one entry per key, in the
/// keys' order; [`own_keys!`] implements it from the keys' doc comments.
pub trait KeyDocs {
    /// One entry per own key.
    fn docs(&self) -> &'static [KeyDoc];
}

/// Which rates beside the mean reward a reward defines (the columns of `shardes eval`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Rates {
    /// Reward 1 means solved.
    pub accuracy: bool,
    /// Reward above 0 means well formed.
    pub format: bool,
}

/// What `shardes init` writes for one of a task's own keys: a comment, then the key set or
/// commented out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyDoc {
    /// The key.
    pub key: &'static str,
    /// The comment above it: the key's doc comment, its lines joined (init wraps the words
    /// again).
    pub about: &'static str,
    /// Whether a config must set it: then init sets it to `value`, a starting value (there
    /// is no default to write); else init writes it commented out with `value` as the
    /// example.
    pub needed: bool,
    /// A TOML literal: the starting value of a needed key, the example of another.
    pub value: &'static str,
}

impl KeyDoc {
    /// A key a config must set; init sets it to `start`.
    pub const fn needed(key: &'static str, about: &'static str, start: &'static str) -> Self {
        KeyDoc {
            key,
            about,
            needed: true,
            value: start,
        }
    }
    /// An optional key; init writes it commented out as `key = example`.
    pub const fn optional(key: &'static str, about: &'static str, example: &'static str) -> Self {
        KeyDoc {
            key,
            about,
            needed: false,
            value: example,
        }
    }
}

/// A task's section as the code that is the same for every task reads it.
struct Parts<'a> {
    settings: &'a TaskSettings,
    own: &'a dyn OwnKeys,
    /// The own keys, in the order they are written.
    own_keys: &'static [&'static str],
    reward: Option<&'a RewardConfig>,
}

impl<K: OwnKeys + DeserializeOwned> TaskSection<K> {
    fn parts(&self) -> Parts<'_> {
        Parts {
            settings: &self.settings,
            own: &self.own,
            own_keys: keys::fields::<K>(),
            reward: self.reward.as_ref(),
        }
    }
}

/// The task names, in [`TaskConfig`]'s order.
pub fn task_names() -> &'static [&'static str] {
    keys::variants::<TaskConfig>()
}

/// The `[task]` keys the task `name` reads (`name` and the keys every task reads first), in
/// the config's order; empty for an unknown name.
pub fn task_keys(name: &str) -> Vec<&'static str> {
    keys::named::<TaskConfig>(name).map_or_else(Vec::new, |t| t.keys())
}

/// What `shardes init` writes for each own key of the task `name`; empty for an unknown
/// name.
pub fn task_docs(name: &str) -> &'static [KeyDoc] {
    keys::named::<TaskConfig>(name).map_or(&[], |t| t.own().docs())
}

/// `[task.reward]`: a program of the user's scores the completions
/// (`shardes::tasks::command` describes the protocol).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RewardConfig {
    /// The program and its arguments, e.g. `["python3", "examples/reward.py"]`.
    pub command: Vec<String>,
    /// Seconds to wait for each answer (default 30).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_s: Option<f64>,
    /// Restarts of the program allowed over the run (default 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restarts: Option<u32>,
}

impl RewardConfig {
    /// The library's spec, range-checked.
    pub fn spec(&self) -> Result<shardes::tasks::command::CommandSpec, ConfigError> {
        use shardes::tasks::command::{CommandSpec, DEFAULT_RESTARTS, DEFAULT_TIMEOUT_S};
        if self.command.is_empty() {
            return Err(ConfigError::new(
                "task.reward.command is empty",
                "give the program and its arguments, e.g. command = [\"python3\", \"examples/reward.py\"]",
            ));
        }
        let secs = self.timeout_s.unwrap_or(DEFAULT_TIMEOUT_S);
        let timeout = CommandSpec::timeout_from_secs(secs).map_err(|_| {
            ConfigError::new(
                format!("task.reward.timeout_s = {secs}"),
                "give the seconds to wait for each answer: above 0 and at most 86400",
            )
        })?;
        Ok(CommandSpec {
            command: self.command.clone(),
            timeout,
            restarts: self.restarts.unwrap_or(DEFAULT_RESTARTS),
        })
    }
}

/// `[eval]`: held-out evaluation of the unperturbed parameters.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct EvalConfig {
    /// Evaluate every this many generations, besides generation 0 and the end (0: only
    /// those two).
    #[serde(default = "default_every")]
    pub every: usize,
    /// Held-out prompts per evaluation.
    #[serde(default = "default_eval_prompts")]
    pub prompts: usize,
    /// Completions kept as samples in each `eval.jsonl` line.
    #[serde(default = "default_samples")]
    pub samples: usize,
}

fn default_every() -> usize {
    10
}
fn default_eval_prompts() -> usize {
    32
}
fn default_samples() -> usize {
    3
}

impl Default for EvalConfig {
    fn default() -> Self {
        EvalConfig {
            every: default_every(),
            prompts: default_eval_prompts(),
            samples: default_samples(),
        }
    }
}

/// The most prompts, prompt tokens or new tokens a config may ask for (a program of that
/// size would not compile in any memory this tool runs in).
const MAX_DIM: usize = 1 << 20;

impl TaskConfig {
    /// The task's `name`.
    pub fn name(&self) -> &'static str {
        keys::name_of(self)
    }

    /// `[task.reward]`, if set.
    pub fn reward(&self) -> Option<&RewardConfig> {
        self.parts().reward
    }

    /// Whether the task's completions are text (else token ids).
    pub fn text(&self) -> bool {
        self.own().text()
    }

    /// The task's own keys: what the code that is the same for every task asks of the task
    /// (how it is built, what its reward means, ...) goes through them.
    pub fn own(&self) -> &dyn OwnKeys {
        self.parts().own
    }

    /// The rates beside the mean reward that the task's reward defines: none where a
    /// `[task.reward]` program scores (the user's program decides what a reward means),
    /// else the built-in reward's.
    pub fn rates(&self) -> Rates {
        match self.reward() {
            Some(_) => Rates::default(),
            None => self.own().rates(),
        }
    }

    /// The `[task]` keys this task reads besides `reward`: `name`, the keys every task
    /// reads, then its own, in the config's order.
    pub fn keys(&self) -> Vec<&'static str> {
        let own = self.parts().own_keys;
        std::iter::once(TAG)
            .chain(keys::fields::<TaskSettings>().iter().copied())
            .chain(own.iter().copied())
            .collect()
    }

    /// Training prompts per generation.
    pub fn prompts(&self) -> usize {
        self.prompts.unwrap_or(8)
    }
    /// Prompt tokens the program holds.
    pub fn prompt_len(&self) -> usize {
        self.prompt_len.unwrap_or(128)
    }
    /// New tokens per completion.
    pub fn max_new_tokens(&self) -> usize {
        self.max_new_tokens.unwrap_or(64)
    }
    /// Whether prompts go through the chat template.
    pub fn chat(&self) -> bool {
        self.chat.unwrap_or(false)
    }
    /// Sampling temperature (0: greedy).
    pub fn temperature(&self) -> f64 {
        self.temperature.unwrap_or(0.0)
    }
    /// Nucleus mass.
    pub fn top_p(&self) -> f64 {
        self.top_p.unwrap_or(1.0)
    }

    /// Refuses a key of the raw `[task]` table that the named task does not read, and an
    /// unknown name (with the nearest one).
    pub(crate) fn check_table(table: &toml::Table) -> Result<(), ConfigError> {
        let names = task_names();
        let Some(name) = table.get(TAG).and_then(toml::Value::as_str) else {
            return Err(ConfigError::new(
                "task.name is missing",
                format!("set task.name to one of: {}", names.join(", ")),
            ));
        };
        let Some(task) = keys::named::<TaskConfig>(name) else {
            let hint = match nearest(name, names) {
                Some(n) => format!("did you mean \"{n}\"? tasks: {}", names.join(", ")),
                None => format!("tasks: {}", names.join(", ")),
            };
            return Err(ConfigError::new(
                format!("task.name: unknown task \"{name}\""),
                hint,
            ));
        };
        let reads = task.keys();
        let every: Vec<&str> = names
            .iter()
            .filter_map(|n| keys::named::<TaskConfig>(n))
            .flat_map(|t| t.keys())
            .collect();
        for key in table.keys() {
            let k = key.as_str();
            if reads.contains(&k) {
                continue;
            }
            if k == "reward" {
                check_reward_table(&task, &table[k])?;
                continue;
            }
            if every.contains(&k) {
                return Err(ConfigError::new(
                    format!("task.{k} does not apply to task \"{name}\""),
                    format!("remove it; {name} reads: {}", reads.join(", ")),
                ));
            }
            let hint = match nearest(k, &reads) {
                Some(n) => format!("did you mean `{n}`? {name} reads: {}", reads.join(", ")),
                None => format!("{name} reads: {}", reads.join(", ")),
            };
            return Err(ConfigError::new(format!("unknown key `task.{k}`"), hint));
        }
        Ok(())
    }

    /// Range checks of the values.
    pub(crate) fn check(&self) -> Result<(), ConfigError> {
        if let Some(r) = self.reward() {
            r.spec()?;
        }
        for (key, v) in [
            ("task.prompts", self.prompts()),
            ("task.prompt_len", self.prompt_len()),
            ("task.max_new_tokens", self.max_new_tokens()),
        ] {
            if v == 0 || v > MAX_DIM {
                return Err(ConfigError::new(
                    format!("{key} = {v}"),
                    format!("set {key} between 1 and {MAX_DIM}"),
                ));
            }
        }
        let t = self.temperature();
        if !t.is_finite() || t < 0.0 {
            return Err(ConfigError::new(
                format!("task.temperature = {t}"),
                "use 0 for greedy decoding or a positive finite temperature",
            ));
        }
        let p = self.top_p();
        if !(p > 0.0 && p <= 1.0) {
            return Err(ConfigError::new(
                format!("task.top_p = {p}"),
                "use a value in (0, 1]; 1 turns nucleus sampling off",
            ));
        }
        if p < 1.0 && t == 0.0 {
            return Err(ConfigError::new(
                format!("task.top_p = {p} with greedy decoding (task.temperature = 0)"),
                "set task.temperature above 0 to sample, or remove task.top_p",
            ));
        }
        self.own().check()
    }

    /// The files whose contents the trajectory depends on, by key.
    pub fn input_files(&self) -> Vec<(String, PathBuf)> {
        self.own().input_files()
    }
}

/// Every task's section reads as the settings every task reads, so that code that is the
/// same for every task (the decode's sizes, sampling and end ids) does not name the task.
impl Deref for TaskConfig {
    type Target = TaskSettings;
    fn deref(&self) -> &TaskSettings {
        self.parts().settings
    }
}

/// Refuses `[task.reward]` for a task without text completions, a `reward` that is not a
/// table, and keys of it that [`RewardConfig`] does not have (with the nearest one).
fn check_reward_table(task: &TaskConfig, value: &toml::Value) -> Result<(), ConfigError> {
    if !task.text() {
        let text: Vec<&str> = task_names()
            .iter()
            .copied()
            .filter(|n| keys::named::<TaskConfig>(n).is_some_and(|t| t.text()))
            .collect();
        return Err(ConfigError::new(
            format!(
                "[task.reward] does not apply to task \"{}\" (its completions are token ids)",
                task.name()
            ),
            format!(
                "remove [task.reward]; a reward program scores the text tasks: {}",
                text.join(", ")
            ),
        ));
    }
    let Some(t) = value.as_table() else {
        return Err(ConfigError::new(
            "task.reward is not a table",
            "write it as a section: [task.reward] then command = [\"python3\", \"reward.py\"]",
        ));
    };
    if !t.contains_key("command") {
        return Err(ConfigError::new(
            "[task.reward] has no command",
            "set task.reward.command = [\"python3\", \"reward.py\"] (the program and its arguments)",
        ));
    }
    let reads = keys::fields::<RewardConfig>();
    for k in t.keys() {
        if reads.contains(&k.as_str()) {
            continue;
        }
        let hint = match nearest(k, reads) {
            Some(n) => format!(
                "did you mean `{n}`? [task.reward] reads: {}",
                reads.join(", ")
            ),
            None => format!("[task.reward] reads: {}", reads.join(", ")),
        };
        return Err(ConfigError::new(
            format!("unknown key `task.reward.{k}`"),
            hint,
        ));
    }
    Ok(())
}

impl EvalConfig {
    /// Range checks.
    pub(crate) fn check(&self) -> Result<(), ConfigError> {
        if self.prompts == 0 || self.prompts > MAX_DIM {
            return Err(ConfigError::new(
                format!("eval.prompts = {}", self.prompts),
                format!("set eval.prompts between 1 and {MAX_DIM}, or remove [eval]"),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{keys, task_names, TaskConfig};
    use crate::config::Config;

    const BASE: &str = r#"
[problem]
name = "qwen2"
size = "tiny"
[es]
strategy = "mirrored(lowrank(r=1))"
n = 16
sigma = 0.01
lr = 0.01
[run]
generations = 2
"#;

    fn parse_with(problem: &str, extra: &str) -> String {
        let text = format!("{}{extra}", BASE.replace("size = \"tiny\"", problem));
        format!("{}", Config::parse(&text).unwrap_err())
    }

    fn parse(extra: &str) -> Result<Config, String> {
        Config::parse(&format!("{BASE}{extra}")).map_err(|e| format!("{e}"))
    }

    #[test]
    fn a_task_section_parses_with_defaults() {
        let c = parse("[task]\nname = \"target_token\"\ntoken = 3\n[eval]\nevery = 5\n").unwrap();
        let t = c.task.as_ref().unwrap();
        assert_eq!(
            (t.prompts(), t.prompt_len(), t.max_new_tokens()),
            (8, 128, 64)
        );
        assert_eq!(c.eval.as_ref().unwrap().every, 5);
        assert_eq!(c.eval.as_ref().unwrap().prompts, 32);
        let plain =
            Config::parse(&BASE.replace("size = \"tiny\"", "size = \"tiny\"\ndata = \"d.jsonl\""))
                .unwrap();
        assert!(plain.task.is_none() && plain.eval.is_none());
    }

    #[test]
    fn task_errors_name_the_key() {
        let cases = [
            (
                "[task]\nname = \"countdwn\"\n",
                "did you mean \"countdown\"",
            ),
            ("[task]\nprompts = 2\n", "task.name is missing"),
            (
                "[task]\nname = \"countdown\"\ntoken = 3\n",
                "task.token does not apply",
            ),
            (
                "[task]\nname = \"countdown\"\nmax_new = 3\n",
                "max_new_tokens",
            ),
            (
                "[task]\nname = \"countdown\"\nprompts = 0\n",
                "task.prompts = 0",
            ),
            (
                "[task]\nname = \"countdown\"\ntemperature = -1.0\n",
                "task.temperature",
            ),
            (
                "[task]\nname = \"countdown\"\ntop_p = 0.9\n",
                "greedy decoding",
            ),
            (
                "[task]\nname = \"countdown\"\nstyle = \"terse\"\n",
                "task.style",
            ),
            ("[task]\nname = \"jsonl\"\n", "needs task.train"),
            ("[task]\nname = \"target_token\"\n", "needs task.token"),
            ("[eval]\nevery = 2\n", "[eval] without a [task]"),
            (
                "[task]\nname = \"target_token\"\ntoken = 1\n[eval]\nprompts = 0\n",
                "eval.prompts = 0",
            ),
            (
                "[task]\nname = \"target_token\"\ntoken = 1\n[eval]\nevry = 2\n",
                "did you mean `every`",
            ),
            (
                "[task]\nname = \"countdown\"\n[task.reward]\ncommand = [\"x\"]\ntimeout = 3\n",
                "unknown key `task.reward.timeout`",
            ),
            (
                "[task]\nname = \"countdown\"\n[task.reward]\ncommand = [\"x\"]\nrestart = 3\n",
                "did you mean `restarts`",
            ),
            (
                "[task]\nname = \"countdown\"\n[task.reward]\ntimeout_s = 3\n",
                "[task.reward] has no command",
            ),
            (
                "[task]\nname = \"countdown\"\n[task.reward]\ncommand = []\n",
                "task.reward.command is empty",
            ),
            (
                "[task]\nname = \"countdown\"\n[task.reward]\ncommand = [\"x\"]\ntimeout_s = 0\n",
                "task.reward.timeout_s = 0",
            ),
            (
                "[task]\nname = \"countdown\"\nreward = 3\n",
                "task.reward is not a table",
            ),
            (
                "[task]\nname = \"target_token\"\ntoken = 1\n[task.reward]\ncommand = [\"x\"]\n",
                "does not apply to task \"target_token\"",
            ),
        ];
        for (extra, want) in cases {
            let e = parse(extra).unwrap_err();
            assert!(e.contains(want), "{extra:?}: {e}");
        }
    }

    /// Each task documents each of its own keys for `shardes init` once, and nothing else
    /// (a renamed key leaves no stale comment behind).
    #[test]
    fn every_own_key_has_one_doc() {
        for name in task_names() {
            let task = keys::named::<TaskConfig>(name).unwrap();
            let mut documented: Vec<&str> = task.own().docs().iter().map(|d| d.key).collect();
            documented.sort_unstable();
            let mut own = task.parts().own_keys.to_vec();
            own.sort_unstable();
            assert_eq!(documented, own, "{name}: its own_keys! struct");
        }
    }

    #[test]
    fn a_reward_table_parses() {
        let c = parse(
            "[task]\nname = \"countdown\"\n[task.reward]\ncommand = [\"python3\", \"r.py\"]\n\
             timeout_s = 0.5\nrestarts = 1\n",
        )
        .unwrap();
        let spec = c.task.unwrap().reward().unwrap().spec().unwrap();
        assert_eq!(spec.command, ["python3", "r.py"]);
        assert_eq!(spec.timeout, std::time::Duration::from_millis(500));
        assert_eq!(spec.restarts, 1);
    }

    #[test]
    fn a_task_needs_a_qwen2_problem_without_teacher_forced_data() {
        let block = BASE.replace("\"qwen2\"\nsize = \"tiny\"", "\"transformer_block\"");
        let e = Config::parse(&format!("{block}[task]\nname = \"countdown\"\n")).unwrap_err();
        assert!(
            format!("{e}").contains("use [problem] name = \"qwen2\""),
            "{e}"
        );
        let e = parse_with("size = \"tiny\"\nseq = 8", "[task]\nname = \"countdown\"\n");
        assert!(e.contains("problem.seq with a [task]"), "{e}");
    }
}
