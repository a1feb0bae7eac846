#!/usr/bin/env python3
"""Writes tests/fixtures/gguf/llama_tiny_*.gguf and llama_tiny_gguf.json: the tiny random Llama
of tests/fixtures/llama_tiny_linear/ converted to GGUF the way llama.cpp's
`convert_hf_to_gguf.py` converts a `LlamaForCausalLM`.

The reference for reading a LLaMA-architecture GGUF file (`tests/pretrained/llama_gguf.rs`): the q/k row
permutation, the `llama.*` keys, tied embeddings, Q8_0 matrices. Run it once, in a
throw-away virtualenv outside the repository, and commit what it writes. The versions it was
run with (`pip freeze`; the hashes in the JSON depend on `gguf`'s writer and quantizer):

    gguf==0.19.0 numpy==2.4.6 safetensors==0.8.0
    torch==2.15.0 transformers==5.24.0 accelerate==1.16.0   (only for the check below)

    python3 -m venv /tmp/hfvenv
    /tmp/hfvenv/bin/pip install gguf==0.19.0 numpy==2.4.6 safetensors==0.8.0
    /tmp/hfvenv/bin/pip install torch==2.15.0 transformers==5.24.0 accelerate==1.16.0
    OMP_WAIT_POLICY=PASSIVE /tmp/hfvenv/bin/python tools/llama_gguf_fixture.py

`--src DIR` (default tests/fixtures/llama_tiny_linear) and `--out DIR` (default
tests/fixtures/gguf) override the folders.

What the converter does for `LlamaForCausalLM`, and so what this script does:
- metadata: `general.architecture = llama`, `general.name`, `general.file_type` (0 all F32,
  7 mostly Q8_0), `general.quantization_version`; `llama.block_count`,
  `llama.context_length` (max_position_embeddings), `llama.embedding_length`,
  `llama.feed_forward_length`, `llama.attention.head_count`, `llama.attention.head_count_kv`,
  `llama.rope.freq_base`, `llama.attention.layer_norm_rms_epsilon` (f32), `llama.vocab_size`,
  `llama.rope.dimension_count` (hidden / heads: config.json has no `head_dim`, so no
  `attention.key_length`/`value_length`), and for `linear` scaling `llama.rope.scaling.type =
  linear` with `llama.rope.scaling.factor`;
- tensors: `token_embd.weight`, `output_norm.weight` and per layer
  `blk.N.{attn_norm,ffn_norm,attn_q,attn_k,attn_v,attn_output,ffn_gate,ffn_up,ffn_down}.weight`
  in the safetensors file's order; no `output.weight` (the embeddings are tied, so the HF file
  has no `lm_head.weight`); the rows of `attn_q` (n = head_count) and `attn_k`
  (n = head_count_kv) permuted for llama.cpp's interleaved rotary layout:
  `w.reshape(n, 2, rows // n // 2, cols).swapaxes(1, 2).reshape(rows, cols)`;
- with `--outtype q8_0`: every 2-D matrix (token_embd included) Q8_0 through
  `gguf.quants.quantize`, the 1-D norms F32.
- a tokenizer: the real converter copies the model's; this model has none, so a small
  consistent byte-level BPE one is made up: `tokenizer.ggml.model = gpt2`, 128 tokens
  (`<unk>`, `<s>`, `</s>` as control tokens, the 94 printable ASCII characters and `Ġ` (space)
  as GPT-2's byte-level alphabet writes them, and 30 merges' results), 30 merges, bos/eos/pad
  ids from config.json (1, 2, 0). It exists so the files carry the keys a real one does
  (`tokenizer.ggml.eos_token_id`, `padding_token_id`); no test depends on its splits.

Files written into `--out`:
- `llama_tiny_f32.gguf`: all F32.
- `llama_tiny_q8.gguf`: matrices Q8_0, norms F32.
- `llama_tiny_yarn.gguf`: as `llama_tiny_q8.gguf`, but with the scaling keys llama.cpp writes
  for YaRN (`rope.scaling.type = yarn`, `rope.scaling.factor`,
  `rope.scaling.original_context_length`), a scaling shardes does not implement: the test
  checks it is refused by name.
- `llama_tiny_gguf.json`: the versions used, each file's size and sha256, and what the checks
  below measured.

Checks (each asserted before anything is written to `--out`):
- every tensor read back with `gguf.GGUFReader`, dequantized and un-permuted, equals the
  safetensors tensor bit for bit (F32) or `gguf.quants.dequantize(quantize(w))` (Q8_0);
- transformers (`AutoModelForCausalLM.from_pretrained(out, gguf_file=...)`) with the HF
  directory's config reproduces expected.json's logits from the F32 file: max abs diff
  printed and asserted < 1e-5. The config must be passed: transformers 5.24's GGUF loader
  reads `rope.scaling.*` only for gpt-oss, so its own config of this file lacks the linear
  scaling (the script prints how far those logits land, and checks every other config field
  it reads against config.json);
- the Q8_0 file's logits (same way) against expected.json: max abs diff printed and
  recorded in the JSON (the Rust test's tolerance is derived from it).
"""

import argparse
import hashlib
import json
import os
import tempfile
from importlib.metadata import version
from pathlib import Path

# Before torch loads OpenMP: spinning threads wreck timings on a shared 2-core machine.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np
from safetensors.numpy import load_file

import gguf
from gguf import GGMLQuantizationType as T

F32_NAME = "llama_tiny_f32.gguf"
Q8_NAME = "llama_tiny_q8.gguf"
YARN_NAME = "llama_tiny_yarn.gguf"
JSON_NAME = "llama_tiny_gguf.json"

# Hugging Face leaf names (after `model.layers.N.`) and llama.cpp's (after `blk.N.`).
LAYER_TENSORS = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
GLOBAL_TENSORS = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


def gguf_name(hf: str) -> str:
    if hf in GLOBAL_TENSORS:
        return GLOBAL_TENSORS[hf]
    rest = hf.removeprefix("model.layers.")
    layer, tail = rest.split(".", 1)
    return f"blk.{int(layer)}.{LAYER_TENSORS[tail]}"


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's `LlamaModel.permute`: HF's rotate-half rows to interleaved pairs."""
    rows = w.shape[0]
    return w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def vocabulary(vocab_size: int) -> tuple[list[str], list[int], list[str]]:
    """A made-up byte-level BPE vocabulary of exactly `vocab_size` tokens: specials, the
    printable ASCII bytes and `Ġ` (GPT-2's byte-level form of a space), then merge results."""
    tokens = ["<unk>", "<s>", "</s>"] + [chr(c) for c in range(0x21, 0x7F)] + ["\u0120"]
    types = [3, 3, 3] + [1] * (len(tokens) - 3)
    pairs = [("\u0120", c) for c in "abcdefghijklmnopqrstuvwxyz"] + [
        ("t", "h"),
        ("h", "e"),
        ("i", "n"),
        ("e", "r"),
    ]
    merges = []
    for left, right in pairs[: vocab_size - len(tokens)]:
        merges.append(f"{left} {right}")
        tokens.append(left + right)
        types.append(1)
    assert len(tokens) == vocab_size and len(set(tokens)) == vocab_size, len(tokens)
    return tokens, types, merges


def write(path: Path, cfg: dict, tensors: dict[str, np.ndarray], qtype: T, scaling: dict) -> None:
    """Writes `tensors` (HF names, f32) as llama.cpp's converter does; `scaling` holds the
    rope.scaling keys to write (type, factor, optional original_context_length)."""
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("llama_tiny_linear")
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(rope.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    f32 = qtype == T.F32
    w.add_file_type(gguf.LlamaFileType.ALL_F32 if f32 else gguf.LlamaFileType.MOSTLY_Q8_0)
    w.add_vocab_size(cfg["vocab_size"])
    w.add_rope_dimension_count(cfg["hidden_size"] // heads)
    w.add_rope_scaling_type(scaling["type"])
    w.add_rope_scaling_factor(scaling["factor"])
    if "original_context_length" in scaling:
        w.add_rope_scaling_orig_ctx_len(scaling["original_context_length"])
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    tokens, types, merges = vocabulary(cfg["vocab_size"])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(cfg["bos_token_id"])
    w.add_eos_token_id(cfg["eos_token_id"])
    w.add_pad_token_id(cfg["pad_token_id"])
    for hf, value in tensors.items():
        if hf.endswith("self_attn.q_proj.weight"):
            value = permute(value, heads)
        elif hf.endswith("self_attn.k_proj.weight"):
            value = permute(value, kv_heads)
        value = np.ascontiguousarray(value, dtype=np.float32)
        if value.ndim == 2 and qtype == T.Q8_0:
            w.add_tensor(gguf_name(hf), gguf.quants.quantize(value, T.Q8_0), raw_dtype=T.Q8_0)
        else:
            w.add_tensor(gguf_name(hf), value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def check_tensors(path: Path, cfg: dict, tensors: dict[str, np.ndarray], qtype: T) -> None:
    """Every tensor read back, dequantized and un-permuted, is the one meant."""
    reader = gguf.GGUFReader(str(path))
    by_name = {t.name: t for t in reader.tensors}
    assert len(by_name) == len(tensors), sorted(by_name)
    assert "output.weight" not in by_name
    for hf, want in tensors.items():
        t = by_name[gguf_name(hf)]
        got = gguf.quants.dequantize(t.data, t.tensor_type).reshape(want.shape).astype(np.float32)
        if hf.endswith("q_proj.weight"):
            got = unpermute(got, cfg["num_attention_heads"])
        elif hf.endswith("k_proj.weight"):
            got = unpermute(got, cfg["num_key_value_heads"])
        if want.ndim == 2 and qtype == T.Q8_0:
            assert t.tensor_type == T.Q8_0, (hf, t.tensor_type)
            want = gguf.quants.dequantize(gguf.quants.quantize(want, T.Q8_0), T.Q8_0)
        else:
            assert t.tensor_type == T.F32, (hf, t.tensor_type)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), hf


def logits(model, ids) -> np.ndarray:
    import torch

    with torch.no_grad():
        return model(torch.tensor(ids)).logits.float().numpy()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--src", default="tests/fixtures/llama_tiny_linear")
    ap.add_argument("--out", default="tests/fixtures/gguf")
    args = ap.parse_args()
    src, out = Path(args.src), Path(args.out)
    cfg = json.loads((src / "config.json").read_text())
    expected = json.loads((src / "expected.json").read_text())
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    assert rope.get("rope_type", rope.get("type")) == "linear", rope
    assert cfg["tie_word_embeddings"] and "head_dim" not in cfg, cfg
    tensors = load_file(str(src / "model.safetensors"))
    assert "lm_head.weight" not in tensors
    assert all(v.dtype == np.float32 for v in tensors.values())
    linear = {"type": gguf.RopeScalingType.LINEAR, "factor": rope["factor"]}
    yarn = {
        "type": gguf.RopeScalingType.YARN,
        "factor": rope["factor"],
        "original_context_length": cfg["max_position_embeddings"] // int(rope["factor"]),
    }

    import torch
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    ids = expected["ids"]
    want = np.asarray(expected["logits"], dtype=np.float32).reshape(expected["logits_shape"])
    hf_config = AutoConfig.from_pretrained(src)
    measured = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for name, qtype, scaling in [
            (F32_NAME, T.F32, linear),
            (Q8_NAME, T.Q8_0, linear),
            (YARN_NAME, T.Q8_0, yarn),
        ]:
            write(tmp / name, cfg, tensors, qtype, scaling)
            check_tensors(tmp / name, cfg, tensors, qtype)

        # transformers' own config of the file: everything but the rotary scaling.
        own = AutoConfig.from_pretrained(tmp, gguf_file=F32_NAME)
        for key in [
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "max_position_embeddings",
            "tie_word_embeddings",
            "bos_token_id",
            "eos_token_id",
            "pad_token_id",
        ]:
            assert getattr(own, key) == getattr(hf_config, key), (key, getattr(own, key))
        assert abs(own.rms_norm_eps - hf_config.rms_norm_eps) < 1e-12
        print(f"transformers' GGUF config rope: {own.rope_parameters} (config.json: {hf_config.rope_parameters})")
        m = AutoModelForCausalLM.from_pretrained(tmp, gguf_file=F32_NAME, dtype=torch.float32).eval()
        unscaled = float(np.abs(logits(m, ids) - want).max())
        print(f"{F32_NAME} with transformers' own GGUF config (no linear scaling): max abs diff {unscaled:.3e}")

        for name in [F32_NAME, Q8_NAME]:
            m = AutoModelForCausalLM.from_pretrained(
                tmp, gguf_file=name, config=hf_config, dtype=torch.float32
            ).eval()
            diff = float(np.abs(logits(m, ids) - want).max())
            measured[name] = diff
            print(f"{name}: transformers logits vs expected.json, max abs diff {diff:.3e}")
        assert measured[F32_NAME] < 1e-5, measured
        assert measured[Q8_NAME] > measured[F32_NAME], measured

        out.mkdir(parents=True, exist_ok=True)
        files = {}
        for name in [F32_NAME, Q8_NAME, YARN_NAME]:
            data = (tmp / name).read_bytes()
            (out / name).write_bytes(data)
            files[name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
            print(f"wrote {out / name}: {len(data)} bytes")

    record = {
        "source": str(src),
        "versions": {
            "gguf": version("gguf"),
            "numpy": np.__version__,
            "safetensors": version("safetensors"),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
        },
        "files": files,
        "logits_max_abs_diff": {
            F32_NAME: measured[F32_NAME],
            Q8_NAME: measured[Q8_NAME],
            "f32_with_transformers_own_gguf_config": unscaled,
        },
    }
    (out / JSON_NAME).write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {out / JSON_NAME}")


if __name__ == "__main__":
    main()
