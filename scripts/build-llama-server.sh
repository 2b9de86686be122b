#!/usr/bin/env bash
# Builds llama.cpp's own llama-server (the pinned release, tag v0.4.0, from the
# source bundle in the npm package node-llama-cpp@3.21.1) into
# .deps/llama-server/bin/llama-server (ignored by git). scripts/test.sh runs
# it (a CPU-only build of the llama-server target: 305 s at -j2 on a 2-core
# VM). tests/unit/llama_server_slot_test.cc uses it when it is there (or
# CACHEGEN_LLAMA_SERVER names another binary).
# Idempotent: does nothing when the STAMP names this version.
# Usage: scripts/build-llama-server.sh [-jN]   (default -j2). Needs npm, git, tar, cmake, ninja, a C++ compiler.
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION="3.21.1"
TAG="v0.4.0"
DEST=".deps/llama-server"
STAMP="node-llama-cpp@${VERSION} llama.cpp ${TAG} llama-server"
JOBS="${1:--j2}"

if [ -f "$DEST/STAMP" ] && [ "$(cat "$DEST/STAMP")" = "$STAMP" ] && [ -x "$DEST/bin/llama-server" ]; then
  echo "build-llama-server: $STAMP already in $DEST"
  exit 0
fi
for tool in npm git tar cmake ninja; do
  if ! command -v "$tool" >/dev/null; then
    echo "build-llama-server: '$tool' not found" >&2
    exit 1
  fi
done

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
echo "build-llama-server: npm pack node-llama-cpp@${VERSION}"
(cd "$work" && npm pack --silent "node-llama-cpp@${VERSION}" >/dev/null)
tar xzf "$work/node-llama-cpp-${VERSION}.tgz" -C "$work" package/llama/gitRelease.bundle
git clone -q "$work/package/llama/gitRelease.bundle" "$work/llama.cpp"

# CPU only, static, no TLS, no web UI download (nothing but the npm registry is reached).
cmake -S "$work/llama.cpp" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
  -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF >/dev/null
start=$(date +%s)
ninja -C "$work/build" "$JOBS" llama-server
echo "build-llama-server: built in $(( $(date +%s) - start )) s"

rm -rf "$DEST.tmp"
mkdir -p "$DEST.tmp/bin"
cp "$work/build/bin/llama-server" "$DEST.tmp/bin/"
echo "$STAMP" >"$DEST.tmp/STAMP"
rm -rf "$DEST"
mv "$DEST.tmp" "$DEST"
echo "build-llama-server: $STAMP in $DEST"
