#!/usr/bin/env bash
# The whole test suite: set up (packages, reference tools, build, model), unit + conformance + differential
# tests (the doctest binary), then the fuzzers (GGUF reader, workflow YAML, expressions, PML, tokenizers, exec calls, eval data, store entries, choreo.toml, LoRA adapters, finetune traces and checkpoints) for a
# bounded time each. With nvcc installed, the CUDA kernels must build. CHOREO_COMPARE=1 adds the old-vs-new
# binary comparison (below).
# Any failed step fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
start=$(date +%s)
step_start=$start
# How long each step took, so that CI's log shows where the time goes (the suite must stay under 25 minutes).
step_done() { local now; now=$(date +%s); echo "step: $1 took $(( now - step_start )) s"; step_start=$now; }
scripts/setup.sh --no-run
step_done "setup (packages, reference tools, build, model)"

source scripts/cache_paths.sh
CACHE="$CHOREO_CACHE"
export CHOREO_PYTHON="$CHOREO_VENV/bin/python"
export CHOREO_SHARED="${CHOREO_SHARED:-$ROOT/../shared}"
[[ -d "$CHOREO_SHARED" ]] || { echo "error: shared data not found at $CHOREO_SHARED (set CHOREO_SHARED)" >&2; exit 1; }

# The CUDA kernels (issue 14) are built by setup.sh whenever nvcc is installed; a .cu that does not compile
# fails the build above. Their logic runs below in the block emulator; on the device only through
# scripts/gpu_check.sh on a machine with a GPU.
if command -v nvcc >/dev/null 2>&1 || [[ -x /usr/local/cuda/bin/nvcc ]]; then
  [[ -x "$ROOT/build/cuda_selftest" ]] || { echo "error: nvcc is installed but the CUDA kernels were not built" >&2; exit 1; }
  printf '\033[1m==> CUDA kernels built with nvcc (%s); no GPU here: their logic is tested in emulation\033[0m\n' \
    "$(grep -m1 CMAKE_CUDA_COMPILER_VERSION "$ROOT/build/CMakeFiles/"*/CMakeCUDACompiler.cmake 2>/dev/null | grep -o '[0-9][0-9.]*' || echo '?')"
fi

# `ctest --test-dir build -j2` (README) runs each doctest case by its name, as CMake read the names from the
# binary: a name CMake's list syntax breaks (';', an unclosed '[') left ctest unable to list anything (issue 42,
# finding 13). Its list must be the binary's, name for name (about 0.2 s).
printf '\033[1m==> ctest lists every doctest case\033[0m\n'
ctest_list=$(ctest --test-dir "$ROOT/build" -N 2>&1) ||
  { echo "error: ctest -N failed:" >&2; tail -n 20 <<<"$ctest_list" >&2; exit 1; }
ctest_names=$(sed -n 's/^ *Test *#[0-9]*: //p' <<<"$ctest_list" | sort)
doctest_names=$("$ROOT/build/choreo_tests" --list-test-cases | grep -v '^\[doctest\]\|^====' | sort)
if [[ "$ctest_names" != "$doctest_names" ]]; then
  echo "error: ctest -N does not list the doctest cases as build/choreo_tests --list-test-cases does:" >&2
  diff <(echo "$ctest_names") <(echo "$doctest_names") >&2 || true
  exit 1
fi
echo "$(wc -l <<<"$doctest_names") cases, the same in both"

# One process runs every doctest case (ctest --test-dir build -j2 runs each case in its own process and
# names a failure by its case, but loading the models once per case makes it about 3x slower on 2 cores).
printf '\033[1m==> unit, conformance and differential tests\033[0m\n'
# The CPU it used against its wall time says how much a second process could gain on 2 cores.
TIMEFORMAT='doctest binary: %R s wall, %U s user, %S s system'
time CHOREO_SOURCE_DIR="$ROOT" timeout 1800 "$ROOT/build/choreo_tests"
step_done "unit, conformance and differential tests"

# The GPU bundle (issue 41, docs/cuda.md): built from this build (about 6 s: strip, ldd, gzip) and run in a bare
# Debian 12 root by chroot, where it must find every library it needs in itself or glibc, generate with the
# emulated CUDA backend and say that there is no device (about 2 s). Only where that root is already cached
# (scripts/gpu_bundle_check.sh makes it once, with debootstrap and the network) and the suite runs as root.
bare="${CHOREO_BARE_ROOT:-$CACHE/bare-bookworm}"
if [[ -x "$ROOT/build/cuda_selftest" && $(id -u) == 0 && -f "$bare/.choreo-complete" ]] && command -v debootstrap >/dev/null; then
  printf '\033[1m==> the GPU bundle in a bare Debian root (%s)\033[0m\n' "$bare"
  CHOREO_BUNDLE_BUILD="$ROOT/build" scripts/gpu_bundle.sh
  CHOREO_BARE_ROOT="$bare" scripts/gpu_bundle_check.sh >"$ROOT/build/gpu_bundle_check.md" ||
    { cat "$ROOT/build/gpu_bundle_check.md"; exit 1; }
  grep -E '^\| [0-9]+ \|' "$ROOT/build/gpu_bundle_check.md"
else
  echo "SKIP: the GPU bundle's check needs nvcc, root, debootstrap and a cached bare root ($bare): run scripts/gpu_bundle_check.sh once"
fi
step_done "the GPU bundle in a bare Debian root"

# The old-vs-new comparison (scripts/compare_binaries.sh: every shipped workflow, three modes, two models, on the
# binary of commit e4f4132 and on this one) is a refactor's check, not every run's: building the old binary and
# running both takes about 17 minutes on 2 cores, two thirds of the suite's 25-minute budget. A change that must
# not change output runs it: CHOREO_COMPARE=1 scripts/test.sh (README.md, "The two commands").
base=e4f4132
if [[ "${CHOREO_COMPARE:-0}" == 1 ]]; then
  printf '\033[1m==> old vs new binary: every shipped workflow, three modes, two models, against %s\033[0m\n' "$base"
  if git -C "$ROOT" cat-file -e "$base^{commit}" 2>/dev/null; then
    old="$ROOT/build/compare-base"
    if [[ ! -x "$old/build/choreo" ]]; then
      rm -rf "$old"
      mkdir -p "$old"
      git -C "$ROOT" archive "$base" | tar -x -C "$old"
      cmake -S "$old" -B "$old/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCHOREO_TESTS=OFF >/dev/null
      ninja -C "$old/build" choreo-cli
    fi
    # The tier comparisons (TIERS=1) ran against a18d5cf when the tier manager was built (BENCHMARKS.md); here the
    # tiers' invariance is the test binary's (tests/runtime/tiers_workflows_test.cc), which keeps the suite in time.
    TIERS="${TIERS:-0}" MAX_TOKENS="${MAX_TOKENS:-16}" scripts/compare_binaries.sh "$old/build/choreo" "$ROOT/build/choreo"
  else
    echo "error: CHOREO_COMPARE=1, but commit $base is not in this clone's history (a shallow clone?)" >&2
    exit 1
  fi
  step_done "old vs new binary"
else
  echo "SKIP: the old-vs-new binary comparison (a refactor's check, about 17 minutes): CHOREO_COMPARE=1 runs it"
fi

printf '\033[1m==> fuzzing: GGUF reader, workflow YAML, expressions, PML, tokenizers, exec calls, eval data, store entries, choreo.toml, LoRA adapters, finetune traces and checkpoints (%s s each)\033[0m\n' "${CHOREO_FUZZ_SECONDS:-15}"
scripts/fuzz.sh "${CHOREO_FUZZ_SECONDS:-15}"
step_done "fuzzing"

echo "all test steps passed in $(( $(date +%s) - start )) s"
