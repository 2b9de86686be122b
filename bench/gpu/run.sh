#!/usr/bin/env bash
# The CUDA decoder's checks and benchmark in one command, for a machine with
# an NVIDIA GPU (docs/GPU.md): configures a CUDA build, builds, runs
# gpu_plan_test (the plan's checks of hostile input), schedule_parity_test
# (every decode schedule, the device among them, against the reference),
# cuda_decoder_test (device errors per job) and cachegen_cuda_bench (decode
# GB/s vs cudaMemcpy device-to-device), and prints the figures.
#
#   bench/gpu/run.sh [--build-only] [bench options, e.g. --reps 50 --bits 3]
#
# --build-only stops after the build (bench/gpu/package.sh uses it).
# Environment: BUILD (build folder, default build-cuda), CUDA_ARCH (default 90,
# H100/H200), JOBS (parallel build jobs, default all cores), SKIP_BUILD=1 (run
# the binaries already in BUILD, e.g. a package from bench/gpu/package.sh; its
# BUILD/lib, if present, goes first on LD_LIBRARY_PATH).
# Exit status: 0 all passed, 1 a build, test or bench failure, 2 no CUDA device.
set -u
cd "$(dirname "$0")/../.."
build=${BUILD:-build-cuda}
arch=${CUDA_ARCH:-90}
jobs=${JOBS:-$(nproc)}
build_only=0
if [ "${1:-}" = "--build-only" ]; then build_only=1; shift; fi
generator=()
command -v ninja > /dev/null && generator=(-G Ninja)

step() { printf '\n== %s\n' "$*"; }

if [ "${SKIP_BUILD:-0}" != 1 ]; then
  step "configure ($build, sm_$arch)"
  cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DCACHEGEN_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="$arch" -DCACHEGEN_LLAMA=OFF || exit 1
  step "build"
  cmake --build "$build" -j "$jobs" --target gpu_plan_test schedule_parity_test cuda_decoder_test cachegen_cuda_bench || exit 1
  [ "$build_only" = 1 ] && exit 0
fi
[ -d "$build/lib" ] && export LD_LIBRARY_PATH="$PWD/$build/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

step "gpu_plan_test (the plan on hostile input; device code on the CPU)"
"$build/gpu_plan_test" --gtest_brief=1 || exit 1

step "device"
"$build/cachegen_cuda_bench" --check-device
rc=$?
if [ "$rc" -eq 2 ]; then
  echo "no CUDA device here: the CPU checks passed; run this script on a GPU machine for the rest"
  exit 2
fi
[ "$rc" -eq 0 ] || exit 1

step "schedule_parity_test (every schedule, the device among them, vs the reference)"
"$build/schedule_parity_test" --gtest_brief=1 || exit 1

step "cuda_decoder_test (device output vs the CPU decoder)"
"$build/cuda_decoder_test" --gtest_brief=1 || exit 1

step "cachegen_cuda_bench (Llama-3-8B shape, 4096 tokens, default codec settings)"
"$build/cachegen_cuda_bench" "$@" || exit 1

step "cachegen_cuda_bench --profile (the same with a model profile: the default quality path)"
"$build/cachegen_cuda_bench" --profile "$@" || exit 1
echo
echo "all passed"
