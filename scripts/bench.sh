#!/usr/bin/env bash
# Compares `vit bench` with the same model and training step in plain PyTorch (scripts/bench_pytorch.py) on the same
# models, batch sizes and thread count. Runs alternate between the two so that drift in machine load hits both; the
# table shows medians over the repeats and our/PyTorch ratios (higher is better for img/s, lower for latency).
# Then whole `vit predict` processes (scripts/bench_predict.py): one image with ViT-Ti/16 and ViT-B/16 (time and peak
# memory), and a folder of 1,000 JPEGs (img/s, busy cores).
# Then the training input pipeline: `vit bench --mode data` against timm's way (scripts/bench_data_timm.py: PyTorch
# DataLoader, PIL, torchvision transforms) with the same workers and transform, RandomResizedCrop(224, scale 0.08-1,
# bilinear) + flip + float + normalise, on generated photo-like JPEGs of 500x375 and 2,000x1,500, as loose files and
# as tar shards (scripts/make_bench_images.py makes them once into $VIT_BENCH_DATA, default build/bench-data).
#
#   scripts/bench.sh [--vit PATH] [--threads N] [--repeats R] [--quick] [--only model|data]
#
# Needs a built `vit` (default: build/vit), Debian's python3-torch and python3-pil (/usr/bin/python3) and, for the
# data part, the project's .venv with torchvision (VIT_SETUP_TEST_EXTRAS=1 scripts/setup.sh).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
vit=$root/build/vit
threads=$(nproc)
repeats=3
quick=0
python=/usr/bin/python3
venv_python=${VIT_VENV:-$root/.venv}/bin/python
only=all
while [ $# -gt 0 ]; do
  case $1 in
    --vit) vit=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --repeats) repeats=$2; shift 2 ;;
    --quick) quick=1; shift ;;  # fewer steps: a smoke test of the script, not a measurement
    --only) only=$2; shift 2 ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ -x "$vit" ] || { echo "no vit binary at $vit (build it, or pass --vit PATH)" >&2; exit 1; }

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
"$python" -c 'import torch, PIL' 2>/dev/null || { echo "$python cannot import torch and PIL (apt install python3-torch python3-pil)" >&2; exit 1; }
cat > "$work/fashion_mnist.json" <<'EOF'
{"model": {"img_size": 28, "patch_size": 4, "in_chans": 1, "num_classes": 10, "embed_dim": 128, "depth": 6,
           "num_heads": 4, "mlp_ratio": 2},
 "data": {"mean": [0.5], "std": [0.5]}}
EOF
for size in tiny small base; do
  echo "{\"model\": {\"preset\": \"vit_${size}_patch16_224\"}}" > "$work/vit_$size.json"
done

# name | config | mode | batch | steps | warmup
cases=()
if [ -f "$root/configs/fashion_mnist.json" ]; then  # the shipped default
  cp "$root/configs/fashion_mnist.json" "$work/default.json"
  cases+=("F-MNIST default config train b128|default|train|128|20|3")
fi
cases+=(
  "F-MNIST 6x128 patch 4 train b128|fashion_mnist|train|128|10|2"
  "ViT-S/16 train b16|vit_small|train|16|4|1"
  "ViT-Ti/16 infer b1|vit_tiny|infer|1|30|5"
  "ViT-B/16 infer b1|vit_base|infer|1|15|3"
)
if [ $quick = 1 ]; then
  cases=("F-MNIST 6x128 patch 4 train b128|fashion_mnist|train|128|2|1" "ViT-Ti/16 infer b1|vit_tiny|infer|1|3|1")
fi

results=$work/results.jsonl
load_start=$(cut -d' ' -f1 /proc/loadavg)
for case in "${cases[@]}"; do
  IFS='|' read -r name config mode batch steps warmup <<< "$case"
  args=(--config "$work/$config.json" --mode "$mode" --batch-size "$batch" --steps "$steps" --warmup "$warmup"
        --threads "$threads" --json)
  for ((r = 1; r <= repeats; r++)); do
    for framework in vit pytorch; do
      echo "[$name] $framework run $r/$repeats" >&2
      if [ $framework = vit ]; then
        out=$("$vit" bench --device cpu "${args[@]}")
      else
        out=$("$python" "$root/scripts/bench_pytorch.py" "${args[@]}")
      fi
      echo "{\"case\": \"$name\", \"mode\": \"$mode\", \"framework\": \"$framework\", \"result\": $out}" >> "$results"
    done
  done
done

load_end=$(cut -d' ' -f1 /proc/loadavg)

"$python" - "$results" "$threads" "$load_start" "$load_end" <<'EOF'
import json, statistics, sys

rows = [json.loads(line) for line in open(sys.argv[1])]
print(f"\nCPU: {open('/proc/cpuinfo').read().split('model name')[1].split(':')[1].splitlines()[0].strip()}, "
      f"{sys.argv[2]} threads; medians of {max(1, len(rows) // 2 // len({r['case'] for r in rows}))} alternating runs\n")
print("| case | metric | vit | PyTorch | vit / PyTorch | vit, of sgemm peak | PyTorch, of sgemm peak "
      "| vit, of its oneDNN sgemm peak |")
print("|---|---|---|---|---|---|---|---|")
for case in dict.fromkeys(r["case"] for r in rows):
    mine = [r for r in rows if r["case"] == case]
    median = lambda fw, key: statistics.median(r["result"][key] for r in mine if r["framework"] == fw)
    if mine[0]["mode"] == "train":
        metric, key = "train img/s", "img_per_s"
    else:
        metric, key = "latency p50 (ms)", "latency_ms_p50"
    ours, theirs = median("vit", key), median("pytorch", key)
    kernel = [r["result"].get("kernel_peak_fraction") for r in mine if r["framework"] == "vit"]
    kernel = f"{100 * statistics.median(kernel):.1f}%" if None not in kernel else "-"
    print(f"| {case} | {metric} | {ours:.2f} | {theirs:.2f} | {ours / theirs:.2f}x "
          f"| {100 * median('vit', 'peak_fraction'):.1f}% | {100 * median('pytorch', 'peak_fraction'):.1f}% "
          f"| {kernel} |")
print(f"\nload average at start {sys.argv[3]}, at end {sys.argv[4]}: other work on the machine distorts multi-thread "
      "timings badly (OpenMP threads wait for descheduled siblings); rerun on an idle machine if these are not ~0")
print("sgemm peak (torch::mm, median of runs): vit %.1f GFLOP/s, PyTorch %.1f GFLOP/s" % (
    statistics.median(r["result"]["peak_gflops"] for r in rows if r["framework"] == "vit"),
    statistics.median(r["result"]["peak_gflops"] for r in rows if r["framework"] == "pytorch")))
EOF

if [ $quick = 1 ]; then
  "$python" "$root/scripts/bench_predict.py" --vit "$vit" --threads "$threads" --images 16 --repeats 1
else
  "$python" "$root/scripts/bench_predict.py" --vit "$vit" --threads "$threads" --repeats "$repeats"
fi
[ "$only" = model ] || bench_data
