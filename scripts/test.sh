#!/usr/bin/env bash
# README's test command: set-up, build, then every test through ctest.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
VIT_SETUP_TEST_EXTRAS=1 "$root/scripts/setup.sh"
"$root/scripts/build.sh"
cd "${VIT_BUILD_DIR:-$root/build}"
# Serially: every test already uses all cores, and oversubscribed OpenMP teams slow each other down badly.
ctest --output-on-failure
