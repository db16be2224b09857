#!/usr/bin/env bash
# README's test command: set-up, build, then every test through ctest. VIT_LIBTORCH=pip runs the same suite against
# PyTorch 2.x's LibTorch (build-pip/); CI (.ci/run) runs both.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
VIT_SETUP_TEST_EXTRAS=1 "$root/scripts/setup.sh"
"$root/scripts/build.sh"
if [[ "${VIT_LIBTORCH:-debian}" == pip ]]; then build=${VIT_BUILD_DIR:-$root/build-pip}; else build=${VIT_BUILD_DIR:-$root/build}; fi
cd "$build"
# Serially: every test already uses all cores, and oversubscribed OpenMP teams slow each other down badly.
ctest --output-on-failure
