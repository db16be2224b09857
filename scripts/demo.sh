#!/usr/bin/env bash
# README's main job on a fresh Debian 12 machine: set-up, build, train the built-in default (Fashion-MNIST) with 3
# seeds, score each run's declared final weights once on the test set (mean and spread, airbench-style), then
# classify sample images and export their attention maps with the first seed's model.
#
#   scripts/demo.sh [--seeds N] [CONFIG [vit train options, e.g. --set train.epochs=5]]
#
# Every decision during training (best checkpoint, EMA or not, time to target) uses the validation split the config
# holds out of the training set; the test set is read only here, once per seed, on final.safetensors.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
seeds=3
if [ "${1:-}" = --seeds ]; then seeds=$2; shift 2; fi
[[ "$seeds" =~ ^[1-9][0-9]*$ ]] || { echo "--seeds needs a positive integer, got '$seeds'" >&2; exit 2; }
"$root/scripts/setup.sh"
"$root/scripts/build.sh"
vit="${VIT_BUILD_DIR:-$root/build}/vit"

config=${1:-configs/fashion_mnist.json}
shift || true
results=$(mktemp)
trap 'rm -f "$results"' EXIT
runs=()
for ((seed = 0; seed < seeds; seed++)); do
  echo "== training $config, seed $seed ($((seed + 1)) of $seeds)"
  start=$(date +%s%N)
  "$vit" train --config "$config" --set train.seed=$seed "$@"
  millis=$(( ($(date +%s%N) - start) / 1000000 ))
  seconds=$((millis / 1000)).$(printf %03d $((millis % 1000)))
  run=$(readlink -f runs/latest)
  runs+=("$run")
  echo "== seed $seed: training took $seconds s (wall, including data loading and evaluation)"
  echo "== scoring $run/final.safetensors on the validation split and, once, on the test set"
  val=$("$vit" evaluate --checkpoint "$run/final.safetensors" --split val --json)
  "$vit" evaluate --checkpoint "$run/final.safetensors" --split test --out "$run/eval"
  echo "{\"seed\": $seed, \"run\": \"$run\", \"train_seconds\": $seconds, \"val\": $val, \"test\": $(cat "$run/eval/report.json")}" >> "$results"
done
python3 - "$results" <<'PY'
import json, statistics, sys

text, rows, decoder, at = open(sys.argv[1]).read(), [], json.JSONDecoder(), 0
while text[at:].strip():  # one (pretty-printed, multi-line) JSON object per seed
    row, at = decoder.raw_decode(text, at + len(text[at:]) - len(text[at:].lstrip()))
    rows.append(row)
print("\n== result: final weights (declared by the config before training), test set scored once per seed\n")
print("| seed | training wall time | val top-1 | test top-1 |")
print("|---|---|---|---|")
for r in rows:
    print(f"| {r['seed']} | {r['train_seconds']:.0f} s | {r['val']['top1']:.2f}% | {r['test']['top1']:.2f}% |")
def spread(values, unit):
    mean = statistics.mean(values)
    if len(values) == 1:
        return f"{mean:.2f}{unit}"
    return (f"{mean:.2f}{unit} mean, {statistics.stdev(values):.2f} std, "
            f"{min(values):.2f}-{max(values):.2f}")
print(f"\ntest top-1 over {len(rows)} seed(s): {spread([r['test']['top1'] for r in rows], '%')}")
print(f"val top-1:  {spread([r['val']['top1'] for r in rows], '%')}")
print(f"training wall time: {spread([r['train_seconds'] for r in rows], ' s')}")
PY
run=${runs[0]}

echo "== classifying sample images"
python3 "$root/scripts/fashion_mnist_samples.py" /usr/share/datasets/fashion-mnist data/samples 8 >/dev/null
"$vit" predict --checkpoint "$run/final.safetensors" data/samples

echo "== exporting attention maps (every method, with faithfulness curves)"
"$vit" export-attention --checkpoint "$run/final.safetensors" --method all --faithfulness --out "$run/attention" \
  data/samples

echo "== which map to trust: faithfulness of every method on the first 100 test images"
python3 "$root/scripts/fashion_mnist_samples.py" /usr/share/datasets/fashion-mnist data/faithfulness 100 >/dev/null
"$vit" export-attention --checkpoint "$run/final.safetensors" --method all --faithfulness \
  --out "$run/faithfulness" data/faithfulness >/dev/null
python3 "$root/scripts/faithfulness_table.py" "$run/faithfulness/summary.json"

cat <<TXT

== where everything went
run directories:  ${runs[*]}
  config.json, summary.csv, metrics.jsonl, curves.png, final.safetensors (the declared result), last.safetensors,
  ema.safetensors, best.safetensors (picked on the validation split), state.safetensors
evaluation:       $run/eval (report.json, confusion.csv, confusion.png)
sample images:    $root/data/samples
attention maps:   $run/attention/index.html (open it in a browser)
faithfulness:     $run/faithfulness/summary.json (100 test images, every method)
TXT
