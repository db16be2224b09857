#!/usr/bin/env python3
"""Classifies a folder of images the way a timm user does, the other side of scripts/bench_predict.py's `vit predict`.

    .venv/bin/python scripts/predict_timm.py --model vit_tiny_patch16_224 --weights W.safetensors --folder DIR
        [--workers 0] [--batch-size 16] [--threads N]

timm.create_model with the given weights, timm's own eval transform (resolve_data_config + create_transform: resize
of the shortest edge to size / crop_pct, bicubic, centre crop, normalise), a PyTorch DataLoader decoding with PIL,
inference_mode, top-1 per image printed as one line (as `vit predict --topk 1` prints one per image).
"""
import argparse
import os

import timm
import torch
from PIL import Image
from timm.data import create_transform, resolve_data_config


class Folder(torch.utils.data.Dataset):
    def __init__(self, folder, transform):
        self.paths = sorted(os.path.join(folder, name) for name in os.listdir(folder))
        self.transform = transform

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, index):
        with Image.open(self.paths[index]) as image:
            return self.transform(image.convert("RGB")), index


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--weights", required=True)
    parser.add_argument("--folder", required=True)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--threads", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads or os.cpu_count())
    model = timm.create_model(args.model, pretrained=False)
    timm.models.load_checkpoint(model, args.weights)
    model.eval()
    dataset = Folder(args.folder, create_transform(**resolve_data_config({}, model=model)))
    loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, num_workers=args.workers)
    with torch.inference_mode():
        for images, indices in loader:
            probs, classes = model(images).softmax(-1).max(-1)
            for index, cls, prob in zip(indices.tolist(), classes.tolist(), probs.tolist()):
                print(f"{dataset.paths[index]}\t{cls}\t{prob:.4f}")


if __name__ == "__main__":
    main()
