#!/usr/bin/env python3
"""Writes tests/fixtures/qwen2_tiny/: a tiny random Qwen2 saved by Hugging Face `transformers`.

The reference implementation for `problems::qwen2` and `shardes::hf`. Run it once, in a
throw-away virtualenv outside the repository, and commit what it writes:

    python3 -m venv /tmp/hfvenv
    /tmp/hfvenv/bin/pip install torch transformers safetensors tokenizers numpy
    /tmp/hfvenv/bin/python tools/qwen2_fixture.py tests/fixtures/qwen2_tiny

It writes:
- `config.json`, `model.safetensors` (f32): `Qwen2ForCausalLM.save_pretrained`;
- `tokenizer.json`: a 128-token BPE trained by the `tokenizers` library on the prompts below;
- `expected.json`: the versions used, the prompts with their token ids, the input ids of a
  `[2, 8]` batch with the model's f32 logits, and the greedy continuation of each prompt
  from `model.generate(do_sample=False)` (which decodes with a KV cache), with the smallest
  top-1/top-2 logit margin seen along the way (so a test knows the argmax is not a near tie).

`tests/suite/qwen2_fixture.rs` checks our logits against these within 1e-4 and our greedy tokens
exactly, and our tokenizer's ids against the `tokenizers` library's.

With `--generate`, it loads the model it saved (nothing else is rewritten) and writes
`generate.json`: `model.generate(do_sample=False)` completions of prompts of different
lengths, each prompt alone, up to `max_new_tokens` and stopped by EOS (the EOS token
included), once with the checkpoint's EOS id and once with an EOS id the model does emit;
with the smallest top-1/top-2 margin along the way. `tests/suite/decode_rows.rs` decodes the
prompts as one right-padded batch and checks every completion exactly:

    /tmp/hfvenv/bin/python tools/qwen2_fixture.py --generate tests/fixtures/qwen2_tiny
"""

import json
import sys
from pathlib import Path

import tokenizers
import torch
import transformers
from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers
from transformers import Qwen2Config, Qwen2ForCausalLM

CORPUS = [
    "evolution strategies perturb the weights and score every copy",
    "the population moves toward the copies that scored well",
    "low rank noise is never materialized",
    "sharded across devices on one mesh axis",
    "the quick brown fox jumps over the lazy dog",
]
PROMPTS = ["the population moves", "low rank noise"]
MAX_NEW = 6
SEQ = 8


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(
        vocab_size=128, special_tokens=["<|endoftext|>", "<unk>"], show_progress=False
    )
    tok.train_from_iterator(CORPUS, trainer)
    tok.save(str(out / "tokenizer.json"))

    config = Qwen2Config(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
    )
    model = Qwen2ForCausalLM(config).float().eval()
    # Larger-than-default weights and non-unit norms so logits are peaked (greedy decoding
    # has clear winners) and every parameter matters to the output.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(0.25 * torch.randn_like(p))
    model.save_pretrained(out, safe_serialization=True)

    prompt_ids = [tok.encode(p).ids for p in PROMPTS]
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, config.vocab_size, (2, SEQ), generator=gen)
    with torch.no_grad():
        logits = model(input_ids=ids).logits.float()

    greedy = []
    min_margin = float("inf")
    for p in prompt_ids:
        x = torch.tensor([p])
        with torch.no_grad():
            g = model.generate(
                x,
                max_new_tokens=MAX_NEW,
                min_new_tokens=MAX_NEW,
                do_sample=False,
                use_cache=True,
                pad_token_id=0,
            )
            new = g[0, len(p):].tolist()
            # The same tokens from the full forward at every step, and how clear each win was.
            seq = list(p)
            for t in new:
                last = model(input_ids=torch.tensor([seq])).logits[0, -1]
                top = torch.topk(last, 2).values
                min_margin = min(min_margin, float(top[0] - top[1]))
                assert int(last.argmax()) == t, "generate disagrees with the full forward"
                seq.append(t)
        greedy.append(new)

    expected = {
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__,
        },
        "prompts": PROMPTS,
        "prompt_ids": prompt_ids,
        "max_new_tokens": MAX_NEW,
        "greedy": greedy,
        "greedy_min_margin": min_margin,
        "ids": ids.tolist(),
        "logits_shape": list(logits.shape),
        "logits": [float(v) for v in logits.flatten()],
    }
    (out / "expected.json").write_text(json.dumps(expected, indent=1) + "\n")
    print(f"wrote {out}: greedy {greedy}, min margin {min_margin:.4f}")


GENERATE_PROMPTS = [
    "the population moves",
    "low rank noise",
    "the quick brown fox jumps over",
    "score",
]
GENERATE_MAX_NEW = 8


def greedy_until_eos(model, prompt, eos):
    """`generate`'s completion of one prompt and the smallest top-1/top-2 margin of the
    full forward along it (which must pick the same tokens)."""
    x = torch.tensor([prompt])
    with torch.no_grad():
        g = model.generate(
            x,
            attention_mask=torch.ones_like(x),
            max_new_tokens=GENERATE_MAX_NEW,
            do_sample=False,
            use_cache=True,
            eos_token_id=eos,
            pad_token_id=0,
        )
        new = g[0, len(prompt):].tolist()
        margin = float("inf")
        seq = list(prompt)
        for t in new:
            last = model(input_ids=torch.tensor([seq])).logits[0, -1]
            top = torch.topk(last, 2).values
            margin = min(margin, float(top[0] - top[1]))
            assert int(last.argmax()) == t, "generate disagrees with the full forward"
            seq.append(t)
            if t in eos:
                break
    return new, margin


def write_generate(out: Path) -> None:
    model = Qwen2ForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    prompt_ids = [tok.encode(p).ids for p in GENERATE_PROMPTS]
    cases = []
    own = [0]
    first = [greedy_until_eos(model, p, own)[0] for p in prompt_ids]
    # An EOS id the model does emit mid-completion: the first token of the first
    # completion, from its third on, that it has not emitted before.
    c0 = first[0]
    emitted = [next(t for i, t in enumerate(c0) if i >= 2 and t not in c0[:i]), 0]
    for eos in [own, emitted]:
        completions, margin = [], float("inf")
        for p in prompt_ids:
            new, m = greedy_until_eos(model, p, eos)
            completions.append(new)
            margin = min(margin, m)
        cases.append({"eos": eos, "completions": completions, "min_margin": margin})
    expected = {
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__,
        },
        "prompts": GENERATE_PROMPTS,
        "prompt_ids": prompt_ids,
        "max_new_tokens": GENERATE_MAX_NEW,
        "cases": cases,
    }
    (out / "generate.json").write_text(json.dumps(expected, indent=1) + "\n")
    print(f"wrote {out / 'generate.json'}: {cases}")


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--generate"]
    target = Path(args[0] if args else "tests/fixtures/qwen2_tiny")
    if "--generate" in sys.argv[1:]:
        write_generate(target)
    else:
        main(target)
