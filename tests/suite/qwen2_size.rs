//! The one parser of a random Qwen2 `size` (`shardes::problem::qwen2::config_of_size`):
//! every form a bad named size's message lists is accepted, loss problems and the decoding
//! model (`shardes::decode::load_qwen2`) read the same config from the same string, and a
//! bad size is an error naming the setting.

use shardes::decode::load_qwen2;
use shardes::hlo::builder::DType;
use shardes::hlo::problems::qwen2::Qwen2Config;
use shardes::problem::qwen2::config_of_size;
use shardes::problem::Setting;
use shardes::{ProblemError, Qwen2Weights};

/// The quoted strings of `text`, in order.
fn quoted(text: &str) -> Vec<&str> {
    text.split('"').skip(1).step_by(2).collect()
}

#[test]
fn every_form_a_bad_named_size_lists_is_accepted() {
    let e = Qwen2Config::by_size("huge").expect_err("no such preset");
    let message = e.to_string();
    let forms: Vec<&str> = quoted(&message)
        .into_iter()
        .filter(|s| *s != "huge")
        .collect();
    assert_eq!(
        forms,
        [
            "tiny",
            "0.5b",
            "qwen2.5-0.5b",
            "1.5b",
            "qwen2.5-1.5b",
            "vocab=4096,d=256,ffn=1024,layers=4,heads=4,kv=2"
        ],
        "{message}"
    );
    for key in ["vocab", "d", "ffn", "layers", "heads", "kv", "checkpoint"] {
        assert!(message.contains(key), "{key} not in {message}");
    }
    for form in forms {
        config_of_size(form).unwrap_or_else(|e| panic!("{form}: {e}"));
    }
}

#[test]
fn the_dimensions_form_sets_each_dimension_over_the_tiny_preset() {
    let c = config_of_size("vocab=64,d=16,ffn=24,layers=3,heads=2,kv=1").unwrap();
    let tiny = Qwen2Config::tiny();
    assert_eq!(
        (
            c.vocab_size,
            c.hidden_size,
            c.intermediate_size,
            c.num_hidden_layers,
            c.num_attention_heads,
            c.num_key_value_heads
        ),
        (64, 16, 24, 3, 2, 1)
    );
    // Unnamed keys keep the tiny preset's values.
    assert_eq!(c.rms_norm_eps, tiny.rms_norm_eps);
    assert_eq!(c.rope_theta, tiny.rope_theta);
    assert_eq!(config_of_size(" d = 16 ").unwrap().hidden_size, 16);
    assert_eq!(config_of_size("TINY").unwrap(), tiny);
}

#[test]
fn bad_sizes_name_the_size_setting_and_say_why() {
    for (bad, why) in [
        ("huge", "size = \"huge\" is invalid"),
        ("vocab=64,dd=16", "unknown dimension `dd`"),
        ("vocab=64,d", "`d` is not key=value"),
        ("vocab=-1", "`-1` is not a positive whole number"),
        ("d=33", "hidden_size"),
        ("layers=0", "num_hidden_layers"),
    ] {
        let e = config_of_size(bad).expect_err(bad);
        let text = e.to_string();
        assert!(text.contains(why), "{bad}: want {why:?} in {text}");
        match e {
            ProblemError::Input { setting, fix, .. } => {
                assert_eq!(setting, Setting::Size, "{bad}");
                assert!(fix.contains("vocab=4096,d=256"), "{bad}: {fix}");
            }
            other => panic!("{bad}: not an input error: {other:?}"),
        }
    }
}

#[test]
fn the_decoding_model_reads_every_size_form_as_loss_problems_do() {
    let size = "vocab=64,d=16,ffn=24,layers=1,heads=2,kv=1";
    let loaded = load_qwen2(&Qwen2Weights::Random(size.into()), DType::F32, 3).unwrap();
    assert_eq!(loaded.config, config_of_size(size).unwrap());
    let shapes: Vec<(String, Vec<usize>)> = loaded
        .params
        .leaves()
        .into_iter()
        .map(|(p, a)| (p, a.shape().to_vec()))
        .collect();
    let want = loaded.config.param_shapes();
    assert_eq!(shapes.len(), want.len());
    for (path, shape) in &want {
        assert!(
            shapes.iter().any(|(p, s)| p == path && s == shape),
            "{path} {shape:?} not in {shapes:?}"
        );
    }
    assert!(loaded.eos.is_empty() && loaded.max_positions.is_none());
    // The same errors as a loss problem's size.
    let e = load_qwen2(
        &Qwen2Weights::Random("vocab=64,dd=16".into()),
        DType::F32,
        3,
    )
    .expect_err("unknown key");
    assert_eq!(
        e.to_string(),
        config_of_size("vocab=64,dd=16").unwrap_err().to_string()
    );
}

#[test]
fn a_custom_size_too_large_for_the_host_is_refused_before_drawing() {
    // 2^26 tokens x 4096 wide: 1 TiB of f32 embedding alone, more than any test host has.
    let size = "vocab=67108864,d=4096,ffn=4096,heads=32,kv=32";
    config_of_size(size).expect("a valid config, only too large");
    let Some((available, _)) = shardes::problem::memory::available() else {
        return; // no figure of available memory on this host: nothing is refused
    };
    assert!(available < 1 << 40, "the host has over 1 TiB available");
    let e = load_qwen2(&Qwen2Weights::Random(size.into()), DType::F32, 0)
        .expect_err("refused before drawing 1 TiB");
    assert!(matches!(e, ProblemError::Memory(_)), "{e:?}");
    assert!(e.to_string().contains("random qwen2"), "{e}");
}
