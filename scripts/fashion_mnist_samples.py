#!/usr/bin/env python3
"""Writes the first N Fashion-MNIST test images as PNG files (stdlib only), named <index>_<class>.png."""
import gzip
import os
import struct
import sys
import zlib

CLASSES = ["t-shirt", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker", "bag", "ankle-boot"]


def read_idx(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    magic, count = struct.unpack(">II", data[:8])
    if magic == 0x803:
        rows, cols = struct.unpack(">II", data[8:16])
        return [data[16 + i * rows * cols:16 + (i + 1) * rows * cols] for i in range(count)], rows, cols
    if magic == 0x801:
        return list(data[8:8 + count]), 0, 0
    raise SystemExit(f"{path}: bad idx magic 0x{magic:08x}")


def png_gray(pixels, width, height):
    raw = b"".join(b"\x00" + pixels[y * width:(y + 1) * width] for y in range(height))
    def chunk(kind, body):
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


def main():
    root, out, count = sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 8
    def find(stem):
        for name in (stem, stem + ".gz"):
            if os.path.exists(os.path.join(root, name)):
                return os.path.join(root, name)
        raise SystemExit(f"{root}: no {stem}[.gz]")
    images, rows, cols = read_idx(find("t10k-images-idx3-ubyte"))
    labels, _, _ = read_idx(find("t10k-labels-idx1-ubyte"))
    os.makedirs(out, exist_ok=True)
    for i in range(min(count, len(images))):
        path = os.path.join(out, f"{i:03d}_{CLASSES[labels[i]]}.png")
        with open(path, "wb") as f:
            f.write(png_gray(images[i], cols, rows))
        print(path)


if __name__ == "__main__":
    main()
