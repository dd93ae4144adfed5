#!/usr/bin/env bash
# Runs a workflow over a subset of MATH end to end with the default model and prints the summary table:
# accuracy per mode (and by subject and level), the paired difference with its bootstrap interval and
# McNemar's test, and the TTFT / end-to-end ratios baseline/choreo (docs/eval.md, "Running").
#
#   scripts/eval_math.sh [more `choreo eval` flags...]
#
# Defaults (override with environment variables): madpar with 2 rounds on the first 5 MATH-500 problems, in
# prefix and choreo modes — a few minutes on a 2-core machine.
#   CHOREO_BIN  the choreo binary                  [build/choreo, as scripts/setup.sh builds it]
#   WORKFLOW    workflow file                      [workflows/madpar.yaml]
#   DATA        MATH jsonl                         [$CHOREO_SHARED/data/math500_test.jsonl, CHOREO_SHARED=../shared]
#   LIMIT       rows                               [5]
#   MODES       modes, space-separated             [prefix choreo]
#   PARAMS      workflow params, space-separated   [rounds=2]
#   CONCURRENCY rows in flight per mode            [4]
#   OUT         results file                       [a new file under ${TMPDIR:-/tmp}]
#   MODEL       -m for choreo eval                 [empty: the default model]
# With OUT naming an existing file, the run resumes it (only the missing rows run).
set -euo pipefail
cd "$(dirname "$0")/.."
CHOREO_BIN=${CHOREO_BIN:-build/choreo}
SHARED=${CHOREO_SHARED:-../shared}
WORKFLOW=${WORKFLOW:-workflows/madpar.yaml}
DATA=${DATA:-$SHARED/data/math500_test.jsonl}
LIMIT=${LIMIT:-5}
MODES=${MODES:-prefix choreo}
PARAMS=${PARAMS-rounds=2}
CONCURRENCY=${CONCURRENCY:-4}
OUT=${OUT:-${TMPDIR:-/tmp}/choreo-eval-math-$$.jsonl}
MODEL=${MODEL:-}

source scripts/eval_common.sh
eval_require_binary eval_math.sh
args=("$WORKFLOW" --data "$DATA" --format math --limit "$LIMIT" --concurrency "$CONCURRENCY" --out "$OUT")
eval_common_args "$PARAMS"
eval_run eval_math.sh "$@"
