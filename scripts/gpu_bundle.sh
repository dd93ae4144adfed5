#!/usr/bin/env bash
# scripts/gpu_bundle.sh: builds the GPU bundle (issue 41): everything choreo's first run on an NVIDIA GPU needs,
# in gpu-bundle/ (ignored by git), at most 60 MiB as carried, for a machine that has a GPU, its driver, the CUDA
# toolkit's cuBLASLt and no Debian packages of ours. docs/cuda.md, "The first GPU run", says how to carry and run it.
#
#   scripts/gpu_bundle.sh
#
# 1. Builds choreo, cuda_selftest and choreo_tests with the CUDA backend required (-DCHOREO_CUDA=ON: sm_80 and
#    sm_90 machine code, sm_90 PTX) in the suite's build/ ($CHOREO_BUNDLE_BUILD for another): a Release build
#    that scripts/setup.sh configured with nvcc installed already has them, so only what changed is rebuilt (a
#    fresh directory is configured as setup.sh does, with ccache when installed). Set CHOREO_CPU_LOCK to a lock
#    file to build and compress under `flock` (a shared machine's rule).
# 2. Stages bin/ (the three binaries, stripped), lib/ (every shared library of their ldd closure but glibc's and
#    the CUDA driver's: OpenBLAS, libstdc++ and the rest; the CUDA runtime is linked statically, cuBLASLt is
#    opened at run time from the machine's toolkit), shared/models/stories260K.gguf and workflows/madpar.yaml.
# 3. Packs them as payload.tar.gz (gzip: the bare Debian root of scripts/gpu_bundle_check.sh has no xz), beside
#    run.sh (scripts/gpu_bundle_run.sh) and a MANIFEST, and fails when the bundle exceeds 60 MiB.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${CHOREO_BUNDLE_BUILD:-$ROOT/build}"
OUT="$ROOT/gpu-bundle"
SHARED="${CHOREO_SHARED:-$ROOT/../shared}"
LIMIT_MIB=60
LOCKED=()
[[ -n "${CHOREO_CPU_LOCK:-}" ]] && LOCKED=(flock "$CHOREO_CPU_LOCK")

die() { echo "gpu_bundle: $*" >&2; exit 1; }
say() { echo "gpu_bundle: $*" >&2; }
[[ -f "$SHARED/models/stories260K.gguf" ]] || die "no $SHARED/models/stories260K.gguf (set CHOREO_SHARED)"

say "building choreo, cuda_selftest and choreo_tests with CUDA in $BUILD"
if [[ -f "$BUILD/CMakeCache.txt" ]]; then
  # An existing build keeps its generator and launchers (a changed launcher would rebuild everything); it must
  # be a Release build, since the bundle's numbers are benchmarks.
  grep -q '^CMAKE_BUILD_TYPE:STRING=Release$' "$BUILD/CMakeCache.txt" || die "$BUILD is not a Release build"
  cmake -S "$ROOT" -B "$BUILD" -DCHOREO_CUDA=ON >/dev/null
else
  LAUNCHERS=()
  if command -v ccache >/dev/null; then
    LAUNCHERS=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  fi
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCHOREO_CUDA=ON ${LAUNCHERS[@]+"${LAUNCHERS[@]}"} >/dev/null
fi
${LOCKED[@]+"${LOCKED[@]}"} ninja -C "$BUILD" choreo-cli cuda_selftest choreo_tests >&2

STAGE="$BUILD/bundle-stage"
rm -rf "$STAGE"
mkdir -p "$STAGE/bin" "$STAGE/lib" "$STAGE/shared/models" "$STAGE/workflows"
for b in choreo cuda_selftest choreo_tests; do
  cp "$BUILD/$b" "$STAGE/bin/$b"
  strip --strip-unneeded "$STAGE/bin/$b"
done
cp "$SHARED/models/stories260K.gguf" "$STAGE/shared/models/"
cp "$ROOT/workflows/madpar.yaml" "$STAGE/workflows/"

# The ldd closure, less what the machine brings: glibc (libc, libm, libdl, librt, libpthread, the loader) and
# the CUDA driver. A CUDA library among the rest means something links what should be static or opened at run time.
GLIBC='^(linux-vdso|libc|libm|libdl|librt|libpthread|libresolv|libutil|libmvec|ld-linux-x86-64)\.so'
for b in "$STAGE"/bin/*; do
  ldd "$b" | grep -q "not found" && die "$b: a library is not found here: $(ldd "$b" | grep 'not found')"
  ldd "$b" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r name path; do
  [[ "$name" =~ $GLIBC ]] && continue
  [[ "$name" =~ ^lib(cuda|nvidia|cudart|cublas) ]] && die "$name is linked; the bundle leaves CUDA libraries to the machine (static runtime, cuBLASLt by dlopen)"
  cp -L "$path" "$STAGE/lib/$name"
done
# Every library resolves within the bundle (and glibc) with the system's library paths out of the way.
for b in "$STAGE"/bin/*; do
  LD_LIBRARY_PATH="$STAGE/lib" ldd "$b" | awk -v lib="$STAGE/lib/" -v glibc="$GLIBC" -v bin="${b##*/}" \
    '$2 == "=>" && index($3, lib) != 1 && $1 !~ glibc {print "gpu_bundle: " bin ": " $1 " is not in the bundle"; bad = 1}
     END {exit bad}' || die "the bundle's libraries are incomplete"
done
GLIBC_NEEDED=$(for f in "$STAGE"/bin/* "$STAGE"/lib/*; do objdump -T "$f" 2>/dev/null; done |
  grep -o 'GLIBC_[0-9][0-9.]*' | sort -Vu | tail -1)

say "packing (gzip -6: -9 saves 0.1 MiB for 2.7 times the time)"
mkdir -p "$OUT"
rm -f "$OUT"/payload.tar.gz "$OUT"/run.sh "$OUT"/MANIFEST
${LOCKED[@]+"${LOCKED[@]}"} bash -c "tar -C '$STAGE' -cf - . | gzip -6 > '$OUT/payload.tar.gz.partial'"
mv "$OUT/payload.tar.gz.partial" "$OUT/payload.tar.gz"
cp "$ROOT/scripts/gpu_bundle_run.sh" "$OUT/run.sh"
chmod +x "$OUT/run.sh"
BYTES=$(du -cb "$OUT"/payload.tar.gz "$OUT"/run.sh | tail -1 | cut -f1)
{
  echo "commit: $(git -C "$ROOT" rev-parse --short HEAD)$(git -C "$ROOT" diff --quiet HEAD 2>/dev/null || echo ' (with uncommitted changes)')"
  echo "built: $(date -u '+%Y-%m-%d %H:%M UTC') on $(. /etc/os-release && echo "$PRETTY_NAME"), nvcc $(grep -m1 -o 'CMAKE_CUDA_COMPILER_VERSION "[0-9.]*"' "$BUILD"/CMakeFiles/*/CMakeCUDACompiler.cmake | grep -o '[0-9.]*'), for $(grep -o '80-real;90-real;90-virtual' "$ROOT/CMakeLists.txt")"
  echo "bundle: $((BYTES / 1048576)) MiB as carried; unpacked $(du -sh "$STAGE" | cut -f1); needs glibc with $GLIBC_NEEDED, the CUDA driver and libcublasLt.so.13"
  echo "sha256: $(sha256sum "$OUT/payload.tar.gz" | cut -d' ' -f1)  payload.tar.gz"
  echo
  echo "payload:"
  (cd "$STAGE" && find . -type f -printf '%10s  %p\n' | sort -k2)
} >"$OUT/MANIFEST"
BYTES=$(du -cb "$OUT" | tail -1 | cut -f1)
say "$OUT: $(awk -v b="$BYTES" 'BEGIN {printf "%.1f", b / 1048576}') MiB (limit $LIMIT_MIB MiB)"
((BYTES <= LIMIT_MIB * 1048576)) || die "the bundle is $BYTES bytes, more than $LIMIT_MIB MiB"
