#!/usr/bin/env bash
# Fills the git-ignored .deps/ from this machine's Debian packages, for a machine that has LibTorch, CMake and a
# compiler but not the rest (scripts/gpu-check.sh): the header-only nlohmann-json and CLI11, GoogleTest's sources
# (compiled there, with LibTorch's C++ ABI), zlib, and the Fashion-MNIST files.
#
#   scripts/vendor-deps.sh        (needs nlohmann-json3-dev libcli11-dev googletest zlib1g-dev dataset-fashion-mnist)
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
deps=$root/.deps

need() {
  for path in "$@"; do
    [ -e "$path" ] || { echo "vendor-deps: missing $path (install the Debian package that provides it)" >&2; exit 1; }
  done
}
need /usr/include/nlohmann/json.hpp /usr/include/CLI/CLI.hpp /usr/src/googletest/CMakeLists.txt \
  /usr/include/zlib.h /usr/include/zconf.h /usr/lib/x86_64-linux-gnu/libz.a \
  /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz

rm -rf "$deps/include" "$deps/googletest" "$deps/zlib" "$deps/fashion-mnist"
mkdir -p "$deps/include" "$deps/zlib/include" "$deps/zlib/lib" "$deps/fashion-mnist"
# Header-only libraries: found through CMAKE_PREFIX_PATH=.deps by find_path (see CMakeLists.txt).
cp -r /usr/include/nlohmann /usr/include/CLI "$deps/include/"
# GoogleTest as sources: a prebuilt libgtest would carry Debian's C++ ABI, pip LibTorch may use the old one.
cp -r /usr/src/googletest "$deps/googletest"
# zlib in its own prefix, used only where the machine has no zlib headers of its own.
cp /usr/include/zlib.h /usr/include/zconf.h "$deps/zlib/include/"
cp /usr/lib/x86_64-linux-gnu/libz.a "$deps/zlib/lib/"
cp /usr/share/datasets/fashion-mnist/*.gz "$deps/fashion-mnist/"
du -sh "$deps"/* | sed 's/^/vendor-deps: /'
