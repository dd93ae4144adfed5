#!/usr/bin/env bash
# Old vs new binary, side by side: proves that a refactor changes no output. Runs every workflow in workflows/
# that needs no extra files, in each engine mode (choreo, prefix, naive), on two models (the chat model, and
# stories260K: a BOS and a SentencePiece vocabulary), with and without stop strings added to every call, once
# with OLD_BIN and once with NEW_BIN, and compares what the two runs wrote: the --json document (every message's
# text, tokens, parents, ids, positions, stop reason, token counts, the batches and the output; the timings
# ttft_ms, total_ms and load_ms are left out, and fields newer than OLD_BIN are skipped: see ADDED), stdout,
# and the exit code (stderr too when a run fails, so a run that fails alike on both, e.g. a PML schema with roles on stories260K, counts as the same). madpar also runs as
# 3 instances of one run (--inputs), compared without what depends on thread timing (see same() below).
# Then the KV tiers: every workflow again on the chat model in choreo mode, with 8-token pages and a T0 budget
# small enough to evict (the smallest of 60/70/80/90% of its peak that the old binary runs with and evicts
# at; madpar with 3 rounds, so that a round's answers can leave while the next round runs), under both
# policies, with nothing, T1, T2 (a fresh store per run) or a Redis T3 (a redis-server started here, emptied
# before each run) below, prefetch off: everything compared, the --json's tier counters included. With
# `--evict workflow` and prefetch on (T1, T2), only what cannot depend on when a background load finishes.
#
#   scripts/compare_binaries.sh OLD_BIN NEW_BIN
#
# Build OLD_BIN from the commit you started from in its own worktree and build dir, e.g.
#   git worktree add --detach ../wt-base BASE_COMMIT && cmake -S ../wt-base -B ../wt-base/build -G Ninja &&
#   ninja -C ../wt-base/build choreo-cli
# and run the script under the machine's build lock (flock /tmp/choreo-cpu.lock scripts/compare_binaries.sh ...).
#
# Environment (all optional):
#   CHOREO_MODEL      the chat model (default: the one scripts/setup.sh installs, scripts/cache_paths.sh)
#   CHOREO_SHARED     shared test data; its models/stories260K.gguf is the second model (default ../shared)
#   MAX_TOKENS        every max_tokens in the workflows is capped at this (default 32), to keep runs short
#   THREADS           -t for every run (default 2)
#   MODES             default "choreo prefix naive"
#   ONLY              space-separated workflow names to run (default: all the script knows)
#   OUT               where runs are written (default a new temporary directory, kept for inspection)
#   TIERS             1 (default) runs the tier comparisons, 0 skips them
# Prints one line per comparison (same / DIFFERENT with the first difference) and a summary; exits 1 when any
# comparison differs, 2 on bad usage. A workflow the script has no inputs for is listed as skipped.
set -euo pipefail

if [[ $# -ne 2 ]]; then
  sed -n '2,17p' "$0" >&2
  exit 2
fi
old_bin="$(realpath "$1")"
new_bin="$(realpath "$2")"
for b in "$old_bin" "$new_bin"; do
  [[ -x "$b" ]] || { echo "compare_binaries.sh: $b is not an executable" >&2; exit 2; }
done

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/scripts/cache_paths.sh"
shared="${CHOREO_SHARED:-$root/../shared}"
chat_model="${CHOREO_MODEL:-$CHOREO_DEFAULT_MODEL}"
small_model="$shared/models/stories260K.gguf"
max_tokens="${MAX_TOKENS:-32}"
threads="${THREADS:-2}"
modes="${MODES:-choreo prefix naive}"
out="${OUT:-$(mktemp -d -t choreo-compare.XXXXXX)}"
mkdir -p "$out"
for m in "$chat_model" "$small_model"; do
  [[ -f "$m" ]] || { echo "compare_binaries.sh: model $m is missing (scripts/setup.sh installs it)" >&2; exit 2; }
done

# The inputs (and smaller params where a workflow's defaults are slow) each workflow runs with, one
# "input KEY=VALUE" or "param KEY=VALUE" a line. A workflow that is not listed here is reported as skipped: add
# it when you add a workflow.
declare -A args=(
  [hello]='input question=Why is the sky blue?'
  [docqa]=$'input context=The lighthouse on Gull Island was built in 1871 by Mara Voss, who kept it lit for forty years. It was automated in 1962.\ninput question=Who built the lighthouse?'
  [multiqa]=$'input document=Tom has three cats: Ada, Bo and Cy. Ada is the oldest. Bo likes fish.\ninput questions=[\'Which cat is the oldest?\', \'What does Bo like?\']'
  [madpar]=$'input problem=What is 12 * 7 - 5?\nparam rounds=2'
  [tot]=$'input problem=What is the sum of the first five odd numbers?\nparam branches=4\nparam voters=2'
  [maditer]=$'input question=Is zero an even number?\nparam rounds=2'
  [bsm]='input task=Write two sentences about the sea and two about the mountains.'
  [prisoners]=''
  [travel]='input days=3'
)
declare -A needs_files=(
  [musique]='a PML schema and prompts written by scripts/musique_to_pml.py'
  [solvecheck]='models: and plan files, which the base binary predates (tests/runtime/models_test.cc and plan_agreement_test.cc run it)'
)
# Instances in one run (--inputs): their calls share engine batches, and prefix mode gives each a scope.
rows_case=madpar
printf '%s\n' '{"problem": "What is 2 + 2?"}' '{"problem": "What is 10 / 4?"}' '{"problem": "What is 3 squared?"}' \
  >"$out/rows.jsonl"

# Copies of workflows/ with every max_tokens capped; the "stop" copy also gives every call stop strings (chosen
# to end many decodes early, some inside a token or across a token boundary).
python3 - "$root/workflows" "$out" "$max_tokens" <<'EOF'
import pathlib, re, shutil, sys
src, out, cap = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), int(sys.argv[3])
stops = '["e t", ".\\n", "!", " and", "ing "]'
for variant in ("plain", "stop"):
    dst = out / f"workflows-{variant}"
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    for wf in dst.glob("*.yaml"):
        text = re.sub(r"max_tokens: (\d+)", lambda m: f"max_tokens: {min(int(m.group(1)), cap)}", wf.read_text())
        if variant == "stop":
            text, n = re.subn(r"^sampling: \{", f"sampling: {{stop: {stops}, ", text, flags=re.M)
            if n != 1:
                sys.exit(f"compare_binaries.sh: {wf.name} has no one-line `sampling: {{...}}` to add stop strings to")
        wf.write_text(text)
EOF

# run BIN TAG WORKFLOW MODEL MODE [ARGS...]: runs one binary, leaving TAG.json, TAG.out, TAG.err and TAG.rc.
store_args=(--no-store)
run() {
  local bin="$1" tag="$2" wf="$3" model="$4" mode="$5"
  shift 5
  local rc=0
  "$bin" run "$wf" -m "$model" -t "$threads" --mode "$mode" "${store_args[@]}" --json "$tag.json" "$@" \
    >"$tag.out" 2>"$tag.err" </dev/null || rc=$?
  echo "$rc" >"$tag.rc"
}

# same OLD_TAG NEW_TAG [instances]: prints nothing and succeeds when the two runs match, else prints the first
# difference. With "instances" (a run of several rows, whose instances' calls meet in the engine in whatever
# order their threads reach it, so that two runs of one binary differ in this too): message ids are left out,
# a message's n_computed and n_reused are compared by their sum (which of two instances computes a message
# they share and which reuses it is that order's choice), the run's total n_computed is compared, and stdout
# is compared as a set of printed blocks.
same() {
  python3 - "$1" "$2" "${3:-}" <<'EOF'
import json, pathlib, re, sys
old, new, how = sys.argv[1], sys.argv[2], sys.argv[3]
instances = how == "instances"
outputs_only = how == "outputs"  # runs with background prefetch: tier counters depend on when loads finish
read = lambda tag, ext: pathlib.Path(f"{tag}.{ext}").read_bytes() if pathlib.Path(f"{tag}.{ext}").exists() else None
def order_free(doc):
    total = 0
    def walk(o):
        nonlocal total
        if isinstance(o, list):
            return [walk(x) for x in o]
        if not isinstance(o, dict):
            return o
        o = {k: walk(v) for k, v in o.items() if k != "id"}
        if "n_computed" in o and "n_reused" in o:
            total += o["n_computed"]
            o["n_computed + n_reused"] = o.pop("n_computed") + o.pop("n_reused")
        return o
    doc = walk(doc)
    doc["total n_computed"] = total
    return doc
blocks = lambda out: sorted(re.split("(?m)^(?=── )".encode(), out or b""))  # a block per "── " title
# --json fields added after the base commit of scripts/test.sh (the KV tiers' metrics): compared when both
# binaries write them, skipped when only the new one does.
ADDED = {"n_loaded", "n_recomputed", "tiers"}
def first_difference(a, b, path="$"):
    if type(a) != type(b):
        return f"{path}: {a!r} vs {b!r}"
    if isinstance(a, dict):
        for k in sorted(set(a) | set(b)):
            if k in ("ttft_ms", "total_ms", "load_ms", "prefetch_wait_ms", "e_recompute_ms"):
                continue
            if outputs_only and k in ("tiers", "n_loaded", "n_recomputed"):
                continue
            if k in ADDED and k not in a:  # an output field newer than the old binary
                continue
            if k not in a or k not in b:
                return f"{path}.{k}: only in {'new' if k in b else 'old'}"
            d = first_difference(a[k], b[k], f"{path}.{k}")
            if d: return d
        return None
    if isinstance(a, list):
        for i, (x, y) in enumerate(zip(a, b)):
            d = first_difference(x, y, f"{path}[{i}]")
            if d: return d
        return f"{path}: {len(a)} vs {len(b)} items" if len(a) != len(b) else None
    return None if a == b else f"{path}: {a!r} vs {b!r}"
if read(old, "rc") != read(new, "rc"):
    sys.exit(f"exit code {read(old, 'rc').decode().strip()} vs {read(new, 'rc').decode().strip()}")
if (blocks(read(old, "out")) != blocks(read(new, "out"))) if instances else (read(old, "out") != read(new, "out")):
    sys.exit("stdout differs")
if read(old, "rc").strip() != b"0" and read(old, "err") != read(new, "err"):
    sys.exit("stderr of the failed run differs")
jo, jn = read(old, "json"), read(new, "json")
if (jo is None) != (jn is None):
    sys.exit("--json written by only one binary")
if jo is not None:
    jo, jn = json.loads(jo), json.loads(jn)
    d = first_difference(order_free(jo), order_free(jn)) if instances else first_difference(jo, jn)
    if d: sys.exit(d)
EOF
}

n_same=0
n_diff=0
n_runs=0
failed_runs=0
start=$(date +%s)
for wf_path in "$root"/workflows/*.yaml; do
  name="$(basename "$wf_path" .yaml)"
  if [[ -n "${ONLY:-}" && " $ONLY " != *" $name "* ]]; then continue; fi
  if [[ -n "${needs_files[$name]:-}" ]]; then
    echo "skip  $name: needs ${needs_files[$name]}"
    continue
  fi
  if [[ ! -v "args[$name]" ]]; then
    echo "skip  $name: compare_binaries.sh has no inputs for it (add them to its table)"
    continue
  fi
  wf_args=()
  while IFS= read -r line; do
    [[ -n "$line" ]] && wf_args+=("--${line%% *}" "${line#* }")
  done <<<"${args[$name]}"
  for variant in plain stop; do
    for model in "$chat_model" "$small_model"; do
      model_tag="$(basename "$model" .gguf)"
      for mode in $modes; do
        cases=("one")
        [[ "$name" == "$rows_case" ]] && cases+=("rows")
        for c in "${cases[@]}"; do
          extra=("${wf_args[@]}")
          [[ "$c" == "rows" ]] && extra=(--param rounds=2 --inputs "$out/rows.jsonl" --concurrency 3)
          tag="$out/$name-$c-$variant-$model_tag-$mode"
          wf="$out/workflows-$variant/$name.yaml"
          run "$old_bin" "$tag.old" "$wf" "$model" "$mode" "${extra[@]}"
          run "$new_bin" "$tag.new" "$wf" "$model" "$mode" "${extra[@]}"
          n_runs=$((n_runs + 2))
          [[ "$(cat "$tag.old.rc")" == 0 ]] || failed_runs=$((failed_runs + 1))
          label="$name"
          [[ "$c" == "rows" ]] && label+=" (3 rows via --inputs)"
          label+=" $variant $model_tag $mode"
          how=""
          [[ "$c" == "rows" ]] && how="instances"
          if why="$(same "$tag.old" "$tag.new" $how 2>&1)"; then
            n_same=$((n_same + 1))
            note=""
            [[ "$(cat "$tag.old.rc")" == 0 ]] || note=" (both exit $(cat "$tag.old.rc"): $(grep -m1 -i error "$tag.old.err" || true))"
            echo "same  $label$note"
          else
            n_diff=$((n_diff + 1))
            echo "DIFFERENT  $label: $why   (files: $tag.{old,new}.*)"
          fi
        done
      done
    done
  done
done
# ---- the KV tiers ------------------------------------------------------------------------------------
compare() {  # compare LABEL OLD_TAG NEW_TAG [how]
  if why="$(same "$2" "$3" "${4:-}" 2>&1)"; then
    n_same=$((n_same + 1))
    note=""
    [[ "$(cat "$2.rc")" == 0 ]] || note=" (both exit $(cat "$2.rc"): $(grep -m1 -i error "$2.err" || true))"
    echo "same  $1$note"
  else
    n_diff=$((n_diff + 1))
    echo "DIFFERENT  $1: $why   (files: $2.*, $3.*)"
  fi
}
json_field() {  # json_field FILE PYTHON-EXPR-ON-d: prints the value, or nothing
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' "$1" "$2" 2>/dev/null || true
}
if [[ "${TIERS:-1}" == 1 ]]; then
  redis_port=""
  if command -v redis-server >/dev/null 2>&1; then
    redis_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no >"$out/redis.log" 2>&1 &
    redis_pid=$!
    trap 'kill $redis_pid 2>/dev/null || true' EXIT
    for _ in $(seq 50); do redis-cli -p "$redis_port" ping >/dev/null 2>&1 && break; sleep 0.1; done
  else
    echo "skip  T3 runs: redis-server is not installed"
  fi
  for wf_path in "$root"/workflows/*.yaml; do
    name="$(basename "$wf_path" .yaml)"
    if [[ -n "${ONLY:-}" && " $ONLY " != *" $name "* ]]; then continue; fi
    [[ -n "${needs_files[$name]:-}" || ! -v "args[$name]" ]] && continue
    wf_args=()
    while IFS= read -r line; do
      [[ "$name" == madpar && "$line" == "param rounds="* ]] && line="param rounds=3"
      [[ -n "$line" ]] && wf_args+=("--${line%% *}" "${line#* }")
    done <<<"${args[$name]}"
    wf_args+=(--page-tokens 8)
    wf="$out/workflows-plain/$name.yaml"
    model_tag="$(basename "$chat_model" .gguf)"
    base="$out/tiers-$name"
    run "$old_bin" "$base-probe" "$wf" "$chat_model" choreo "${wf_args[@]}"
    peak=$(json_field "$base-probe.json" 'd["tiers"]["t0_peak_bytes"]')
    budget=""
    for f in 60 70 80 90; do
      [[ -n "$peak" ]] || break
      mib=$(( (peak * f / 100 + 1048575) / 1048576 ))
      run "$old_bin" "$base-probe-$mib" "$wf" "$chat_model" choreo "${wf_args[@]}" --cache-mib "$mib" --evict lru
      if [[ "$(cat "$base-probe-$mib.rc")" == 0 && "$(json_field "$base-probe-$mib.json" 'd["tiers"]["t0_evictions"]')" -gt 0 ]]; then
        budget=$mib
        break
      fi
    done
    if [[ -z "$budget" ]]; then
      echo "skip  $name tiers: no T0 budget of 60-90% of its peak ($peak bytes) runs and evicts"
      continue
    fi
    for policy in lru workflow; do
      for tier in none T1 T2 T3 T1-prefetch T2-prefetch; do
        [[ "$tier" == T3 && -z "$redis_port" ]] && continue
        [[ "$tier" == *-prefetch && "$policy" == lru ]] && continue
        extra=("${wf_args[@]}" --cache-mib "$budget" --evict "$policy" --prefetch-steps 0)
        [[ "$tier" == *-prefetch ]] && extra=("${wf_args[@]}" --cache-mib "$budget" --evict "$policy" --prefetch-steps 2)
        [[ "$tier" == T1* ]] && extra+=(--host-cache-mib 64)
        [[ "$tier" == T2* ]] && extra+=(--disk-cache-mib 64)
        [[ "$tier" == T3 ]] && extra+=(--redis "127.0.0.1:$redis_port")
        tag="$base-$policy-$tier"
        for side in old new; do
          bin="$old_bin"
          [[ "$side" == new ]] && bin="$new_bin"
          [[ "$tier" == T3 ]] && redis-cli -p "$redis_port" flushall >/dev/null
          store_args=(--no-store)
          if [[ "$tier" == T2* ]]; then
            rm -rf "$tag.$side.store"
            store_args=(--cache-dir "$tag.$side.store")
          fi
          run "$bin" "$tag.$side" "$wf" "$chat_model" choreo "${extra[@]}"
          store_args=(--no-store)
        done
        n_runs=$((n_runs + 2))
        [[ "$(cat "$tag.old.rc")" == 0 ]] || failed_runs=$((failed_runs + 1))
        how=""
        [[ "$tier" == *-prefetch ]] && how="outputs"
        compare "$name tiers $model_tag choreo --cache-mib $budget --evict $policy, $tier below" "$tag.old" "$tag.new" $how
      done
    done
  done
fi

echo "compare_binaries.sh: $n_same same, $n_diff different, $n_runs runs ($failed_runs comparisons where both runs" \
  "failed alike), $(( $(date +%s) - start )) s; runs kept in $out"
[[ $n_diff -eq 0 ]]
