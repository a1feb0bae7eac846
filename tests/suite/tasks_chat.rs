//! Chat templates: Qwen2.5-Instruct's real template (fixture
//! `tests/fixtures/chat/tokenizer_config.json`) renders exactly as `transformers`'
//! `apply_chat_template(..., add_generation_prompt=True)` does; named template lists,
//! `chat_template.jinja`, special tokens, and the errors.
//!
//! Tolerances: none; rendered strings are compared exactly.

use std::path::{Path, PathBuf};

use shardes::tasks::chat::{ChatTemplate, Message, SpecialTokens};
use shardes::tasks::TaskError;

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/chat")
}

fn scratch(name: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("shardes-tasks-chat-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

const QWEN_SYSTEM: &str = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";

#[test]
fn qwen25_instruct_renders_exactly() {
    let t = ChatTemplate::from_checkpoint(&fixture()).unwrap();
    let prompt = "Using the numbers [44, 19, 35], create an equation that equals 98.";
    assert_eq!(
        t.render(prompt, None).unwrap(),
        format!(
            "<|im_start|>system\n{QWEN_SYSTEM}<|im_end|>\n<|im_start|>user\n{prompt}<|im_end|>\n\
             <|im_start|>assistant\n"
        )
    );
    assert_eq!(
        t.render("2+2?", Some("Answer briefly.")).unwrap(),
        "<|im_start|>system\nAnswer briefly.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n\
         <|im_start|>assistant\n"
    );
    // A multi-line prompt with Jinja-looking text is data, not template.
    assert_eq!(
        t.render("line 1\n{{ x }} {% if %}", None).unwrap(),
        format!(
            "<|im_start|>system\n{QWEN_SYSTEM}<|im_end|>\n<|im_start|>user\nline 1\n{{{{ x }}}} \
             {{% if %}}<|im_end|>\n<|im_start|>assistant\n"
        )
    );
    let conversation = [
        Message::new("user", "Hi"),
        Message::new("assistant", "Hello!"),
        Message::new("user", "Bye"),
    ];
    assert_eq!(
        t.render_messages(&conversation, false).unwrap(),
        format!(
            "<|im_start|>system\n{QWEN_SYSTEM}<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n\
             <|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n"
        )
    );
    assert_eq!(
        t.special_tokens(),
        &SpecialTokens {
            bos: None,
            eos: Some("<|im_end|>".into()),
            unk: None,
            pad: Some("<|endoftext|>".into()),
        }
    );
}

#[test]
fn special_tokens_reach_the_template() {
    let dir = scratch("tokens");
    let config = serde_json::json!({
        "bos_token": {"__type": "AddedToken", "content": "<s>", "lstrip": false},
        "eos_token": "</s>",
        "chat_template": "{{ bos_token }}{% for m in messages %}[{{ m.role }}] {{ m.content | trim }}{{ eos_token }}{% endfor %}{% if add_generation_prompt %}[assistant] {% endif %}"
    });
    std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).unwrap();
    let t = ChatTemplate::from_checkpoint(&dir).unwrap();
    assert_eq!(
        t.render(" hi ", Some("sys")).unwrap(),
        "<s>[system] sys</s>[user] hi</s>[assistant] "
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn named_template_lists_and_jinja_files() {
    let dir = scratch("named");
    let config = serde_json::json!({
        "chat_template": [
            {"name": "tool_use", "template": "tools:{{ messages[0].content }}"},
            {"name": "default", "template": "default:{{ messages[0].content }}"}
        ]
    });
    let path = dir.join("tokenizer_config.json");
    std::fs::write(&path, config.to_string()).unwrap();
    let t = ChatTemplate::from_tokenizer_config(&path).unwrap();
    assert_eq!(t.render("x", None).unwrap(), "default:x");
    let t = ChatTemplate::from_tokenizer_config_named(&path, Some("tool_use")).unwrap();
    assert_eq!(t.render("x", None).unwrap(), "tools:x");
    let err = ChatTemplate::from_tokenizer_config_named(&path, Some("rag")).unwrap_err();
    assert!(err.to_string().contains("tool_use"), "{err}");

    // No `chat_template` key: chat_template.jinja beside the config is used.
    std::fs::write(&path, r#"{"eos_token": "<e>"}"#).unwrap();
    std::fs::write(
        dir.join("chat_template.jinja"),
        "{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}\n",
    )
    .unwrap();
    let t = ChatTemplate::from_checkpoint(&dir).unwrap();
    assert_eq!(t.render("y", None).unwrap(), "y<e>");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn errors() {
    let dir = scratch("errors");
    let path = dir.join("tokenizer_config.json");
    // No chat template anywhere.
    std::fs::write(&path, r#"{"eos_token": "</s>", "chat_template": null}"#).unwrap();
    let err = ChatTemplate::from_checkpoint(&dir).unwrap_err();
    assert!(
        matches!(&err, TaskError::NoChatTemplate { path: p } if p == &path),
        "{err}"
    );
    let msg = err.to_string();
    assert!(msg.contains("task.chat = false"), "{msg}");
    assert!(msg.contains("chat template"), "{msg}");
    // Not JSON; a template of the wrong type.
    std::fs::write(&path, "{").unwrap();
    let err = ChatTemplate::from_tokenizer_config(&path).unwrap_err();
    assert!(matches!(err, TaskError::TokenizerConfig { .. }), "{err}");
    std::fs::write(&path, r#"{"chat_template": 3}"#).unwrap();
    assert!(ChatTemplate::from_tokenizer_config(&path).is_err());
    // A missing checkpoint.
    let err = ChatTemplate::from_checkpoint(&dir.join("nope")).unwrap_err();
    assert!(matches!(err, TaskError::Read { .. }), "{err}");
    // Syntax errors at load, raise_exception at render.
    let err = ChatTemplate::new("{% if %}", SpecialTokens::default()).unwrap_err();
    assert!(matches!(err, TaskError::Template { .. }), "{err}");
    let t = ChatTemplate::new(
        "{% if messages[0].role != 'system' %}{{ raise_exception('a system message is required') }}{% endif %}ok",
        SpecialTokens::default(),
    )
    .unwrap();
    let err = t.render("x", None).unwrap_err();
    assert!(
        err.to_string().contains("a system message is required"),
        "{err}"
    );
    assert_eq!(t.render("x", Some("s")).unwrap(), "ok");
    std::fs::remove_dir_all(&dir).unwrap();
}
