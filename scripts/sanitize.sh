#!/usr/bin/env bash
# The whole ctest suite under AddressSanitizer + UndefinedBehaviorSanitizer. Our code (and GoogleTest's main) is
# instrumented; libtorch, OpenCV and the other system libraries are not. Built with clang into build-sanitize/ (the
# libFuzzer targets have their own build, scripts/fuzz.sh). Extra arguments go to ctest (e.g. -R test_decode).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
start=$SECONDS
VIT_SETUP_TEST_EXTRAS=1 VIT_SETUP_SANITIZE=1 "$root/scripts/setup.sh"
setup_s=$((SECONDS - start))
build=${VIT_SANITIZE_BUILD_DIR:-$root/build-sanitize}
# Instrumented code runs several times slower: every case's time limit is four times the plain suites'. -O1, as
# AddressSanitizer's own documentation advises: fast enough for the instrumented code (the tensor work runs in the
# uninstrumented libtorch), and a shorter build than Release's -O3.
CC=clang CXX=clang++ VIT_BUILD_DIR="$build" "$root/scripts/build.sh" -DVIT_SANITIZE=ON -DVIT_BUILD_FUZZERS=OFF -DVIT_TIMEOUT_SCALE=4 -DVIT_ISA_MATRIX=avx2 \
  "-DCMAKE_CXX_FLAGS_RELEASE=-O1 -DNDEBUG"
build_s=$((SECONDS - start - setup_s))
# Every report fails its test. Leak checking stays on, with the few leaks of uninstrumented libraries named in
# tests/sanitizer/lsan.supp; the container-overflow check needs every library that touches a std::vector instrumented.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:detect_container_overflow=0:abort_on_error=0:strict_string_checks=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$root/tests/sanitizer/lsan.supp:print_suppressions=0}
# Passive OpenMP waiting: libtorch's workers otherwise spin for the thread that runs instrumented (slower) code and
# take its core; one training test ran 50 s instead of 6.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1:suppressions=$root/tests/sanitizer/ubsan.supp}
cd "$build"
ctest --output-on-failure -j "$(nproc)" "$@"
echo "sanitize: set-up ${setup_s} s, build ${build_s} s, ctest $((SECONDS - start - setup_s - build_s)) s"
grep -h "Python processes" tests/references/log.txt 2>/dev/null || true
echo "sanitize: the suite passed under ASan + UBSan"
