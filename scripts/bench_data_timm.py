#!/usr/bin/env python3
"""Images/s of the training data pipeline the timm way: a torch DataLoader with worker processes decoding JPEGs with
PIL under timm's training transform without colour jitter or auto-augment (RandomResizedCrop 224, scale 0.08-1,
bilinear; horizontal flip; ToTensor; ImageNet normalisation), batched by the default collate. Reads a torchvision
ImageFolder (--folder) or WebDataset tar shards (--shards, a brace pattern; a minimal streaming reader, shards split
across workers), both as written by scripts/make_bench_images.py. Runs --epochs passes; the first --warmup-batches
batches are untimed, and the clock runs from there to the last batch. Prints one JSON line.

    .venv/bin/python scripts/bench_data_timm.py (--folder DIR/folder/train
        | --shards 'DIR/shards/train-{000000..000019}.tar')
        [--workers 2] [--batch-size 64] [--epochs 1] [--warmup-batches 5] [--seed 0]
"""
import argparse
import io
import json
import random
import re
import sys
import tarfile
import time

try:
    import PIL
    import torch
    import torchvision
    from PIL import Image
    from torch.utils.data import DataLoader, IterableDataset, get_worker_info
    from torchvision import datasets, transforms
except ImportError as error:
    sys.exit(f"bench_data_timm.py needs torch, torchvision and pillow: {error}")

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


class TarShards(IterableDataset):
    """(image, label) from tar shards read as streams; each worker reads its share of the shards, in an order
    shuffled per epoch by the seed. A sample is the consecutive members <key>.jpg and <key>.cls."""

    def __init__(self, paths, transform, seed):
        self.paths, self.transform, self.seed, self.epoch = paths, transform, seed, 0

    def __iter__(self):
        paths = list(self.paths)
        random.Random(self.seed + self.epoch).shuffle(paths)
        self.epoch += 1
        worker = get_worker_info()
        if worker is not None:
            paths = paths[worker.id::worker.num_workers]
        for path in paths:
            with tarfile.open(path, "r|") as tar:
                key, sample = None, {}
                for member in tar:
                    if not member.isfile():
                        continue
                    name, _, ext = member.name.rpartition("/")[2].partition(".")
                    if name != key:
                        yield from self.decode(sample)
                        key, sample = name, {}
                    sample[ext] = tar.extractfile(member).read()
                yield from self.decode(sample)

    def decode(self, sample):
        if "jpg" in sample and "cls" in sample:
            image = Image.open(io.BytesIO(sample["jpg"])).convert("RGB")
            yield self.transform(image), int(sample["cls"])


def expand_braces(pattern):
    match = re.fullmatch(r"(.*)\{(\d+)\.\.(\d+)\}(.*)", pattern)
    if not match:
        return [pattern]
    prefix, first, last, suffix = match.groups()
    return [f"{prefix}{i:0{len(first)}d}{suffix}" for i in range(int(first), int(last) + 1)]


def worker_init(_):
    torch.set_num_threads(1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--folder")
    source.add_argument("--shards")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--warmup-batches", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)

    transform = transforms.Compose([
        transforms.RandomResizedCrop(224, scale=(0.08, 1.0), interpolation=transforms.InterpolationMode.BILINEAR),
        transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD),
    ])
    print(transform, file=sys.stderr)
    if args.folder:
        pipeline, dataset, shuffle = "timm-folder", datasets.ImageFolder(args.folder, transform), True
    else:
        paths = expand_braces(args.shards)
        if len(paths) < args.workers:
            print(f"warning: {len(paths)} shards for {args.workers} workers; some workers idle", file=sys.stderr)
        pipeline, dataset, shuffle = "timm-shards", TarShards(paths, transform, args.seed), None
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=shuffle, num_workers=args.workers,
                        pin_memory=False, drop_last=True, persistent_workers=args.workers > 0,
                        worker_init_fn=worker_init, generator=torch.Generator().manual_seed(args.seed))

    seen, images, start = 0, 0, time.perf_counter()
    for _ in range(args.epochs):
        for batch, _labels in loader:
            seen += 1
            if seen <= args.warmup_batches:
                start = time.perf_counter()
            else:
                images += batch.shape[0]
    seconds = time.perf_counter() - start
    if images == 0:
        sys.exit(f"no timed batches: {seen} batches in all, {args.warmup_batches} warm-up")
    print(json.dumps({"pipeline": pipeline, "workers": args.workers, "batch_size": args.batch_size, "images": images,
                      "seconds": round(seconds, 3), "img_per_s": round(images / seconds, 1),
                      "torch": torch.__version__, "torchvision": torchvision.__version__, "pillow": PIL.__version__}))


if __name__ == "__main__":
    main()
