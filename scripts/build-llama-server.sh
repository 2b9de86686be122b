#!/usr/bin/env bash
# Builds llama.cpp's own llama-server (the pinned release, tag v0.4.0, from the
# source bundle in the npm package node-llama-cpp@3.21.1) into
# .deps/llama-server/bin/llama-server (ignored by git). scripts/test.sh runs
# it (a CPU-only build of the llama-server target: 305 s at -j2 on a 2-core
# VM). tests/unit/llama_server_slot_test.cc uses it when it is there (or
# CACHEGEN_LLAMA_SERVER names another binary).
# Idempotent: does nothing when the STAMP names this version. A build is also
# kept outside the clone, keyed by the version, in
# ${CACHEGEN_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/cachegen}/llama-server/<version>/,
# so that a fresh clone on the same machine (a CI rerun) copies it instead of
# building again; a new machine still builds it.
# Usage: scripts/build-llama-server.sh [-jN]   (default -j2). Needs npm, git, tar, cmake, ninja, a C++ compiler.
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION="3.21.1"
TAG="v0.4.0"
DEST=".deps/llama-server"
STAMP="node-llama-cpp@${VERSION} llama.cpp ${TAG} llama-server"
JOBS="${1:--j2}"

CACHE="${CACHEGEN_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/cachegen}/llama-server/${VERSION}-${TAG}"

# A complete build (STAMP and binary) in folder $1.
complete() { [ -f "$1/STAMP" ] && [ "$(cat "$1/STAMP")" = "$STAMP" ] && [ -x "$1/bin/llama-server" ]; }
# Copies folder $1 to folder $2 through a temporary one, so $2 is whole or absent.
install_copy() {
  rm -rf "$2.tmp"
  mkdir -p "$(dirname "$2")"
  cp -r "$1" "$2.tmp"
  rm -rf "$2"
  mv "$2.tmp" "$2"
}

if complete "$DEST"; then
  echo "build-llama-server: $STAMP already in $DEST"
  exit 0
fi
if complete "$CACHE"; then
  install_copy "$CACHE" "$DEST"
  echo "build-llama-server: $STAMP copied from $CACHE"
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

mkdir -p "$work/out/bin"
cp "$work/build/bin/llama-server" "$work/out/bin/"
echo "$STAMP" >"$work/out/STAMP"
install_copy "$work/out" "$DEST"
echo "build-llama-server: $STAMP in $DEST"
if install_copy "$work/out" "$CACHE" 2>/dev/null; then
  echo "build-llama-server: kept in $CACHE for later clones"
else
  echo "build-llama-server: could not keep a copy in $CACHE (later clones build again)" >&2
fi
