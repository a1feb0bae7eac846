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
    response_prefix: Option<String>,
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
            response_prefix: None,
        }
    }

    /// Starts every reply with `prefix`: it is appended to each text prompt (after the
    /// chat template) and put before each completion's text, so a reward reads the reply
    /// whole. Prompts given as ids are left as they are.
    pub fn with_response_prefix(mut self, prefix: Option<String>) -> TextCodec {
        self.response_prefix = prefix.filter(|p| !p.is_empty());
        self
    }

    /// The text prompt the tokenizer sees: rendered through the chat template (if any),
    /// then the reply's prefix.
    fn text_of(&self, text: &str) -> Result<String, Error> {
        let mut out = match &self.chat {
            Some(chat) => chat.render(text, self.system.as_deref())?,
            None => text.to_string(),
        };
        if let Some(p) = &self.response_prefix {
            out.push_str(p);
        }
        Ok(out)
    }

    /// Whether the codec has a tokenizer.
    pub fn has_tokenizer(&self) -> bool {
        self.tokenizer.is_some()
    }

    /// The text the model sees for `prompt` (after the chat template), for display.
    pub fn rendered(&self, prompt: &Prompt) -> Result<String, Error> {
        match prompt {
            Prompt::Text(t) => self.text_of(t),
            p => Ok(p.display()),
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
                let full = self.text_of(text)?;
                let ids = match &self.chat {
                    Some(_) => tok.encode(&full, false),
                    None => tok.encode(&full, true),
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
                let text = match &self.response_prefix {
                    Some(p) => format!("{p}{text}"),
                    None => text,
                };
                // One text per id list, in order.
                if let Some(ids) = all.next() {
                    out.push(Completion { ids, text });
                }
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokenizer() -> Tokenizer {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/qwen2_tiny/tokenizer.json"
        );
        Tokenizer::from_file(path).expect("fixture tokenizer")
    }

    #[test]
    fn a_response_prefix_ends_the_prompt_and_starts_every_rewarded_text() {
        let plain = TextCodec::new(Some(tokenizer()), None, None);
        let prefixed = TextCodec::new(Some(tokenizer()), None, None)
            .with_response_prefix(Some(" noise".into()));
        let prompt = Prompt::Text("low rank".into());
        let tok = tokenizer();
        assert_eq!(
            prefixed.encode(&prompt).unwrap(),
            tok.encode("low rank noise", true).unwrap()
        );
        assert_eq!(prefixed.rendered(&prompt).unwrap(), "low rank noise");
        assert_eq!(plain.rendered(&prompt).unwrap(), "low rank");
        let ids = tok.encode(" is never", false).unwrap();
        let c = prefixed.completions(vec![ids.clone()]).unwrap();
        assert_eq!(c[0].ids, ids, "the ids stay the generated ones");
        assert_eq!(
            c[0].text,
            format!(" noise{}", plain.completions(vec![ids]).unwrap()[0].text)
        );
        // Ids prompts are left alone; an empty prefix is no prefix.
        assert_eq!(
            prefixed.encode(&Prompt::Ids(vec![3, 4])).unwrap(),
            vec![3, 4]
        );
        let empty =
            TextCodec::new(Some(tokenizer()), None, None).with_response_prefix(Some(String::new()));
        assert_eq!(empty.rendered(&prompt).unwrap(), "low rank");
    }
}
