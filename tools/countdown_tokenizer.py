#!/usr/bin/env python3
"""Writes examples/countdown_tokenizer.json: a tiny word-piece tokenizer for Countdown.

The tiny Qwen2 fixture's 128-token BPE has no digits, so Countdown prompts lose their
numbers there. This vocabulary has what Countdown text needs (digits, `+ - * /`,
parentheses, `=`, the `<answer>` tags and the words of the compact prompt) in under 64
tokens, so it fits the random `size = "tiny"` preset (128 ids) that
`examples/countdown_tiny.toml` trains. Numbers are split into digits (`15` is `1`, `##5`)
and decoded back whole. Run it in a throw-away virtualenv outside the repository:

    python3 -m venv /tmp/tokvenv && /tmp/tokvenv/bin/pip install tokenizers
    /tmp/tokvenv/bin/python tools/countdown_tokenizer.py examples/countdown_tokenizer.json
"""

import sys

from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers

SPECIAL = ["<pad>", "<eos>", "<unk>"]
TAGS = ["<answer>", "</answer>", "<think>", "</think>"]
WORDS = ["numbers", "target", "answer", "use", "make", "the", "and", "is"]
SYMBOLS = list("+-*/()=.,[]")


def main(out: str) -> None:
    vocab = {}
    for tok in SPECIAL + TAGS + WORDS + SYMBOLS:
        vocab[tok] = len(vocab)
    for d in "0123456789":
        vocab[d] = len(vocab)
    for d in "0123456789":
        vocab["##" + d] = len(vocab)
    tok = Tokenizer(models.WordPiece(vocab, unk_token="<unk>", max_input_chars_per_word=64))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Whitespace(), pre_tokenizers.Punctuation()]
    )
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    tok.add_special_tokens([AddedToken(t, special=True) for t in SPECIAL])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TAGS])
    tok.save(out)
    check = Tokenizer.from_file(out)
    enc = check.encode("numbers 3 15 7 target 98 answer <answer>(15 - 7) * 3</answer>")
    print(len(vocab), "tokens;", enc.tokens)
    print(repr(check.decode(enc.ids)))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "examples/countdown_tokenizer.json")
