#!/usr/bin/env bash
# The paper's headline for `choreo finetune` (BENCHMARKS.md, "choreo finetune on SmolLM2"): multiqa over
# MuSiQue-derived rows (scripts/finetune_multiqa_rows.py: training rows and held-out rows share no item; with
# WORKFLOW=docqa, workflows/docqa.yaml over scripts/finetune_docqa_rows.py's rows),
# baseline traces of every row (`finetune traces`, prefix mode, temperature 1), an adapter trained on the
# training rows' traces with the held-out rows' traces as validation (the log-loss gap before and after),
# then `choreo eval` of the held-out rows in prefix mode (the baseline), choreo mode, and choreo mode with
# the adapter, scored together (QA-F1 against the gold answers, paired differences with bootstrap intervals).
# With REPAIR=POLICY (say first:16), choreo mode with `--repair POLICY` and with both the adapter and the
# policy are scored beside them (BENCHMARKS.md, "Against fine-tuning").
#
#   scripts/bench_finetune.sh DIR [more `choreo finetune train` flags...]
#
# Every step writes into DIR and is skipped when its output is there (delete a file to redo its step);
# traces and eval resume where they stopped. Environment: CHOREO_BIN [build/choreo], CHOREO_SHARED
# [../shared], MODEL (-m) [the default model], EPOCHS [2], LR [3e-4], ACCUMULATE [4], RANK [8], SEED [1],
# WORKFLOW [multiqa] (or docqa), REPAIR [none].
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:?usage: scripts/bench_finetune.sh DIR [train flags...]}
shift
CHOREO_BIN=${CHOREO_BIN:-build/choreo}
SHARED=${CHOREO_SHARED:-../shared}
EPOCHS=${EPOCHS:-2} LR=${LR:-3e-4} ACCUMULATE=${ACCUMULATE:-4} RANK=${RANK:-8} SEED=${SEED:-1}
model=()
[[ -n "${MODEL:-}" ]] && model=(-m "$MODEL")
WORKFLOW=${WORKFLOW:-multiqa} REPAIR=${REPAIR:-}
case "$WORKFLOW" in
  multiqa | docqa) ;;
  *) echo "bench_finetune.sh: WORKFLOW must be multiqa or docqa, not '$WORKFLOW'" >&2; exit 2 ;;
esac
wf=workflows/$WORKFLOW.yaml
mkdir -p "$DIR"
say() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }

[[ -f "$DIR/heldout.jsonl" ]] ||
  python3 "scripts/finetune_${WORKFLOW}_rows.py" "$SHARED/data/cacheblend_musique_s.json" \
    --train "$DIR/train.jsonl" --heldout "$DIR/heldout.jsonl" >&2
for split in train heldout; do
  say "baseline traces of the $split rows"
  "$CHOREO_BIN" finetune traces "$wf" "${model[@]}" --inputs "$DIR/$split.jsonl" --temperature 1 --seed "$SEED" \
    -o "$DIR/traces-$split.jsonl"
done
if [[ ! -f "$DIR/adapter.gguf" ]]; then
  say "training (log in $DIR/train.log)"
  /usr/bin/time -v "$CHOREO_BIN" finetune train "$wf" "${model[@]}" --traces "$DIR/traces-train.jsonl" \
    --val-traces "$DIR/traces-heldout.jsonl" --epochs "$EPOCHS" --lr "$LR" --accumulate "$ACCUMULATE" \
    --rank "$RANK" --seed "$SEED" -o "$DIR/adapter.gguf" "$@" 2>&1 | tee "$DIR/train.log"
fi
# eval_heldout OUT FLAGS...: `choreo eval` of the held-out rows into DIR/OUT (resumed), scored with QA-F1.
eval_heldout() {
  local out=$1
  shift
  "$CHOREO_BIN" eval "$wf" "${model[@]}" "$@" --data "$DIR/heldout.jsonl" --format jsonl --metric qa_f1 \
    --concurrency 1 --out "$DIR/$out" --resume >/dev/null
}
say "held-out rows: prefix (baseline) and choreo"
eval_heldout eval-base.jsonl --mode prefix --mode choreo
say "held-out rows: choreo with the adapter"
eval_heldout eval-lora.jsonl --mode choreo --lora "$DIR/adapter.gguf"
parts=("$DIR/eval-lora.jsonl" choreo+adapter)
if [[ -n "$REPAIR" ]]; then
  say "held-out rows: choreo with --repair $REPAIR, and with the adapter too"
  eval_heldout eval-repair.jsonl --mode choreo --repair "$REPAIR"
  eval_heldout eval-both.jsonl --mode choreo --repair "$REPAIR" --lora "$DIR/adapter.gguf"
  parts+=("$DIR/eval-repair.jsonl" "choreo+$REPAIR" "$DIR/eval-both.jsonl" "choreo+adapter+$REPAIR")
fi
# One file, each variant's rows as their own mode, scored together (the baseline is prefix).
python3 - "$DIR" "${parts[@]}" <<'PY'
import json, sys
d, parts = sys.argv[1], sys.argv[2:]
with open(f"{d}/eval-all.jsonl", "w") as out:
    out.writelines(open(f"{d}/eval-base.jsonl"))
    for path, mode in zip(parts[::2], parts[1::2]):
        for line in open(path):
            row = json.loads(line)
            row["mode"] = mode
            out.write(json.dumps(row, ensure_ascii=False) + "\n")
PY
"$CHOREO_BIN" eval score --metric qa_f1 "$DIR/eval-all.jsonl"
