#!/usr/bin/env bash
# One prepared check for a machine with an NVIDIA GPU, PyTorch's bundled LibTorch, CMake and a compiler, and nothing
# else (no OpenCV, no network): builds vit against that LibTorch, runs the CUDA tests (CUDA vs CPU, bf16 and fp16 with
# loss scaling, NCCL at world size 1, SDPA vs explicit attention), trains ViT-B/16 in bf16 for 200 steps on synthetic
# data (img/s and model FLOP utilisation against the GPU's bf16 peak), measures batch-1 and batch-256 inference and
# trains the Fashion-MNIST default on the GPU, then prints a summary. Finishes within 8 minutes.
#
# Beforehand, on a machine with the Debian packages: scripts/vendor-deps.sh (fills the git-ignored .deps/), then copy
# the working tree with .deps/ to the GPU machine and run scripts/gpu-check.sh from anywhere.
#
# Environment: PYTHON (default python3, the one with torch), VIT_CMAKE_ARGS (extra configure arguments),
# VIT_GPU_CHECK_SECONDS (total budget, default 470), VIT_GPU_BUILD_DIR (default build-gpu), VIT_GPU_BF16_TFLOPS (the
# GPU's dense bf16 peak, for utilisation; known for H100/H200 and A100).
set -uo pipefail

start=$(date +%s)
budget=${VIT_GPU_CHECK_SECONDS:-470}
root=$(cd "$(dirname "$0")/.." && pwd)
deps=$root/.deps
build=${VIT_GPU_BUILD_DIR:-$root/build-gpu}
python=${PYTHON:-python3}
jobs=$(nproc)
summary=()
failed=0

elapsed() { echo $(($(date +%s) - start)); }
remaining() { echo $((budget - $(elapsed))); }
say() { echo "== [$(elapsed)s] $*"; }
note() { summary+=("$*"); echo "   -> $*"; }
fail() { note "FAIL: $*"; failed=1; }
finish() {
  echo
  echo "================ gpu-check summary ($(elapsed)s) ================"
  printf '%s\n' "${summary[@]}"
  [ $failed = 0 ] && echo "RESULT: PASS" || echo "RESULT: FAIL"
  exit $failed
}

# ---- the machine ----
say "machine"
if command -v nvidia-smi >/dev/null; then
  note "GPU: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -1)"
else
  note "nvidia-smi not found"
fi
torch_info=$("$python" -c 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.is_available(),
int(torch._C._GLIBCXX_USE_CXX11_ABI), torch.utils.cmake_prefix_path)') || {
  fail "$python cannot import torch (set PYTHON=/path/to/python with PyTorch)"; finish; }
read -r torch_version torch_cuda torch_gpu cxx11_abi torch_prefix <<< "$torch_info"
note "PyTorch $torch_version, CUDA $torch_cuda, GPU visible to PyTorch: $torch_gpu, C++11 ABI $cxx11_abi"
# The prefix that holds lib/ and share/cmake/ (see CMakeLists.txt): LibTorch's libraries are found there first.
torch_prefix=$(cd "$torch_prefix/../.." && pwd)
gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
case "${VIT_GPU_BF16_TFLOPS:-}:$gpu_name" in
  :*H100*|:*H200*) bf16_tflops=989.4 ;;  # SXM, dense (no sparsity)
  :*A100*) bf16_tflops=312 ;;
  :*) bf16_tflops= ;;
  *) bf16_tflops=$VIT_GPU_BF16_TFLOPS ;;
esac
[ -d "$deps/include/nlohmann" ] || { fail "no .deps/ (run scripts/vendor-deps.sh on the Debian machine, copy .deps/)"; finish; }
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH=/usr/local/cuda/bin:$PATH; fi
command -v nvcc >/dev/null || echo "   (no nvcc on PATH: LibTorch's CMake config may not find the CUDA toolkit)"

# ---- GoogleTest from the vendored sources, with LibTorch's C++ ABI ----
say "GoogleTest"
gtest=$build/gtest-install
if [ ! -f "$gtest/lib/cmake/GTest/GTestConfig.cmake" ] && [ ! -f "$gtest/lib64/cmake/GTest/GTestConfig.cmake" ]; then
  cmake -S "$deps/googletest" -B "$build/gtest" -DCMAKE_BUILD_TYPE=Release -DBUILD_GMOCK=OFF -DINSTALL_GTEST=ON \
    -DCMAKE_CXX_FLAGS="-D_GLIBCXX_USE_CXX11_ABI=$cxx11_abi" -DCMAKE_INSTALL_PREFIX="$gtest" >"$build.gtest.log" 2>&1 &&
    cmake --build "$build/gtest" -j"$jobs" --target install >>"$build.gtest.log" 2>&1 ||
    { tail -20 "$build.gtest.log"; fail "GoogleTest build (log: $build.gtest.log)"; }
fi

# ---- configure and build vit (no OpenCV) ----
say "configure + build (-j$jobs)"
prefix="$torch_prefix;$deps;$gtest"
[ -f /usr/include/zlib.h ] || prefix="$prefix;$deps/zlib"
mkdir -p "$build"
# shellcheck disable=SC2086
if ! cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DVIT_WITH_OPENCV=OFF -DCMAKE_PREFIX_PATH="$prefix" \
    ${VIT_CMAKE_ARGS:-} >"$build/configure.log" 2>&1; then
  tail -30 "$build/configure.log"; fail "configure (log: $build/configure.log)"; finish
fi
if ! cmake --build "$build" -j"$jobs" --target vit >"$build/build.log" 2>&1; then
  grep -m 20 -E "error|Error" "$build/build.log"; fail "build of vit (log: $build/build.log)"; finish
fi
note "built vit in $(elapsed)s (LibTorch $torch_version, OpenCV off)"
vit=$build/vit
# The tests separately: a test that does not compile here must not cost the benchmarks and the training run.
if grep -q "GoogleTest not found" "$build/configure.log"; then
  note "GoogleTest not found: tests not built"
elif ! cmake --build "$build" -j"$jobs" --target test_core >"$build/build-tests.log" 2>&1; then
  grep -m 20 -E "error|Error" "$build/build-tests.log"; fail "build of test_core (log: $build/build-tests.log)"
fi

# ---- CUDA tests ----
if [ -x "$build/tests/test_core" ]; then
  say "CUDA tests"
  limit=$(($(remaining) - 200)); [ $limit -gt 30 ] || limit=30
  out=$(timeout $limit "$build/tests/test_core" --gtest_filter='Cuda.*:Bench.*:Sdpa.*' 2>&1)
  status=$?
  echo "$out" | grep -E "^\[ *(RUN|OK|FAILED|SKIPPED|PASSED) *\]|CUDA vs CPU|bf16 loss|fp16 with|sdpa vs|50 steps|Failure|Expected|Which is|skipped" \
    | head -60
  if echo "$out" | grep -q "SKIPPED"; then fail "CUDA tests skipped: LibTorch sees no GPU"
  elif [ $status != 0 ]; then fail "CUDA tests (exit $status)"
  else note "CUDA tests passed: $(echo "$out" | grep -E 'CUDA vs CPU|bf16 loss|fp16 with|sdpa vs|50 steps' | tr '\n' ';')"; fi
else
  note "CUDA tests not run (no test_core binary)"
fi

# ---- vit bench: ViT-B/16 bf16 ----
work=$(mktemp -d)
echo '{"model": {"preset": "vit_base_patch16_224"}}' > "$work/vit_base.json"
bench() {  # label, then vit bench arguments
  local label=$1; shift
  say "bench $label"
  local json
  if json=$(timeout 150 "$vit" bench --config "$work/vit_base.json" --device cuda --amp bf16 --json "$@"); then
    echo "   $json"
    note "$label: $("$python" -c 'import json,sys; r=json.loads(sys.argv[1]); peak=sys.argv[2]
figures=[f"{k} {r[k]:.4g}" for k in ("img_per_s","step_ms_p50","latency_ms_p50","batch_latency_ms_p50",
  "gflops","peak_gflops","peak_fraction","peak_cuda_mb") if r.get(k) is not None]
g=r.get("gflops")
if peak and g: figures.append(f"MFU {g / (float(peak) * 1e3):.1%} of {peak} TFLOP/s bf16")
print(", ".join(figures))' "$json" "$bf16_tflops")"
  else
    fail "vit bench $label"
  fi
}
bench "ViT-B/16 bf16 train b256, 200 steps" --mode train --batch-size 256 --steps 200 --warmup 10
bench "ViT-B/16 bf16 infer b1+b256" --mode infer --batch-size 256 --steps 20 --warmup 5

# ---- train the Fashion-MNIST default on the GPU ----
left=$(($(remaining) - 15))
say "train configs/fashion_mnist.json on cuda (up to ${left}s)"
if [ "$left" -lt 30 ]; then
  fail "no time left to train"
else
  # SIGINT at the time limit: vit saves its state and exits 130, which still counts as a (partial) run.
  timeout --signal=INT "$left" "$vit" train --config "$root/configs/fashion_mnist.json" \
    --set data.root="$deps/fashion-mnist" --set train.device=cuda --set train.output_root="$build/runs" \
    --out "$build/runs/fashion_mnist-gpu" > "$work/train.log" 2>&1
  status=$?
  tail -8 "$work/train.log"
  metrics=$build/runs/fashion_mnist-gpu/summary.csv
  if [ $status = 0 ]; then
    note "F-MNIST training: $(grep -E 'best top-1|wall time|time to 90' "$work/train.log" | tr -s ' ' | tr '\n' ';')"
  elif [ $status = 130 ] || [ $status = 124 ]; then
    note "F-MNIST training stopped at the time limit: $(grep -E 'step [0-9]+/[0-9]+ loss' "$work/train.log" | tail -1)"
    [ -s "$metrics" ] && note "epochs done (summary.csv): $(tail -n +2 "$metrics" | tr '\n' ';')"
  else
    fail "F-MNIST training (exit $status): $(tail -2 "$work/train.log" | tr '\n' ' ')"
  fi
fi
rm -rf "$work"
finish
