#!/usr/bin/env python3
"""Checks what `shardes export` wrote against transformers and the `gguf` package.

Run it from a virtualenv outside the repository (nothing here is imported by the tests).
The versions it was checked with (`pip freeze`):

    torch==2.15.0 transformers==5.24.0 tokenizers==0.23.3 gguf==0.19.0 numpy==2.4.6
    safetensors==0.8.0 accelerate==1.16.0   (accelerate only for --gguf-transformers)

    OMP_WAIT_POLICY=PASSIVE /work/hfvenv/bin/python tools/check_export.py \
        --hf OUT_DIR [--gguf OUT.gguf] \
        [--shardes target/release/shardes --config RUN/config.toml --params RUN/params.safetensors \
         --prompt "What is the capital of France?" --max-new-tokens 16] \
        [--expected expected.json] [--source-gguf MODEL.gguf] [--gguf-transformers]

What it checks (each failure is printed and the exit status is 1):

1. The Hugging Face directory loads in transformers (`AutoModelForCausalLM`,
   `AutoTokenizer`); the prompt shardes rendered (chat template applied, as `shardes
   generate` prints it) is encoded with the exported tokenizer and greedy-decoded for
   --max-new-tokens; the new tokens (up to the first EOS) must decode to the completion
   `shardes generate --params` printed, with the same token count. With --shardes the script
   runs `shardes generate CONFIG --params PARAMS --prompt TEXT --max-new-tokens N` itself;
   with --expected it reads {"prompt": rendered text, "completion": text, "tokens": n}.
   The exported chat template, applied by transformers, must render the prompt as shardes did.
2. The GGUF file read with the `gguf` package: `general.architecture` and the family's
   hyperparameters equal config.json's; every tensor's shape is the HF tensor's (ggml
   order reversed); its values, dequantized with `gguf.quants.dequantize` (and q/k rows
   un-permuted for llama), equal the HF export's f32 weights: F32 exactly, F16 exactly as
   numpy's float16 rounding, Q8_0 byte for byte as `gguf.quants.quantize` of the permuted
   weights (so the encoder is gguf-py's). With --params and an f32 export, the HF export's
   tensors must equal the params file's bit for bit. With --source-gguf, every `tokenizer.*` key must
   equal the source file's.
3. With --gguf-transformers the GGUF file is also loaded by transformers (`gguf_file=`) and
   greedy-decoded on the same prompt; its tokens are printed (Q8_0 may differ from f32).
"""

import argparse
import json
import os
import re
import subprocess
import sys

import numpy as np

FAILURES = []


def fail(msg):
    FAILURES.append(msg)
    print(f"FAIL: {msg}")


def ok(msg):
    print(f"ok: {msg}")


def response_prefix(args):
    """The config's task.response_prefix ('' without a config or a prefix)."""
    if not getattr(args, "config", None):
        return ""
    import tomllib
    with open(args.config, "rb") as f:
        return tomllib.load(f).get("task", {}).get("response_prefix", "")


def shardes_generate(args):
    cmd = [args.shardes, "generate", args.config, "--prompt", args.prompt,
           "--max-new-tokens", str(args.max_new_tokens)]
    if args.params:
        cmd += ["--params", args.params]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"shardes generate failed ({out.returncode}):\n{out.stderr}")
    text = out.stdout
    m = re.search(r"### prompt 0\n(.*)\n### completion 0 \((\d+) tokens[^)]*\)\n(.*)\n\n",
                  text, re.S)
    if not m:
        sys.exit(f"cannot parse shardes generate's output:\n{text}")
    return {"prompt": m.group(1), "tokens": int(m.group(2)), "completion": m.group(3)}


def check_hf(args, expected):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(args.hf)
    model = AutoModelForCausalLM.from_pretrained(args.hf, dtype=torch.float32)
    model.eval()
    ok(f"transformers loaded {args.hf}: {type(model).__name__}, "
       f"{sum(p.numel() for p in model.parameters())} parameters")
    if expected is None:
        return None
    if getattr(tok, "chat_template", None):
        rendered = tok.apply_chat_template(
            [{"role": "user", "content": args.prompt}], tokenize=False,
            add_generation_prompt=True)
        if rendered == expected["prompt"]:
            ok("the exported chat template renders the prompt as shardes does")
        else:
            print(f"  (transformers renders {rendered!r}; shardes {expected['prompt']!r})")
    # shardes encodes with the exported tokenizer.json itself; AutoTokenizer may build its
    # own pipeline for the model type (transformers 5 does for qwen2), so the ids are
    # compared and the file's are used.
    from tokenizers import Tokenizer
    raw = Tokenizer.from_file(os.path.join(args.hf, "tokenizer.json"))
    file_ids = raw.encode(expected["prompt"], add_special_tokens=False).ids
    auto_ids = tok(expected["prompt"], add_special_tokens=False).input_ids
    if auto_ids == file_ids:
        ok(f"AutoTokenizer ({type(tok).__name__}) encodes the prompt as tokenizer.json does")
    else:
        print(f"  note: AutoTokenizer ({type(tok).__name__}) encodes the prompt differently "
              f"from tokenizer.json; using tokenizer.json's ids")
    ids = torch.tensor([file_ids])
    gen = model.generation_config
    eos = gen.eos_token_id
    eos = set(eos if isinstance(eos, list) else ([] if eos is None else [eos]))
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=expected.get("max_new_tokens", args.max_new_tokens),
                             do_sample=False, pad_token_id=gen.pad_token_id)
    new = out[0, ids.shape[1]:].tolist()
    cut = next((i for i, t in enumerate(new) if t in eos), len(new))
    text = raw.decode(new[:cut], skip_special_tokens=True)
    print(f"  transformers: {len(new[:cut])} tokens {new[:cut]} -> {text!r}")
    print(f"  shardes:      {expected['tokens']} tokens -> {expected['completion']!r}")
    # shardes counts the EOS that ended a completion; transformers' ids stop before it.
    count = cut + (1 if cut < len(new) else 0)
    # With task.response_prefix the rendered prompt ends with the prefix, and shardes
    # prints the completion as the reward reads it: prefix + generated text.
    prefix = response_prefix(args)
    if prefix:
        print(f"  (task.response_prefix {prefix!r} starts shardes' printed completion)")
    if prefix + text == expected["completion"] and count == expected["tokens"]:
        ok("transformers' greedy tokens equal shardes generate's")
    else:
        fail("transformers' greedy completion differs from shardes generate's")
    return new[:cut]


def permute_back(w, heads):
    """llama.cpp's q/k row order to Hugging Face's (view [n, d/(2n), 2], swap the last two)."""
    rows = w.shape[0]
    rest = w.shape[1:]
    return w.reshape(heads, rows // heads // 2, 2, *rest).swapaxes(1, 2).reshape(w.shape)


def permute(w, heads):
    rows = w.shape[0]
    rest = w.shape[1:]
    return w.reshape(heads, 2, rows // heads // 2, *rest).swapaxes(1, 2).reshape(w.shape)


def check_gguf(args):
    import gguf
    from safetensors.numpy import load_file

    cfg = json.load(open(os.path.join(args.hf, "config.json")))
    hf = load_file(os.path.join(args.hf, "model.safetensors"))
    hf = {k: v.astype(np.float32) for k, v in hf.items()}
    if args.params and cfg.get("torch_dtype") == "float32":
        params = load_file(args.params)
        same = set(params) == set(hf) and all(
            np.array_equal(params[k].view(np.uint32), hf[k].view(np.uint32)) for k in params)
        if same:
            ok(f"the HF export's {len(hf)} tensors equal {args.params} bit for bit")
        else:
            fail(f"the HF export's tensors differ from {args.params}")
    r = gguf.GGUFReader(args.gguf)
    fields = {k: f.contents() for k, f in r.fields.items()}
    arch = fields.get("general.architecture")
    want_arch = {"qwen2": "qwen2", "llama": "llama", "mistral": "llama"}[cfg["model_type"]]
    if arch != want_arch:
        fail(f"general.architecture = {arch!r}, want {want_arch!r}")
    hd = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    keys = {
        "block_count": cfg["num_hidden_layers"],
        "embedding_length": cfg["hidden_size"],
        "feed_forward_length": cfg["intermediate_size"],
        "attention.head_count": cfg["num_attention_heads"],
        "attention.head_count_kv": cfg["num_key_value_heads"],
        "vocab_size": cfg["vocab_size"],
        "rope.dimension_count": hd,
    }
    if "max_position_embeddings" in cfg:
        keys["context_length"] = cfg["max_position_embeddings"]
    for k, v in keys.items():
        got = fields.get(f"{arch}.{k}")
        if got != v:
            fail(f"{arch}.{k} = {got}, config.json says {v}")
    for k, v in [("rope.freq_base", cfg["rope_theta"]),
                 ("attention.layer_norm_rms_epsilon", cfg["rms_norm_eps"])]:
        got = fields.get(f"{arch}.{k}")
        if got is None or np.float32(got) != np.float32(v):
            fail(f"{arch}.{k} = {got}, config.json says {v}")
    ok(f"GGUF keys: general.architecture = {arch}, {len(keys) + 2} hyperparameters match config.json")
    if args.source_gguf:
        src = gguf.GGUFReader(args.source_gguf)
        sf = {k: f for k, f in src.fields.items() if k.startswith("tokenizer.")}
        for k, f in sf.items():
            mine = r.fields.get(k)
            if mine is None:
                fail(f"{k} missing from the export")
            elif mine.contents() != f.contents():
                fail(f"{k} differs from the source's")
        ok(f"{len(sf)} tokenizer.* keys equal the source's")
    names = {
        "token_embd.weight": "model.embed_tokens.weight",
        "output_norm.weight": "model.norm.weight",
        "output.weight": "lm_head.weight",
    }
    per_layer = {
        "attn_norm.weight": "input_layernorm.weight",
        "ffn_norm.weight": "post_attention_layernorm.weight",
        "attn_q.weight": "self_attn.q_proj.weight", "attn_q.bias": "self_attn.q_proj.bias",
        "attn_k.weight": "self_attn.k_proj.weight", "attn_k.bias": "self_attn.k_proj.bias",
        "attn_v.weight": "self_attn.v_proj.weight", "attn_v.bias": "self_attn.v_proj.bias",
        "attn_output.weight": "self_attn.o_proj.weight",
        "ffn_gate.weight": "mlp.gate_proj.weight", "ffn_up.weight": "mlp.up_proj.weight",
        "ffn_down.weight": "mlp.down_proj.weight",
    }
    seen = set()
    types = {}
    for t in r.tensors:
        if t.name in names:
            leaf = names[t.name]
        else:
            m = re.match(r"blk\.(\d+)\.(.*)", t.name)
            leaf = f"model.layers.{m.group(1)}.{per_layer[m.group(2)]}"
        seen.add(leaf)
        w = hf[leaf]
        shape = [int(x) for x in reversed(t.shape)]
        if shape != list(w.shape):
            fail(f"{t.name}: shape {shape}, HF {list(w.shape)}")
            continue
        want = w
        if arch == "llama" and (".q_proj." in leaf or ".k_proj." in leaf):
            heads = cfg["num_attention_heads"] if ".q_proj." in leaf else cfg["num_key_value_heads"]
            want = permute(w, heads)
        ty = t.tensor_type
        types[ty.name] = types.get(ty.name, 0) + 1
        got = gguf.quants.dequantize(t.data, ty).reshape(w.shape)
        if ty == gguf.GGMLQuantizationType.F32:
            good = np.array_equal(got.view(np.uint32), want.view(np.uint32))
        elif ty == gguf.GGMLQuantizationType.F16:
            good = np.array_equal(got, want.astype(np.float16).astype(np.float32))
        elif ty == gguf.GGMLQuantizationType.Q8_0:
            ref = gguf.quants.quantize(want, ty)
            good = np.array_equal(np.asarray(t.data).view(np.uint8).reshape(-1),
                                  ref.view(np.uint8).reshape(-1))
        else:
            fail(f"{t.name}: unexpected type {ty.name}")
            continue
        if not good:
            fail(f"{t.name} ({ty.name}): values differ from the HF export's {leaf}")
        if arch == "llama" and (".q_proj." in leaf or ".k_proj." in leaf) and ty.name == "F32":
            if not np.array_equal(permute_back(got, heads), w):
                fail(f"{t.name}: un-permuting does not give back {leaf}")
    missing = set(hf) - seen
    if missing:
        fail(f"tensors of the HF export missing from the GGUF file: {sorted(missing)[:5]}")
    ok(f"GGUF tensors: {len(r.tensors)} ({types}) match the HF export's weights")


def check_gguf_transformers(args, expected):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    d, f = os.path.split(os.path.abspath(args.gguf))
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32)
    ids = tok(expected["prompt"], add_special_tokens=False, return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=args.max_new_tokens, do_sample=False)
    new = out[0, ids.shape[1]:].tolist()
    print(f"  transformers on the GGUF file: {new} -> {tok.decode(new, skip_special_tokens=True)!r}")
    return new


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--hf", required=True, help="the exported Hugging Face directory")
    p.add_argument("--gguf", help="the exported GGUF file")
    p.add_argument("--source-gguf", help="the GGUF file the run started from")
    p.add_argument("--shardes", help="the shardes binary (runs shardes generate)")
    p.add_argument("--config", help="the run's config.toml, for shardes generate")
    p.add_argument("--params", help="the params file, for shardes generate --params")
    p.add_argument("--prompt", default="What is the capital of France?")
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--expected", help="JSON {prompt, completion, tokens} instead of --shardes")
    p.add_argument("--gguf-transformers", action="store_true")
    args = p.parse_args()
    expected = None
    if args.shardes:
        expected = shardes_generate(args)
    elif args.expected:
        expected = json.load(open(args.expected))
    new = check_hf(args, expected)
    if args.gguf:
        check_gguf(args)
        if args.gguf_transformers and expected is not None:
            g = check_gguf_transformers(args, expected)
            print(f"  (GGUF in transformers {'equals' if g[:len(new)] == new else 'differs from'} "
                  f"the HF export's greedy tokens)")
    if FAILURES:
        print(f"{len(FAILURES)} failure(s)")
        sys.exit(1)
    print("all checks passed")


if __name__ == "__main__":
    main()
