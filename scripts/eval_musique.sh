#!/usr/bin/env bash
# Document QA over Prompt Cache modules on the MuSiQue sample: every item becomes a PML schema with one module
# per passage (scripts/musique_to_pml.py), and workflows/musique.yaml asks the item's question as uncached text
# over its passages. `choreo eval` runs it in a baseline mode (the same tokens re-encoded in one pass) and in
# choreo mode (the passages encoded as modules at their schema positions, the decode reading them in place),
# then prints QA-F1 per mode, the paired difference, and the TTFT and end-to-end ratios (docs/eval.md,
# "Document QA over Prompt Cache modules").
#
#   scripts/eval_musique.sh [more `choreo eval` flags...]
#
# Defaults (override with environment variables): the first 2 items, naive then choreo mode, one row at a
# time — about 3 minutes on 2 cores (each item is ~6,000 tokens).
#   CHOREO_BIN   the choreo binary                      [build/choreo, as scripts/setup.sh builds it]
#   DATA         the MuSiQue sample                     [$CHOREO_SHARED/data/cacheblend_musique_s.json, CHOREO_SHARED=../shared]
#   PML_DIR      where the schemas and prompts.jsonl go [${TMPDIR:-/tmp}/choreo-musique-pml]
#   LIMIT        items (0: all 150)                     [2]
#   MODES        modes, space-separated                 [naive choreo: full recompute vs cached modules]
#   CONCURRENCY  rows in flight per mode                [1: each row's TTFT is its own]
#   OUT          results file                           [a new file under ${TMPDIR:-/tmp}]
#   MODEL        -m for choreo eval                     [empty: the default model]
#   STORE        encode the selected items' schemas ahead of time into this store (choreo encode) and let
#                choreo mode load them from it (choreo eval --cache-dir)       [empty: no store]
# With OUT naming an existing file, the run resumes it (only the missing rows run).
set -euo pipefail
cd "$(dirname "$0")/.."
CHOREO_BIN=${CHOREO_BIN:-build/choreo}
SHARED=${CHOREO_SHARED:-../shared}
DATA=${DATA:-$SHARED/data/cacheblend_musique_s.json}
PML_DIR=${PML_DIR:-${TMPDIR:-/tmp}/choreo-musique-pml}
LIMIT=${LIMIT:-2}
MODES=${MODES:-naive choreo}
CONCURRENCY=${CONCURRENCY:-1}
OUT=${OUT:-${TMPDIR:-/tmp}/choreo-eval-musique-$$.jsonl}
MODEL=${MODEL:-}
STORE=${STORE:-}

source scripts/eval_common.sh
eval_require_binary eval_musique.sh
# The schemas are made again each time (a few milliseconds), so they always follow DATA and the script.
python3 scripts/musique_to_pml.py --data "$DATA" --out "$PML_DIR" >&2

# The workflow reads each item's schema from PML_DIR, outside its own directory: allow it (docs/limits.md).
args=(workflows/musique.yaml --data "$PML_DIR/prompts.jsonl" --allow-path "$PML_DIR" --metric qa_f1
  --concurrency "$CONCURRENCY" --out "$OUT")
[[ "$LIMIT" != 0 ]] && args+=(--limit "$LIMIT")
eval_common_args ""
if [[ -n "$STORE" ]]; then
  mkdir -p "$STORE"
  # The schemas of the selected items, in data order; encode loads what the store holds and writes the rest.
  mapfile -t schemas < <(python3 -c 'import json, sys
limit = int(sys.argv[2])
for i, line in enumerate(open(sys.argv[1], encoding="utf-8")):
    if limit and i >= limit: break
    print(json.loads(line)["schema"])' "$PML_DIR/prompts.jsonl" "$LIMIT")
  echo "encoding ${#schemas[@]} schemas into $STORE" >&2
  for schema in "${schemas[@]}"; do
    "$CHOREO_BIN" encode "$schema" --cache-dir "$STORE" ${MODEL:+-m "$MODEL"} > /dev/null
  done
  args+=(--cache-dir "$STORE")
fi

eval_run eval_musique.sh "$@"
