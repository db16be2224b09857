#!/usr/bin/env bash
# Configures and builds vit (Release) into build/ (or $VIT_BUILD_DIR); extra arguments go to CMake.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${VIT_BUILD_DIR:-$root/build}
jobs=${VIT_JOBS:-$(nproc)}
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build "$build" -j "$jobs"
