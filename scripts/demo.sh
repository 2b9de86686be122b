#!/usr/bin/env bash
# The main job: build cachegen (Release, build/) and run `cachegen demo`, which
# encodes a synthetic production-shaped KV cache with every codec, decodes it
# and prints size, error and speed side by side.
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS="${JOBS:-$(nproc)}"

bash scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCACHEGEN_BUILD_BENCH=OFF >/dev/null
ninja -C build -j"$JOBS" cachegen_cli
build/cachegen demo "$@"
