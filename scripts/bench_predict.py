#!/usr/bin/env python3
"""Whole-process timings of `vit predict`, as a user sees them: start-up, model load, decode, forward, output.

    .venv/bin/python scripts/bench_predict.py --vit build/vit [--images 1000] [--repeats 3] [--threads N]

Writes ViT-Ti/16 and ViT-B/16 model files with random weights under timm's names (scripts/bench_pytorch.py's
model), and photo-sized JPEGs (500x375, smooth colour fields plus noise; Python's PIL), then reports the median
wall time and peak resident memory of `vit predict one.jpg` per model, and img/s and busy cores of `vit predict`
over the folder of JPEGs with ViT-Ti/16, alternating with the same folder classified timm's way
(scripts/predict_timm.py: create_model, its eval transform, a DataLoader with PIL, 0 and 2 workers; the better of
the two is the ratio's other side).
"""
import argparse
import json
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time

PRESETS = (("ViT-Ti/16", "vit_tiny_patch16_224"), ("ViT-B/16", "vit_base_patch16_224"))


def save_timm_file(path, preset):
    """A plain timm-named safetensors file for the preset, written by hand (no safetensors package in Debian)."""
    import torch
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_pytorch import PRESETS, DEFAULTS, VisionTransformer

    args = dict(DEFAULTS)
    args.update(PRESETS[preset])
    size = args.pop("img_size")
    args["img_h"] = args["img_w"] = size
    torch.manual_seed(0)
    state = VisionTransformer(**args).state_dict()
    header, chunks, offset = {}, [], 0
    for name, tensor in state.items():
        name = name.replace("patch_embed.", "patch_embed.proj.")  # timm wraps the convolution in PatchEmbed
        data = tensor.detach().contiguous().numpy().astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(tensor.shape), "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for chunk in chunks:
            f.write(chunk)


def write_jpegs(folder, count):
    import numpy as np
    from PIL import Image

    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(count):
        small = Image.fromarray((rng.random((12, 16, 3)) * 255).astype(np.uint8))
        pixels = np.asarray(small.resize((500, 375), Image.BICUBIC)).astype(np.int16)
        pixels = pixels + rng.integers(-20, 21, pixels.shape)
        Image.fromarray(pixels.clip(0, 255).astype(np.uint8)).save(f"{folder}/img_{i:04d}.jpg", quality=90)


def prepare(work, images):
    write_jpegs(f"{work}/images", images)
    for _, preset in PRESETS:
        save_timm_file(f"{work}/{preset}.safetensors", preset)
        with open(f"{work}/{preset}.json", "w") as f:
            json.dump({"model": {"preset": preset}}, f)


def run(command):
    """Wall seconds, CPU seconds and peak RSS (MiB) of one child process; its output is discarded. A forked child's
    peak RSS includes what it inherited before exec, so this process must stay small: torch, numpy and PIL are only
    imported in the separate --prepare process."""
    start = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - start
    errors = child.stderr.read().decode()
    child.stderr.close()
    if status != 0:
        sys.exit(f"{' '.join(command)} failed:\n{errors}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024.0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vit", required=True)
    parser.add_argument("--images", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--prepare", metavar="DIR", help=argparse.SUPPRESS)  # internal: write the inputs into DIR
    args = parser.parse_args()
    if args.prepare:
        prepare(args.prepare, args.images)
        return

    with tempfile.TemporaryDirectory() as work:
        subprocess.run([sys.executable, os.path.abspath(__file__), "--vit", args.vit, "--images", str(args.images),
                        "--prepare", work], check=True)
        one = f"{work}/images/img_0000.jpg"
        rows = []
        for label, preset in PRESETS:
            model, config = f"{work}/{preset}.safetensors", f"{work}/{preset}.json"
            base = [args.vit, "predict", "--checkpoint", model, "--config", config, "--threads", str(args.threads),
                    "--topk", "1"]
            single = [run(base + [one]) for _ in range(args.repeats)]
            rows.append(f"| `vit predict one.jpg`, {label} | {statistics.median(r[0] for r in single):.2f} s "
                        f"| {statistics.median(r[2] for r in single):.0f} MiB | |")
            if preset == "vit_tiny_patch16_224":
                timm_side = lambda workers: [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                                          "predict_timm.py"),
                                             "--model", preset, "--weights", model, "--folder", f"{work}/images",
                                             "--workers", str(workers), "--threads", str(args.threads)]
                folder, timm_runs = [], {0: [], 2: []}
                for _ in range(args.repeats):  # alternating, so that drift in machine load hits both sides
                    folder.append(run(base + [f"{work}/images"]))
                    for workers in timm_runs:
                        timm_runs[workers].append(run(timm_side(workers)))
                wall = statistics.median(r[0] for r in folder)
                busy = statistics.median(r[1] / r[0] for r in folder)
                rows.append(f"| `vit predict` {args.images} JPEGs (500x375), {label} | {wall:.2f} s "
                            f"({args.images / wall:.1f} img/s) | {statistics.median(r[2] for r in folder):.0f} MiB "
                            f"| {busy:.2f} |")
                for workers, runs in timm_runs.items():
                    timm_wall = statistics.median(r[0] for r in runs)
                    rows.append(f"| timm's way, {workers} DataLoader workers, same folder and weights | "
                                f"{timm_wall:.2f} s ({args.images / timm_wall:.1f} img/s) | "
                                f"{statistics.median(r[2] for r in runs):.0f} MiB "
                                f"| {statistics.median(r[1] / r[0] for r in runs):.2f} |")
                best = min(statistics.median(r[0] for r in runs) for runs in timm_runs.values())
                ratio = f"vit predict / timm's way (its better worker count): {best / wall:.2f}x the images per second"
        startup = [run([args.vit, "--version"]) for _ in range(args.repeats)]

    print(f"\nWhole processes, medians of {args.repeats} runs (output discarded):\n")
    print("| command | wall time | peak memory | busy cores |")
    print("|---|---|---|---|")
    print(f"| `vit --version` (libtorch start-up alone) | {statistics.median(r[0] for r in startup):.2f} s "
          f"| {statistics.median(r[2] for r in startup):.0f} MiB | |")
    for row in rows:
        print(row)
    print(f"\n{ratio} (goal: at least 1.5x)")


if __name__ == "__main__":
    main()
