#!/usr/bin/env python3
"""Writes tests/fixtures/llama_tiny/ and tests/fixtures/llama_tiny_linear/: tiny random Llamas
saved by Hugging Face `transformers`.

The reference for our Llama loader and forward pass (explicit `head_dim`, untied `lm_head`,
grouped-query attention, and the `llama3` and `linear` RoPE scalings). Run it once, in a
throw-away virtualenv outside the repository, and commit what it writes. The versions it was
run with (`pip freeze`):

    torch==2.15.0 (the PyPI wheel, here installed with --no-deps; only CPU kernels run) transformers==5.24.0
    safetensors==0.8.0 numpy==2.4.6 huggingface_hub==2.4.0

    python3 -m venv /tmp/hfvenv
    /tmp/hfvenv/bin/pip install transformers==5.24.0 safetensors==0.8.0 numpy==2.4.6
    /tmp/hfvenv/bin/pip install torch==2.15.0
    OMP_WAIT_POLICY=PASSIVE /tmp/hfvenv/bin/python tools/llama_fixture.py            # both
    OMP_WAIT_POLICY=PASSIVE /tmp/hfvenv/bin/python tools/llama_fixture.py --variant llama3
    OMP_WAIT_POLICY=PASSIVE /tmp/hfvenv/bin/python tools/llama_fixture.py --variant linear

`--out DIR` overrides the target folder (only with one `--variant`). No tokenizer: tests feed
token ids. Each variant's folder gets:
- `config.json`, `model.safetensors` (f32): `LlamaForCausalLM.save_pretrained`;
- `expected.json`: the versions used, the config fields our loader reads, the RoPE inverse
  frequencies transformers uses (`model.model.rotary_emb.inv_freq`, `attention_scaling`, and
  for `llama3` which frequency index falls in which regime: kept, smoothed, divided by the
  factor), the input ids of a `[2, 12]` batch with the model's full f32 logits
  (`[2, 12, 128]`, flattened row-major), and the greedy continuation of each of two prompts
  (given ids) from `model.generate(do_sample=False)` (which decodes with a KV cache), with the
  smallest top-1/top-2 logit margin at each step (from a full forward, which must pick the
  same tokens), and `logits_max_abs_diff_with_unscaled_rope`: how far the same weights with
  plain RoPE (same theta) land from those logits, so the scaling visibly matters.

Variants:
- `llama3` (`tests/fixtures/llama_tiny`): vocab 128, hidden 32, intermediate 64, 2 layers, 4
  heads, 2 KV heads, `head_dim = 16` (not hidden/heads = 8), untied `lm_head.weight`,
  rope_theta 10000 and `llama3` scaling with factor 8, low/high freq factors 1/4 and
  `original_max_position_embeddings = 64`, so that at head_dim 16 (wavelengths
  2*pi*10000^(i/8), i = 0..7: 6.3, 19.9, 62.8, 199, ...) index 0 is kept (< 16), indices 1 and 2
  are smoothed (in [16, 64]) and indices 3..7 are divided by the factor (> 64).
- `linear` (`tests/fixtures/llama_tiny_linear`): the same sizes with `linear` scaling (factor
  4), tied embeddings (no `lm_head.weight` in the file), and the default head_dim
  (hidden/heads = 8). transformers 5.24 writes `"head_dim": 8` into config.json anyway; this
  script deletes that key after saving, so the loader must derive it (as for older Llama
  configs), and checks that transformers reloads the folder to the same logits.

The weights are larger than transformers' default init (normal std 0.2 for matrices and
embeddings, norms 1 + 0.1 * normal, seeded) so the logits are peaked and greedy decoding has
clear winners. The seeds (10 for llama3, 0 for linear) were picked among 0..11 as those whose
greedy steps have the largest smallest top-1/top-2 margin (about 0.09 and 0.08).
"""

import argparse
import json
import math
import os
import time
from pathlib import Path

# Before torch loads OpenMP: spinning threads wreck timings on a shared 2-core machine.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import safetensors
import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

SEQ = 12
MAX_NEW = 8
PROMPTS = [[1, 17, 42, 99, 5], [1, 120, 3, 64, 77, 8, 31, 2, 90]]

VARIANTS = {
    "llama3": {
        "out": "tests/fixtures/llama_tiny",
        "seed": 10,
        "head_dim": 16,
        "tie_word_embeddings": False,
        "rope_parameters": {
            "rope_type": "llama3",
            "rope_theta": 10000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    },
    "linear": {
        "out": "tests/fixtures/llama_tiny_linear",
        "seed": 0,
        "head_dim": None,
        "tie_word_embeddings": True,
        "rope_parameters": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
    },
}


def versions():
    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "safetensors": safetensors.__version__,
    }


def llama3_regimes(rope):
    """Which inverse-frequency index transformers keeps, smooths, or divides by the factor
    (the same comparisons as `_compute_llama3_parameters`, in f32)."""
    dim = rope["dim"]
    inv = 1.0 / (rope["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    wavelen = 2 * math.pi / inv
    old = rope["original_max_position_embeddings"]
    low = old / rope["low_freq_factor"]
    high = old / rope["high_freq_factor"]
    kept, smoothed, divided = [], [], []
    for i, w in enumerate(wavelen.tolist()):
        if w < high:
            kept.append(i)
        elif w > low:
            divided.append(i)
        else:
            smoothed.append(i)
    return {
        "unscaled_inv_freq": inv.tolist(),
        "wavelen": wavelen.tolist(),
        "high_freq_wavelen": high,
        "low_freq_wavelen": low,
        "kept": kept,
        "smoothed": smoothed,
        "divided_by_factor": divided,
    }


def greedy(model, prompt):
    """`generate`'s MAX_NEW greedy tokens after `prompt`, and the top-1/top-2 margin of the
    full forward at each step (which must pick the same tokens)."""
    x = torch.tensor([prompt])
    with torch.no_grad():
        g = model.generate(
            x,
            attention_mask=torch.ones_like(x),
            max_new_tokens=MAX_NEW,
            min_new_tokens=MAX_NEW,
            do_sample=False,
            use_cache=True,
            pad_token_id=0,
        )
        new = g[0, len(prompt):].tolist()
        margins = []
        seq = list(prompt)
        for t in new:
            last = model(input_ids=torch.tensor([seq])).logits[0, -1]
            top = torch.topk(last, 2).values
            margins.append(float(top[0] - top[1]))
            assert int(last.argmax()) == t, "generate disagrees with the full forward"
            seq.append(t)
    return new, margins


def build(variant: str, out: Path) -> None:
    t0 = time.time()
    spec = VARIANTS[variant]
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(spec["seed"])
    config = LlamaConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=spec["head_dim"],
        max_position_embeddings=512,
        rms_norm_eps=1e-5,
        rope_parameters=dict(spec["rope_parameters"]),
        tie_word_embeddings=spec["tie_word_embeddings"],
        attention_bias=False,
        mlp_bias=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    model = LlamaForCausalLM(config).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.copy_(0.2 * torch.randn_like(p))
    model.save_pretrained(out, safe_serialization=True)
    saved_config = json.loads((out / "config.json").read_text())
    if spec["head_dim"] is None:
        # Make the loader derive head_dim = hidden / heads, as for older Llama configs.
        assert saved_config.pop("head_dim") == 8
        (out / "config.json").write_text(json.dumps(saved_config, indent=2, sort_keys=True) + "\n")
    with safetensors.safe_open(str(out / "model.safetensors"), "pt") as f:
        tensor_names = sorted(f.keys())
    assert ("lm_head.weight" in tensor_names) != spec["tie_word_embeddings"], tensor_names

    gen = torch.Generator().manual_seed(100 + spec["seed"])
    ids = torch.randint(0, config.vocab_size, (2, SEQ), generator=gen)
    with torch.no_grad():
        logits = model(input_ids=ids).logits.float()

    # What is on disk reproduces the logits.
    reloaded = LlamaForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    with torch.no_grad():
        again = reloaded(input_ids=ids).logits.float()
    assert torch.equal(again, logits), float((again - logits).abs().max())
    assert reloaded.config.head_dim == model.config.head_dim

    # The scaling matters: the same weights with unscaled RoPE (same theta) give other logits.
    plain = LlamaConfig(**{**config.to_dict(), "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}})
    unscaled = LlamaForCausalLM(plain).float().eval()
    unscaled.load_state_dict(model.state_dict())
    with torch.no_grad():
        scaling_effect = float((unscaled(input_ids=ids).logits - logits).abs().max())
    assert scaling_effect > 1e-2, scaling_effect

    greedy_tokens, greedy_margins = [], []
    for p in PROMPTS:
        new, margins = greedy(model, p)
        greedy_tokens.append(new)
        greedy_margins.append(margins)

    rotary = model.model.rotary_emb
    rope = dict(spec["rope_parameters"])
    rope["dim"] = config.head_dim
    rope_block = {
        "inv_freq": rotary.inv_freq.float().tolist(),
        "attention_scaling": float(rotary.attention_scaling),
    }
    if rope["rope_type"] == "llama3":
        rope_block.update(llama3_regimes(rope))

    expected = {
        "variant": variant,
        "versions": versions(),
        "config": {
            "vocab_size": config.vocab_size,
            "hidden_size": config.hidden_size,
            "intermediate_size": config.intermediate_size,
            "num_hidden_layers": config.num_hidden_layers,
            "num_attention_heads": config.num_attention_heads,
            "num_key_value_heads": config.num_key_value_heads,
            "head_dim": config.head_dim,
            "head_dim_in_config_json": "head_dim" in saved_config,
            "rms_norm_eps": config.rms_norm_eps,
            "tie_word_embeddings": config.tie_word_embeddings,
            "rope_parameters": config.rope_parameters,
            "max_position_embeddings": config.max_position_embeddings,
        },
        "config_json_keys": sorted(saved_config.keys()),
        "tensor_names": tensor_names,
        "rope": rope_block,
        "ids": ids.tolist(),
        "logits_shape": list(logits.shape),
        "logits": [float(v) for v in logits.flatten()],
        "logits_max_abs_diff_with_unscaled_rope": scaling_effect,
        "prompt_ids": PROMPTS,
        "max_new_tokens": MAX_NEW,
        "greedy": greedy_tokens,
        "greedy_margins": greedy_margins,
        "greedy_min_margin": min(min(m) for m in greedy_margins),
    }
    (out / "expected.json").write_text(json.dumps(expected, indent=1) + "\n")
    (out / "model.safetensors").chmod(0o644)
    print(
        f"wrote {out} ({variant}) in {time.time() - t0:.1f}s: greedy {greedy_tokens}, "
        f"min margin {expected['greedy_min_margin']:.4f}, unscaled-rope logit diff "
        f"{scaling_effect:.3f}, inv_freq {rope_block['inv_freq']}"
    )


if __name__ == "__main__":
    torch.set_num_threads(2)
    parser = argparse.ArgumentParser()
    parser.add_argument("--variant", choices=["llama3", "linear", "both"], default="both")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    chosen = ["llama3", "linear"] if args.variant == "both" else [args.variant]
    if args.out is not None and len(chosen) != 1:
        parser.error("--out needs a single --variant")
    for v in chosen:
        build(v, args.out or Path(VARIANTS[v]["out"]))
