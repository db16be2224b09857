#!/usr/bin/env bash
# Installs what building, testing and the demo need, from Debian 12 packages; installs only what is missing.
# Works as root or through sudo. With Torch_DIR or CMAKE_PREFIX_PATH pointing at your own LibTorch (e.g. an
# official CUDA build), Debian's libtorch-dev is left alone and CMake uses yours.
set -euo pipefail

packages=(cmake g++ make pkg-config libopenblas0-openmp libopencv-dev libcli11-dev libspdlog-dev
          nlohmann-json3-dev libgtest-dev googletest zlib1g-dev dataset-fashion-mnist libgloo-dev
          python3 python3-numpy)
# Test-only extras: Chromium renders the attention gallery page; Debian's PyTorch is the speed baseline.
if [[ "${VIT_SETUP_TEST_EXTRAS:-0}" == 1 ]]; then
  packages+=(chromium python3-torch)
fi
if [[ -z "${Torch_DIR:-}" && "${CMAKE_PREFIX_PATH:-}" != *orch* ]]; then
  packages+=(libtorch-dev)
else
  echo "setup: using your LibTorch (Torch_DIR=${Torch_DIR:-} CMAKE_PREFIX_PATH=${CMAKE_PREFIX_PATH:-}); not installing libtorch-dev"
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  echo "setup: all packages present"
  exit 0
fi

sudo=()
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || { echo "setup: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  sudo=(sudo)
fi
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -q
"${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
