#!/usr/bin/env bash
# Installs what building, testing and the demo need, from Debian 12 packages (and, for the LibTorch 2.x build, PyPI);
# installs only what is missing. Works as root or through sudo.
#
# VIT_LIBTORCH chooses the LibTorch to build against:
#   debian (default)  Debian's libtorch-dev 1.13.1, CPU only.
#   pip               PyTorch's own wheel from PyPI (CUDA-enabled, with LibTorch inside) in the project-local
#                     virtual environment .venv/ (or $VIT_VENV); scripts/build.sh then builds into build-pip/.
# With Torch_DIR or CMAKE_PREFIX_PATH pointing at your own LibTorch, Debian's libtorch-dev is left alone.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
libtorch=${VIT_LIBTORCH:-debian}

# The wheel is pinned, never a silent "latest": torch 2.14.1 is the newest release whose default wheel is built for
# CUDA 13.0 (its cuda-toolkit dependency is 13.0.3), the toolkit these machines carry, so LibTorch's CMake config, the
# toolkit's headers and the CUDA runtime the wheel brings agree. 2.15.0's default wheel moved to CUDA 13.2. 2.14's
# headers require C++20 (CMakeLists.txt switches to it). Its C++ ABI is the new one (_GLIBCXX_USE_CXX11_ABI=1), as
# Debian's, so Debian's OpenCV, GoogleTest and spdlog link with it.
torch_version=${VIT_TORCH_VERSION:-2.14.1}

packages=(cmake g++ make ninja-build pkg-config libopenblas0-openmp libdnnl-dev libopencv-dev libcli11-dev libspdlog-dev
          nlohmann-json3-dev libgtest-dev googletest zlib1g-dev dataset-fashion-mnist libgloo-dev
          python3 python3-numpy libprotobuf-dev protobuf-compiler libonnx-dev libarchive-dev libjpeg-dev
          libcpp-httplib-dev)
# Test-only extras: Chromium renders the attention gallery page; the reference libraries (timm, transformers, onnx,
# onnxruntime) and PyTorch 2.x, also scripts/bench.sh's speed baselines, come from PyPI into the project's virtual
# environment.
extras=0
[[ "${VIT_SETUP_TEST_EXTRAS:-0}" == 1 ]] && extras=1
if ((extras)); then
  packages+=(chromium python3-venv)
fi
# Serving benchmark extras (scripts/bench_serve.py): wrk drives the HTTP load; FastAPI and uvicorn from PyPI serve the
# other side, timm's model in the same virtual environment, so this switch also installs the test extras' PyPI part.
bench_extras=0
if [[ "${VIT_SETUP_BENCH_EXTRAS:-0}" == 1 ]]; then
  bench_extras=1 extras=1
  packages+=(wrk python3-venv)
fi
# Sanitizer and fuzzing builds (scripts/sanitize.sh, scripts/fuzz.sh): clang with its ASan/UBSan/libFuzzer runtimes,
# and llvm-symbolizer for readable reports.
if [[ "${VIT_SETUP_SANITIZE:-0}" == 1 ]]; then
  packages+=(clang libclang-rt-14-dev llvm-14)
fi
# The torch-free units cross-built for 64-bit Arm and tested under qemu (scripts/cross-aarch64.sh): Debian's cross
# compiler and qemu's user-mode emulation (GoogleTest is built from the googletest package's sources).
if [[ "${VIT_SETUP_CROSS:-0}" == 1 ]]; then
  packages+=(g++-aarch64-linux-gnu qemu-user)
fi
# The reference libraries the interoperability tests compare with, at the versions they were checked against.
reference_packages=(timm==1.0.31 transformers==5.24.0 safetensors==0.8.0 onnx==1.23.2 onnxruntime==1.32.0
                    numpy==2.4.6 pillow==13.0.0)
# The serving benchmark's FastAPI side: the newest releases on PyPI when checked, installed and run with Debian 12's
# Python 3.11 (fastapi 0.165.0 brings starlette 1.10 and pydantic 2.14). uvicorn without [standard]: asyncio and h11, as
# `pip install fastapi uvicorn` gives. python-multipart is what FastAPI's file uploads need (the benchmark posts raw
# bodies, but a user's server usually has it).
serve_packages=(fastapi==0.165.0 uvicorn==0.55.0 python-multipart==0.0.34)
case "$libtorch" in
  debian)
    if [[ -z "${Torch_DIR:-}" && "${CMAKE_PREFIX_PATH:-}" != *orch* ]]; then
      packages+=(libtorch-dev)
    else
      echo "setup: using your LibTorch (Torch_DIR=${Torch_DIR:-} CMAKE_PREFIX_PATH=${CMAKE_PREFIX_PATH:-}); not installing libtorch-dev"
    fi
    ;;
  pip) packages+=(python3-venv) ;;
  *) echo "setup: VIT_LIBTORCH=$libtorch is not one of: debian, pip" >&2; exit 2 ;;
esac

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  echo "setup: all packages present"
else
  sudo=()
  if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null || { echo "setup: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
    sudo=(sudo)
  fi
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  "${sudo[@]}" apt-get update -q
  "${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

venv=${VIT_VENV:-$root/.venv}
pip_install() { "$venv/bin/python" -m pip install -q --disable-pip-version-check "$@"; }
if [[ "$libtorch" == pip ]] || ((extras)); then
  [[ -x "$venv/bin/python" ]] || { echo "setup: creating $venv"; /usr/bin/python3 -m venv "$venv"; }
  have=$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("torch"))' 2>/dev/null || true)
  if [[ "$have" != "$torch_version"* ]]; then
    echo "setup: installing torch==$torch_version into $venv (PyPI's default wheel, about 5 GB with its CUDA libraries)"
    if [[ "$libtorch" == pip ]]; then
      pip_install "torch==$torch_version"
    else
      pip_install "torch==$torch_version" || echo "setup: WARNING: PyPI unreachable? torch not installed; the tests that compare with timm, transformers and onnxruntime will skip" >&2
    fi
  else
    echo "setup: torch $have present in $venv"
  fi
fi
# Installs the pinned packages $3.. into the venv unless each is there at its version; $1 names them in messages, $2
# says what a failure leaves out.
pinned_install() {
  local what=$1 without=$2
  shift 2
  if "$venv/bin/python" -c 'import importlib.metadata as m, sys
for spec in sys.argv[1:]:
    name, version = spec.split("==")
    if m.version(name) != version: sys.exit(1)' "$@" 2>/dev/null; then
    echo "setup: $what present in $venv"
  else
    echo "setup: installing $* into $venv"
    pip_install "$@" || echo "setup: WARNING: PyPI unreachable? $what not installed; $without" >&2
  fi
}
if ((extras)); then
  pinned_install "reference libraries" "the tests that compare with them will skip" "${reference_packages[@]}"
fi
if ((bench_extras)); then
  pinned_install "serving benchmark libraries" "scripts/bench_serve.py will stop" "${serve_packages[@]}"
fi
