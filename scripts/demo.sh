#!/usr/bin/env bash
# The main job: build cachegen (Release, build/, with llama.cpp from the npm
# registry) and run `cachegen demo`: stories260K (../shared, else a generated
# random-weight model) prefills a context, its KV is compressed by the default
# codec and restored into a fresh context, and the demo prints the size ratio,
# dPPL and the sentence generated with the exact and the restored KV, then
# the same with a model profile it learns first from other windows. Without
# llama.cpp (fetch failed) it prints the synthetic codec table instead.
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS="${JOBS:-$(nproc)}"

bash scripts/setup.sh
bash scripts/fetch-llama.sh || echo "demo.sh: llama.cpp not fetched; the demo runs on synthetic KV" >&2
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCACHEGEN_BUILD_BENCH=OFF >/dev/null
ninja -C build -j"$JOBS" cachegen_cli
build/cachegen demo "$@"
