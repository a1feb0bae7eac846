//! Prompts to ids and ids to text: the chat template, the tokenizer, and parallel
//! detokenization of a population's completions.

use crate::tasks::chat::ChatTemplate;
use crate::tokenizer::Tokenizer;
use crate::Error;

use super::task::{join_ids, Completion, Prompt};

/// Turns prompts into ids and generated ids into [`Completion`]s.
pub struct TextCodec {
    tokenizer: Option<Tokenizer>,
    chat: Option<ChatTemplate>,
    system: Option<String>,
}

impl TextCodec {
    /// A codec; text prompts need a `tokenizer`; with `chat`, text prompts are rendered
    /// as the user's turn (after `system`) before tokenizing.
    pub fn new(
        tokenizer: Option<Tokenizer>,
        chat: Option<ChatTemplate>,
        system: Option<String>,
    ) -> TextCodec {
        TextCodec {
            tokenizer,
            chat,
            system,
        }
    }

    /// Whether the codec has a tokenizer.
    pub fn has_tokenizer(&self) -> bool {
        self.tokenizer.is_some()
    }

    /// The text the model sees for `prompt` (after the chat template), for display.
    pub fn rendered(&self, prompt: &Prompt) -> Result<String, Error> {
        match (prompt, &self.chat) {
            (Prompt::Text(t), Some(chat)) => Ok(chat.render(t, self.system.as_deref())?),
            (p, _) => Ok(p.display()),
        }
    }

    /// The ids of `prompt`. A rendered chat prompt is tokenized without adding special
    /// tokens (the template wrote them), a plain one with them, as `transformers` does.
    pub fn encode(&self, prompt: &Prompt) -> Result<Vec<u32>, Error> {
        match prompt {
            Prompt::Ids(ids) => Ok(ids.clone()),
            Prompt::Text(text) => {
                let tok = self.tokenizer.as_ref().ok_or_else(|| {
                    Error::Invalid(
                        "a text prompt needs a tokenizer: give problem.tokenizer or a \
                         checkpoint with a tokenizer.json"
                            .into(),
                    )
                })?;
                let ids = match &self.chat {
                    Some(chat) => tok.encode(&chat.render(text, self.system.as_deref())?, false),
                    None => tok.encode(text, true),
                };
                ids.map_err(|e| Error::Invalid(e.to_string()))
            }
        }
    }

    /// The completions of `ids` (each already cut at its length), detokenized on all host
    /// cores.
    pub fn completions(&self, ids: Vec<Vec<u32>>) -> Result<Vec<Completion>, Error> {
        let Some(tok) = &self.tokenizer else {
            return Ok(ids
                .into_iter()
                .map(|ids| Completion {
                    text: join_ids(&ids),
                    ids,
                })
                .collect());
        };
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let per = ids.len().div_ceil(threads).max(1);
        let texts: Vec<Result<Vec<String>, Error>> = std::thread::scope(|s| {
            let handles: Vec<_> = ids
                .chunks(per)
                .map(|chunk| {
                    s.spawn(move || {
                        chunk
                            .iter()
                            .map(|c| {
                                tok.decode(c, true)
                                    .map_err(|e| Error::Invalid(e.to_string()))
                            })
                            .collect::<Result<Vec<String>, Error>>()
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(Error::Invalid("detokenizing panicked".into())))
                })
                .collect()
        });
        let mut out = Vec::with_capacity(ids.len());
        let mut all = ids.into_iter();
        for chunk in texts {
            for text in chunk? {
                // One text per id list, in order.
                if let Some(ids) = all.next() {
                    out.push(Completion { ids, text });
                }
            }
        }
        Ok(out)
    }
}
