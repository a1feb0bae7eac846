//! `shardes bench CONFIG` on a decode config (one with a `[decode]` section): tokens per
//! second of the ES decode against a plain batched greedy decode of the same `n × B`
//! sequences through the unperturbed weights, side by side ([`shardes::bench::decode`]).
//!
//! ```toml
//! devices = 8
//! [decode]
//! size = "tiny"          # a preset, or checkpoint = "DIR", or a [decode.model] table
//! batch = 4              # prompts per member
//! prompt_len = 16
//! max_new = 32
//! compute_dtype = "f32"  # or "bf16"
//! seed = 0
//! [es]                   # the run config's [es] section
//! strategy = "mirrored(lowrank(r=1))"
//! n = 64
//! sigma = 0.001
//! lr = 0.0005
//! ```

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::Deserialize;
use shardes::bench::decode::{run_decode, DecodeBenchInput, DecodeBenchReport, DecodeTimes};
use shardes::decode::{load_qwen2, LoadedQwen2};
use shardes::hlo::builder::DType;
use shardes::hlo::es::EsSpec;
use shardes::hlo::prng::{bits, fold_in};
use shardes::hlo::problems::qwen2::{Layers, Qwen2Config};
use shardes::Qwen2Weights;

use super::{print_report, BenchArgs};
use crate::config::{es_error, ConfigError};

/// A decode benchmark's config.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DecodeBenchConfig {
    /// The PJRT plugin, as a run config's `plugin` (`cpu` when absent).
    #[serde(default)]
    plugin: Option<String>,
    #[serde(default = "one")]
    devices: usize,
    decode: DecodeSection,
    es: EsSpec,
}

fn one() -> usize {
    1
}

/// `[decode]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DecodeSection {
    size: Option<String>,
    checkpoint: Option<PathBuf>,
    /// A named model (`shardes models`) or a path, as `problem.model`.
    pretrained: Option<String>,
    model: Option<ModelDims>,
    /// `loop` or `unrolled` (default), as `problem.layers`.
    #[serde(default)]
    layers: Option<String>,
    batch: usize,
    prompt_len: usize,
    max_new: usize,
    #[serde(default)]
    compute_dtype: Option<String>,
    #[serde(default)]
    seed: u64,
}

/// `[decode.model]`: a random Qwen2 of these dimensions.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ModelDims {
    vocab_size: usize,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: usize,
}

/// Whether `path` is a decode config (its TOML has a `[decode]` table); unreadable or
/// invalid files are left to the run config's own errors.
pub fn is_decode_config(path: &Path) -> bool {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|t| t.parse::<toml::Table>().ok())
        .is_some_and(|t| t.contains_key("decode"))
}

fn config_error(message: String, hint: &str) -> anyhow::Error {
    ConfigError::new(message, hint).into()
}

/// `decode.compute_dtype`: the model's, and as in a run of a qwen2 problem, the ES's.
fn compute_dtype(d: &DecodeSection) -> Result<DType> {
    match d.compute_dtype.as_deref() {
        None | Some("f32") => Ok(DType::F32),
        Some("bf16") => Ok(DType::BF16),
        Some(other) => Err(config_error(
            format!(
                "decode.compute_dtype = \"{}\"",
                shardes::hlo::es::spec::excerpt(other)
            ),
            "use \"f32\" or \"bf16\"",
        )),
    }
}

/// The model, its parameters and key, from the `[decode]` section.
fn model(d: &DecodeSection) -> Result<LoadedQwen2> {
    let dtype = compute_dtype(d)?;
    let source_err = |e: shardes::ProblemError| {
        config_error(format!("decode: {e}"), "fix the model source in [decode]")
    };
    let layers = d
        .layers
        .as_deref()
        .map_or(Ok(Layers::Unrolled), Layers::parse)
        .map_err(|e| {
            config_error(
                format!("decode.layers: {e}"),
                "use \"loop\" or \"unrolled\"",
            )
        })?;
    let mut loaded = match (&d.size, &d.checkpoint, &d.pretrained, &d.model) {
        (Some(size), None, None, None) => {
            load_qwen2(&Qwen2Weights::Random(size.clone()), dtype, d.seed).map_err(source_err)
        }
        (None, Some(dir), None, None) => {
            load_qwen2(&Qwen2Weights::Checkpoint(dir.clone()), dtype, d.seed).map_err(source_err)
        }
        (None, None, Some(name), None) => {
            let source = shardes::models::resolve_model(name).map_err(|e| {
                config_error(
                    format!("decode.pretrained = \"{name}\": {e}"),
                    "use a model name `shardes models` lists, a .gguf file or a Hugging Face \
                     directory",
                )
            })?;
            let weights = Qwen2Weights::Checkpoint(source.path().to_path_buf());
            load_qwen2(&weights, dtype, d.seed).map_err(source_err)
        }
        (None, None, None, Some(m)) => {
            let config = Qwen2Config {
                vocab_size: m.vocab_size,
                hidden_size: m.hidden_size,
                intermediate_size: m.intermediate_size,
                num_hidden_layers: m.num_hidden_layers,
                num_attention_heads: m.num_attention_heads,
                num_key_value_heads: m.num_key_value_heads,
                rope_theta: 10_000.0,
                rms_norm_eps: 1e-6,
                tie_word_embeddings: true,
                ..Qwen2Config::tiny()
            };
            let key = shardes::hlo::prng::key(d.seed)
                .map_err(|e| config_error(format!("decode.seed: {e}"), "use a seed below 2^63"))?;
            let params = config.init(key, 0.02).map_err(|e| {
                config_error(format!("decode.model: {e}"), "fix the dimension it names")
            })?;
            Ok(LoadedQwen2 {
                layers,
                ..LoadedQwen2::random(config, params, key, dtype)
            })
        }
        _ => Err(config_error(
            "[decode] needs exactly one of size, checkpoint, pretrained or a [decode.model] \
             table"
                .into(),
            "e.g. size = \"tiny\"",
        )),
    }?;
    loaded.layers = layers;
    Ok(loaded)
}

/// Runs the decode benchmark of `args.config`.
pub fn run(args: &BenchArgs) -> Result<()> {
    let text = std::fs::read_to_string(&args.config)
        .with_context(|| format!("reading {}", args.config.display()))?;
    let mut cfg: DecodeBenchConfig = toml::from_str(&text).map_err(|e| {
        config_error(
            format!("{}: {}", args.config.display(), e.message()),
            "a decode benchmark config has devices, [decode] and [es] (see benches/decode_tiny.toml)",
        )
    })?;
    if let Some(n) = args.n {
        cfg.es.n = n;
    }
    if let Some(d) = args.devices {
        cfg.devices = d;
    }
    if let Some(c) = args.member_chunk {
        cfg.es.member_chunk = Some(c);
    }
    // The ES reads the model in the model's dtype, as `shardes run` sets it from a qwen2
    // problem's compute_dtype (its noise rounded to that dtype once, its leaves converted
    // once): the ES decode measured is the one a run makes.
    let es = cfg
        .es
        .build(cfg.devices)
        .map_err(es_error)?
        .with_compute_dtype(compute_dtype(&cfg.decode)?)
        .map_err(es_error)?;
    let loaded = model(&cfg.decode)?;
    let d = &cfg.decode;
    let config = loaded.decode_config(d.batch, d.prompt_len, d.max_new);
    let decoder = loaded.decoder(&config);
    // Full-length prompts of random ids, drawn from the seed.
    let vocab = loaded.config.vocab_size as u32;
    let ids = bits(fold_in(loaded.key, 2), &[d.batch * d.prompt_len])
        .map_err(|e| config_error(format!("decode: {e}"), "lower batch or prompt_len"))?;
    let prompts: Vec<Vec<u32>> = ids
        .chunks(d.prompt_len.max(1))
        .map(|c| c.iter().map(|b| b % vocab).collect())
        .collect();
    // No compile cache: the report's compile times are measured.
    let client =
        crate::setup::client_for(cfg.plugin.as_deref(), cfg.devices)?.with_compile_cache(None);
    let input = DecodeBenchInput {
        client: &client,
        es: &es,
        decoder,
        params: &loaded.params,
        key: loaded.key,
        config,
        prompts,
        gemm_size: args.gemm_size,
    };
    let report = run_decode(
        &input,
        args.warmup,
        args.generations,
        &mut |stage, done, total| {
            eprint!("\r{stage} {done}/{total}        ");
        },
    )
    .map_err(|e| match e {
        shardes::Error::Es(e) => es_error(e).into(),
        other => anyhow::Error::from(other),
    })?;
    eprintln!();
    print_report(args, &table(&report), &report)
}

/// The report as the human table.
pub fn table(r: &DecodeBenchReport) -> String {
    let mut s = String::new();
    s.push_str(&format!(
        "decode: {} n={} devices={} member_chunk={} batch={} prompt_len={} max_new={} \
         rounds={}\n",
        r.strategy, r.n, r.devices, r.member_chunk, r.batch, r.prompt_len, r.max_new, r.rounds
    ));
    s.push_str(&format!(
        "{:<30}{:>20}{:>20}\n",
        "", "ES decode", "plain decode"
    ));
    // Each row formats the ES decode and the plain one alike.
    type Cell = fn(&DecodeTimes) -> String;
    let rows: [(&str, Cell); 7] = [
        ("emission ms", |x| format!("{:.1}", x.emit_ms)),
        ("compile ms", |x| format!("{:.0}", x.compile_ms)),
        ("ms per call (median)", |x| {
            format!("{:.2}", x.call_ms.median)
        }),
        ("ms (min..max)", |x| {
            format!("{:.2}..{:.2}", x.call_ms.min, x.call_ms.max)
        }),
        ("prefill + 1 token ms", |x| {
            format!("{:.2}", x.prefill_ms.median)
        }),
        ("per-token step ms", |x| format!("{:.2}", x.step_ms)),
        ("tokens/s", |x| format!("{:.0}", x.tokens_per_s)),
    ];
    for (what, cell) in rows {
        let (a, b) = (cell(&r.es), cell(&r.plain));
        s.push_str(&format!("  {what:<28}{a:>20}{b:>20}\n"));
    }
    s.push_str(&format!(
        "{} tokens per call; plain/ES tokens/s ratio {:.3}; GEMM peak {:.1} GFLOP/s; peak RSS \
         {:.0} MiB\n",
        r.tokens_per_call,
        r.ratio,
        r.gemm_peak_gflops,
        r.peak_rss_bytes as f64 / 1048576.0
    ));
    s
}
