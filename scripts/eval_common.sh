# Shared by scripts/eval_{math,longbench,musique}.sh (sourced, not run): the checks and flags every one of
# them has. The caller sets CHOREO_BIN, MODES, MODEL and OUT, and builds its own `args` array first.

# Fails with exit 2 and a hint when the choreo binary is missing. $1: the calling script's name.
eval_require_binary() {
  if [[ ! -x "$CHOREO_BIN" ]]; then
    echo "$1: no choreo binary at $CHOREO_BIN (run scripts/setup.sh or set CHOREO_BIN)" >&2
    exit 2
  fi
}

# Appends to `args`: one --mode per word of MODES, one --param per word of $1 (may be empty), -m MODEL when
# set, and --resume when OUT already holds rows.
eval_common_args() {
  local m p
  for m in $MODES; do args+=(--mode "$m"); done
  for p in $1; do args+=(--param "$p"); done
  [[ -n "$MODEL" ]] && args+=(-m "$MODEL")
  [[ -s "$OUT" ]] && args+=(--resume)
  return 0
}

# Runs `choreo eval "${args[@]}" "$@"` and reports the time taken. $1: the calling script's name.
eval_run() {
  local name=$1 start
  shift
  echo "results: $OUT" >&2
  start=$(date +%s)
  "$CHOREO_BIN" eval "${args[@]}" "$@"
  echo "$name: finished in $(($(date +%s) - start)) s; results in $OUT" >&2
}
