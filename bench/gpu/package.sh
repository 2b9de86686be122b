#!/usr/bin/env bash
# Builds the CUDA decoder's checks here (bench/gpu/run.sh --build-only) and
# copies what a GPU machine without this project's build dependencies needs
# to run them into OUT: the three binaries, the shared libraries they load
# that are not the C library's own or the GPU driver's, and bench/gpu/run.sh.
# There:
#
#   SKIP_BUILD=1 OUT/bench/gpu/run.sh [bench options]
#
#   bench/gpu/package.sh OUT
#
# The binaries need a C library at least as new as this machine's build
# needed (objdump -T shows the GLIBC_ versions). Environment as run.sh's.
# Exit status: 0 packaged, 1 failure.
set -euo pipefail
out=${1:?usage: bench/gpu/package.sh OUT}
cd "$(dirname "$0")/../.."
build=${BUILD:-build-cuda}
bench/gpu/run.sh --build-only
mkdir -p "$out/bench/gpu" "$out/build-cuda/lib"
cp bench/gpu/run.sh "$out/bench/gpu/"
bins=(gpu_plan_test schedule_parity_test cuda_decoder_test cachegen_cuda_bench)
for b in "${bins[@]}"; do cp "$build/$b" "$out/build-cuda/"; done
# Every resolved library but the C library's own (libc, libm, libdl, ...,
# which must come from the target) and the driver's (libcuda).
for b in "${bins[@]}"; do ldd "$build/$b"; done |
  awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u |
  grep -Ev '/(libc|libm|libdl|libpthread|librt|libcuda)\.so' |
  while read -r lib; do cp -L "$lib" "$out/build-cuda/lib/"; done
echo "packaged into $out ($(du -sh "$out" | cut -f1)); on the GPU machine: SKIP_BUILD=1 $out/bench/gpu/run.sh"
