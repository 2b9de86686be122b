#!/usr/bin/env bash
# Fetches the pinned llama.cpp release (tag v0.4.0) from the npm registry into
# .deps/llama/ (ignored by git):
#   .deps/llama/lib/      prebuilt CPU shared libraries of @node-llama-cpp/linux-x64@3.21.1
#                         (plus the libllama.so / libggml.so links the package lacks)
#   .deps/llama/include/  llama.h, ggml*.h and gguf.h from the source bundle in node-llama-cpp@3.21.1
# Idempotent: does nothing when .deps/llama/STAMP names this version. Needs npm, git, tar.
# CMake (CACHEGEN_LLAMA=AUTO) uses this folder when no system llama.cpp is found.
# Exit status 0 on success or when already present; non-zero (with a message) otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION="3.21.1"
TAG="v0.4.0"
DEST=".deps/llama"
STAMP="node-llama-cpp@${VERSION} llama.cpp ${TAG}"

if [ -f "$DEST/STAMP" ] && [ "$(cat "$DEST/STAMP")" = "$STAMP" ] && [ -e "$DEST/lib/libllama.so" ] &&
   [ -f "$DEST/include/llama.h" ]; then
  echo "fetch-llama: $STAMP already in $DEST"
  exit 0
fi

if [ "$(uname -s)-$(uname -m)" != "Linux-x86_64" ]; then
  echo "fetch-llama: prebuilt libraries exist here only for Linux x86_64 (this is $(uname -s)-$(uname -m))" >&2
  exit 1
fi
for tool in npm git tar; do
  if ! command -v "$tool" >/dev/null; then
    echo "fetch-llama: '$tool' not found" >&2
    exit 1
  fi
done

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

echo "fetch-llama: npm pack @node-llama-cpp/linux-x64@${VERSION} node-llama-cpp@${VERSION}"
(cd "$work" && npm pack --silent "@node-llama-cpp/linux-x64@${VERSION}" "node-llama-cpp@${VERSION}" >/dev/null)

mkdir -p "$work/bins" "$work/src"
tar xzf "$work/node-llama-cpp-linux-x64-${VERSION}.tgz" -C "$work/bins" package/bins/linux-x64
tar xzf "$work/node-llama-cpp-${VERSION}.tgz" -C "$work/src" package/llama/gitRelease.bundle
git clone -q --bare "$work/src/package/llama/gitRelease.bundle" "$work/llama.git"

rm -rf "$DEST.tmp"
mkdir -p "$DEST.tmp/lib" "$DEST.tmp/include"
cp "$work"/bins/package/bins/linux-x64/lib*.so "$DEST.tmp/lib/"
ln -s "libllama.${TAG}.so" "$DEST.tmp/lib/libllama.so"
ln -s "libggml.${TAG}.so" "$DEST.tmp/lib/libggml.so"
git -C "$work/llama.git" archive HEAD include ggml/include | tar x -C "$work/src"
cp "$work"/src/include/*.h "$work"/src/ggml/include/*.h "$DEST.tmp/include/"
for f in llama.h ggml.h ggml-backend.h gguf.h; do
  if [ ! -f "$DEST.tmp/include/$f" ]; then
    echo "fetch-llama: $f missing from the source bundle" >&2
    exit 1
  fi
done
echo "$STAMP" >"$DEST.tmp/STAMP"
rm -rf "$DEST"
mv "$DEST.tmp" "$DEST"
echo "fetch-llama: $STAMP in $DEST"
