#!/usr/bin/env bash
# Prompt Cache on MuSiQue (docs/pml.md, "Measured"): TTFT of prompts served over cached PML modules vs a full
# recompute of the same tokens, and QA-F1 of both answers, on two models in the same run of this script:
#   1. SmolLM2-135M-Instruct (the default model): TTFT and F1;
#   2. a random-weight Llama-3.2-1B-shape model (made with `choreo model synth` when missing): TTFT only,
#      since its text means nothing (its F1 is printed but meaningless).
#
#   scripts/bench_pml.sh
#
# Defaults suit a busy shared 2-core machine (about 10 + 15 minutes). One thread is the default because the
# engine's OpenMP threads spin-wait: on an oversubscribed machine two threads made TTFT swing 3-10x from run to
# run, one thread did not. Override with environment variables:
#   BUILD           build directory holding bench_pml and choreo   [build]
#   THREADS         threads                                        [1]
#   SMOL_LIMIT      MuSiQue items for SmolLM2 (0: all 150)          [6]
#   SMOL_MODEL      SmolLM2 GGUF                                    [the default model: $CHOREO_MODEL or setup's]
#   LLAMA_LIMIT     items for the Llama-3.2-1B shape                [3]
#   LLAMA_PASSAGES  passages per item for it (0: all; its synthetic vocabulary makes ~2.5x more tokens)  [2]
#   LLAMA_MODEL     its GGUF                                        [${TMPDIR:-/tmp}/choreo-bench/llama-3.2-1b-q8_0.gguf]
#   OUT_DIR         where the --json reports go                     [${TMPDIR:-/tmp}/choreo-bench]
#   SKIP_LLAMA=1    only the SmolLM2 run
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
THREADS=${THREADS:-1}
SMOL_LIMIT=${SMOL_LIMIT:-6}
SMOL_MODEL=${SMOL_MODEL:-}
LLAMA_LIMIT=${LLAMA_LIMIT:-3}
LLAMA_PASSAGES=${LLAMA_PASSAGES:-2}
OUT_DIR=${OUT_DIR:-${TMPDIR:-/tmp}/choreo-bench}
LLAMA_MODEL=${LLAMA_MODEL:-$OUT_DIR/llama-3.2-1b-q8_0.gguf}
export CHOREO_SHARED=${CHOREO_SHARED:-../shared}

for program in bench_pml choreo; do
  if [[ ! -x "$BUILD/$program" ]]; then
    echo "bench_pml.sh: no $BUILD/$program (build it: ninja -C $BUILD $program, or set BUILD)" >&2
    exit 2
  fi
done
mkdir -p "$OUT_DIR"

echo "== SmolLM2-135M-Instruct: $SMOL_LIMIT items"
smol_args=(--limit "$SMOL_LIMIT" -t "$THREADS" --json "$OUT_DIR/bench_pml_smollm2.json")
[[ -n "$SMOL_MODEL" ]] && smol_args+=(-m "$SMOL_MODEL")
"$BUILD/bench_pml" "${smol_args[@]}"

[[ "${SKIP_LLAMA:-0}" == 1 ]] && exit 0
if [[ ! -f "$LLAMA_MODEL" ]]; then
  echo "== making $LLAMA_MODEL (random weights)"
  "$BUILD/choreo" model synth --shape llama-3.2-1b --type q8_0 -o "$LLAMA_MODEL"
fi
echo "== Llama-3.2-1B shape (random weights: TTFT only, F1 meaningless): $LLAMA_LIMIT items, $LLAMA_PASSAGES passages"
"$BUILD/bench_pml" -m "$LLAMA_MODEL" --limit "$LLAMA_LIMIT" --passages "$LLAMA_PASSAGES" -t "$THREADS" \
  --json "$OUT_DIR/bench_pml_llama-3.2-1b.json"
