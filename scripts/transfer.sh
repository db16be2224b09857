#!/usr/bin/env bash
# Transfer learning on Fashion-MNIST, as README reports it: pretrain the built-in default model on classes 0-4
# (T-shirt/top, Trouser, Pullover, Dress, Coat), then learn classes 5-9 (Sandal, Shirt, Sneaker, Bag, Ankle boot)
# from only 100 training images per class, twice: from scratch, and fine-tuned from the pretrained model
# (--init-from: new head, layer-wise lr decay 0.65, lr 2e-3). Every in-training choice uses a validation split held out
# of the training set; the recipe declares its final weights (the last step's) before training, and the test set
# (the 5,000 test images of classes 5-9) is scored once per run, at the end.
#   scripts/transfer.sh [OUT]    (default runs/transfer; about 13 minutes on 2 cores)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
"$root/scripts/setup.sh"
"$root/scripts/build.sh"
vit="${VIT_BUILD_DIR:-$root/build}/vit"
out=${1:-runs/transfer}
config=configs/fashion_mnist.json
mkdir -p "$out"

# Classes 0-4, all 30,000 training images less a 10% validation split, 10 epochs; no early target.
pretrain=(--set 'data.classes=[0,1,2,3,4]' --set data.val_fraction=0.1 --set train.epochs=10
          --set train.target_top1=0)
# Classes 5-9 (relabelled 0-4), 100 training images per class after a 10% validation split (3,000 images) of the
# full training set; 60 epochs of 10 steps, no EMA (too few steps for 0.999), last weights.
small=(--set 'data.classes=[5,6,7,8,9]' --set data.val_fraction=0.1 --set data.train_per_class=100
       --set train.batch_size=50 --set train.epochs=60 --set train.eval_interval=10 --set train.ema_decay=0
       --set train.final_weights=model
       --set train.warmup_epochs=3 --set train.target_top1=0 --set train.log_interval=20)

echo "== pretraining on classes 0-4"
"$vit" train --config "$config" --out "$out/pretrain" "${pretrain[@]}"
echo "== classes 5-9 from scratch (500 training images)"
"$vit" train --config "$config" --out "$out/scratch" "${small[@]}"
echo "== classes 5-9 fine-tuned from the classes 0-4 model (500 training images)"
"$vit" train --config "$config" --out "$out/finetune" "${small[@]}" --init-from "$out/pretrain/last.safetensors" \
  --set train.layer_decay=0.65 --set train.lr=2e-3

echo "== test set (classes 5-9, 5,000 images), once per run, last weights"
for run in scratch finetune; do
  "$vit" evaluate --checkpoint "$out/$run/last.safetensors" --split test --json > "$out/$run/test.json"
done
python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
rows = [(run, json.load(open(f"{out}/{run}/test.json"))) for run in ("scratch", "finetune")]
print(f"{'run':<10} {'test top-1':>10} {'test loss':>10}")
for run, report in rows:
    print(f"{run:<10} {report['top1']:>9.2f}% {report['loss']:>10.4f}")
PY
