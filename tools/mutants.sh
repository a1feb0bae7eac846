#!/usr/bin/env bash
# Mutation testing of the ES core and the PRNG with cargo-mutants, within a time budget.
#
#   tools/mutants.sh [BUDGET_MINUTES]     # default 60; results in mutants.out/
#
# Each target file is mutated on its own and tested with the tests that can kill its
# mutants (the XLA-backed tests live in the root package, so they are named explicitly;
# running the whole workspace per mutant would take hours on 2 cores). Survivors are listed
# in mutants.out/*/mutants.out/missed.txt: each must be killed by a new test or explained in
# docs/mutants.md (equivalent mutant).
set -euo pipefail
cd "$(dirname "$0")/.."
budget_min=${1:-60}
command -v cargo-mutants >/dev/null 2>&1 || cargo install cargo-mutants --locked
deadline=$(( $(date +%s) + budget_min * 60 ))
# cargo-mutants tests a copy of the tree under $TMPDIR; the tests read ../shared/ next to the
# checkout, so the copy gets the same neighbour.
work=$(mktemp -d "${TMPDIR:-/tmp}/shardes-mutants.XXXXXX")
ln -s "$(cd .. && pwd)/shared" "$work/shared"
export TMPDIR=$work

run() {  # run NAME FILE TEST-ARGS...: mutate FILE, kill with the given cargo test args
  local name=$1 file=$2; shift 2
  local left=$(( deadline - $(date +%s) ))
  if [ "$left" -le 60 ]; then echo "mutants: budget spent before $name"; return; fi
  echo "mutants: $name ($file), $((left / 60)) min left"
  mkdir -p "mutants.out/$name"
  timeout "$left" cargo mutants --no-shuffle -p shardes-hlo -f "$file" \
    --output "mutants.out/$name" --timeout 300 "$@" || true
}

# The root-package targets below name tests of the `shardes` package; cargo-mutants 27 runs
# its baseline with `--package shardes-hlo` and those names, which fails, so the baseline is
# checked here instead and skipped there.
root() {  # root NAME FILE TEST...: mutate FILE, kill with the root package's tests TEST...
  # (files of the one test binary tests/suite/: each TEST is a module filter, `TEST::`)
  local name=$1 file=$2; shift 2
  local tests=(--test suite --)
  for t in "$@"; do tests+=("$t::"); done
  if [ "$(( deadline - $(date +%s) ))" -le 60 ]; then echo "mutants: budget spent before $name"; return; fi
  if ! cargo test -p shardes "${tests[@]}" >/dev/null 2>&1; then
    echo "mutants: $name: the unmutated tests ($*) fail; fix them first"; return
  fi
  run "$name" "$file" --baseline skip --test-package shardes -- "${tests[@]}"
}

# Unit-tested in the crate itself (fast).
run spec crates/shardes-hlo/src/es/spec.rs
# Host PRNG: the JAX vectors.
root prng_host crates/shardes-hlo/src/prng/host.rs prng_vectors
# Emitted PRNG, shaping, seams, program: through XLA.
root prng_emit crates/shardes-hlo/src/prng/emit.rs prng_emitted es_noise
root shaping crates/shardes-hlo/src/es/shaping.rs es_shaping
root strategy crates/shardes-hlo/src/es/strategy.rs es_noise es_api es_gen0
root seams crates/shardes-hlo/src/nn.rs es_gen0 es_program
root program crates/shardes-hlo/src/es/program.rs es_gen0 es_update es_split es_api

rm -rf "$work"
# cargo-mutants writes DIR/mutants.out/{caught,missed,unviable,timeout}.txt.
count() { wc -l < "$1" 2>/dev/null || echo 0; }
for d in mutants.out/*/mutants.out; do
  [ -d "$d" ] || continue
  name=$(basename "$(dirname "$d")")
  printf '%-12s caught %4s  missed %4s  unviable %4s  timeout %4s\n' "$name" \
    "$(count "$d/caught.txt")" "$(count "$d/missed.txt")" "$(count "$d/unviable.txt")" "$(count "$d/timeout.txt")"
done
