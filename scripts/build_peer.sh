#!/usr/bin/env bash
# Builds the peer's own binaries, llama.cpp's `llama-bench`, `llama-batched-bench` and `llama-server` (the
# last for scripts/bench_serve.py; not in the CUDA build), natively
# from the llama.cpp source that the llama-cpp-python sdist vendors (the same version choreo's Python
# reference tools use), and caches them next to choreo's venv. Prints the directory that holds them.
# Idempotent: cached binaries are reused.
#
#   scripts/build_peer.sh            # -> ~/.cache/choreo/peer/llama-cpp-python-0.3.36/bin
#   scripts/build_peer.sh --cuda     # llama.cpp's CUDA build (-DGGML_CUDA=ON), for scripts/gpu_check.sh
#                                    # -> ~/.cache/choreo/peer/llama-cpp-python-0.3.36/bin-cuda
#
# Needs cmake and a C++ compiler (scripts/setup.sh installs both) and PyPI for the sdist (pip download).
set -euo pipefail

VERSION=0.3.36
source "$(dirname "${BASH_SOURCE[0]}")/cache_paths.sh"
CACHE="$CHOREO_CACHE"
VENV="$CHOREO_VENV"
PEER="$CACHE/peer/llama-cpp-python-$VERSION"
TOOLS=(llama-bench llama-batched-bench llama-server)
FLAVOUR=""
CUDA_FLAGS=()
SERVER=ON
if [[ "${1:-}" == "--cuda" ]]; then
  FLAVOUR="-cuda"
  CUDA_FLAGS=(-DGGML_CUDA=ON)
  TOOLS=(llama-bench llama-batched-bench)
  SERVER=OFF
elif [[ $# -gt 0 ]]; then
  echo "usage: scripts/build_peer.sh [--cuda]" >&2
  exit 2
fi

have_all() {
  for t in "${TOOLS[@]}"; do [[ -x "$PEER/bin$FLAVOUR/$t" ]] || return 1; done
}
if have_all; then
  echo "$PEER/bin$FLAVOUR"
  exit 0
fi

say() { echo "build_peer: $*" >&2; }
mkdir -p "$PEER"
PIP="$VENV/bin/pip"
[[ -x "$PIP" ]] || PIP="python3 -m pip"
if [[ ! -f "$PEER/llama_cpp_python-$VERSION.tar.gz" ]]; then
  say "downloading the llama-cpp-python $VERSION sdist"
  $PIP download -q --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$PEER" >&2
fi
SRC="$PEER/src"
if [[ ! -d "$SRC/vendor/llama.cpp" ]]; then
  rm -rf "$SRC.partial"
  mkdir -p "$SRC.partial"
  tar xzf "$PEER/llama_cpp_python-$VERSION.tar.gz" -C "$SRC.partial" --strip-components=1
  mv "$SRC.partial" "$SRC"
fi

# Native: the peer gets every instruction set this CPU has (-march=native), as a user building llama.cpp
# would. OpenMP on, as llama.cpp's default CPU build.
say "building ${TOOLS[*]} (a few minutes)"
cmake -S "$SRC/vendor/llama.cpp" -B "$PEER/build$FLAVOUR" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
  -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_SERVER=$SERVER -DLLAMA_BUILD_TOOLS=ON -DBUILD_SHARED_LIBS=OFF ${CUDA_FLAGS[@]+"${CUDA_FLAGS[@]}"} >&2
cmake --build "$PEER/build$FLAVOUR" --target "${TOOLS[@]}" -j"$(nproc)" >&2
mkdir -p "$PEER/bin$FLAVOUR"
for t in "${TOOLS[@]}"; do
  cp "$PEER/build$FLAVOUR/bin/$t" "$PEER/bin$FLAVOUR/$t.partial"
  mv "$PEER/bin$FLAVOUR/$t.partial" "$PEER/bin$FLAVOUR/$t"
done
echo "$PEER/bin$FLAVOUR"
