#!/usr/bin/env bash
# Configures and builds vit (Release); extra arguments go to CMake.
#   scripts/build.sh                    against Debian's libtorch (or Torch_DIR / CMAKE_PREFIX_PATH) into build/
#   VIT_LIBTORCH=pip scripts/build.sh   against the LibTorch inside .venv's PyTorch wheel (scripts/setup.sh with
#                                       VIT_LIBTORCH=pip makes it; CUDA-enabled, needs the CUDA toolkit) into build-pip/
# VIT_BUILD_DIR overrides the build folder, VIT_JOBS the parallel jobs.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
jobs=${VIT_JOBS:-$(nproc)}
args=()
case "${VIT_LIBTORCH:-debian}" in
  debian) build=${VIT_BUILD_DIR:-$root/build} ;;
  pip)
    build=${VIT_BUILD_DIR:-$root/build-pip}
    venv=${VIT_VENV:-$root/.venv}
    # The torch package folder holds lib/ and share/cmake/: as a prefix, both LibTorch's config and its libraries are
    # found there before any system libtorch (see CMakeLists.txt). Found without importing torch (seconds, warnings).
    torch=$("$venv/bin/python" -c 'import importlib.util as u; print(u.find_spec("torch").submodule_search_locations[0])' 2>/dev/null) ||
      { echo "build: no torch in $venv (run: VIT_LIBTORCH=pip scripts/setup.sh)" >&2; exit 1; }
    args+=("-DCMAKE_PREFIX_PATH=$torch")
    if ! command -v nvcc >/dev/null && [[ -x /usr/local/cuda/bin/nvcc ]]; then export CUDACXX=/usr/local/cuda/bin/nvcc; fi
    # No CUDA sources here: name one architecture instead of LibTorch probing for a GPU on every configure.
    export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
    ;;
  *) echo "build: VIT_LIBTORCH=$VIT_LIBTORCH is not one of: debian, pip" >&2; exit 2 ;;
esac
# Ninja (Debian's ninja-build) for a new build folder: it overlaps the targets' compiles where Make finishes one
# target before starting the next (a clean build: 171 s against 186 s on 2 cores). A folder keeps its generator.
if [[ ! -f "$build/CMakeCache.txt" ]] && command -v ninja >/dev/null; then args+=(-G Ninja); fi
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release "${args[@]}" "$@" >/dev/null
cmake --build "$build" -j "$jobs"
