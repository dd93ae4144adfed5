#!/usr/bin/env bash
# scripts/gpu_check.sh: the CUDA backend's check, for the day a machine with an NVIDIA GPU is available
# (issue 14). It has never run: no machine of this project has had a GPU (docs/cuda.md).
#
#   scripts/gpu_check.sh [--no-bench]
#
# On a machine with an NVIDIA GPU, its driver and the CUDA toolkit (nvcc), after scripts/setup.sh --no-run:
#   1. builds choreo with the CUDA backend required (-DCHOREO_CUDA=ON) into build-gpu/;
#   2. runs cuda_selftest (the kernels against the CPU backend, the device's bandwidth and fp32 peak);
#   3. runs the backend conformance suite (KV pages, segment attention) and the engine tests that run on the
#      CUDA backend (master equivalence, batch invariance, llama.cpp's logits and greedy tokens on stories260K):
#      with a device present, tests/test_models.h adds the real CUDA backend to each of them;
#   4. runs `choreo bench --backend cuda` against llama.cpp's CUDA build (-ngl 99), 5 rounds taking turns
#      (scripts/bench_compare.py --cuda; the peer is built by scripts/build_peer.sh --cuda);
# and prints one table: each step, pass or fail, and the benchmark's ratios. Exit 0 only if every step passed.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="$ROOT/build-gpu"
SHARED="${CHOREO_SHARED:-$ROOT/../shared}"
BENCH=1
[[ "${1:-}" == "--no-bench" ]] && BENCH=0

die() { echo "gpu_check: $*" >&2; exit 2; }
command -v nvidia-smi >/dev/null 2>&1 || die "no nvidia-smi: this machine has no NVIDIA driver"
nvidia-smi -L >/dev/null 2>&1 || die "nvidia-smi lists no GPU"
[[ -d "$SHARED/models" ]] || die "no shared models at $SHARED (set CHOREO_SHARED)"

declare -a NAMES RESULTS
step() {  # step NAME COMMAND...: runs it, records pass/fail, keeps its output in build-gpu/logs/
  local name="$1"; shift
  mkdir -p "$BUILD/logs"
  local log="$BUILD/logs/$(echo "$name" | tr ' /' '__').log"
  echo "==> $name" >&2
  if "$@" >"$log" 2>&1; then RESULTS+=("pass"); else RESULTS+=("FAIL (log: $log)"); fi
  NAMES+=("$name")
}

GPU="$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | head -1)"
step "build (CHOREO_CUDA=ON)" bash -c "cmake -S '$ROOT' -B '$BUILD' -G Ninja -DCMAKE_BUILD_TYPE=Release -DCHOREO_CUDA=ON \
  && ninja -C '$BUILD'"
export CHOREO_SOURCE_DIR="$ROOT" CHOREO_SHARED="$SHARED" CHOREO_BIN="$BUILD/choreo"
source "$ROOT/scripts/cache_paths.sh"
export CHOREO_PYTHON="${CHOREO_PYTHON:-$CHOREO_VENV/bin/python}"
step "cuda_selftest" "$BUILD/cuda_selftest"
step "conformance: pages and attention" "$BUILD/choreo_tests" -tc='pages:*,attention*,*cuda*,*CUDA*'
step "master equivalence on CUDA" "$BUILD/choreo_tests" -tc='master equivalence on a CUDA device*'
step "batch invariance on CUDA" "$BUILD/choreo_tests" -tc='batch invariance on a CUDA device*'
step "stories260K vs llama.cpp on CUDA" "$BUILD/choreo_tests" -tc='stories260K on the CUDA kernels*'
step "choreo --backend cuda generate" bash -c "'$BUILD/choreo' generate --backend cuda -m '$SHARED/models/stories260K.gguf' \
  -p 'Once upon a time' -n 24 --temp 0 | grep -q 'there was a little girl named Lily'"
if [[ $BENCH == 1 ]]; then
  step "bench vs llama.cpp CUDA (5 rounds)" bash -c "python3 '$ROOT/scripts/bench_compare.py' --cuda -r 5 --rows idle,depth,parallel \
    > '$BUILD/logs/bench_table.md'"
fi

echo
echo "## scripts/gpu_check.sh on $GPU ($(date -u +%Y-%m-%d), choreo $(git -C "$ROOT" rev-parse --short HEAD))"
echo
echo "| step | result |"
echo "|---|---|"
failed=0
for i in "${!NAMES[@]}"; do
  echo "| ${NAMES[$i]} | ${RESULTS[$i]} |"
  [[ "${RESULTS[$i]}" == pass ]] || failed=1
done
if [[ $BENCH == 1 && -s "$BUILD/logs/bench_table.md" ]]; then
  echo
  cat "$BUILD/logs/bench_table.md"
fi
exit $failed
