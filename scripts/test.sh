#!/usr/bin/env bash
# The whole test suite: set up (packages, reference tools, build, model), unit + conformance + differential
# tests (ctest), then the fuzzers (GGUF reader, workflow YAML, expressions, PML, tokenizers, exec calls, eval data, store entries) for a
# bounded time each.
# Any failed step fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
start=$(date +%s)
scripts/setup.sh --no-run

CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/choreo"
export CHOREO_PYTHON="${CHOREO_VENV:-$CACHE/venv}/bin/python"
export CHOREO_SHARED="${CHOREO_SHARED:-$ROOT/../shared}"
[[ -d "$CHOREO_SHARED" ]] || { echo "error: shared data not found at $CHOREO_SHARED (set CHOREO_SHARED)" >&2; exit 1; }

printf '\033[1m==> unit, conformance and differential tests\033[0m\n'
ctest --test-dir "$ROOT/build" --output-on-failure --timeout 1500

printf '\033[1m==> fuzzing: GGUF reader, workflow YAML, expressions, PML, tokenizers, exec calls, eval data, store entries (%s s each)\033[0m\n' "${CHOREO_FUZZ_SECONDS:-45}"
scripts/fuzz.sh "${CHOREO_FUZZ_SECONDS:-45}"

echo "all test steps passed in $(( $(date +%s) - start )) s"
