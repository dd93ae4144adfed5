#!/usr/bin/env bash
# Runs the document-QA workflow over a subset of a LongBench file (or the MuSiQue sample) end to end with the
# default model and prints the summary table: the score per mode (qa_f1, Rouge-L, ... as LongBench defines
# them, x100), the paired difference with its bootstrap interval, and the TTFT / end-to-end ratios
# baseline/choreo (docs/eval.md, "Running").
#
#   scripts/eval_longbench.sh [more `choreo eval` flags...]
#
# Defaults (override with environment variables): workflows/docqa.yaml on the first 2 rows of LongBench's
# qasper (2.5k and 3.7k words) in prefix and choreo modes — about 3 minutes of CPU on 2 cores.
#   CHOREO_BIN  the choreo binary                  [build/choreo, as scripts/setup.sh builds it]
#   WORKFLOW    workflow file                      [workflows/docqa.yaml]
#   DATA        LongBench jsonl or the MuSiQue json [$CHOREO_SHARED/data/longbench/qasper.jsonl, CHOREO_SHARED=../shared]
#   MAP         --map pairs, space-separated       [question=input for LongBench jsonl; none for MuSiQue]
#   LIMIT       rows                               [2]
#   MODES       modes, space-separated             [prefix choreo]
#   PARAMS      workflow params, space-separated   [none]
#   CONCURRENCY rows in flight per mode            [2]
#   OUT         results file                       [a new file under ${TMPDIR:-/tmp}]
#   MODEL       -m for choreo eval                 [empty: the default model]
# For MuSiQue: DATA=../shared/data/cacheblend_musique_s.json scripts/eval_longbench.sh
# With OUT naming an existing file, the run resumes it (only the missing rows run).
set -euo pipefail
cd "$(dirname "$0")/.."
CHOREO_BIN=${CHOREO_BIN:-build/choreo}
SHARED=${CHOREO_SHARED:-../shared}
WORKFLOW=${WORKFLOW:-workflows/docqa.yaml}
DATA=${DATA:-$SHARED/data/longbench/qasper.jsonl}
if [[ -z "${MAP+set}" ]]; then
  case "$DATA" in *.jsonl) MAP="question=input" ;; *) MAP="" ;; esac
fi
LIMIT=${LIMIT:-2}
MODES=${MODES:-prefix choreo}
PARAMS=${PARAMS:-}
CONCURRENCY=${CONCURRENCY:-2}
OUT=${OUT:-${TMPDIR:-/tmp}/choreo-eval-longbench-$$.jsonl}
MODEL=${MODEL:-}

source scripts/eval_common.sh
eval_require_binary eval_longbench.sh
args=("$WORKFLOW" --data "$DATA" --limit "$LIMIT" --concurrency "$CONCURRENCY" --out "$OUT")
for p in $MAP; do args+=(--map "$p"); done
eval_common_args "$PARAMS"
eval_run eval_longbench.sh "$@"
