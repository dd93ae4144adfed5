#!/usr/bin/env bash
# scripts/gpu_bundle_check.sh: runs the GPU bundle (gpu-bundle/, made by scripts/gpu_bundle.sh) in a bare Debian 12
# root, with no GPU and none of the build's packages, to show that it needs nothing the GPU machine lacks
# (issue 41): `gpu-bundle/run.sh --selfcheck` there unpacks the payload, finds every library of its binaries in
# the bundle or in the bare root's glibc, runs `choreo --backend cuda-emulated generate` on stories260K (the
# CUDA kernels in the block emulator: the greedy text shared/README.md gives), and checks that cuda_selftest
# and `choreo --backend cuda` say clearly that there is no CUDA device.
#
#   scripts/gpu_bundle_check.sh [BUNDLE_DIR]        (default: gpu-bundle/ of this repository)
#
# Needs root (chroot, mount), debootstrap and Debian's mirror (apt's own). The root is made once with
# `debootstrap --variant=minbase bookworm` (required packages only: no compiler, no dev packages, no xz, no
# Python) and kept in $CHOREO_BARE_ROOT (default ~/.cache/choreo/bare-bookworm); each check copies the bundle
# into a fresh directory inside it. scripts/test.sh runs this when that root is already cached (it never
# makes it: the first debootstrap takes minutes and the network; docs/cuda.md, "The first GPU run"). Prints
# run.sh's summary; exit 0 only if every self-check step passed.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUNDLE="$(cd "${1:-$ROOT/gpu-bundle}" && pwd)"
source "$ROOT/scripts/cache_paths.sh"
BARE="${CHOREO_BARE_ROOT:-$CHOREO_CACHE/bare-bookworm}"
MIRROR="${CHOREO_DEBIAN_MIRROR:-http://deb.debian.org/debian}"

die() { echo "gpu_bundle_check: $*" >&2; exit 2; }
[[ -f "$BUNDLE/run.sh" ]] || die "no bundle at $BUNDLE (run scripts/gpu_bundle.sh first)"
[[ $(id -u) == 0 ]] || die "needs root (debootstrap, chroot and mount)"
command -v debootstrap >/dev/null || die "needs debootstrap (apt-get install debootstrap)"

if [[ ! -f "$BARE/.choreo-complete" ]]; then
  echo "gpu_bundle_check: debootstrap --variant=minbase bookworm into $BARE (once; a few minutes)" >&2
  rm -rf "$BARE"
  mkdir -p "$BARE"
  debootstrap --variant=minbase bookworm "$BARE" "$MIRROR" >"$BARE.debootstrap.log" 2>&1 ||
    die "debootstrap failed (log: $BARE.debootstrap.log)"
  touch "$BARE/.choreo-complete"
fi
# The bare root really is bare: none of what the build links, no compiler.
for absent in usr/include/yaml-cpp usr/include/fmt usr/lib/x86_64-linux-gnu/libopenblas.so.0 \
  usr/lib/x86_64-linux-gnu/libyaml-cpp.so.0.7 usr/lib/x86_64-linux-gnu/libfmt.so.9 usr/bin/g++ usr/bin/xz \
  usr/bin/python3; do
  [[ ! -e "$BARE/$absent" ]] || die "$BARE is not bare: it has /$absent (remove it to make a fresh one)"
done

# A fresh copy of the bundle, and /proc and /dev for the programs; unmounted and removed on the way out.
RUN="$BARE/check"
cleanup() {
  umount "$BARE/proc" 2>/dev/null || true
  umount "$BARE/dev" 2>/dev/null || true
  rm -rf "$RUN"
}
trap cleanup EXIT
rm -rf "$RUN"
mkdir -p "$RUN"
cp -a "$BUNDLE" "$RUN/gpu-bundle"
mount -t proc proc "$BARE/proc"
mount --bind /dev "$BARE/dev"
status=0
chroot "$BARE" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root OUT=/check/results \
  CHOREO_BUNDLE_WORK=/check/work /bin/bash /check/gpu-bundle/run.sh --selfcheck || status=$?
cat "$RUN/results/summary.md" 2>/dev/null || echo "gpu_bundle_check: run.sh wrote no summary" >&2
exit $status
