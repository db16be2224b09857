#!/usr/bin/env bash
# Runs one libFuzzer target (tests/fuzz/) for SECONDS in a build of its own (build-fuzz/: ASan + UBSan as in
# scripts/sanitize.sh, plus libFuzzer's coverage feedback in every unit), from its seed corpus (made by
# scripts/make_fuzz_corpus.py when missing).
#   scripts/fuzz.sh TARGET SECONDS [libFuzzer options...]    e.g. scripts/fuzz.sh fuzz_safetensors 600
# New inputs go to build-fuzz/fuzz-corpus/TARGET/, findings to build-fuzz/fuzz-artifacts/TARGET/; the exit
# status is non-zero on any finding (crash, sanitizer report, timeout, out-of-memory or over-large allocation).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
targets="fuzz_safetensors fuzz_model_file fuzz_config fuzz_datasets fuzz_image"
if (($# < 2)) || [[ " $targets " != *" $1 "* ]] || [[ ! "$2" =~ ^[0-9]+$ ]]; then
  echo "usage: scripts/fuzz.sh TARGET SECONDS [libFuzzer options...]; TARGET is one of: $targets" >&2
  exit 2
fi
target=$1 seconds=$2
shift 2
# The largest input worth mutating: a little above the biggest seed of each target.
case "$target" in
  fuzz_safetensors) max_len=4096 ;;
  fuzz_model_file) max_len=16384 ;;
  fuzz_config) max_len=4096 ;;
  fuzz_datasets) max_len=16384 ;;
  fuzz_image) max_len=65536 ;;
esac

VIT_SETUP_SANITIZE=1 "$root/scripts/setup.sh"
build=${VIT_FUZZ_BUILD_DIR:-$root/build-fuzz}
# Not the sanitizer suite's build: the coverage instrumentation libFuzzer needs in every unit would slow that whole
# suite down. Only this target is built.
CC=clang CXX=clang++ cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DVIT_SANITIZE=ON -DVIT_BUILD_FUZZERS=ON \
  >/dev/null
cmake --build "$build" --target "$target" -j "${VIT_JOBS:-$(nproc)}"

corpus=$build/fuzz-corpus/$target
if [[ ! -d "$corpus" ]] || [[ -z "$(ls -A "$corpus")" ]]; then
  python=/usr/bin/python3
  [[ -x "$root/.venv/bin/python" ]] && python=$root/.venv/bin/python  # Pillow for the image seeds
  "$python" "$root/scripts/make_fuzz_corpus.py" "$build/fuzz-corpus" "$target"
fi
artifacts=$build/fuzz-artifacts/$target
mkdir -p "$artifacts"
options=(-max_total_time="$seconds" -rss_limit_mb=2048 -malloc_limit_mb=2048 -timeout=10 -max_len="$max_len"
         -artifact_prefix="$artifacts/" -print_final_stats=1)
[[ -f "$root/tests/fuzz/$target.dict" ]] && options+=(-dict="$root/tests/fuzz/$target.dict")

# As scripts/sanitize.sh: every report is fatal, leaks of the uninstrumented libraries are suppressed by name.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:detect_container_overflow=0:abort_on_error=0:strict_string_checks=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$root/tests/sanitizer/lsan.supp:print_suppressions=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1:suppressions=$root/tests/sanitizer/ubsan.supp}
# One thread per input: libtorch's thread pools would only compete with the fuzzer for the cores.
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1

log=$build/fuzz-artifacts/$target.log
status=0
"$build/tests/fuzz/$target" "${options[@]}" "$@" "$corpus" 2>&1 | tee "$log" || status=$?
echo "fuzz: $target: $(grep -E '^#[0-9]+[[:space:]]+DONE' "$log" | tail -1 || true)"
if ((status != 0)); then
  echo "fuzz: $target FAILED (exit $status); the input is in $artifacts/ (reproduce: $build/tests/fuzz/$target FILE)" >&2
  exit 1
fi
echo "fuzz: $target ran ${seconds}s clean; corpus $(ls "$corpus" | wc -l) files in $corpus"
