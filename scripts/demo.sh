#!/usr/bin/env bash
# README's main job on a fresh Debian 12 machine: set-up, build, train the built-in default (Fashion-MNIST) to
# >= 90% test accuracy, evaluate it on the test set, classify sample images and export their attention maps.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
"$root/scripts/setup.sh"
"$root/scripts/build.sh"
vit="${VIT_BUILD_DIR:-$root/build}/vit"

config=${1:-configs/fashion_mnist.json}
shift || true
echo "== training $config"
start=$(date +%s)
"$vit" train --config "$config" "$@"
echo "== training took $(( $(date +%s) - start )) s (wall, including data loading and evaluation)"
run=$(readlink -f runs/latest)

echo "== evaluating on the Fashion-MNIST test set (10,000 images)"
"$vit" evaluate --checkpoint "$run/best.safetensors" --split test --out "$run/eval"

echo "== classifying sample images"
python3 "$root/scripts/fashion_mnist_samples.py" /usr/share/datasets/fashion-mnist data/samples 8 >/dev/null
"$vit" predict --checkpoint "$run/best.safetensors" data/samples

echo "== exporting attention maps (every method, with faithfulness curves)"
"$vit" export-attention --checkpoint "$run/best.safetensors" --method all --faithfulness --out "$run/attention" \
  data/samples

echo "== which map to trust: faithfulness of every method on the first 100 test images"
python3 "$root/scripts/fashion_mnist_samples.py" /usr/share/datasets/fashion-mnist data/faithfulness 100 >/dev/null
"$vit" export-attention --checkpoint "$run/best.safetensors" --method all --faithfulness \
  --out "$run/faithfulness" data/faithfulness >/dev/null
python3 "$root/scripts/faithfulness_table.py" "$run/faithfulness/summary.json"

cat <<TXT

== where everything went
run directory:    $run
  config.json, summary.csv, metrics.jsonl, curves.png, last.safetensors, best.safetensors, state.safetensors
evaluation:       $run/eval (report.json, confusion.csv, confusion.png)
sample images:    $root/data/samples
attention maps:   $run/attention/index.html (open it in a browser)
faithfulness:     $run/faithfulness/summary.json (100 test images, every method)
TXT
