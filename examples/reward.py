#!/usr/bin/env python3
"""A reward program for shardes ([task.reward] command = ["python3", "examples/reward.py"]).

Python's standard library only. shardes starts it once per run and writes one JSON request
per completion on its stdin:

    {"id": 17, "member": 3, "prompt_index": 1, "prompt": "...", "completion": "...",
     "item": {...the task item's fields...}}

and reads one answer line per request on its stdout: {"id": 17, "reward": 1.0}. Answers
may come in any order (shardes matches them by id); flush after each one. Anything written
on stderr is kept (the last 20 lines) and shown if the program dies.

Rewards:
- a jsonl item ({"prompt", "answer", ...}): 1.0 when the answer given matches the item's
  "answer" (the trimmed body of the first <answer>...</answer>, else the last number of
  the completion; numbers compare by value, so "1,000.50" matches "1000.5"), else a
  format bonus (--format-bonus, default 0.1) when the completion has a closed
  <answer>...</answer>, else 0. With --format-bonus 0 this is the built-in exact match.
- a countdown item ({"numbers", "target", ...}): 1.0 when the first <answer>...</answer>
  is an arithmetic expression using given numbers at most once each and equal to the
  target, the bonus when it is only well formed (digits, + - * / ( ) and spaces), else 0.
"""

import argparse
import ast
import json
import re
import sys
from fractions import Fraction

NUMBER_PART = re.compile(r"[0-9.,]")


def answer_tag(text):
    """The body of the first <answer> up to the first </answer> after it, or None."""
    start = text.find("<answer>")
    if start < 0:
        return None
    start += len("<answer>")
    stop = text.find("</answer>", start)
    return None if stop < 0 else text[start:stop]


def last_number(text):
    """The last run of digits, commas and dots around a digit, with a leading '-' unless
    the '-' follows a digit (as the built-in reward reads it)."""
    last = max((i for i, c in enumerate(text) if c.isascii() and c.isdigit()), default=-1)
    if last < 0:
        return None
    part = lambda c: c.isascii() and (c.isdigit() or c in ",.")
    start, stop = last, last + 1
    while start > 0 and part(text[start - 1]):
        start -= 1
    while stop < len(text) and part(text[stop]):
        stop += 1
    while not text[start].isdigit():
        start += 1
    while not text[stop - 1].isdigit():
        stop -= 1
    if start > 0 and text[start - 1] == "-" and (start < 2 or not text[start - 2].isdigit()):
        start -= 1
    return text[start:stop]


def canonical(s):
    """A number's canonical decimal text, or None when s is not a number."""
    m = re.fullmatch(r"([+-]?)((?:\d{1,3}(?:,\d{3})+)|\d+)(?:\.(\d+))?", s)
    if not m:
        return None
    sign, whole, frac = m.group(1), m.group(2).replace(",", ""), (m.group(3) or "")
    whole, frac = whole.lstrip("0") or "0", frac.rstrip("0")
    out = whole + ("." + frac if frac else "")
    return "-" + out if sign == "-" and out != "0" else out


def matches(got, want):
    got, want = got.strip(), want.strip()
    a, b = canonical(got), canonical(want)
    return a == b if a is not None and b is not None else got == want


def jsonl_reward(item, completion, bonus):
    body = answer_tag(completion)
    got = body.strip() if body is not None else last_number(completion)
    if got is not None and matches(got, str(item["answer"])):
        return 1.0
    return bonus if body is not None else 0.0


def evaluate(node, used):
    """The exact value of an expression of + - * / and integer literals."""
    if isinstance(node, ast.Expression):
        return evaluate(node.body, used)
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        used.append(node.value)
        return Fraction(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in (ast.Add, ast.Sub, ast.Mult, ast.Div):
        a, b = evaluate(node.left, used), evaluate(node.right, used)
        if isinstance(node.op, ast.Add):
            return a + b
        if isinstance(node.op, ast.Sub):
            return a - b
        if isinstance(node.op, ast.Mult):
            return a * b
        if b == 0:
            raise ValueError("division by zero")
        return a / b
    raise ValueError("not an arithmetic expression")


def countdown_reward(item, completion, bonus):
    body = answer_tag(completion)
    if body is None or not body.strip():
        return 0.0
    body = body.strip()
    if not re.fullmatch(r"[0-9+\-*/()\s]+", body):
        return 0.0
    if len(body) > 1000:
        return bonus
    try:
        used = []
        value = evaluate(ast.parse(body, mode="eval"), used)
    except (SyntaxError, ValueError, RecursionError):
        return bonus
    left = list(item["numbers"])
    for n in used:
        if n not in left:
            return bonus
        left.remove(n)
    return 1.0 if value == item["target"] else bonus


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--format-bonus", type=float, default=0.1)
    args = p.parse_args()
    # EOF on stdin: the run ended (or died); exit rather than linger.
    for line in sys.stdin:
        req = json.loads(line)
        item, completion = req["item"], req["completion"]
        try:
            if "numbers" in item and "target" in item:
                r = countdown_reward(item, completion, args.format_bonus)
            else:
                r = jsonl_reward(item, completion, args.format_bonus)
        except Exception as e:  # one bad completion must not end the program
            print(f"reward failed for id {req['id']}: {e!r}", file=sys.stderr, flush=True)
            r = 0.0
        sys.stdout.write(json.dumps({"id": req["id"], "reward": r}) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
