#!/usr/bin/env bash
# Installs the Debian packages cachegen needs to build and test. Idempotent:
# only packages that `dpkg -s` reports missing are installed (sudo only when
# not root).
#
# CACHEGEN_SETUP_CUDA=1 (set by scripts/test.sh, i.e. CI) also installs a CUDA
# compiler so that the CUDA decoder is compiled (docs/GPU.md): Debian 12's
# nvidia-cuda-toolkit (CUDA 11.8, in the archive's non-free component; about
# 1.6 GB of downloads, so never unasked). Skipped when an nvcc is already
# present; when it cannot be installed the script says so and succeeds, and
# the build goes on without the CUDA decoder.
set -euo pipefail

PACKAGES=(cmake ninja-build g++ clang libclang-rt-14-dev pkg-config libzstd-dev libxxhash-dev libcli11-dev
          nlohmann-json3-dev libfmt-dev libspdlog-dev libgtest-dev libgmock-dev libbenchmark-dev zstd python3
          libhiredis-dev redis-server libboost-dev gnuplot-nox libeigen3-dev
          python3-dev pybind11-dev python3-numpy python3-pytest)

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
apt_install() {
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "$@"
}

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg -s "$p" >/dev/null 2>&1; then missing+=("$p"); fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#PACKAGES[@]} packages present"
else
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  apt_install "${missing[@]}"
fi

# The CUDA toolkit (only with CACHEGEN_SETUP_CUDA=1). Returns 0 whatever
# happens: a missing toolkit only leaves the CUDA decoder unbuilt.
setup_cuda() {
  local nvcc
  nvcc="$(command -v nvcc || true)"
  if [ -n "$nvcc" ]; then
    echo "setup: CUDA compiler present ($nvcc), nvidia-cuda-toolkit not installed"
    return 0
  fi
  if [ -x /usr/local/cuda/bin/nvcc ]; then
    echo "setup: CUDA toolkit NOT installed: /usr/local/cuda/bin/nvcc exists but is not on PATH;" \
         "add /usr/local/cuda/bin to PATH to build the CUDA decoder with it" >&2
    return 0
  fi
  local codename=""
  if [ -r /etc/os-release ]; then codename="$(. /etc/os-release && echo "${VERSION_CODENAME:-}")"; fi
  if [ "$codename" != bookworm ]; then
    echo "setup: CUDA toolkit NOT installed: not Debian 12 (bookworm); install a CUDA toolkit" \
         "(nvcc 11.8 or newer) to build the CUDA decoder" >&2
    return 0
  fi
  # Debian ships the toolkit in non-free (it needs contrib too); add those
  # components of the same archive, signed by the same keyring, if no
  # configured source offers the package.
  local list=/etc/apt/sources.list.d/cachegen-non-free.sources
  if ! apt-cache policy nvidia-cuda-toolkit 2>/dev/null | grep -q 'Candidate: [0-9]'; then
    echo "setup: adding Debian's contrib and non-free components ($list)"
    printf '%s\n' 'Types: deb' 'URIs: http://deb.debian.org/debian' 'Suites: bookworm bookworm-updates' \
      'Components: contrib non-free' 'Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg' \
      | $SUDO tee "$list" >/dev/null || true
    $SUDO apt-get update -qq || true
  fi
  echo "setup: installing nvidia-cuda-toolkit (about 1.6 GB of downloads)"
  if ! apt_install nvidia-cuda-toolkit; then
    echo "setup: CUDA toolkit NOT installed: apt-get install nvidia-cuda-toolkit failed;" \
         "the CUDA decoder will not be built (the CPU build goes on)" >&2
    return 0
  fi
  echo "setup: CUDA compiler installed: $(command -v nvcc) ($(nvcc --version | grep -o 'release [0-9.]*'))"
}

if [ "${CACHEGEN_SETUP_CUDA:-0}" = 1 ]; then setup_cuda; fi
