//! From `[task]` to the library's task and text codec (shared by `shardes run` and
//! `shardes generate`).

use std::path::{Path, PathBuf};

use anyhow::Result;
use shardes::finetune::{RewardTask, TextCodec, TextTask};
use shardes::tasks::command::RewardCommand;
use shardes::tasks::{Task, TaskError};
use shardes::tokenizer::Tokenizer;
use shardes::Qwen2Weights;

use crate::config::{Config, ConfigError, ProblemConfig, TaskConfig};

/// A task error as a config error naming the `[task]` key to change.
pub fn task_error(e: TaskError) -> ConfigError {
    let hint = match &e {
        TaskError::Config(_) => "change that [task] key".to_string(),
        TaskError::NoChatTemplate { .. } => {
            "set task.chat = false, or point problem.checkpoint at an Instruct model".into()
        }
        TaskError::MalformedLine { .. } | TaskError::EmptyTaskFile { .. } => {
            "fix the file named above (task.train or task.held_out)".into()
        }
        TaskError::Read { .. } => "check task.train / task.held_out".into(),
        TaskError::Command(_) => "fix task.reward.command (see above)".into(),
        _ => "check the [task] section".into(),
    };
    ConfigError::new(format!("task: {e}"), hint)
}

/// The reward program of `[task.reward]`, checked (it exists and is executable) but not
/// started: it starts at the first batch it scores.
fn reward_command(t: &TaskConfig) -> Result<Option<RewardCommand>> {
    let Some(r) = t.reward() else {
        return Ok(None);
    };
    let command = RewardCommand::new(r.spec()?).map_err(|e| {
        ConfigError::new(
            format!("{e}"),
            "set task.reward.command to an executable program and its arguments, e.g. \
             [\"python3\", \"examples/reward.py\"]",
        )
    })?;
    Ok(Some(command))
}

/// `task` as a reward task, rewarded by `command` when there is one (else by its own
/// reward).
pub fn text_task<T: Task + 'static>(
    task: T,
    command: Option<RewardCommand>,
) -> Box<dyn RewardTask> {
    match command {
        Some(c) => Box::new(TextTask::with_command(task, c)),
        None => Box::new(TextTask::new(task)),
    }
}

/// The task of `t`; `vocab` is the model's vocabulary (for `target_token`). How a task is
/// built is the task's own (its module under `config/task/`); here only what is the same
/// for every task: the reward program.
pub fn task(t: &TaskConfig, vocab: usize) -> Result<Box<dyn RewardTask>> {
    let command = reward_command(t)?;
    Ok(t.own().build(vocab, command)?)
}

/// The model path (a Hugging Face directory or a GGUF file, a named model resolved) and
/// the tokenizer file a `qwen2` problem names.
fn qwen2_files(problem: &ProblemConfig) -> Result<(Option<PathBuf>, Option<PathBuf>)> {
    match problem {
        ProblemConfig::Qwen2 { tokenizer, .. } => {
            let model = match crate::setup::weights(problem)? {
                Qwen2Weights::Checkpoint(p) => Some(p),
                Qwen2Weights::Random(_) => None,
            };
            Ok((model, tokenizer.clone()))
        }
        _ => Ok((None, None)),
    }
}

/// The codec of `config`: the problem's tokenizer (when it has one) and, with
/// `task.chat`, the checkpoint's chat template.
pub fn codec(config: &Config, t: &TaskConfig) -> Result<TextCodec> {
    let (checkpoint, tok) = qwen2_files(&config.problem)?;
    let tokenizer = match (&tok, &checkpoint) {
        (Some(p), _) => Some(Tokenizer::from_file(p).map_err(|e| {
            ConfigError::new(
                format!("problem.tokenizer: {e}"),
                "point problem.tokenizer (or the checkpoint) at a Hugging Face tokenizer.json",
            )
        })?),
        (None, Some(model)) => shardes::pretrained::tokenizer(model).map_err(|e| {
            ConfigError::new(
                format!("problem.checkpoint: the model's tokenizer: {e}"),
                "set problem.tokenizer to a Hugging Face tokenizer.json",
            )
        })?,
        (None, None) => None,
    };
    if t.text() && tokenizer.is_none() {
        return Err(ConfigError::new(
            format!(
                "task \"{}\" has text prompts but the problem has no tokenizer",
                t.name()
            ),
            "set problem.tokenizer, or use a checkpoint directory with a tokenizer.json",
        )
        .into());
    }
    let chat = if t.chat() {
        let model: &Path = checkpoint.as_deref().ok_or_else(|| {
            ConfigError::new(
                "task.chat = true needs a pretrained model (problem.model or \
                 problem.checkpoint: the chat template comes with it)",
                "point problem.model or problem.checkpoint at an Instruct model, or set \
                 task.chat = false",
            )
        })?;
        if !shardes::pretrained::has_chat_template(model) {
            return Err(ConfigError::new(
                format!(
                    "task.chat = true: {} has no chat template (no tokenizer_config.json, or \
                     no tokenizer.chat_template in the GGUF file)",
                    model.display()
                ),
                "set task.chat = false, or point the problem at an Instruct model with its \
                 chat template",
            )
            .into());
        }
        Some(shardes::pretrained::chat_template(model).map_err(|e| {
            ConfigError::new(
                format!("the chat template of {}: {e}", model.display()),
                "use the model's own chat template, or set task.chat = false",
            )
        })?)
    } else {
        None
    };
    Ok(TextCodec::new(tokenizer, chat, t.system.clone())
        .with_response_prefix(t.response_prefix.clone()))
}
