#!/usr/bin/env bash
# Fuzzes the GGUF reader with libFuzzer + ASan + UBSan.
#   scripts/fuzz.sh [seconds=60]
# Builds build-fuzz/ with clang (the whole library instrumented), seeds build-fuzz/gguf-corpus with the shared
# GGUF files and writer-made files, runs for the given time and exits non-zero on any crash, leak or timeout
# (the failing input is saved as build-fuzz/artifacts/crash-*; re-run it with build-fuzz/gguf_fuzz <file>).
set -euo pipefail

seconds="${1:-60}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
shared="${CHOREO_SHARED:-$root/../shared}"
build="$root/build-fuzz"
sanitizers="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"

CC=clang CXX=clang++ cmake -S "$root" -B "$build" -G Ninja \
  -DCHOREO_FUZZ=ON -DCHOREO_TESTS=OFF -DCHOREO_WERROR=OFF \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS="$sanitizers" -DCMAKE_C_FLAGS="$sanitizers" \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g" >/dev/null
ninja -C "$build" -j2 gguf_fuzz

corpus="$build/gguf-corpus"
artifacts="$build/artifacts"
mkdir -p "$corpus" "$artifacts"
if [[ -d "$shared/models" ]]; then
  find "$shared/models" -name '*.gguf' -exec cp -f {} "$corpus/" \;
else
  echo "fuzz.sh: $shared/models not found; seeding with writer-made files only" >&2
fi
# Writer-made seeds (every value type, alignments, vocab-only, tiny synthetic models).
if ! CHOREO_FUZZ_SEED_DIR="$corpus" "$build/gguf_fuzz" -runs=0 "$corpus" >"$build/seed.log" 2>&1; then
  cat "$build/seed.log" >&2
  echo "fuzz.sh: writing or replaying the seed corpus failed" >&2
  exit 1
fi

dict="$build/gguf.dict"
cat >"$dict" <<'DICT'
"GGUF"
"\x03\x00\x00\x00"
"\x02\x00\x00\x00"
"general.alignment"
"tokenizer.ggml.tokens"
"\x08\x00\x00\x00"
"\x09\x00\x00\x00"
"\xff\xff\xff\xff\xff\xff\xff\xff"
DICT

echo "fuzz.sh: fuzzing gguf_fuzz for ${seconds}s (corpus $corpus)"
"$build/gguf_fuzz" "$corpus" \
  -max_total_time="$seconds" -max_len=1048576 -rss_limit_mb=2048 -timeout=20 \
  -dict="$dict" -artifact_prefix="$artifacts/" -print_final_stats=1
