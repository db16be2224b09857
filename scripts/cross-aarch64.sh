#!/usr/bin/env bash
# The units of src/ that need no LibTorch (row kernels, AdamW's update, ...), cross-built for 64-bit Arm with Debian's
# g++-aarch64-linux-gnu into build-aarch64/ (tests/portable/), and their test run under qemu-aarch64 (qemu-user).
# Installs the cross compiler and qemu when missing (scripts/setup.sh). VIT_PORTABLE_NATIVE=1 also runs the same test
# built for this machine (build-portable/). Extra arguments go to the test (e.g. --gtest_filter=*Softmax*).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
start=$SECONDS

# Set-up: Debian 12's packages, only what is missing (scripts/setup.sh, with the cross compiler and qemu).
VIT_SETUP_CROSS=1 "$root/scripts/setup.sh"
setup_s=$((SECONDS - start))

# Build: the units and their test in one aarch64 binary, GoogleTest compiled for it from /usr/src/googletest.
build=${VIT_AARCH64_BUILD_DIR:-$root/build-aarch64}
cmake -S "$root/tests/portable" -B "$build" -G Ninja \
  -DCMAKE_TOOLCHAIN_FILE="$root/tests/portable/aarch64-toolchain.cmake" >/dev/null
cmake --build "$build" -j "$(nproc)"
if [[ "${VIT_PORTABLE_NATIVE:-0}" == 1 ]]; then
  cmake -S "$root/tests/portable" -B "$root/build-portable" -G Ninja >/dev/null
  cmake --build "$root/build-portable" -j "$(nproc)"
fi
build_s=$((SECONDS - start - setup_s))

# Test: under qemu's user-mode emulation, the Arm C library and loader from the cross compiler's sysroot.
qemu-aarch64 -L /usr/aarch64-linux-gnu "$build/test_portable" "$@"
test_s=$((SECONDS - start - setup_s - build_s))
native=""
if [[ "${VIT_PORTABLE_NATIVE:-0}" == 1 ]]; then
  "$root/build-portable/test_portable" "$@"
  native=", native test $((SECONDS - start - setup_s - build_s - test_s)) s"
fi
echo "cross-aarch64: set-up ${setup_s} s, build ${build_s} s, test under qemu ${test_s} s${native}"
