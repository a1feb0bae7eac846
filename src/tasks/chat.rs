//! Chat templates: wrap a prompt the way an Instruct checkpoint was trained to see it.
//!
//! The template is the checkpoint's own Jinja text, from `tokenizer_config.json`'s
//! `chat_template` key (a string, or a list of `{"name", "template"}` entries of which
//! `default` is used unless another name is asked for), or from a `chat_template.jinja`
//! file beside it (how newer checkpoints ship it). It is rendered with MiniJinja set up
//! the way Hugging Face `transformers` sets up Jinja2 for `apply_chat_template`:
//! `trim_blocks` and `lstrip_blocks` on, loop controls (`break`/`continue`), Python string
//! and dict methods (`.strip()`, `.startswith()`, `.items()`, ..., from
//! `minijinja-contrib`'s `pycompat`), a `raise_exception(message)` function, a `tojson`
//! filter that writes like Python's `json.dumps` (`", "` and `": "` separators,
//! non-ASCII kept), and the special tokens (`bos_token`, `eos_token`, `unk_token`,
//! `pad_token`, when the config names them) as variables. `strftime_now` is not
//! provided, so templates that test for it (Llama 3.x) use their fixed fallback date and
//! the rendering stays deterministic.
//!
//! [`ChatTemplate::render`] renders `[{"role": "user", "content": prompt}]`, after an
//! optional system message, with `add_generation_prompt = true`. The text already holds
//! the template's special tokens (a `bos_token` the template writes, say), so encode it
//! without adding special tokens again.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use minijinja::syntax::SyntaxConfig;
use minijinja::value::{Kwargs, Serde, Value};
use minijinja::{Environment, Error as JinjaError, ErrorKind};
use serde::Serialize;

use super::TaskError;

const TEMPLATE_NAME: &str = "chat_template";

/// One chat message.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Message {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// The text.
    pub content: String,
}

impl Message {
    /// A message with `role` and `content`.
    pub fn new(role: &str, content: &str) -> Message {
        Message {
            role: role.to_string(),
            content: content.to_string(),
        }
    }
}

/// The special-token strings a template may use (`None`: not defined for the template).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SpecialTokens {
    /// `bos_token`.
    pub bos: Option<String>,
    /// `eos_token`.
    pub eos: Option<String>,
    /// `unk_token`.
    pub unk: Option<String>,
    /// `pad_token`.
    pub pad: Option<String>,
}

/// A compiled chat template with its special tokens.
pub struct ChatTemplate {
    env: Environment<'static>,
    tokens: SpecialTokens,
    origin: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("origin", &self.origin)
            .field("tokens", &self.tokens)
            .finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// The template of the checkpoint directory `dir` (its `tokenizer_config.json`, or
    /// `chat_template.jinja` when the config has none).
    pub fn from_checkpoint(dir: &Path) -> Result<ChatTemplate, TaskError> {
        ChatTemplate::from_tokenizer_config(&dir.join("tokenizer_config.json"))
    }

    /// The `default` template of a `tokenizer_config.json` (or of `chat_template.jinja` in
    /// the same directory when the config has no `chat_template`).
    pub fn from_tokenizer_config(path: &Path) -> Result<ChatTemplate, TaskError> {
        ChatTemplate::from_tokenizer_config_named(path, None)
    }

    /// Like [`ChatTemplate::from_tokenizer_config`], choosing the template `name` when the
    /// config lists several (`None`: `default`; a single string template has no name and
    /// is used whatever `name` says).
    pub fn from_tokenizer_config_named(
        path: &Path,
        name: Option<&str>,
    ) -> Result<ChatTemplate, TaskError> {
        let text = std::fs::read_to_string(path).map_err(|source| TaskError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let config: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| TaskError::TokenizerConfig {
                path: path.to_path_buf(),
                reason: format!("invalid JSON ({e})"),
            })?;
        let bad = |reason: String| TaskError::TokenizerConfig {
            path: path.to_path_buf(),
            reason,
        };
        let tokens = SpecialTokens {
            bos: token(&config, "bos_token").map_err(&bad)?,
            eos: token(&config, "eos_token").map_err(&bad)?,
            unk: token(&config, "unk_token").map_err(&bad)?,
            pad: token(&config, "pad_token").map_err(&bad)?,
        };
        let (source, origin) = match config.get("chat_template") {
            None | Some(serde_json::Value::Null) => {
                let jinja = sibling(path, "chat_template.jinja");
                match std::fs::read_to_string(&jinja) {
                    Ok(s) => (s, jinja.display().to_string()),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                        return Err(TaskError::NoChatTemplate {
                            path: path.to_path_buf(),
                        })
                    }
                    Err(source) => {
                        return Err(TaskError::Read {
                            path: jinja,
                            source,
                        })
                    }
                }
            }
            Some(serde_json::Value::String(s)) => (s.clone(), path.display().to_string()),
            Some(serde_json::Value::Array(list)) => {
                let want = name.unwrap_or("default");
                let mut names = Vec::new();
                let mut found = None;
                for entry in list {
                    let n = entry.get("name").and_then(|v| v.as_str());
                    let t = entry.get("template").and_then(|v| v.as_str());
                    let (Some(n), Some(t)) = (n, t) else {
                        return Err(bad(
                            "a `chat_template` list entry lacks a string `name` or `template`"
                                .into(),
                        ));
                    };
                    names.push(n.to_string());
                    if n == want && found.is_none() {
                        found = Some(t.to_string());
                    }
                }
                let Some(t) = found else {
                    return Err(bad(format!(
                        "no chat template named `{want}` (the file has {names:?}); ask for \
                         one of those"
                    )));
                };
                (t, format!("{} ({want})", path.display()))
            }
            Some(_) => {
                return Err(bad(
                    "`chat_template` is neither a string nor a list of named templates".into(),
                ))
            }
        };
        ChatTemplate::compile(source, tokens, origin)
    }

    /// A template from its Jinja `source` and the special tokens it may use.
    pub fn new(source: &str, tokens: SpecialTokens) -> Result<ChatTemplate, TaskError> {
        ChatTemplate::compile(source.to_string(), tokens, "the given source".into())
    }

    fn compile(
        source: String,
        tokens: SpecialTokens,
        origin: String,
    ) -> Result<ChatTemplate, TaskError> {
        let template_error = |e: JinjaError| TaskError::Template {
            origin: origin.clone(),
            message: describe(&e),
        };
        let mut env = Environment::new();
        let syntax = SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(template_error)?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_filter("tojson", tojson);
        env.add_template_owned(TEMPLATE_NAME, source)
            .map_err(template_error)?;
        Ok(ChatTemplate {
            env,
            tokens,
            origin,
        })
    }

    /// The special tokens the template sees.
    pub fn special_tokens(&self) -> &SpecialTokens {
        &self.tokens
    }

    /// `prompt` as the user's turn, after `system` when given, ready for the assistant's
    /// reply (`add_generation_prompt = true`).
    pub fn render(&self, prompt: &str, system: Option<&str>) -> Result<String, TaskError> {
        let mut messages = Vec::with_capacity(2);
        if let Some(s) = system {
            messages.push(Message::new("system", s));
        }
        messages.push(Message::new("user", prompt));
        self.render_messages(&messages, true)
    }

    /// Renders a conversation.
    pub fn render_messages(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<String, TaskError> {
        let fail = |e: JinjaError| TaskError::Template {
            origin: self.origin.clone(),
            message: describe(&e),
        };
        let mut ctx: BTreeMap<&str, Value> = BTreeMap::new();
        ctx.insert("messages", Value::from(Serde(messages)));
        ctx.insert("add_generation_prompt", Value::from(add_generation_prompt));
        let t = &self.tokens;
        for (k, v) in [
            ("bos_token", &t.bos),
            ("eos_token", &t.eos),
            ("unk_token", &t.unk),
            ("pad_token", &t.pad),
        ] {
            if let Some(v) = v {
                ctx.insert(k, Value::from(v.as_str()));
            }
        }
        let template = self.env.get_template(TEMPLATE_NAME).map_err(fail)?;
        template.render(Value::from(Serde(ctx))).map_err(fail)
    }
}

/// `dir/name` for the directory holding `path`.
fn sibling(path: &Path, name: &str) -> PathBuf {
    match path.parent() {
        Some(dir) => dir.join(name),
        None => PathBuf::from(name),
    }
}

/// A special token of the config: a string, an `AddedToken` object (`{"content": ...}`),
/// or absent / null.
fn token(config: &serde_json::Value, key: &str) -> Result<Option<String>, String> {
    match config.get(key) {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::String(s)) => Ok(Some(s.clone())),
        Some(serde_json::Value::Object(o)) => match o.get("content") {
            Some(serde_json::Value::String(s)) => Ok(Some(s.clone())),
            _ => Err(format!("`{key}` is an object without a string `content`")),
        },
        Some(_) => Err(format!("`{key}` is neither a string nor a token object")),
    }
}

/// The engine's message with its causes.
fn describe(e: &JinjaError) -> String {
    let mut s = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(cause) = src {
        s.push_str(": ");
        s.push_str(&cause.to_string());
        src = cause.source();
    }
    s
}

/// `raise_exception(message)`: the template refuses the conversation.
fn raise_exception(message: String) -> Result<Value, JinjaError> {
    Err(JinjaError::new(ErrorKind::InvalidOperation, message))
}

/// Python's `json.dumps(value, ensure_ascii=False, indent=indent)`, as `transformers`'
/// `tojson` filter writes it (keys in the order the value holds them).
fn tojson(value: &Value, indent: Option<Value>, kwargs: Kwargs) -> Result<String, JinjaError> {
    let indent = match indent {
        Some(v) => Some(v),
        None => kwargs.get::<Option<Value>>("indent")?,
    };
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => Some(usize::try_from(v)?),
    };
    let ensure_ascii = kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false);
    // Accepted for compatibility; keys are written in the order the value holds them.
    let _ = kwargs.get::<Option<bool>>("sort_keys")?;
    kwargs.assert_all_used()?;
    let json = serde_json::to_value(value)
        .map_err(|e| JinjaError::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    let mut out = String::new();
    write_py_json(&mut out, &json, indent, 0, ensure_ascii);
    Ok(out)
}

fn write_py_json(
    out: &mut String,
    v: &serde_json::Value,
    indent: Option<usize>,
    level: usize,
    ensure_ascii: bool,
) {
    use serde_json::Value as J;
    let newline = |out: &mut String, level: usize| {
        if let Some(n) = indent {
            out.push('\n');
            out.push_str(&" ".repeat(n * level));
        }
    };
    // Python: ", " between items without indent, "," with indent (then a newline).
    let sep = if indent.is_some() { "," } else { ", " };
    match v {
        J::Null => out.push_str("null"),
        J::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        J::Number(n) => out.push_str(&n.to_string()),
        J::String(s) => write_py_string(out, s, ensure_ascii),
        J::Array(items) if items.is_empty() => out.push_str("[]"),
        J::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(sep);
                }
                newline(out, level + 1);
                write_py_json(out, item, indent, level + 1, ensure_ascii);
            }
            newline(out, level);
            out.push(']');
        }
        J::Object(map) if map.is_empty() => out.push_str("{}"),
        J::Object(map) => {
            out.push('{');
            for (i, (k, item)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(sep);
                }
                newline(out, level + 1);
                write_py_string(out, k, ensure_ascii);
                out.push_str(": ");
                write_py_json(out, item, indent, level + 1, ensure_ascii);
            }
            newline(out, level);
            out.push('}');
        }
    }
}

/// A JSON string as Python writes it: `\"`, `\\`, `\n`, `\r`, `\t`, `\b`, `\f`, other
/// control characters as `\u00XX`, and (with `ensure_ascii`) non-ASCII as `\uXXXX`
/// (surrogate pairs beyond the BMP).
fn write_py_string(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (ensure_ascii && !c.is_ascii()) => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(src: &str) -> String {
        let t = ChatTemplate::new(src, SpecialTokens::default()).unwrap();
        t.render("hi", None).unwrap()
    }

    #[test]
    fn tojson_writes_like_python() {
        assert_eq!(
            render(r#"{{ {"a": [1, "x\n"], "b": none} | tojson }}"#),
            r#"{"a": [1, "x\n"], "b": null}"#
        );
        assert_eq!(
            render(r#"{{ [1, {"k": "é"}] | tojson(indent=2) }}"#),
            "[\n  1,\n  {\n    \"k\": \"é\"\n  }\n]"
        );
        assert_eq!(
            render(r#"{{ "é😀" | tojson(ensure_ascii=true) }}"#),
            r#""\u00e9\ud83d\ude00""#
        );
    }

    #[test]
    fn python_methods_and_loop_controls() {
        assert_eq!(
            render("{{ '  x  '.strip() }}|{{ 'abc'.startswith('a') }}"),
            "x|True"
        );
        assert_eq!(
            render(
                "{% for i in [1, 2, 3] %}{% if i == 2 %}{% break %}{% endif %}{{ i }}{% endfor %}"
            ),
            "1"
        );
    }
}
