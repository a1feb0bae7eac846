#!/usr/bin/env bash
# Real-hardware validation: runs the device-count invariance check and the quickstart through
# the accelerator's PJRT plugin and writes validation/report.json.
#
#   validation/run.sh          # CUDA GPU or TPU if present; otherwise skips with a message
#   validation/run.sh --cpu    # dry run on the provisioned CPU plugin with 8 simulated devices
#
# Plugins come from the Python package registry through pip, pinned, into validation/.venv:
#   CUDA: jax-cuda12-pjrt + jax-cuda12-plugin[with_cuda] (the NVIDIA runtime packages)
#   TPU:  libtpu
# and shardes finds them there through `--plugin cuda` / `--plugin tpu` with
# SHARDES_PYTHON=validation/.venv/bin/python (the same lookup as `plugin = "cuda"` in a config).
set -euo pipefail
cd "$(dirname "$0")/.."
out=validation/report.json
CUDA_PJRT="jax-cuda12-pjrt==0.12.0.1"
CUDA_LIBS="jax-cuda12-plugin[with_cuda]==0.12.0.1"
TPU_PJRT="libtpu==0.0.51"

skip() {
  echo "validation: $1; skipping (nothing was run). Run it on a machine with an accelerator, or use --cpu for a dry run."
  printf '{"skipped": true, "reason": "%s"}\n' "$1" > "$out"
  exit 0
}

venv() {
  if [ ! -x validation/.venv/bin/python ]; then
    python3 -m venv validation/.venv
  fi
  validation/.venv/bin/python -m pip install --quiet "$@"
}

find_so() {  # find_so GLOB: the first matching file inside the venv
  find validation/.venv -name "$1" -type f | head -n 1
}

args=()
if [ "${1:-}" = "--cpu" ]; then
  plugin=""   # default discovery: xla_extension/, then the provisioned CPU plugin
  args=(--cpu-devices 8)
elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q GPU; then
  echo "validation: $(nvidia-smi -L | wc -l) NVIDIA GPU(s) found; provisioning the CUDA plugin"
  venv "$CUDA_PJRT" "$CUDA_LIBS"
  [ -n "$(find_so 'xla_cuda_plugin.so')" ] || { echo "validation: the CUDA plugin was not found in validation/.venv after pip install"; exit 1; }
  plugin=cuda
elif ls /dev/accel* >/dev/null 2>&1 || ls /dev/vfio/[0-9]* >/dev/null 2>&1; then
  echo "validation: TPU devices found; provisioning libtpu"
  venv "$TPU_PJRT"
  [ -n "$(find_so 'libtpu.so')" ] || { echo "validation: libtpu.so was not found in validation/.venv after pip install"; exit 1; }
  plugin=tpu
else
  skip "no GPU (nvidia-smi lists none) and no TPU (/dev/accel*) on this machine"
fi
if [ -n "$plugin" ]; then
  echo "validation: plugin $plugin (from validation/.venv)"
  export SHARDES_PYTHON="$PWD/validation/.venv/bin/python"
  args+=(--plugin "$plugin")
fi
cargo run --release --example validate -- --out "$out" "${args[@]}"
