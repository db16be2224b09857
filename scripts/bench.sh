#!/usr/bin/env bash
# Compares `vit bench` with the same model and training step in PyTorch 2.x written timm's way
# (scripts/bench_pytorch.py: SDPA attention, AdamW fused where PyTorch has it on CPU), eagerly and through
# torch.compile, and for inference also with onnxruntime running our `vit export --format onnx` file
# (scripts/bench_onnxruntime.py), on the same models, batch sizes and thread count. Runs alternate between the sides
# so that drift in machine load hits all; the table shows medians over the repeats, vit/other ratios, and whether
# the speed goals are met.
# Then whole `vit predict` processes (scripts/bench_predict.py): one image with ViT-Ti/16 and ViT-B/16 (time and peak
# memory), and a folder of 1,000 JPEGs (img/s, busy cores).
# Then the training input pipeline: `vit bench --mode data` against timm's way (scripts/bench_data_timm.py: PyTorch
# DataLoader, PIL, torchvision transforms) with the same workers and transform, RandomResizedCrop(224, scale 0.08-1,
# bilinear) + flip + float + normalise, on generated photo-like JPEGs of 500x375 and 2,000x1,500, as loose files and
# as tar shards (scripts/make_bench_images.py makes them once into $VIT_BENCH_DATA, default build/bench-data).
#
#   scripts/bench.sh [--vit PATH] [--threads N] [--repeats R] [--quick] [--only model|data|precision|amp|serve]
#                    [--isa avx2|baseline]
#
# --only precision: `vit bench --precision` int8 and bf16 against float32 and against onnxruntime's quantize_dynamic
# of our ONNX export (ViT-S/16, ViT-B/16; batch-1 latency and batch-32 img/s); also part of a full run.
# --only amp: mixed-precision training on the CPU, `vit bench --amp bf16` (the fused blocks' products in bfloat16)
# against PyTorch 2 eager under torch.autocast("cpu", torch.bfloat16), each beside its own float32, on the three
# training cases; also part of a full run.
# --only serve: HTTP classification under load (scripts/bench_serve.py): `vit serve` against FastAPI + uvicorn + timm
# (scripts/serve_timm.py), driven by wrk at 1, 8 and 64 connections with ViT-Ti/16 (img/s, p50/p99 latency, errors),
# beside `vit predict`'s folder img/s and one image's decode + forward; also the last part of a full run. It needs wrk
# and FastAPI and uvicorn in that .venv, which VIT_SETUP_BENCH_EXTRAS=1 scripts/setup.sh installs.
#
# --isa avx2 | baseline: every side capped at that instruction set, a stand-in for a CPU that has no more: vit's
# kernels (VIT_CPU_ISA), oneDNN (ONEDNN_MAX_CPU_ISA), LibTorch's own kernels (ATEN_CPU_CAPABILITY) and its BLAS (MKL,
# OpenBLAS). onnxruntime has no such switch: its side keeps this CPU's own instructions (VNNI where it has them),
# which the output says. The first lines name the CPU and the paths vit takes (`vit info --system`).
# --repeats R: runs per side and case (default 3; medians). --quick: one or two steps of two cases, a smoke test of
# the script, not a measurement. Needs a built `vit` (default: build/vit); PyTorch 2.x and onnxruntime in the
# project's .venv (or $VIT_VENV), which VIT_SETUP_TEST_EXTRAS=1 scripts/setup.sh installs, and torch.compile needs g++
# and Python's headers; the data part needs torchvision in that .venv too (setup.sh does not install it).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
vit=$root/build/vit
threads=$(nproc)
repeats=3
quick=0
venv_python=${VIT_VENV:-$root/.venv}/bin/python
only=all
isa=
while [ $# -gt 0 ]; do
  case $1 in
    --vit) vit=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --repeats) repeats=$2; shift 2 ;;
    --quick) quick=1; shift ;;  # fewer steps: a smoke test of the script, not a measurement
    --only) only=$2; shift 2 ;;
    --isa) isa=$2; shift 2 ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ -x "$vit" ] || { echo "no vit binary at $vit (build it, or pass --vit PATH)" >&2; exit 1; }
case $isa in
  "") ;;
  avx2) export VIT_CPU_ISA=avx2 ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 \
               OPENBLAS_CORETYPE=Haswell ;;
  baseline) export VIT_CPU_ISA=baseline ONEDNN_MAX_CPU_ISA=SSE41 ATEN_CPU_CAPABILITY=default \
                   MKL_ENABLE_INSTRUCTIONS=SSE4_2 OPENBLAS_CORETYPE=Nehalem ;;
  *) echo "--isa $isa is not one of: avx2, baseline" >&2; exit 2 ;;
esac
# Every number below belongs to this CPU and these paths.
echo "CPU: $(lscpu | sed -n 's/^Model name: *//p' | head -n 1) (family $(lscpu | sed -n 's/^CPU family: *//p' | head -n 1), model $(lscpu | sed -n 's/^Model: *//p' | head -n 1)); ${isa:+capped at $isa (onnxruntime not capped); }vit: $("$vit" info --system --json | "${VIT_VENV:-$root/.venv}/bin/python" -c 'import json, sys; s = json.load(sys.stdin); print(s["vit_kernels"], "|", "oneDNN", s["onednn"], "|", "LibTorch", s["libtorch"], "|", "int8:", s["precisions"]["int8"])' 2>/dev/null || echo "see vit info --system")"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# ---- the training input pipeline against timm's DataLoader ----
bench_data() {
  "$venv_python" -c 'import torch, torchvision, PIL' 2>/dev/null ||
    { echo "$venv_python cannot import torch, torchvision and PIL (run VIT_SETUP_TEST_EXTRAS=1 scripts/setup.sh)" >&2; exit 1; }
  local data=${VIT_BENCH_DATA:-$root/build/bench-data} workers=2 batch=64
  local sets=("500x375|2000" "2000x1500|600")
  if [ $quick = 1 ]; then sets=("500x375|200" "2000x1500|40"); batch=8; fi
  local results=$work/data.jsonl
  for set in "${sets[@]}"; do
    IFS='|' read -r size count <<< "$set"
    local dir=$data/$size-$count
    [ -d "$dir/shards" ] || "$venv_python" "$root/scripts/make_bench_images.py" --out "$dir" --size "$size" --count "$count" >&2
    local pattern
    pattern="$dir/shards/train-{000000..$(printf %06d $(( (count + 99) / 100 - 1 )))}.tar"
    for layout in folder shards; do
      if [ $layout = folder ]; then
        data_keys="\"format\": \"folder\", \"train_dir\": \"$dir/folder/train\", \"val_dir\": \"$dir/folder/train\""
        source_args=(--folder "$dir/folder/train")
      else
        data_keys="\"format\": \"wds\", \"train_shards\": \"$pattern\", \"val_shards\": \"$pattern\""
        source_args=(--shards "$pattern")
      fi
      cat > "$work/data.json" <<JSON
{"model": {"img_size": 224, "patch_size": 16, "in_chans": 3, "num_classes": 10},
 "data": {$data_keys, "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225], "interpolation": "bilinear",
          "augment": {"random_resized_crop": true, "scale": [0.08, 1.0], "hflip": 0.5}},
 "train": {"seed": 0}}
JSON
      for ((r = 1; r <= repeats; r++)); do
        echo "[data $size $layout] run $r/$repeats" >&2
        out=$("$vit" bench --mode data --config "$work/data.json" --workers $workers --batch-size $batch --json)
        echo "{\"set\": \"$size\", \"layout\": \"$layout\", \"side\": \"vit\", \"result\": $out}" >> "$results"
        out=$("$venv_python" "$root/scripts/bench_data_timm.py" "${source_args[@]}" --workers $workers --batch-size $batch 2>/dev/null)
        echo "{\"set\": \"$size\", \"layout\": \"$layout\", \"side\": \"timm\", \"result\": $out}" >> "$results"
      done
    done
  done
  "$venv_python" - "$results" <<'PY'
import json, statistics, sys

rows = [json.loads(line) for line in open(sys.argv[1])]
timm = next(r["result"] for r in rows if r["side"] == "timm")
print(f"\nTraining input pipeline, {timm['workers']} workers, batch {timm['batch_size']}; timm side: torch "
      f"{timm['torch']}, torchvision {timm['torchvision']}, Pillow {timm['pillow']}; medians of alternating runs\n")
print("| images | layout | vit img/s | timm's DataLoader img/s | vit / timm |")
print("|---|---|---|---|---|")
median = lambda s, l, side: statistics.median(r["result"]["img_per_s"] for r in rows
                                             if (r["set"], r["layout"], r["side"]) == (s, l, side))
for s, l in dict.fromkeys((r["set"], r["layout"]) for r in rows):
    ours, theirs = median(s, l, "vit"), median(s, l, "timm")
    print(f"| {s} JPEG | {l} | {ours:.0f} | {theirs:.0f} | {ours / theirs:.2f}x |")
for s in dict.fromkeys(r["set"] for r in rows):
    print(f"shards / folder, vit, {s}: {median(s, 'shards', 'vit') / median(s, 'folder', 'vit'):.2f}x")
PY
}
if [ "$only" = data ]; then bench_data; exit 0; fi

# ---- HTTP serving under load: vit serve against FastAPI + uvicorn + timm ----
bench_serve() {
  if [ $quick = 1 ]; then
    "$venv_python" "$root/scripts/bench_serve.py" --vit "$vit" --threads "$threads" --quick
  else
    "$venv_python" "$root/scripts/bench_serve.py" --vit "$vit" --threads "$threads" --repeats "$repeats"
  fi
}
if [ "$only" = serve ]; then bench_serve; exit 0; fi
# The other sides, in the project's virtual environment; a missing one fails here rather than leaving a column empty.
# (bench_predict.py also uses its PIL and NumPy.)
versions=$("$venv_python" -c 'import sys, torch, onnxruntime, numpy, PIL
if int(torch.__version__.split(".")[0]) < 2: sys.exit(f"PyTorch {torch.__version__} is older than 2")
print(torch.__version__, onnxruntime.__version__)') ||
  { echo "$venv_python lacks PyTorch 2.x, onnxruntime, NumPy or Pillow (VIT_SETUP_TEST_EXTRAS=1 scripts/setup.sh" \
         "installs them)" >&2; exit 1; }
read -r torch_version ort_version <<< "$versions"
echo "PyTorch $torch_version (eager and torch.compile), onnxruntime $ort_version, $threads threads"

cat > "$work/fashion_mnist.json" <<'EOF'
{"model": {"img_size": 28, "patch_size": 4, "in_chans": 1, "num_classes": 10, "embed_dim": 128, "depth": 6,
           "num_heads": 4, "mlp_ratio": 2},
 "data": {"mean": [0.5], "std": [0.5]}}
EOF
for size in tiny small base; do
  echo "{\"model\": {\"preset\": \"vit_${size}_patch16_224\"}}" > "$work/vit_$size.json"
done

# Our ONNX export of a config's model with random weights: bench_predict.py's timm-named file, through `vit export`.
export_onnx() {
  local config=$1 preset
  preset=$("$venv_python" -c 'import json, sys; print(json.load(open(sys.argv[1]))["model"]["preset"])' \
           "$work/$config.json")
  "$venv_python" -c 'import sys; sys.path.insert(0, sys.argv[1])
from bench_predict import save_timm_file
save_timm_file(sys.argv[2], sys.argv[3])' "$root/scripts" "$work/$config.safetensors" "$preset"
  "$vit" export --checkpoint "$work/$config.safetensors" --config "$work/$config.json" --format onnx \
    --out "$work/$config.onnx" >&2 || { echo "vit export --format onnx failed for $config" >&2; exit 1; }
  rm "$work/$config.safetensors"
}

# ---- reduced precision: vit's int8 and bf16 against its float32 and onnxruntime's dynamic int8 ----
# onnxruntime's side is its own quantize_dynamic (int8 weights per channel, uint8 activations per tensor) of our
# float32 export, the int8 a user of onnxruntime would reach for. Batch 1: latency p50; batch 32: img/s.
bench_precision() {
  local results=$work/precision.jsonl models=(vit_small vit_base) steps=15 batch_steps=3 bf16=bf16
  # bf16 where this CPU (or cap) runs it; its columns say "-" elsewhere.
  "$vit" info --system | grep -q "^precision    bf16: oneDNN" || bf16=
  [ $quick = 1 ] && models=(vit_tiny) steps=3 batch_steps=1
  for config in "${models[@]}"; do
    [ -f "$work/$config.onnx" ] || export_onnx "$config"
    # reduce_range (7-bit weights) where onnxruntime advises it: a CPU without VNNI, whose u8 x s8 pairs saturate.
    "$venv_python" -c 'import sys
from onnxruntime.quantization import QuantType, quantize_dynamic
quantize_dynamic(sys.argv[1], sys.argv[2], weight_type=QuantType.QInt8, per_channel=True,
                 reduce_range=sys.argv[3] == "avx2")' \
      "$work/$config.onnx" "$work/$config.int8.onnx" "$isa" 2>/dev/null
    for ((r = 1; r <= repeats; r++)); do
      for side in fp32 int8 $bf16 onnxruntime onnxruntime-int8; do
        echo "[$config precision] $side run $r/$repeats" >&2
        case $side in
          onnxruntime) out=$("$venv_python" "$root/scripts/bench_onnxruntime.py" --model "$work/$config.onnx" \
                             --steps $steps --threads "$threads" --json) ;;
          onnxruntime-int8) out=$("$venv_python" "$root/scripts/bench_onnxruntime.py" --model "$work/$config.int8.onnx" \
                                  --steps $steps --threads "$threads" --json) ;;
          *) out=$("$vit" bench --device cpu --config "$work/$config.json" --mode infer --precision $side \
                   --batch-size 1 --steps $steps --warmup 2 --threads "$threads" --json 2>/dev/null)
             # batch 32 in fewer steps (its batch-1 part unused)
             out32=$("$vit" bench --device cpu --config "$work/$config.json" --mode infer --precision $side \
                     --batch-size 32 --steps $batch_steps --warmup 1 --threads "$threads" --json 2>/dev/null)
             echo "{\"model\": \"$config\", \"side\": \"$side b32\", \"result\": $out32}" >> "$results" ;;
        esac
        echo "{\"model\": \"$config\", \"side\": \"$side\", \"result\": $out}" >> "$results"
      done
    done
  done
  # The goals: issue 34's on a CPU with VNNI or AMX; issue 68's where int8 runs without VNNI (--isa avx2).
  local goals="0.5 0.9"
  [ "$isa" = avx2 ] && goals="0.6 1.0"
  "$venv_python" - "$results" "$threads" $goals <<'PY'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
goal_fp32, goal_ort = float(sys.argv[3]), float(sys.argv[4])
print(f"\nReduced precision, {sys.argv[2]} threads, medians of alternating runs (batch-1 latency p50 in ms; "
      "batch-32 img/s)\n")
print("| model | fp32 ms | int8 ms | bf16 ms | onnxruntime fp32 ms | onnxruntime int8 ms | int8 / fp32 | "
      "int8 / onnxruntime int8 | bf16 / fp32 | b32 img/s fp32, int8, bf16 | int8 / fp32 img/s | weights MiB fp32, int8, bf16 |")
print("|---" * 12 + "|")
goals = []
for model in dict.fromkeys(r["model"] for r in rows):
    med = lambda side, key: statistics.median(r["result"][key] for r in rows if (r["model"], r["side"]) == (model, side))
    ran = {r["side"] for r in rows if r["model"] == model}
    lat = {s: med(s, "latency_ms_p50") for s in ("fp32", "int8", "bf16", "onnxruntime", "onnxruntime-int8") if s in ran}
    ips = {s: med(s + " b32", "infer_img_per_s") for s in ("fp32", "int8", "bf16") if s in ran}
    mib = {s: med(s, "weight_mb") for s in ("fp32", "int8", "bf16") if s in ran}
    r1, r2, r3 = lat["int8"] / lat["fp32"], lat["int8"] / lat["onnxruntime-int8"], ips["int8"] / ips["fp32"]
    f = lambda table, side, form="{:.1f}": form.format(table[side]) if side in table else "-"  # bf16 may not run
    bf16_ratio = f"{lat['bf16'] / lat['fp32']:.2f}x" if "bf16" in lat else "-"
    print(f"| {model} | {lat['fp32']:.1f} | {lat['int8']:.1f} | {f(lat, 'bf16')} | {lat['onnxruntime']:.1f} | "
          f"{lat['onnxruntime-int8']:.1f} | {r1:.2f}x | {r2:.2f}x | {bf16_ratio} | "
          f"{ips['fp32']:.1f}, {ips['int8']:.1f}, {f(ips, 'bf16')} | {r3:.2f}x | "
          f"{mib['fp32']:.0f}, {mib['int8']:.0f}, {f(mib, 'bf16', '{:.0f}')} |")
    goals += [f"{model}: int8 / fp32 batch-1 latency <= {goal_fp32}x: {r1:.2f}x, " + ("met" if r1 <= goal_fp32 else "NOT met"),
              f"{model}: int8 / onnxruntime int8 latency <= {goal_ort}x: {r2:.2f}x, " + ("met" if r2 <= goal_ort else "NOT met"),
              f"{model}: int8 / fp32 batch-32 img/s >= 1.8x: {r3:.2f}x, " + ("met" if r3 >= 1.8 else "NOT met")]
print("\nGoals:")
for goal in goals:
    print(f"  {goal}")
PY
}

# ---- mixed-precision training: vit --amp bf16 against PyTorch 2 eager under CPU autocast, each with its float32 ----
bench_amp() {
  local results=$work/amp.jsonl
  local amp_cases=("F-MNIST default config train b128|default|128|20|3"
                   "F-MNIST 6x128 patch 4 train b128|fashion_mnist|128|10|2" "ViT-S/16 train b16|vit_small|16|4|1")
  [ $quick = 1 ] && amp_cases=("F-MNIST 6x128 patch 4 train b128|fashion_mnist|128|2|1")
  [ -f "$work/default.json" ] || amp_cases=("${amp_cases[@]:1}")
  for case in "${amp_cases[@]}"; do
    IFS='|' read -r name config batch steps warmup <<< "$case"
    local args=(--config "$work/$config.json" --mode train --batch-size "$batch" --steps "$steps" --warmup "$warmup"
                --threads "$threads" --json)
    for ((r = 1; r <= repeats; r++)); do
      for side in "vit off" "vit bf16" "eager off" "eager bf16"; do
        read -r tool amp <<< "$side"
        echo "[$name amp] $tool $amp run $r/$repeats" >&2
        if [ "$tool" = vit ]; then
          out=$("$vit" bench --device cpu "${args[@]}" --amp "$amp" 2>/dev/null)
        else
          out=$("$venv_python" "$root/scripts/bench_pytorch.py" "${args[@]}" --amp "$amp")
        fi
        echo "{\"case\": \"$name\", \"side\": \"$tool $amp\", \"result\": $out}" >> "$results"
      done
    done
  done
  "$venv_python" - "$results" "$threads" <<'PY'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
print(f"\nMixed-precision training on the CPU, {sys.argv[2]} threads, train img/s, medians of alternating runs\n")
print("| case | vit fp32 | vit bf16 | eager fp32 | eager bf16 (autocast) | vit bf16 / vit fp32 | "
      "vit bf16 / eager bf16 | vit bf16 / eager fp32 |")
print("|---" * 8 + "|")
for case in dict.fromkeys(r["case"] for r in rows):
    med = {side: statistics.median(r["result"]["img_per_s"] for r in rows if (r["case"], r["side"]) == (case, side))
           for side in ("vit off", "vit bf16", "eager off", "eager bf16")}
    print(f"| {case} | {med['vit off']:.1f} | {med['vit bf16']:.1f} | {med['eager off']:.1f} | {med['eager bf16']:.1f} | "
          f"{med['vit bf16'] / med['vit off']:.2f}x | {med['vit bf16'] / med['eager bf16']:.2f}x | "
          f"{med['vit bf16'] / med['eager off']:.2f}x |")
PY
}

# name | config | mode | batch | steps | warmup | goals: side>=ratio or side<=ratio (vit/side; img/s up, latency down).
# mode: train (img/s), infer (batch-1 latency; onnxruntime too), throughput (inference img/s at the batch size).
if [ "$only" = precision ]; then bench_precision; exit 0; fi
[ -f "$root/configs/fashion_mnist.json" ] && cp "$root/configs/fashion_mnist.json" "$work/default.json"
if [ "$only" = amp ]; then bench_amp; exit 0; fi
cases=()
if [ -f "$root/configs/fashion_mnist.json" ]; then  # the shipped default
  cases+=("F-MNIST default config train b128|default|train|128|20|3|eager>=1.6 compile>=1.0")
fi
cases+=(
  "F-MNIST 6x128 patch 4 train b128|fashion_mnist|train|128|10|2|eager>=1.5 compile>=1.0"
  "ViT-S/16 train b16|vit_small|train|16|4|1|eager>=1.15 compile>=1.0"
  "ViT-Ti/16 infer b1|vit_tiny|infer|1|30|5|eager<=0.7 onnxruntime<=0.75"
  "ViT-B/16 infer b1|vit_base|infer|1|15|3|eager<=0.85 onnxruntime<=0.95"
  "ViT-Ti/16 infer b32|vit_tiny|throughput|32|5|1|eager>=1.2"
  "ViT-B/16 infer b32|vit_base|throughput|32|3|1|eager>=1.2"
)
if [ $quick = 1 ]; then
  cases=("F-MNIST 6x128 patch 4 train b128|fashion_mnist|train|128|2|1|eager>=1.5 compile>=1.0"
         "ViT-Ti/16 infer b1|vit_tiny|infer|1|3|1|eager<=0.7 onnxruntime<=0.75"
         "ViT-Ti/16 infer b32|vit_tiny|throughput|8|2|1|eager>=1.2")
fi

results=$work/results.jsonl
load_start=$(cut -d' ' -f1 /proc/loadavg)
for case in "${cases[@]}"; do
  IFS='|' read -r name config mode batch steps warmup goals <<< "$case"
  tool_mode=$mode
  [ "$mode" = throughput ] && tool_mode=infer
  args=(--config "$work/$config.json" --mode "$tool_mode" --batch-size "$batch" --steps "$steps" --warmup "$warmup"
        --threads "$threads" --json)
  sides=(vit eager compile)
  if [ "$mode" = infer ]; then
    sides+=(onnxruntime)
    [ -f "$work/$config.onnx" ] || export_onnx "$config"
  fi
  for ((r = 1; r <= repeats; r++)); do
    for side in "${sides[@]}"; do
      echo "[$name] $side run $r/$repeats" >&2
      case $side in
        vit) out=$("$vit" bench --device cpu "${args[@]}" --amp off) ;;  # float32, as the other sides (a config may say bf16)
        eager) out=$("$venv_python" "$root/scripts/bench_pytorch.py" "${args[@]}") ;;
        compile) out=$("$venv_python" "$root/scripts/bench_pytorch.py" "${args[@]}" --compile) ;;
        onnxruntime) out=$("$venv_python" "$root/scripts/bench_onnxruntime.py" --model "$work/$config.onnx" \
                         --batch-size "$batch" --steps "$steps" --warmup "$warmup" --threads "$threads" --json) ;;
      esac
      echo "{\"case\": \"$name\", \"mode\": \"$mode\", \"goals\": \"$goals\", \"side\": \"$side\", \"result\": $out}" \
        >> "$results"
    done
  done
done

load_end=$(cut -d' ' -f1 /proc/loadavg)

"$venv_python" - "$results" "$threads" "$load_start" "$load_end" "$torch_version" "$ort_version" <<'EOF'
import json, re, statistics, sys

rows = [json.loads(line) for line in open(sys.argv[1])]
cases = list(dict.fromkeys(r["case"] for r in rows))
runs = min(sum(r["case"] == c and r["side"] == "vit" for r in rows) for c in cases)
adamw = next((r["result"]["adamw"] for r in rows if "adamw" in r["result"]), "-")
sides = {"eager": "PyTorch 2 eager", "compile": "torch.compile", "onnxruntime": "onnxruntime"}
print(f"\nCPU: {open('/proc/cpuinfo').read().split('model name')[1].split(':')[1].splitlines()[0].strip()}, "
      f"{sys.argv[2]} threads; medians of {runs} alternating runs; PyTorch {sys.argv[5]} (AdamW {adamw}), "
      f"onnxruntime {sys.argv[6]}\n")
print("| case | metric | vit | " + " | ".join(sides.values()) + " | " +
      " | ".join(f"vit / {s}" for s in sides) + " | vit, of its oneDNN sgemm peak | PyTorch 2 eager, of its sgemm peak |")
print("|---" * (5 + 2 * len(sides)) + "|")
goals, compile_s = [], {}
for case in cases:
    mine = [r for r in rows if r["case"] == case]
    key, metric = {"train": ("img_per_s", "train img/s"), "infer": ("latency_ms_p50", "latency p50 (ms)"),
                   "throughput": ("infer_img_per_s", "infer img/s")}[mine[0]["mode"]]
    median = lambda side, key=key: statistics.median(r["result"][key] for r in mine if r["side"] == side)
    present = {side for side in sides if any(r["side"] == side for r in mine)}
    ours = median("vit")
    ratio = {side: ours / median(side) for side in present}
    kernel = [r["result"].get("kernel_peak_fraction") for r in mine if r["side"] == "vit"]
    kernel = f"{100 * statistics.median(kernel):.1f}%" if None not in kernel else "-"
    eager_peak = f"{100 * statistics.median(r['result']['peak_fraction'] for r in mine if r['side'] == 'eager'):.1f}%"
    print(f"| {case} | {metric} | {ours:.2f} | "
          + " | ".join(f"{median(side):.2f}" if side in present else "-" for side in sides) + " | "
          + " | ".join(f"{ratio[side]:.2f}x" if side in present else "-" for side in sides) + f" | {kernel} | {eager_peak} |")
    compile_s[case] = [r["result"]["compile_s"] for r in mine if r["side"] == "compile"]
    for side, op, bound in re.findall(r"(\w+)(>=|<=)([\d.]+)", mine[0]["goals"]):
        met = ratio[side] >= float(bound) if op == ">=" else ratio[side] <= float(bound)
        goals.append(f"{case}: {metric} vit / {sides[side]} {op} {bound}x: {ratio[side]:.2f}x, "
                     + ("met" if met else "NOT met"))
print("\nRatios are vit / other: for img/s higher is better (vit faster), for latency lower is better.")
print("\nGoals:")
for goal in goals:
    print(f"  {goal}")
print("\ntorch.compile time (first calls, s): " + "; ".join(
    f"{case}: " + ", ".join(f"{s:.1f}" for s in times) for case, times in compile_s.items()))
print(f"load average at start {sys.argv[3]}, at end {sys.argv[4]}: other work on the machine distorts multi-thread "
      "timings badly (OpenMP threads wait for descheduled siblings); rerun on an idle machine if these are not ~0")
peak = lambda side, key="peak_gflops": statistics.median(
    r["result"][key] for r in rows if r["side"] == side and r["result"].get(key) is not None)
blas = {r["result"].get("torch_blas") for r in rows if r["side"] == "vit"} - {None}
print(f"sgemm peak (1024^3, median of runs): vit's torch::mm {peak('vit'):.1f} GFLOP/s"
      + (f" ({', '.join(sorted(blas))})" if blas else "")
      + (f", its oneDNN sgemm {peak('vit', 'kernel_peak_gflops'):.1f} GFLOP/s"
         if any(r["result"].get("kernel_peak_gflops") for r in rows if r["side"] == "vit") else "")
      + f"; PyTorch 2's torch.mm {peak('eager'):.1f} GFLOP/s")
EOF

if [ $quick = 1 ]; then
  "$venv_python" "$root/scripts/bench_predict.py" --vit "$vit" --threads "$threads" --images 16 --repeats 1
else
  "$venv_python" "$root/scripts/bench_predict.py" --vit "$vit" --threads "$threads" --repeats "$repeats"
fi
[ "$only" = model ] || bench_data
[ "$only" = model ] || bench_precision
[ "$only" = model ] || bench_amp
[ "$only" = model ] || bench_serve
