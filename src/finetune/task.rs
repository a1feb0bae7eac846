//! A task as the reward loop sees it: prompts (text or token ids) and a scorer of
//! completions, object safe so a run can hold any task behind one type.

use std::sync::Arc;

use crate::tasks::command::{RewardCommand, RewardRequest};
use crate::tasks::target_token::TargetToken;
use crate::tasks::{score_batch, Scores, Task, TaskError, TaskItem};

/// One decoded completion: its token ids (generated part only, EOS and padding removed)
/// and their text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Completion {
    /// Generated ids.
    pub ids: Vec<u32>,
    /// Their text (detokenized without special tokens; ids joined by spaces when the run
    /// has no tokenizer).
    pub text: String,
}

/// A prompt: text to render and tokenize, or ids used as they are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Prompt {
    /// Text (wrapped with the chat template when the run asks for it, then tokenized).
    Text(String),
    /// Token ids, fed to the model unchanged.
    Ids(Vec<u32>),
}

impl Prompt {
    /// The prompt for logs and samples.
    pub fn display(&self) -> String {
        match self {
            Prompt::Text(t) => t.clone(),
            Prompt::Ids(ids) => join_ids(ids),
        }
    }
}

/// Ids as text when there is no tokenizer: `"5 17 3"`.
pub fn join_ids(ids: &[u32]) -> String {
    ids.iter().map(u32::to_string).collect::<Vec<_>>().join(" ")
}

/// Scores `[members × prompts]` completions; the first member's global index, `None` for
/// completions of the unperturbed parameters.
type Scorer = dyn Fn(&[Completion], Option<usize>) -> Result<Scores, TaskError> + Send + Sync;

/// The prompts of one generation (or of the held-out set) and how to score their
/// completions.
pub struct PromptBatch {
    /// The prompts, in order.
    pub prompts: Vec<Prompt>,
    scorer: Arc<Scorer>,
}

impl PromptBatch {
    /// A batch from prompts and a scorer of `[members × prompts]` completions (row-major).
    pub fn new(
        prompts: Vec<Prompt>,
        scorer: impl Fn(&[Completion]) -> Result<Scores, TaskError> + Send + Sync + 'static,
    ) -> PromptBatch {
        PromptBatch::with_members(prompts, move |c: &[Completion], _: Option<usize>| scorer(c))
    }

    /// A batch whose scorer also takes the global index of the completions' first member
    /// (`None` for the unperturbed parameters), for rewards that report it (a reward
    /// program's `member`).
    pub fn with_members(
        prompts: Vec<Prompt>,
        scorer: impl Fn(&[Completion], Option<usize>) -> Result<Scores, TaskError>
            + Send
            + Sync
            + 'static,
    ) -> PromptBatch {
        PromptBatch {
            prompts,
            scorer: Arc::new(scorer),
        }
    }

    /// Scores completions laid out `[members, prompts]` row-major: completion `j` answers
    /// prompt `j % prompts.len()` for member `j / prompts.len()`. Failing rewards are
    /// contained ([`crate::tasks::Scores`]).
    pub fn score(&self, completions: &[Completion]) -> Result<Scores, TaskError> {
        self.score_from(completions, 0)
    }

    /// [`PromptBatch::score`] for members numbered from `first` (this process's share of a
    /// population across processes).
    pub fn score_from(
        &self,
        completions: &[Completion],
        first: usize,
    ) -> Result<Scores, TaskError> {
        (self.scorer)(completions, Some(first))
    }

    /// Scores completions of the unperturbed parameters, one per prompt (a held-out
    /// evaluation): no member.
    pub fn score_plain(&self, completions: &[Completion]) -> Result<Scores, TaskError> {
        (self.scorer)(completions, None)
    }
}

/// A source of prompts with their reward, deterministic in `(seed, generation, count)`.
pub trait RewardTask: Send + Sync {
    /// The task's name for logs.
    fn name(&self) -> &str;
    /// `count` training prompts of `generation` in a run with `seed`.
    fn train(&self, seed: u64, generation: u32, count: usize) -> Result<PromptBatch, TaskError>;
    /// The first `count` held-out prompts (the same for every run).
    fn held_out(&self, count: usize) -> Result<PromptBatch, TaskError>;
}

/// A text [`Task`] (countdown, jsonl, or a user's own) as a [`RewardTask`], rewarded by
/// the task's own reward or by a reward program ([`TextTask::with_command`]).
pub struct TextTask<T: Task> {
    task: Arc<T>,
    command: Option<Arc<RewardCommand>>,
}

impl<T: Task + 'static> TextTask<T> {
    /// Wraps `task`, rewarded by [`Task::reward`].
    pub fn new(task: T) -> TextTask<T> {
        TextTask {
            task: Arc::new(task),
            command: None,
        }
    }

    /// Wraps `task`, rewarded by the program `command` instead of [`Task::reward`].
    pub fn with_command(task: T, command: RewardCommand) -> TextTask<T> {
        TextTask {
            task: Arc::new(task),
            command: Some(Arc::new(command)),
        }
    }

    /// The task.
    pub fn task(&self) -> &T {
        &self.task
    }

    /// The reward program, when the task has one.
    pub fn command(&self) -> Option<&RewardCommand> {
        self.command.as_deref()
    }

    fn batch(&self, items: Vec<T::Item>) -> PromptBatch {
        let prompts = items
            .iter()
            .map(|i| Prompt::Text(i.prompt().to_string()))
            .collect();
        let task = Arc::clone(&self.task);
        match &self.command {
            None => PromptBatch::new(prompts, move |c: &[Completion]| {
                let texts: Vec<&str> = c.iter().map(|c| c.text.as_str()).collect();
                score_batch(task.reward(), &items, &texts)
            }),
            Some(command) => {
                let command = Arc::clone(command);
                // Each item's fields once per batch, not once per member.
                let fields: Vec<serde_json::Value> = items.iter().map(TaskItem::fields).collect();
                PromptBatch::with_members(prompts, move |c: &[Completion], first| {
                    if items.is_empty() || !c.len().is_multiple_of(items.len()) {
                        return Err(TaskError::Pairing {
                            completions: c.len(),
                            items: items.len(),
                        });
                    }
                    let b = items.len();
                    let requests: Vec<RewardRequest<'_>> = c
                        .iter()
                        .enumerate()
                        .map(|(j, c)| RewardRequest {
                            member: first.map(|f| f + j / b),
                            prompt_index: j % b,
                            prompt: items[j % b].prompt(),
                            completion: &c.text,
                            item: &fields[j % b],
                        })
                        .collect();
                    Ok(command.score(&requests)?)
                })
            }
        }
    }
}

impl<T: Task + 'static> RewardTask for TextTask<T> {
    fn name(&self) -> &str {
        self.task.name()
    }

    fn train(&self, seed: u64, generation: u32, count: usize) -> Result<PromptBatch, TaskError> {
        Ok(self.batch(self.task.train(seed, generation, count)?))
    }

    fn held_out(&self, count: usize) -> Result<PromptBatch, TaskError> {
        Ok(self.batch(self.task.held_out(count)?))
    }
}

impl TargetToken {
    fn batch(&self, prompts: Vec<Vec<u32>>) -> PromptBatch {
        let token = self.config().token;
        let count = prompts.len();
        PromptBatch::new(
            prompts.into_iter().map(Prompt::Ids).collect(),
            move |c: &[Completion]| {
                if count == 0 || !c.len().is_multiple_of(count) {
                    return Err(TaskError::Pairing {
                        completions: c.len(),
                        items: count,
                    });
                }
                Ok(Scores {
                    rewards: c
                        .iter()
                        .map(|c| crate::tasks::target_token::reward(token, &c.ids))
                        .collect(),
                    contained: Vec::new(),
                    floor: None,
                })
            },
        )
    }
}

impl RewardTask for TargetToken {
    fn name(&self) -> &str {
        "target_token"
    }

    fn train(&self, seed: u64, generation: u32, count: usize) -> Result<PromptBatch, TaskError> {
        Ok(self.batch(TargetToken::train(self, seed, generation, count)?))
    }

    fn held_out(&self, count: usize) -> Result<PromptBatch, TaskError> {
        Ok(self.batch(TargetToken::held_out(self, count)?))
    }
}
