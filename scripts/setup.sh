#!/usr/bin/env bash
# Installs the Debian packages cachegen needs to build and test. Idempotent:
# only packages that `dpkg -s` reports missing are installed (sudo only when
# not root).
set -euo pipefail

PACKAGES=(cmake ninja-build g++ clang libclang-rt-14-dev pkg-config libzstd-dev libxxhash-dev libcli11-dev
          nlohmann-json3-dev libfmt-dev libspdlog-dev libgtest-dev libgmock-dev libbenchmark-dev zstd python3
          libhiredis-dev redis-server libcpp-httplib-dev libssl-dev gnuplot-nox)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg -s "$p" >/dev/null 2>&1; then missing+=("$p"); fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#PACKAGES[@]} packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "setup: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
