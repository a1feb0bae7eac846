#!/usr/bin/env python3
"""The side-by-side anchor of issue #37: `shardes bench`'s decode against Hugging Face
`transformers`' greedy `generate` (torch, f32 and bf16) on the same model, rows, prompt length
and new tokens, alternating in one session, and the table of ratios.

What it measures, for each `--rows` value R (R = members × prompts per member):

- shardes: `shardes bench CONFIG --json` on a config derived from `--config` (default
  `benches/decode_smollm2.toml`: SmolLM2-135M-Instruct, the real GGUF weights) with
  `[decode] batch = B` (prompts per member, the config's unless `--prompts-per-member`),
  `[es] n = R / B`, `prompt_len = P`, `max_new = T` (and `compute_dtype` per
  `--shardes-dtypes`), written to a temporary directory. It reports the ES decode (every
  member's perturbation) and a plain batched greedy decode of the same R rows through the
  unperturbed weights, each with its XLA compile time, the median call (prefill of the
  P-token prompts + T new tokens, no EOS: every row runs to T), the same programs built for
  one new token (prefill + first token), and the machine's f32 GEMM peak (`--gemm-size`).
- torch: `model.generate(input_ids, attention_mask, do_sample=False, num_beams=1,
  max_new_tokens=T, min_new_tokens=T, use_cache=True)` on R prompts of exactly P random token
  ids (B distinct prompts, each repeated R / B times, as the bench's rows are; the ids differ
  from the bench's, which does not change the work of a full-length decode), the model loaded
  from the same GGUF file with `gguf_file=` (transformers dequantizes it to f32; the bf16
  model is that model cast with `.to(torch.bfloat16)`), `torch.set_num_threads(--threads)`.
  Only the `generate` call is timed (`time.perf_counter` around it), after one untimed
  warm-up per dtype and rows (the same prompts, two new tokens); each output is checked to be exactly P + T long. Then the same
  call with `max_new_tokens=1` (prefill + first token), also timed.

Both sides count the same thing: **tokens/s = R × T / seconds of one whole decode call**
(prefill included in the seconds, prompt tokens not counted as tokens). shardes' figure is
the bench's own (`n × B × T` over the median call of its `--shardes-generations` calls).

The per-token step: `step = (full call − prefill-and-first-token call) / (T − 1)`, the
mean time of one of the steps that produce tokens 2..T (shardes computes it as `step_ms`
in its JSON; the script does the same for torch). Its useful FLOPs, per row, for a LLaMA
decoder (L layers, width d, H heads, K KV heads, head dim h, MLP width F, vocabulary V):

    2 × [L × (d·H·h + 2·d·K·h + H·h·d + 3·d·F) + d·V]  each weight matrix once: q, k, v,
                                                      o, gate, up, down, and the head
  + L × 4·H·h·c                                       q·kᵀ and p·v over c cached positions

with c = P + T/2, the mean context over the timed steps (the step producing token k attends
over P + k − 1 positions). Norms, RoPE, softmax, the embedding lookup and the ES's low-rank
perturbation are not counted, nor the masked slots a static-shape cache attends over: this
is the model's arithmetic, the same count for every column. SmolLM2-135M: 134.5 M weights
touched, about 0.27 GFLOP per row per token. GFLOP/s = R × that / step seconds, and its
fraction of the f32 GEMM peak that `shardes bench` measured in the same run (for torch bf16
the fraction is against that f32 peak too: indicative only).

Rounds: each round runs, for every R, shardes then torch (odd rounds: torch then shardes),
so load drift hits both sides; every figure in the table is the median over rounds, and the
JSON keeps every round's numbers, the load averages and the versions.

Run it on an idle machine (nothing else compiling or running: `uptime`'s load average near
0; the load is recorded before each measurement), from a virtualenv outside the repository,
with a release binary:

    cargo build --release -p shardes-cli
    /work/hfvenv/bin/python tools/decode_side_by_side.py --rows 64 256 --prompt-len 96 \\
        --new-tokens 64 --rounds 3 --out /tmp/decode_side_by_side.md

(defaults: `--threads` = the cores this process may use, `--torch-dtypes f32 bf16`,
`--shardes-dtypes f32`, `--shardes target/release/shardes`, `--config
benches/decode_smollm2.toml`, `--gemm-size 1024`, and per `shardes bench` run
`--shardes-warmup 1 --shardes-generations 1`: a cold first call skews the step time). It
writes the markdown table to --out, the JSON next to it (`.json`), and prints the table. At
the docs' 64-row timings (about a minute per 64-row decode call on either side), a round of
64 and 256 rows is of the order of half an hour on the 2-core machine. A quick check that it
works: `--rows 8 --prompt-len 8 --new-tokens 4 --rounds 1`.

Pinned versions (`pip freeze`; the script refuses others unless `--any-versions`):

    torch==2.15.0 transformers==5.24.0 gguf==0.19.0 accelerate==1.16.0 numpy==2.4.6
    tokenizers==0.23.3 safetensors==0.8.0

    python3 -m venv /work/hfvenv
    /work/hfvenv/bin/pip install transformers==5.24.0 gguf==0.19.0 accelerate==1.16.0 \\
        tokenizers==0.23.3 safetensors==0.8.0 numpy==2.4.6
    /work/hfvenv/bin/pip install torch==2.15.0

(loading a GGUF in transformers needs `gguf` and `accelerate`). The GGUF file is the one
`shardes models` lists as cached for the config's `pretrained` name (`--gguf` overrides).
"""

import argparse
import copy
import importlib.metadata
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

PINNED = {
    "torch": "2.15.0",
    "transformers": "5.24.0",
    "gguf": "0.19.0",
    "accelerate": "1.16.0",
    "numpy": "2.4.6",
}

REPO = Path(__file__).resolve().parent.parent


def versions():
    out = {}
    for name in PINNED:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def check_versions(allow_any):
    got = versions()
    # A local build tag (`2.15.0+cu132`) is the same release.
    bad = {k: v for k, v in got.items() if (v or "").split("+")[0] != PINNED[k]}
    if bad and not allow_any:
        sys.exit(
            f"versions differ from the pinned ones: {bad} (pinned {PINNED}); "
            "install the pinned versions or pass --any-versions"
        )
    return got


def cpu_info():
    """The CPU's model name and whether it has AVX-512 BF16 / AMX (from /proc/cpuinfo)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {"cpu": platform.processor() or platform.machine()}
    name = next((ln.split(":", 1)[1].strip() for ln in text.splitlines()
                 if ln.startswith("model name")), platform.machine())
    flags = next((ln.split(":", 1)[1].split() for ln in text.splitlines()
                  if ln.startswith("flags")), [])
    return {"cpu": name, "bf16_flags": [f for f in flags if "bf16" in f or f.startswith("amx")]}


def load_avg():
    return [round(x, 2) for x in os.getloadavg()]


# ---------------------------------------------------------------- the bench config


def toml_value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # a TOML basic string is JSON's string syntax
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    raise ValueError(f"cannot write {v!r} as TOML")


def toml_dump(table):
    """Top-level keys, then one level of tables (and their own sub-tables)."""

    def emit(prefix, t, lines):
        for k, v in t.items():
            if not isinstance(v, dict):
                lines.append(f"{k} = {toml_value(v)}")
        for k, v in t.items():
            if isinstance(v, dict):
                name = f"{prefix}.{k}" if prefix else k
                lines.append("")
                lines.append(f"[{name}]")
                emit(name, v, lines)

    lines = []
    emit("", table, lines)
    return "\n".join(lines) + "\n"


def bench_config(base, rows, per_member, prompt_len, new_tokens, dtype):
    cfg = copy.deepcopy(base)
    if rows % per_member:
        sys.exit(f"--rows {rows} is not a multiple of {per_member} prompts per member")
    cfg["decode"]["batch"] = per_member
    cfg["decode"]["prompt_len"] = prompt_len
    cfg["decode"]["max_new"] = new_tokens
    cfg["decode"]["compute_dtype"] = dtype
    cfg["es"]["n"] = rows // per_member
    return cfg


def gguf_path(shardes, base, override):
    if override:
        return Path(override).expanduser()
    name = base["decode"].get("pretrained")
    if not name:
        sys.exit("the config has no decode.pretrained: pass --gguf")
    if name.endswith(".gguf"):
        return Path(name).expanduser()
    listing = subprocess.run(
        [shardes, "models"], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    for i, line in enumerate(listing):
        if line.strip() == name:
            for follow in listing[i + 1 : i + 6]:
                if "cached" in follow and ": " in follow:
                    return Path(follow.split(": ", 1)[1].strip())
    sys.exit(f"`shardes models` lists no cached file for {name}: fetch it or pass --gguf")


def run_shardes(args, cfg, tmp, tag):
    path = Path(tmp) / f"{tag}.toml"
    path.write_text(
        f"# written by tools/decode_side_by_side.py from {args.config}\n" + toml_dump(cfg)
    )
    out_json = Path(tmp) / f"{tag}.json"
    cmd = [
        str(args.shardes),
        "bench",
        str(path),
        "--generations",
        str(args.shardes_generations),
        "--warmup",
        str(args.shardes_warmup),
        "--gemm-size",
        str(args.gemm_size),
        "--json",
        str(out_json),
    ]
    load = load_avg()
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    r = json.loads(out_json.read_text())
    print(p.stdout, end="", flush=True)
    return {
        "command": cmd,
        "load_before": load,
        "wall_s": round(wall, 1),
        "es_tokens_per_s": r["es"]["tokens_per_s"],
        "plain_tokens_per_s": r["plain"]["tokens_per_s"],
        "es_call_ms": r["es"]["call_ms"]["median"],
        "plain_call_ms": r["plain"]["call_ms"]["median"],
        "es_step_ms": r["es"].get("step_ms"),
        "plain_step_ms": r["plain"].get("step_ms"),
        "es_compile_s": r["es"]["compile_ms"] / 1e3,
        "plain_compile_s": r["plain"]["compile_ms"] / 1e3,
        "gemm_peak_gflops": r.get("gemm_peak_gflops", 0.0),
        "member_chunk": r["member_chunk"],
        "peak_rss_mib": r["peak_rss_bytes"] / 2**20,
        "report": r,
    }


# ---------------------------------------------------------------- torch


def torch_prompts(torch, rows, per_member, prompt_len, vocab, seed):
    g = torch.Generator().manual_seed(seed)
    distinct = torch.randint(0, vocab, (per_member, prompt_len), generator=g)
    return distinct.repeat(rows // per_member, 1)


def generate(torch, model, ids, new_tokens, pad):
    mask = torch.ones_like(ids)
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=False,
            num_beams=1,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            use_cache=True,
            pad_token_id=pad,
        )
    dt = time.perf_counter() - t0
    if tuple(out.shape) != (ids.shape[0], ids.shape[1] + new_tokens):
        sys.exit(f"generate returned {tuple(out.shape)}, not a full-length decode")
    return dt


def run_torch(torch, model, ids, new_tokens, pad):
    load = load_avg()
    full = generate(torch, model, ids, new_tokens, pad)
    one = generate(torch, model, ids, 1, pad) if new_tokens > 1 else full
    rows = ids.shape[0]
    return {
        "load_before": load,
        "call_s": full,
        "prefill_s": one,
        "tokens_per_s": rows * new_tokens / full,
        "step_ms": (full - one) / (new_tokens - 1) * 1e3 if new_tokens > 1 else None,
    }


# ---------------------------------------------------------------- FLOPs


def step_flops_per_row(c, prompt_len, new_tokens):
    """Useful FLOPs of one decode step for one row (see the module docstring)."""
    d = c.hidden_size
    L = c.num_hidden_layers
    H = c.num_attention_heads
    K = c.num_key_value_heads
    h = getattr(c, "head_dim", None) or d // H
    F = c.intermediate_size
    V = c.vocab_size
    weights = L * (d * H * h + 2 * d * K * h + H * h * d + 3 * d * F) + d * V
    ctx = prompt_len + new_tokens / 2
    return 2 * weights + L * 4 * H * h * ctx, weights


# ---------------------------------------------------------------- the table


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def fmt(x, spec=".0f"):
    return "–" if x is None else format(x, spec)


def ratio(a, b):
    return None if a is None or not b else a / b


def tables(results, args, flops_row, weights):
    lines = []
    torch_cols = [f"torch {d}" for d in args.torch_dtypes]
    head = (
        ["rows", "shardes dtype", "shardes ES", "shardes plain"]
        + torch_cols
        + ["ES/plain", "plain/torch f32", "ES/torch f32", "ES/best torch"]
        + ["ES compile s", "plain compile s"]
    )
    lines.append(
        f"tokens/s = rows × {args.new_tokens} new tokens / seconds of one whole decode call "
        f"(prefill of {args.prompt_len}-token prompts included); medians over "
        f"{args.rounds} round(s), alternating shardes and torch; torch threads "
        f"{args.threads}."
    )
    lines.append("")
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "---|" * len(head))
    for res in results:
        tq = {d: med([r["tokens_per_s"] for r in res["torch"][d]]) for d in args.torch_dtypes}
        best = max((v for v in tq.values() if v), default=None)
        for sd in args.shardes_dtypes:
            s = res["shardes"][sd]
            es = med([r["es_tokens_per_s"] for r in s])
            plain = med([r["plain_tokens_per_s"] for r in s])
            tf32 = tq.get("f32")
            row = (
                [str(res["rows"]), sd, fmt(es, ".1f"), fmt(plain, ".1f")]
                + [fmt(tq[d], ".1f") for d in args.torch_dtypes]
                + [
                    fmt(ratio(es, plain), ".3f"),
                    fmt(ratio(plain, tf32), ".3f"),
                    fmt(ratio(es, tf32), ".3f"),
                    fmt(ratio(es, best), ".3f"),
                    fmt(med([r["es_compile_s"] for r in s]), ".1f"),
                    fmt(med([r["plain_compile_s"] for r in s]), ".1f"),
                ]
            )
            lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    lines.append(
        f"The per-token step: (whole call − prefill-and-first-token call) / "
        f"({args.new_tokens} − 1); useful FLOPs per row per step = 2 × {weights / 1e6:.1f} M "
        f"weights + attention over {args.prompt_len} + {args.new_tokens}/2 positions = "
        f"{flops_row / 1e6:.1f} MFLOP. GEMM peak: f32, `shardes bench --gemm-size "
        f"{args.gemm_size}` in the same run (median over rounds)."
    )
    lines.append("")
    head2 = ["rows", "decode", "step ms", "GFLOP per step", "GFLOP/s", "GEMM peak GFLOP/s",
             "of GEMM peak"]
    lines.append("| " + " | ".join(head2) + " |")
    lines.append("|" + "---|" * len(head2))
    for res in results:
        gflop = res["rows"] * flops_row / 1e9
        peaks = [r["gemm_peak_gflops"] for sd in args.shardes_dtypes for r in res["shardes"][sd]]
        peak = med([p for p in peaks if p])
        entries = []
        for sd in args.shardes_dtypes:
            s = res["shardes"][sd]
            entries.append((f"shardes ES {sd}", med([r["es_step_ms"] for r in s])))
            entries.append((f"shardes plain {sd}", med([r["plain_step_ms"] for r in s])))
        for d in args.torch_dtypes:
            entries.append((f"torch {d}", med([r["step_ms"] for r in res["torch"][d]])))
        for name, ms in entries:
            # A step at or below 0 ms is noise larger than T − 1 steps: no rate.
            rate = gflop / (ms / 1e3) if ms and ms > 0 else None
            frac = ratio(rate, peak)
            lines.append(
                "| "
                + " | ".join(
                    [str(res["rows"]), name, fmt(ms, ".1f"), fmt(gflop, ".2f"), fmt(rate, ".1f"),
                     fmt(peak, ".1f"), "–" if frac is None else f"{100 * frac:.1f}%"]
                )
                + " |"
            )
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- main


def main():
    cores = len(os.sched_getaffinity(0))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--prompt-len", type=int, default=96)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=cores, help="torch threads (default: cores)")
    ap.add_argument("--torch-dtypes", nargs="+", default=["f32", "bf16"], choices=["f32", "bf16"])
    ap.add_argument("--shardes-dtypes", nargs="+", default=["f32"], choices=["f32", "bf16"])
    ap.add_argument("--shardes", type=Path, default=REPO / "target/release/shardes")
    ap.add_argument("--config", type=Path, default=REPO / "benches/decode_smollm2.toml")
    ap.add_argument("--prompts-per-member", type=int, default=None,
                    help="B (default: the config's decode.batch); members = rows / B")
    ap.add_argument("--shardes-generations", type=int, default=1,
                    help="timed calls per shardes bench run (its --generations)")
    ap.add_argument("--shardes-warmup", type=int, default=1,
                    help="untimed calls per shardes bench run (its --warmup)")
    ap.add_argument("--gemm-size", type=int, default=1024,
                    help="shardes bench --gemm-size (0: no GEMM peak)")
    ap.add_argument("--plugin", default=None,
                    help="the shardes bench config's plugin (e.g. cpu-jax; default: the config's)")
    ap.add_argument("--gguf", default=None, help="the model file for torch")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None,
                    help="markdown table here, the JSON beside it (.json)")
    ap.add_argument("--any-versions", action="store_true")
    args = ap.parse_args()

    got = check_versions(args.any_versions)
    import torch
    from transformers import AutoModelForCausalLM

    if not args.shardes.exists():
        sys.exit(f"{args.shardes}: build it with `cargo build --release -p shardes-cli`")
    base = tomllib.loads(args.config.read_text())
    if args.plugin:
        base["plugin"] = args.plugin
    per_member = args.prompts_per_member or base["decode"]["batch"]
    for r in args.rows:
        if r % per_member:
            sys.exit(f"--rows {r} is not a multiple of {per_member} prompts per member")
    gguf = gguf_path(str(args.shardes), base, args.gguf)
    torch.set_num_threads(args.threads)
    load0 = load_avg()
    if load0[0] > 0.5:
        print(f"warning: load average {load0}: the machine is not idle", file=sys.stderr)

    t0 = time.perf_counter()
    f32 = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                               dtype=torch.float32)
    f32.eval()
    models = {}
    for d in args.torch_dtypes:
        models[d] = f32 if d == "f32" else copy.deepcopy(f32).to(torch.bfloat16)
    if "f32" not in args.torch_dtypes:
        del f32
    print(f"torch: loaded {gguf.name} in {time.perf_counter() - t0:.1f} s", flush=True)
    config = next(iter(models.values())).config
    pad = config.pad_token_id if config.pad_token_id is not None else 0
    flops_row, weights = step_flops_per_row(config, args.prompt_len, args.new_tokens)

    results = [
        {
            "rows": r,
            "members": r // per_member,
            "prompts_per_member": per_member,
            "shardes": {d: [] for d in args.shardes_dtypes},
            "torch": {d: [] for d in args.torch_dtypes},
        }
        for r in args.rows
    ]
    with tempfile.TemporaryDirectory(prefix="decode_side_by_side_") as tmp:
        for rnd in range(args.rounds):
            for res in results:
                rows = res["rows"]
                ids = torch_prompts(torch, rows, per_member, args.prompt_len,
                                    config.vocab_size, args.seed)

                def shardes_side():
                    for sd in args.shardes_dtypes:
                        cfg = bench_config(base, rows, per_member, args.prompt_len,
                                           args.new_tokens, sd)
                        print(f"round {rnd + 1}: shardes bench, {rows} rows, {sd}", flush=True)
                        res["shardes"][sd].append(
                            run_shardes(args, cfg, tmp, f"r{rows}_{sd}_{rnd}"))

                def torch_side():
                    for d, m in models.items():
                        if rnd == 0:
                            # The untimed warm-up: these rows and prompts, two new tokens.
                            generate(torch, m, ids, 2, pad)
                        print(f"round {rnd + 1}: torch generate, {rows} rows, {d}", flush=True)
                        t = run_torch(torch, m, ids, args.new_tokens, pad)
                        print(f"  {t['tokens_per_s']:.1f} tokens/s ({t['call_s']:.1f} s)",
                              flush=True)
                        res["torch"][d].append(t)

                sides = [shardes_side, torch_side]
                for side in sides if rnd % 2 == 0 else reversed(sides):
                    side()

    table = tables(results, args, flops_row, weights)
    print()
    print(table, end="")
    if args.out:
        args.out.write_text(table)
        rev = subprocess.run(["git", "-C", str(REPO), "describe", "--always", "--dirty"],
                             capture_output=True, text=True).stdout.strip()
        report = {
            "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "command": sys.argv,
            "git": rev,
            "versions": got,
            "python": platform.python_version(),
            "machine": {"cores": cores, **cpu_info(),
                        "load_at_start": load0, "load_at_end": load_avg(),
                        "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY")},
            "gguf": str(gguf),
            "flops_per_row_step": flops_row,
            "weights_touched_per_token": weights,
            "results": results,
        }
        js = args.out.with_suffix(".json")
        js.write_text(json.dumps(report, indent=1))
        print(f"wrote {args.out} and {js}")


if __name__ == "__main__":
    main()
