#!/usr/bin/env bash
# Compares `vit bench` with the same model and training step in plain PyTorch (scripts/bench_pytorch.py) on the same
# models, batch sizes and thread count. Runs alternate between the two so that drift in machine load hits both; the
# table shows medians over the repeats and our/PyTorch ratios (higher is better for img/s, lower for latency).
# Then whole `vit predict` processes (scripts/bench_predict.py): one image with ViT-Ti/16 and ViT-B/16 (time and peak
# memory), and a folder of 1,000 JPEGs (img/s, busy cores).
#
#   scripts/bench.sh [--vit PATH] [--threads N] [--repeats R] [--quick]
#
# Needs a built `vit` (default: build/vit) and Debian's python3-torch and python3-pil (/usr/bin/python3).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
vit=$root/build/vit
threads=$(nproc)
repeats=3
quick=0
python=/usr/bin/python3
while [ $# -gt 0 ]; do
  case $1 in
    --vit) vit=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --repeats) repeats=$2; shift 2 ;;
    --quick) quick=1; shift ;;  # fewer steps: a smoke test of the script, not a measurement
    -h|--help) sed -n '2,8p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ -x "$vit" ] || { echo "no vit binary at $vit (build it, or pass --vit PATH)" >&2; exit 1; }
"$python" -c 'import torch, PIL' 2>/dev/null || { echo "$python cannot import torch and PIL (apt install python3-torch python3-pil)" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
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
