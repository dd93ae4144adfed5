#!/usr/bin/env bash
# run.sh of the GPU bundle (issue 41). Source: scripts/gpu_bundle_run.sh; scripts/gpu_bundle.sh copies it into
# gpu-bundle/ beside payload.tar.gz (choreo, cuda_selftest, choreo_tests, their libraries, stories260K, madpar).
# choreo's first run on a GPU in one call: it needs nothing but the bundle, bash, coreutils, gzip and awk, the
# GPU's driver, and the CUDA toolkit's cuBLASLt (libcublasLt.so.13, found on the machine: too large to carry).
#
#   bash gpu-bundle/run.sh               every step below, within $CHOREO_BUNDLE_BUDGET_S (default 470 s)
#   bash gpu-bundle/run.sh --selfcheck   without a GPU (scripts/gpu_bundle_check.sh, in a bare Debian root):
#                                        the payload unpacks and its libraries resolve, the emulated CUDA backend
#                                        generates stories260K's text, and cuda_selftest and --backend cuda say
#                                        that there is no device
#
# Writes summary.md and logs/ under $OUT if set, else ./gpu-results/; the summary is rewritten after every
# step, so a run cut short still leaves one. Each step has a time limit (trimmed to what is left of the budget;
# a step that finds no time left is skipped) and the order puts what decides the most first, so one failure
# or timeout still lets the rest report:
#   unpack, nvidia-smi, cuda_selftest (kernels, copy and read bandwidth, fp32 peak), `choreo generate` on cuda
#   against cpu, cuBLASLt's products against the CPU backend's, the device tests (conformance on the device, master equivalence, batch invariance, the
#   products including cuBLASLt's, greedy agreement with the CPU backend), then Llama-3.2-1B-shaped models
#   (`choreo model synth`, Q8_0 and Q4_0): `choreo bench` pp512/tg128 at depth 0, decode at B = 1, 8, 32, 64
#   (64 steps after 128 tokens), madpar through `choreo profile`, pp512/tg128 at depth 4096; then the
#   Llama-3.1-8B shape the same way (fewer repetitions, decode 32 steps after 32 tokens, no madpar); last, the
#   decode rows as a fraction of the measured bandwidth and prefill in TFLOP/s against the peak.
# Synthetic models and the unpacked payload go to $CHOREO_BUNDLE_WORK (default ${TMPDIR:-/tmp}/choreo-gpu-bundle),
# never under $OUT. For a dry run of this script on a machine without a GPU: CHOREO_BUNDLE_BACKEND=cpu runs
# generate, bench and profile on the CPU backend, CHOREO_BUNDLE_SMALL / CHOREO_BUNDLE_LARGE replace the two
# shapes (default llama-3.2-1b, llama-3.1-8b) and CHOREO_BUNDLE_PARALLEL the decode batches (default 1,8,32,64).
set -uo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
RESULTS="${OUT:-$PWD/gpu-results}"
BUDGET_S="${CHOREO_BUNDLE_BUDGET_S:-470}"
WORK="${CHOREO_BUNDLE_WORK:-${TMPDIR:-/tmp}/choreo-gpu-bundle}"
export BACKEND="${CHOREO_BUNDLE_BACKEND:-cuda}" PARALLEL="${CHOREO_BUNDLE_PARALLEL:-1,8,32,64}"
SMALL="${CHOREO_BUNDLE_SMALL:-llama-3.2-1b}" LARGE="${CHOREO_BUNDLE_LARGE:-llama-3.1-8b}"
MODE=full
case "${1:-}" in
  "") ;;
  --selfcheck) MODE=selfcheck ;;
  *) echo "usage: bash run.sh [--selfcheck]" >&2; exit 2 ;;
esac

export HERE BUNDLE="$WORK/root" MODELS="$WORK/models" SCRATCH="$WORK/scratch"
export LOGS="$RESULTS/logs"
mkdir -p "$LOGS" "$MODELS" "$SCRATCH" || { echo "run.sh: cannot write $RESULTS or $WORK" >&2; exit 1; }
rm -f "$LOGS"/*.log "$RESULTS/summary.md" "$SCRATCH"/*.facts
STEPS="$SCRATCH/steps.md" SECTIONS="$SCRATCH/sections.md"
: >"$STEPS"
: >"$SECTIONS"
START=$(date +%s)
N=0
FAILED=0
LAST_LOG=""  # the log of the last step
STORIES_TEXT=", there was a little girl named Lily. She loved to play outside in the park. One day, she saw"

left_s() { echo $((BUDGET_S - ($(date +%s) - START))); }

# The summary: what ran where, the steps so far, then each step's section.
write_summary() {
  {
    echo "# choreo on a GPU: gpu-bundle/run.sh$([[ $MODE == selfcheck ]] && echo ' --selfcheck (no GPU)')"
    echo
    echo "- when: $(date -u '+%Y-%m-%d %H:%M UTC'); host: $(uname -n), $(uname -m), $(nproc) cores; glibc $(ldd --version 2>/dev/null | head -1 | awk '{print $NF}')"
    [[ -f "$HERE/MANIFEST" ]] && sed -n 's/^\(commit\|built\|bundle\):/- \1:/p' "$HERE/MANIFEST"
    [[ -s "$SCRATCH/gpu.txt" ]] && echo "- GPU: $(cat "$SCRATCH/gpu.txt")"
    echo "- elapsed: $(($(date +%s) - START)) s of a $BUDGET_S s budget"
    echo
    echo "| # | step | result | seconds | limit | log |"
    echo "|---:|---|---|---:|---:|---|"
    cat "$STEPS"
    echo
    cat "$SECTIONS"
  } >"$RESULTS/summary.md.partial" && mv "$RESULTS/summary.md.partial" "$RESULTS/summary.md"
}

# step NAME LIMIT_S COMMAND...: runs COMMAND (a function below, or a program) under timeout with its output in
# logs/NN-NAME.log, records the result, rewrites the summary. Returns the command's status.
step() {
  local name=$1 limit=$2
  shift 2
  N=$((N + 1))
  local slug log avail started rc result
  slug=$(echo "$name" | tr -c 'A-Za-z0-9.\n' '-' | tr -s '-' | sed 's/-$//')
  log="$LOGS/$(printf '%02d' "$N")-$slug.log"
  LAST_LOG=$log
  avail=$(($(left_s) - 10))
  if ((avail < 5)); then
    echo "| $N | $name | skipped: no time left | 0 | $limit | |" >>"$STEPS"
    write_summary
    return 1
  fi
  ((limit > avail)) && limit=$avail
  echo "run.sh: [$N] $name (limit ${limit} s)" >&2
  started=$(date +%s)
  timeout -k 5 "$limit" bash -c '"$@"' _ "$@" >"$log" 2>&1
  rc=$?
  case $rc in
    0) result=pass ;;
    124 | 137) result="**TIMEOUT**" ;;
    *) result="**FAIL** (exit $rc)" ;;
  esac
  ((rc == 0)) || FAILED=$((FAILED + 1))
  echo "| $N | $name | $result | $(($(date +%s) - started)) | $limit | logs/${log##*/} |" >>"$STEPS"
  write_summary
  return $rc
}

section() { { printf '%s\n' "$@"; echo; } >>"$SECTIONS"; }
fence() { echo '```'; cat "$@"; echo '```'; }

# ---- Steps (exported: step runs each in a fresh bash under timeout) ----

unpack() {
  local stamp="$HERE/payload.tar.gz"
  if [[ ! -f "$BUNDLE/.unpacked" || "$BUNDLE/.unpacked" -ot "$stamp" ]]; then
    rm -rf "$BUNDLE" && mkdir -p "$BUNDLE" && tar -xzf "$HERE/payload.tar.gz" -C "$BUNDLE" && touch "$BUNDLE/.unpacked" || return 1
  fi
  du -sh "$BUNDLE"
  # Every library of every binary: in the bundle, or the system's glibc (what the bundle leaves to the machine).
  local missing=0 b
  for b in "$BUNDLE"/bin/*; do
    echo "== ldd $b"
    ldd "$b" | tee "$SCRATCH/ldd.txt"
    if grep -q "not found" "$SCRATCH/ldd.txt"; then missing=1; fi
    awk '$3 ~ /^\// && $3 !~ "^'"$BUNDLE"'/" {print $1}' "$SCRATCH/ldd.txt" |
      grep -v -E '^(libc|libm|libdl|librt|libpthread|libresolv|libutil|libmvec|ld-linux-x86-64)\.so' &&
      { echo "a system library beyond glibc above"; missing=1; }
  done
  return "$missing"
}

# cuBLASLt of CUDA 13, which `--backend cuda` opens with dlopen (kernels/cuda/device/gemm_lt.cu): the loader's
# cache, then the CUDA toolkit's usual places, nvcc's, Python's NVIDIA wheels, then a search of the disk.
find_cublaslt() {
  local f=libcublasLt.so.13 d
  if ldconfig -p 2>/dev/null | grep -q "$f"; then ldconfig -p | awk -v f="$f" '$1 == f {print $NF; exit}' | xargs dirname; return 0; fi
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda-13*/lib64 \
    /usr/local/cuda-13*/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu /opt/cuda/lib64 \
    "$(dirname "$(command -v nvcc 2>/dev/null || echo /none/bin/nvcc)")/../lib64"; do
    [[ -e "$d/$f" ]] && { (cd "$d" && pwd); return 0; }
  done
  if command -v python3 >/dev/null; then
    d=$(python3 - 2>/dev/null <<'EOF'
import glob, site, sys
for base in site.getsitepackages() + [site.getusersitepackages()]:
    for hit in glob.glob(base + "/nvidia/**/libcublasLt.so.13*", recursive=True):
        print(hit.rsplit("/", 1)[0]); sys.exit(0)
EOF
)
    [[ -n "$d" ]] && { echo "$d"; return 0; }
  fi
  d=$(timeout 20 find / -xdev -name "$f*" -print -quit 2>/dev/null)
  [[ -n "$d" ]] && { dirname "$d"; return 0; }
  return 1
}

gpu_info() {
  nvidia-smi || return 1
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem,power.limit --format=csv
}

generate_both() {
  local args=(generate -m "$BUNDLE/shared/models/stories260K.gguf" -p "Once upon a time" -n 48 --temp 0)
  choreo --backend cpu "${args[@]}" -t 4 >"$SCRATCH/gen-cpu.txt" 2>"$SCRATCH/gen-cpu.err" || { cat "$SCRATCH/gen-cpu.err"; return 1; }
  choreo --backend "$BACKEND" "${args[@]}" >"$SCRATCH/gen-cuda.txt" 2>"$SCRATCH/gen-cuda.err" || { cat "$SCRATCH/gen-cuda.err"; return 1; }
  echo "cpu:  $(cat "$SCRATCH/gen-cpu.txt")  [$(tail -1 "$SCRATCH/gen-cpu.err")]"
  echo "$BACKEND: $(cat "$SCRATCH/gen-cuda.txt")  [$(tail -1 "$SCRATCH/gen-cuda.err")]"
  if cmp -s "$SCRATCH/gen-cpu.txt" "$SCRATCH/gen-cuda.txt"; then echo "identical"; else echo "DIFFERENT"; return 1; fi
}

# cuBLASLt (kernels/cuda/device/gemm_lt.cu) against the CPU backend: its F32, F16 and BF16 products, 96 and 2048
# wide, 5 and 300 rows, each within the rounding of its type of the CPU backend's (tests/cuda/device_test.cc).
# Nothing else checks it: in emulation these products go to a CPU GEMM. Without a device it fails.
cublaslt_vs_cpu() {
  CHOREO_SHARED="$BUNDLE/shared" CHOREO_REQUIRE_CUDA_DEVICE=1 choreo_tests --duration=true \
    -tc="cuda device: cuBLASLt's*"
}

# The device's test cases of choreo_tests: the conformance tests on "cuda" alone, the whole-backend checks
# (tests/cuda/device_test.cc: cuBLASLt's and the linear kernel's products against float64, greedy agreement,
# head shapes) and the engine's master equivalence and batch invariance on the device. Without a device they
# fail.
device_tests() {
  CHOREO_SHARED="$BUNDLE/shared" CHOREO_REQUIRE_CUDA_DEVICE=1 CHOREO_CONFORMANCE_BACKENDS=cuda \
    choreo_tests --duration=true \
    -tc='pages:*,segment attention*,key re-rotation*,sampling:*,cuda device:*,*on a CUDA device*' \
    -tce="cuda device: cuBLASLt's*"
}

synth() {  # synth SHAPE TYPE
  local out="$MODELS/$1-$2.gguf"
  [[ -s "$out" ]] && { echo "$out exists"; return 0; }
  choreo model synth --shape "$1" --type "$2" -o "$out.partial" && mv "$out.partial" "$out" && ls -l "$out"
}

# bench SHAPE TYPE WHAT REPS [PROMPT STEPS]: one `choreo bench` per kind of test, so that a slow or failed one
# loses only its own rows. pp: pp512 and tg128 at depth 0; decode: B sequences decoded together (each first
# given PROMPT tokens, untimed), STEPS steps (a tgSTEPS row at B = 1 comes with it); d4096: pp512 and tg128
# with 4096 tokens already in the cache (encoded once, untimed).
bench() {
  local model="$MODELS/$1-$2.gguf"
  case $3 in
    pp) choreo --backend "$BACKEND" bench -m "$model" -p 512 -n 128 -r "$4" ;;
    decode) choreo --backend "$BACKEND" bench -m "$model" -p 0 -n "$6" -r "$4" --parallel "$PARALLEL" \
      --parallel-prompt "$5" ;;
    d*) choreo --backend "$BACKEND" bench -m "$model" -p 512 -n 128 -r "$4" -d "${3#d}" ;;
  esac
}

madpar() {  # madpar SHAPE TYPE
  choreo --backend "$BACKEND" profile "$BUNDLE/workflows/madpar.yaml" -m "$MODELS/$1-$2.gguf" --limit 1 \
    --input "problem=Find the sum of all positive integers n such that n^2 - 19n + 99 is a perfect square." \
    --json "$RESULTS/madpar-$1-$2.json"
}

# ---- Self-check steps (no GPU) ----

emulated_generate() {
  local text
  text=$(choreo --backend cuda-emulated generate -m "$BUNDLE/shared/models/stories260K.gguf" -p "Once upon a time" \
    -n 32 --temp 0) || return 1
  echo "$text"
  [[ "$text" == "$STORIES_TEXT" ]] || { echo "expected: $STORIES_TEXT"; return 1; }
}

no_device_selftest() {
  cuda_selftest
  local rc=$?
  echo "exit $rc"
  [[ $rc == 2 ]]
}

no_device_backend() {
  choreo --backend cuda generate -m "$BUNDLE/shared/models/stories260K.gguf" -p "Once upon a time" -n 4
  local rc=$?
  echo "exit $rc"
  [[ $rc == 2 ]]
}

emulated_test_binary() {
  choreo_tests -ltc -tc='cuda device:*,*on a CUDA device*' &&
    CHOREO_SHARED="$BUNDLE/shared" CHOREO_CONFORMANCE_BACKENDS=cuda-emulated \
      choreo_tests -tc='key re-rotation: lists that do not match*,sampling: top_k and softmax give a row the same bits*'
}

export -f unpack find_cublaslt gpu_info generate_both cublaslt_vs_cpu device_tests synth bench madpar emulated_generate \
  no_device_selftest no_device_backend emulated_test_binary
export STORIES_TEXT SCRATCH RESULTS
export PATH="$BUNDLE/bin:$PATH" LD_LIBRARY_PATH="$BUNDLE/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

write_summary
step "unpack the payload; every library in the bundle or glibc" 60 unpack

if [[ $MODE == selfcheck ]]; then
  section "## The bundle's binaries and their libraries" "$(fence "$LAST_LOG")"
  step "choreo --backend cuda-emulated generate (stories260K)" 60 emulated_generate
  section "## choreo --backend cuda-emulated generate" "$(fence "$LAST_LOG")"
  step "cuda_selftest says there is no device" 30 no_device_selftest
  section "## cuda_selftest without a device" "$(fence "$LAST_LOG")"
  step "choreo --backend cuda says there is no device" 30 no_device_backend
  section "## choreo --backend cuda without a device" "$(fence "$LAST_LOG")"
  step "choreo_tests starts: device cases listed, emulated cases pass" 120 emulated_test_binary
  section "## choreo_tests" "$(fence "$LAST_LOG")"
  write_summary
  exit $((FAILED > 0))
fi

# ---- The run on a GPU ----
if dir=$(find_cublaslt); then
  export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$dir"
  section "## cuBLASLt" "libcublasLt.so.13 (--backend cuda's F32/F16/BF16 products, opened at run time): found in $dir"
else
  section "## cuBLASLt" "**libcublasLt.so.13 was not found on this machine**: --backend cuda cannot make its device."
fi

step "nvidia-smi" 20 gpu_info
awk -F', ' '/^name, / {getline; print $1 ", driver " $2 ", " $3 ", max SM clock " $4 ", max memory clock " $5 ", power limit " $6}' \
  "$LAST_LOG" >"$SCRATCH/gpu.txt" 2>/dev/null
step "cuda_selftest (kernels, bandwidth, peak)" 90 cuda_selftest
SELFTEST_LOG=$LAST_LOG
section "## cuda_selftest" "$(fence "$SELFTEST_LOG")"
step "choreo generate: cuda against cpu (stories260K, 48 greedy tokens)" 60 generate_both
section "## choreo generate, cuda against cpu" "$(fence "$LAST_LOG")"
step "cuBLASLt against the CPU backend (F32, F16, BF16 products)" 60 cublaslt_vs_cpu
section "## cuBLASLt against the CPU backend" "$(echo '```'; grep -E 'MESSAGE|ERROR|FAILED|THREW|^\[doctest\] (test cases|Status)' "$LAST_LOG" | tail -20; echo '```')"
step "device tests (choreo_tests on the GPU)" 150 device_tests
section "## Device tests" "$(echo '```'; grep -E '^\[doctest\] (test cases|assertions|Status)|ERROR|FAILED|THREW|[0-9.]+ s: ' "$LAST_LOG" | tail -60; echo '```')"

declare -a BENCH_LOGS MADPAR_LOGS
declare -A PROMPT_OF  # a decode log's tokens per sequence before the timed steps
bench_step() {  # bench_step LIMIT SHAPE TYPE WHAT REPS [PROMPT STEPS]
  local limit=$1 what=$4
  shift
  [[ $what == pp ]] && what="pp512 tg128"
  [[ $what == decode ]] && what="decode B = $PARALLEL, $6 steps after $5 tokens"
  [[ $what == d4096 ]] && what="pp512 tg128 at depth 4096"
  step "bench $1 $2: $what" "$limit" bench "$@"
  BENCH_LOGS+=("$LAST_LOG")
  PROMPT_OF[$LAST_LOG]=${5:-0}
}
# The smaller shape first and whole: every test, madpar, both types; then the larger shape, with fewer
# repetitions (a step that runs out of time is cut, and the budget skips what does not fit).
# The larger shape's decode rows start from 32 tokens and take 32 steps: its untimed prompts (B of them, for
# each B) at 128 tokens would cost more prefill than the step's limit is likely to hold.
step "synth $SMALL q8_0" 60 synth "$SMALL" q8_0
bench_step 60 "$SMALL" q8_0 pp 3
bench_step 90 "$SMALL" q8_0 decode 2 128 64
step "madpar through choreo profile, $SMALL q8_0" 120 madpar "$SMALL" q8_0
MADPAR_LOGS+=("$LAST_LOG")
step "synth $SMALL q4_0" 60 synth "$SMALL" q4_0
bench_step 60 "$SMALL" q4_0 pp 3
bench_step 90 "$SMALL" q4_0 decode 2 128 64
bench_step 60 "$SMALL" q8_0 d4096 2
bench_step 60 "$SMALL" q4_0 d4096 2
step "synth $LARGE q4_0" 90 synth "$LARGE" q4_0
bench_step 90 "$LARGE" q4_0 pp 2
bench_step 120 "$LARGE" q4_0 decode 1 32 32
step "synth $LARGE q8_0" 120 synth "$LARGE" q8_0
bench_step 90 "$LARGE" q8_0 pp 2
bench_step 120 "$LARGE" q8_0 decode 1 32 32
bench_step 90 "$LARGE" q4_0 d4096 1
bench_step 90 "$LARGE" q8_0 d4096 1

# ---- What the numbers mean: decode against bandwidth, prefill against the peak ----
number() { awk -v k="$1" '$1 == k ":" {print $2; exit}' "$SELFTEST_LOG" 2>/dev/null; }
COPY_GBPS=$(number copy-gbps) READ_GBPS=$(number read-gbps) PEAK_TFLOPS=$(number fp32-peak-tflops)
# A model's shape from `choreo model info --tensors`: weight bytes a decode step reads (every matrix; the
# embedding table only when it is also the output projection), matrix parameters, KV bytes per token (f32).
model_facts() {
  choreo model info --tensors "$1" 2>/dev/null | awk '
    function bytes_per(t) {
      if (t == "F32") return 4
      if (t == "F16" || t == "BF16") return 2
      if (t == "Q8_0") return 34 / 32
      if (t == "Q4_0") return 18 / 32
      if (t == "Q4_1") return 20 / 32
      return 0
    }
    $1 == "llama.block_count" { layers = $3 }
    $1 == "llama.attention.head_count_kv" { kv_heads = $3 }
    $1 == "llama.attention.head_count" { heads = $3 }
    $1 == "llama.embedding_length" { d_model = $3 }
    $0 ~ /^  [a-z_0-9.]+ +[A-Z0-9_]+ +\[/ {
      dims = $0; sub(/.*\[/, "", dims); sub(/\].*/, "", dims); n = split(dims, d, / x /); e = 1
      for (i = 1; i <= n; ++i) e *= d[i]
      b = e * bytes_per($2)
      if ($1 == "token_embd.weight") { embd_b = b; embd_e = e; next }
      if ($1 == "output.weight") tied = 0
      total_b += b
      if (n == 2) mat_e += e
    }
    BEGIN { tied = 1 }
    END {
      if (tied) { total_b += embd_b; mat_e += embd_e }
      printf "%.0f %.0f %.0f %d %d\n", total_b, mat_e, layers * 2 * kv_heads * (d_model / heads) * 4, layers, d_model
    }'
}
if ((${#BENCH_LOGS[@]} > 0)); then
  {
    echo "## Decode against the measured bandwidth; prefill against the peak"
    echo
    echo "Decode: bytes read per step = every weight matrix (the embedding table only when tied to the output) +"
    echo "the f32 KV of each sequence's mean context; GB/s = steps/s x bytes. Against cuda_selftest's copy"
    echo "(${COPY_GBPS:-?} GB/s, read + write of a device-to-device copy), its read kernel (${READ_GBPS:-?} GB/s) and the"
    echo "H200 datasheet's 4800 GB/s. Prefill: FLOPs per token = 2 x matrix parameters + 4 x layers x d_model x mean"
    echo "context (scores and values); against the fp32 peak of the CUDA cores (${PEAK_TFLOPS:-?} TFLOP/s: the"
    echo "arithmetic of choreo's linear kernel for Q8_0/Q4_0, which uses no tensor cores) and the H200 SXM"
    echo "datasheet's dense BF16 tensor peak (989 TFLOP/s) for scale."
    echo
    echo "| model | test | t/s | GB/s | of copy | of read | of 4.8 TB/s | TFLOP/s | of fp32 peak | of BF16 tensor peak |"
    echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"
    for log in "${BENCH_LOGS[@]}"; do
      [[ -f "$log" ]] || continue
      grep -E '^\| .*\.gguf ' "$log" | while IFS= read -r row; do
        file=$(echo "$row" | awk -F'|' '{gsub(/ /, "", $2); print $2}')
        [[ -s "$SCRATCH/$file.facts" ]] || model_facts "$MODELS/$file" >"$SCRATCH/$file.facts"
        echo "$row" | awk -F'|' -v facts="$(cat "$SCRATCH/$file.facts")" -v copy="${COPY_GBPS:-0}" -v read="${READ_GBPS:-0}" \
          -v peak="${PEAK_TFLOPS:-0}" -v prompt="${PROMPT_OF[$log]:-0}" '
        function pct(x, of) { return of > 0 ? sprintf("%.1f%%", 100 * x / of) : "?" }
        {
          split(facts, f, " "); weights = f[1]; mat = f[2]; kv = f[3]; layers = f[4]; d_model = f[5]
          model = $2; gsub(/^ +| +$/, "", model); test = $7; gsub(/^ +| +$/, "", test); tps = $8; sub(/±.*/, "", tps); tps += 0
          depth = 0; if (match(test, /@ d[0-9]+/)) depth = substr(test, RSTART + 3, RLENGTH - 3) + 0
          if (test ~ /^pp/) {
            n = substr(test, 3) + 0; ctx = depth + (n + 1) / 2
            tf = tps * (2 * mat + 4 * layers * d_model * ctx) / 1e12
            printf "| %s | %s | %.1f | | | | | %.2f | %s | %.2f%% |\n", model, test, tps, tf, pct(tf, peak), 100 * tf / 989
          } else {
            b = 1; if (match(test, / x[0-9]+/)) b = substr(test, RSTART + 2, RLENGTH - 2) + 0
            n = substr(test, 3) + 0; ctx = test ~ / x/ ? prompt + n / 2 : depth + n / 2
            gbps = tps / b * (weights + b * ctx * kv) / 1e9
            printf "| %s | %s | %.1f | %.0f | %s | %s | %.1f%% | | | |\n", model, test, tps, gbps, pct(gbps, copy),
                   pct(gbps, read), 100 * gbps / 4800
          }
        }'
      done
    done
    echo
  } >>"$SECTIONS"
fi
((${#BENCH_LOGS[@]} > 0)) && section "## choreo bench, as printed"
for log in "${BENCH_LOGS[@]}"; do [[ -f "$log" ]] && section "### ${log##*/}" "$(fence "$log")"; done
for log in "${MADPAR_LOGS[@]}"; do [[ -f "$log" ]] && section "## madpar through choreo profile (${log##*/})" "$(fence "$log")"; done
write_summary
echo "run.sh: $FAILED step(s) failed; summary in $RESULTS/summary.md" >&2
exit $((FAILED > 0))
