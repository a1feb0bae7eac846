#!/usr/bin/env bash
# Where a generation's time goes, by XLA:CPU kernel (fusion, dot, runtime function).
#
#   tools/profile.sh CONFIG [SECONDS] [GENERATIONS]
#
# Runs `shardes run` on a copy of CONFIG (its out directory moved to a temporary one and
# `run.generations` set to GENERATIONS, default 400), waits for the compile, samples the
# running process with `perf record` for SECONDS (default 10), then resolves the JIT
# addresses through gdb while the process is still alive: XLA:CPU registers each compiled
# object with gdb's JIT interface, so `info symbol` names the fusion (`multiply_tanh_fusion`,
# ...). Prints the share of samples per kernel; match the names against the optimized HLO
# (`XLA_FLAGS=--xla_dump_to=DIR --xla_dump_hlo_as_text shardes hlo CONFIG --optimized`,
# file `*.generation.cpu_after_optimizations.txt`).
#
# With PROFILE_BENCH=1 it profiles `shardes bench CONFIG --generations GENERATIONS` instead
# (a decode bench: the ES decode's timed calls come first), sampling after PROFILE_WAIT
# seconds (default 30: the load and the compile), e.g.
#   PROFILE_BENCH=1 PROFILE_WAIT=40 tools/profile.sh benches/decode_smollm2.toml 20 50
#
# Addresses gdb cannot name are JIT code outside XLA's objects (oneDNN's GEMM kernels);
# they are grouped per 64 KiB page. Needs perf (perf_event_paranoid ≤ 2), gdb and python3;
# the build is `cargo build --release -p shardes-cli`.
set -euo pipefail

cfg=${1:?usage: tools/profile.sh CONFIG [SECONDS] [GENERATIONS]}
secs=${2:-10}
gens=${3:-400}
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${CARGO_TARGET_DIR:-$root/target}/release/shardes
for tool in perf gdb python3; do
  command -v "$tool" >/dev/null || { echo "profile.sh: $tool is not installed" >&2; exit 2; }
done
[ -x "$bin" ] || { echo "profile.sh: no $bin; run cargo build --release -p shardes-cli" >&2; exit 2; }

work=$(mktemp -d)
trap 'kill "$pid" 2>/dev/null || true; rm -rf "$work"' EXIT
sed -e "s#^out *=.*#out = \"$work/run\"#" -e "s#^generations *=.*#generations = $gens#" "$cfg" >"$work/config.toml"

if [ "${PROFILE_BENCH:-0}" = 1 ]; then
  "$bin" bench "$cfg" --generations "$gens" --warmup 0 --gemm-size 0 >"$work/run.log" 2>&1 &
  pid=$!
  sleep "${PROFILE_WAIT:-30}"
  kill -0 "$pid" 2>/dev/null || { cat "$work/run.log" >&2; exit 1; }
else
  "$bin" run "$work/config.toml" --force >"$work/run.log" 2>&1 &
  pid=$!
  # Sample only once the generations run: wait for the first progress line after the compile.
  for _ in $(seq 600); do
    grep -q "^gen 1/" "$work/run.log" 2>/dev/null && break
    kill -0 "$pid" 2>/dev/null || { cat "$work/run.log" >&2; exit 1; }
    sleep 0.5
  done
fi
perf record -p "$pid" -o "$work/perf.data" -- sleep "$secs" >/dev/null 2>&1
kill -0 "$pid" 2>/dev/null || { echo "profile.sh: the run ended before sampling did; raise GENERATIONS" >&2; exit 1; }
perf report -i "$work/perf.data" --no-children --sort sym -g none 2>/dev/null |
  awk '/%/ && n++ < 2000' >"$work/top.txt"
grep -o '0x[0-9a-f]*' "$work/top.txt" >"$work/addrs.txt" || true
gdb_args=()
while read -r a; do gdb_args+=(-ex "info symbol $a"); done <"$work/addrs.txt"
gdb -p "$pid" -batch "${gdb_args[@]}" 2>/dev/null | grep -E ' in section |No symbol' >"$work/syms.txt" || true
kill "$pid" 2>/dev/null || true

python3 - "$work" <<'EOF'
import collections, re, sys
work = sys.argv[1]
top = open(f"{work}/top.txt").read().splitlines()
addrs = open(f"{work}/addrs.txt").read().split()
syms = open(f"{work}/syms.txt").read().splitlines()
by_addr, named = {}, collections.Counter()
for line in top:
    m = re.match(r"\s*([\d.]+)%\s+\[.\]\s+(.*)", line)
    if not m:
        continue
    pct, sym = float(m.group(1)), m.group(2).strip()
    if sym.startswith("0x"):
        by_addr[sym] = pct
    else:
        named[sym[:70]] += pct
kernels = collections.Counter()
for a, s in zip(addrs, syms):
    name = f"(unnamed JIT code @{int(a, 16) >> 16:#x}xxxx)" if "No symbol" in s else s.split(" + ")[0]
    kernels[name] += by_addr.get(a, 0.0)
print(f"{'share':>7}  kernel (XLA JIT objects: {sum(kernels.values()):.1f}% of samples)")
for k, v in kernels.most_common(25):
    print(f"{v:6.2f}%  {k}")
print(f"{'share':>7}  function in a library ({sum(named.values()):.1f}% of samples)")
for k, v in named.most_common(10):
    print(f"{v:6.2f}%  {k}")
EOF
