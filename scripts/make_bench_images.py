#!/usr/bin/env python3
"""Writes a reproducible set of photo-like JPEGs for data-loader benchmarks, in two layouts with identical bytes:
an ImageFolder tree DIR/folder/train/<class>/<index>.jpg and WebDataset tar shards DIR/shards/train-NNNNNN.tar
(members <key>.jpg and <key>.cls, the label as ASCII decimal). Prints a summary and the shards' brace pattern.

    .venv/bin/python scripts/make_bench_images.py --out DIR [--count 2000] [--size 500x375] [--seed 0]
        [--quality 90] [--shard-size 100] [--classes 10] [--jobs N]

Each image: a smooth random colour field, a few blurred ellipses and rectangles and a 1/f luminance texture, built
at half resolution and upscaled, plus mild Gaussian noise; baseline JPEG, 4:2:0 chroma subsampling (PIL).
"""
import argparse
import functools
import io
import multiprocessing
import os
import statistics
import sys
import tarfile
import time

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

# Gaussian noise (sigma 2.5) by table look-up on random bytes: the rounded N(0, 2.5^2) quantiles at (i + 0.5) / 256.
NOISE = np.round([statistics.NormalDist(0.0, 2.5).inv_cdf((i + 0.5) / 256) for i in range(256)]).astype(np.int16)


def make_jpeg(index, seed, width, height, quality):
    rng = np.random.default_rng([seed, index])
    w, h = max(width // 2, 16), max(height // 2, 16)
    # Smooth colour field: a 6x8 grid of random colours, bicubic-upscaled.
    grid = rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)
    canvas = Image.fromarray(grid).resize((w, h), Image.BICUBIC)
    draw = ImageDraw.Draw(canvas)
    for _ in range(rng.integers(3, 9)):
        xs, ys = np.sort(rng.integers(0, w, 2)), np.sort(rng.integers(0, h, 2))
        shape = draw.ellipse if rng.random() < 0.5 else draw.rectangle
        shape([int(xs[0]), int(ys[0]), int(xs[1]), int(ys[1])], fill=tuple(int(v) for v in rng.integers(0, 256, 3)))
    canvas = canvas.filter(ImageFilter.GaussianBlur(float(rng.uniform(0.5, 3.0)) * w / 250))
    # 1/f texture (the amplitude spectrum of natural images), a random strength per image.
    fy, fx = np.fft.fftfreq(h)[:, None], np.fft.rfftfreq(w)[None, :]
    spectrum = np.fft.rfft2(rng.standard_normal((h, w), dtype=np.float32)) / np.maximum(np.hypot(fy, fx), 1.0 / w)
    texture = np.fft.irfft2(spectrum, s=(h, w)).astype(np.float32)
    texture *= rng.uniform(8.0, 32.0) / texture.std()
    pixels = np.asarray(canvas, dtype=np.float32) + texture[..., None]
    small = Image.fromarray(pixels.clip(0, 255).astype(np.uint8))
    full = np.asarray(small.resize((width, height), Image.BICUBIC), dtype=np.int16)
    full += NOISE[np.frombuffer(rng.bytes(full.size), dtype=np.uint8).reshape(full.shape)]
    out = io.BytesIO()
    Image.fromarray(full.clip(0, 255).astype(np.uint8)).save(out, "JPEG", quality=quality, subsampling="4:2:0")
    return out.getvalue()


def add_member(tar, name, data):
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), 0o644, 0
    tar.addfile(info, io.BytesIO(data))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--size", default="500x375", help="WxH")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quality", type=int, default=90)
    parser.add_argument("--shard-size", type=int, default=100)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--jobs", type=int, default=os.cpu_count())
    args = parser.parse_args()
    width, height = map(int, args.size.lower().split("x"))
    folder, shards = os.path.join(args.out, "folder", "train"), os.path.join(args.out, "shards")
    for path in (os.path.dirname(folder), shards):
        if os.path.exists(path):
            sys.exit(f"{path} exists; remove it first")
    for c in range(args.classes):
        os.makedirs(os.path.join(folder, str(c)))
    os.makedirs(shards)

    start, total, tar = time.perf_counter(), 0, None
    make = functools.partial(make_jpeg, seed=args.seed, width=width, height=height, quality=args.quality)
    with multiprocessing.Pool(args.jobs) as pool:
        for index, data in enumerate(pool.imap(make, range(args.count), chunksize=4)):
            label = index % args.classes
            with open(os.path.join(folder, str(label), f"{index:06d}.jpg"), "wb") as f:
                f.write(data)
            if index % args.shard_size == 0:
                if tar:
                    tar.close()
                tar = tarfile.open(os.path.join(shards, f"train-{index // args.shard_size:06d}.tar"), "w")
            add_member(tar, f"sample{index:06d}.jpg", data)
            add_member(tar, f"sample{index:06d}.cls", str(label).encode())
            total += len(data)
    if tar:
        tar.close()
    last = (args.count - 1) // args.shard_size
    print(f"{args.count} images {width}x{height} q{args.quality}, {args.classes} classes: "
          f"{total / 1e6:.1f} MB of JPEG per layout, {last + 1} shards, {time.perf_counter() - start:.1f} s")
    print(os.path.join(shards, f"train-{{000000..{last:06d}}}.tar"))


if __name__ == "__main__":
    main()
