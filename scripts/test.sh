#!/usr/bin/env bash
# README's test command: set-up, build, then every test through ctest, then the torch-free units cross-built for
# 64-bit Arm and tested under qemu (scripts/cross-aarch64.sh). VIT_LIBTORCH=pip runs the same suite against PyTorch
# 2.x's LibTorch (build-pip/), without the Arm part; CI (.ci/run) runs both.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
start=$SECONDS
VIT_SETUP_TEST_EXTRAS=1 "$root/scripts/setup.sh"
setup_s=$((SECONDS - start))
"$root/scripts/build.sh"
build_s=$((SECONDS - start - setup_s))
if [[ "${VIT_LIBTORCH:-debian}" == pip ]]; then build=${VIT_BUILD_DIR:-$root/build-pip}; else build=${VIT_BUILD_DIR:-$root/build}; fi
cd "$build"
# Two at a time: most cases are sub-second and share their source file's process (tests/ctest_cases.cmake); the ones
# that use every core (training, ranks, OpenMP) say so (PROCESSORS, tests/slow_cases.txt) and run alone.
ctest --output-on-failure -j "$(nproc)"
echo "test: set-up ${setup_s} s, build ${build_s} s, ctest $((SECONDS - start - setup_s - build_s)) s"
# The suite's one reference run says how many Python processes it started (tests/reference_run.sh).
grep -h "Python processes" tests/references/log.txt 2>/dev/null || true
# The CPU paths each process took: the machine's own, and the capped runs' (tests/CMakeLists.txt, isa_*).
grep -ho "vit-test: paths .*" Testing/Temporary/LastTest.log 2>/dev/null | sort | uniq -c || true
if [[ "${VIT_LIBTORCH:-debian}" != pip ]]; then "$root/scripts/cross-aarch64.sh"; fi
