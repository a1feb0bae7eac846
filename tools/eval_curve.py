#!/usr/bin/env python3
"""Prints a run's held-out curve as a Markdown table: `eval.jsonl` of `shardes run` with a
Countdown `[task]` (standard library only).

    python3 tools/eval_curve.py runs/countdown_smollm2 [runs/countdown_smollm2/metrics.jsonl]

Per evaluation: the generation, the held-out mean reward with its standard error, the
format rate and the accuracy. Countdown's rewards are 1 (correct), 0.1 (well formed, wrong)
and 0, so the standard error follows from the three rates exactly:
E[r^2] = accuracy + 0.01 (format - accuracy), var = E[r^2] - mean^2, SE = sqrt(var / n).
With the metrics file, also the median seconds per generation (its `ms`).
"""

import json
import math
import statistics
import sys
from pathlib import Path


def main() -> None:
    out = Path(sys.argv[1])
    rows = [json.loads(line) for line in (out / "eval.jsonl").read_text().splitlines() if line.strip()]
    print("| generation | mean reward ± SE | format rate | accuracy | held-out prompts |")
    print("|---|---|---|---|---|")
    first = None
    for r in rows:
        n, mean = r["prompts"], r["mean_reward"]
        acc, fmt = r["accuracy"], r["format_rate"]
        second = acc + 0.01 * (fmt - acc)
        se = math.sqrt(max(second - mean * mean, 0.0) / max(n, 1))
        first = first or (mean, se)
        print(f"| {r['generation']} | {mean:.4f} ± {se:.4f} | {fmt:.3f} | {acc:.3f} | {n} |")
    if first and rows:
        last = rows[-1]
        n = last["prompts"]
        second = last["accuracy"] + 0.01 * (last["format_rate"] - last["accuracy"])
        se_last = math.sqrt(max(second - last["mean_reward"] ** 2, 0.0) / max(n, 1))
        rise = last["mean_reward"] - first[0]
        # The two evaluations decode the same held-out prompts; the SE of the difference is
        # bounded by the sum of the two SEs (independence would give the root of squares).
        print()
        ratio = f"{rise / (2 * se_last):.2f}" if se_last > 0 else "n/a (no spread)"
        print(f"rise {rise:+.4f}, SE of the last {se_last:.4f}, rise / (2 SE) = {ratio}")
    metrics = out / "metrics.jsonl"
    if metrics.is_file():
        ms = [json.loads(l).get("ms") for l in metrics.read_text().splitlines() if l.strip()]
        ms = [m for m in ms if isinstance(m, (int, float))]
        if ms:
            print(f"median seconds per generation: {statistics.median(ms) / 1000:.1f} "
                  f"({len(ms)} generations)")


if __name__ == "__main__":
    main()
