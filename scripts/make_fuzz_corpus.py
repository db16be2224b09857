#!/usr/bin/env python3
"""Writes the seed corpus of the libFuzzer targets (tests/fuzz/): small valid inputs for each, from which the fuzzer
mutates. Run by scripts/fuzz.sh when a target's corpus is missing; images need Pillow (the project's .venv has it).

Usage: make_fuzz_corpus.py [OUT_DIR] [TARGET ...]   (default: build-sanitize/fuzz-corpus, every target)
"""
import io
import json
import os
import struct
import sys
import zlib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGETS = ["fuzz_safetensors", "fuzz_model_file", "fuzz_config", "fuzz_datasets", "fuzz_image"]


# ---- safetensors (the layout io/safetensors.h describes) ----

DTYPES = {"F32": ("<f", 4), "F16": ("<e", 2), "BF16": (None, 2), "F64": ("<d", 8), "I64": ("<q", 8),
          "I32": ("<i", 4), "U8": ("<B", 1), "BOOL": ("<?", 1)}


def pack(dtype, values):
    fmt, size = DTYPES[dtype]
    if dtype == "BF16":  # the top half of the float32
        return b"".join(struct.pack("<f", v)[2:] for v in values)
    return b"".join(struct.pack(fmt, v) for v in values)


def safetensors(tensors, metadata=None):
    """tensors: [(name, dtype, shape, values)] -> bytes, header padded to 8 as our writer does."""
    header, data = {}, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape, values in tensors:
        raw = pack(dtype, values)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text + data


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def ramp(shape):
    return [((i * 37) % 17 - 8) / 16.0 for i in range(numel(shape))]


def safetensors_seeds():
    seeds = {}
    for dtype in DTYPES:
        values = [i % 2 == 1 for i in range(6)] if dtype == "BOOL" else [i % 5 for i in range(6)]
        seeds["dtype_" + dtype.lower()] = safetensors([("t", dtype, [2, 3], values)])
    seeds["scalar_and_empty"] = safetensors([("s", "F32", [], [1.5]), ("e", "F32", [0, 4], [])])
    seeds["metadata_only"] = safetensors([], {"format": "pt", "note": "x"})
    seeds["several"] = safetensors([("a.weight", "F16", [2, 2], [1, 2, 3, 4]), ("a.bias", "I64", [2], [7, -1]),
                                    ("b", "U8", [3], [0, 1, 255])], {"k": "v"})
    return seeds


# ---- model files (io/model_file.h): timm's tensor names; the tiny architecture matches tests/fuzz/fuzz_model_file ----

TINY = {"img_size": 8, "patch_size": 4, "in_chans": 1, "num_classes": 2, "embed_dim": 8, "depth": 1, "num_heads": 2,
        "mlp_ratio": 2.0}


def model_tensors(m):
    """The state dict of model/vit.h's VisionTransformer for config `m` (timm's names and shapes)."""
    D, P, C = m["embed_dim"], m["patch_size"], m.get("in_chans", 3)
    H = int(D * m.get("mlp_ratio", 4.0))
    gh, gw = m["img_size"] // P, m["img_size"] // P
    prefix = (1 if m.get("class_token", True) else 0) + m.get("reg_tokens", 0)
    pos_prefix = 0 if m.get("no_embed_class", False) else prefix
    pool = m.get("global_pool", "token")
    fc_norm = m.get("fc_norm")
    use_fc_norm = fc_norm if fc_norm is not None else pool == "avg"
    hd = D // m["num_heads"]
    shapes = [("patch_embed.proj.weight", [D, C, P, P])]
    if not m.get("pre_norm", False):
        shapes.append(("patch_embed.proj.bias", [D]))
    if m.get("class_token", True):
        shapes.append(("cls_token", [1, 1, D]))
    if m.get("reg_tokens", 0):
        shapes.append(("reg_token", [1, m["reg_tokens"], D]))
    shapes.append(("pos_embed", [1, pos_prefix + gh * gw, D]))
    if m.get("pre_norm", False):
        shapes += [("norm_pre.weight", [D]), ("norm_pre.bias", [D])]
    for b in range(m["depth"]):
        p = f"blocks.{b}."
        shapes += [(p + "norm1.weight", [D]), (p + "norm1.bias", [D]), (p + "attn.qkv.weight", [3 * D, D])]
        if m.get("qkv_bias", True):
            shapes.append((p + "attn.qkv.bias", [3 * D]))
        if m.get("qk_norm", False):
            shapes += [(p + "attn.q_norm.weight", [hd]), (p + "attn.q_norm.bias", [hd]),
                       (p + "attn.k_norm.weight", [hd]), (p + "attn.k_norm.bias", [hd])]
        if m.get("rel_pos_bias", False):
            entries = (2 * gh - 1) * (2 * gw - 1) + (3 if prefix > 0 else 0)
            shapes.append((p + "attn.relative_position_bias_table", [entries, m["num_heads"]]))
        shapes += [(p + "attn.proj.weight", [D, D]), (p + "attn.proj.bias", [D]),
                   (p + "norm2.weight", [D]), (p + "norm2.bias", [D]),
                   (p + "mlp.fc1.weight", [H, D]), (p + "mlp.fc1.bias", [H]),
                   (p + "mlp.fc2.weight", [D, H]), (p + "mlp.fc2.bias", [D])]
        if m.get("init_values") is not None:
            shapes += [(p + "ls1.gamma", [D]), (p + "ls2.gamma", [D])]
    final_norm = m.get("final_norm", True)
    if final_norm and not use_fc_norm:
        shapes += [("norm.weight", [D]), ("norm.bias", [D])]
    if pool == "map":
        a = "attn_pool."
        shapes += [(a + "latent", [1, 1, D]), (a + "q.weight", [D, D]), (a + "q.bias", [D]),
                   (a + "kv.weight", [2 * D, D]), (a + "kv.bias", [2 * D]), (a + "proj.weight", [D, D]),
                   (a + "proj.bias", [D]), (a + "norm.weight", [D]), (a + "norm.bias", [D]),
                   (a + "mlp.fc1.weight", [H, D]), (a + "mlp.fc1.bias", [H]),
                   (a + "mlp.fc2.weight", [D, H]), (a + "mlp.fc2.bias", [D])]
    if final_norm and use_fc_norm:
        shapes += [("fc_norm.weight", [D]), ("fc_norm.bias", [D])]
    if m.get("num_classes", 1000) > 0:
        shapes += [("head.weight", [m["num_classes"], D]), ("head.bias", [m["num_classes"]])]
    return [(name, "F32", shape, ramp(shape)) for name, shape in shapes]


def model_file(m, dtype="F32"):
    metadata = {"format": "vit-model", "format_version": "1", "model": json.dumps(m),
                "preprocess": json.dumps({"mean": [0.5], "std": [0.5], "crop_pct": 0.875}),
                "class_names": json.dumps([f"c{i}" for i in range(m.get("num_classes", 1000))])}
    tensors = [(n, dtype, s, v) for n, _, s, v in model_tensors(m)]
    return safetensors(tensors, metadata)


def model_seeds():
    seeds = {"own_tiny": model_file(TINY), "own_tiny_f16": model_file(TINY, "F16"),
             "plain_tiny": safetensors(model_tensors(TINY))}
    # The plain file at a 3x3 grid: loading with the tiny config resamples its position embedding.
    seeds["plain_grid3"] = safetensors(model_tensors(dict(TINY, img_size=12)))
    variants = {
        "avg_pool": {"class_token": False, "global_pool": "avg"},
        "registers": {"reg_tokens": 1, "no_embed_class": True, "init_values": 1e-5},
        "clip_like": {"pre_norm": True, "act_layer": "quick_gelu", "qk_norm": True},
        "map_head": {"global_pool": "map", "class_token": False, "act_layer": "gelu_tanh"},
        "rel_pos": {"rel_pos_bias": True, "qkv_bias": False, "num_classes": 0},
    }
    for name, change in variants.items():
        seeds["own_" + name] = model_file(dict(TINY, **change))
    return seeds


# ---- configs: the shipped ones, with --set overrides after a NUL ----

def config_seeds():
    seeds = {}
    folder = os.path.join(ROOT, "configs")
    for name in sorted(os.listdir(folder)):
        if name.endswith(".json"):
            with open(os.path.join(folder, name), "rb") as f:
                seeds[name[:-5]] = f.read()
    seeds["overrides"] = (b'{"model": {"preset": "vit_tiny_patch16_224"}, "data": {"format": "csv"}}\0'
                          b"model.depth=2\ndata.augment.hflip=0.5\ntrain.freeze=[\"backbone\"]\ndata.classes=[1, \"b\"]"
                          b"\nmodel.img_size=[32, 48]\ntrain.amp=bf16")
    seeds["empty_with_set"] = b"{}\0model.embed_dim=64\nmodel.num_heads=4\ndata.root=/x\ntrain.seed=7"
    return seeds


# ---- datasets (tests/fuzz/fuzz_datasets.cpp's input: mode byte, u16 length of part A, part A, part B) ----

def dataset_input(mode, a, b):
    return bytes([mode]) + struct.pack("<H", len(a)) + a + b


def idx_images(count, rows, cols):
    return struct.pack(">IIII", 0x803, count, rows, cols) + bytes((i * 7) % 256 for i in range(count * rows * cols))


def idx_labels(labels):
    return struct.pack(">II", 0x801, len(labels)) + bytes(labels)


def cifar_records(labels, label_bytes):
    out = b""
    for i, label in enumerate(labels):
        out += bytes([0] * (label_bytes - 1) + [label]) + bytes((i + j) % 256 for j in range(3072))
    return out


def dataset_seeds():
    labels = [0, 1, 1, 0, 2, 1]
    idx = (idx_images(6, 3, 2), idx_labels(labels))
    names = b"zero\none\ntwo\n" + b"".join(b"c%d\n" % i for i in range(3, 10))
    csv_train = b"path,label\na.png,0\nb.png,1\n\"c,d.png\",1\nsub/e.jpg,2\n/abs/f.png,0\n"
    csv_named = b"a.png,cat\nb.png,dog\nc.png,cat\nd.png,bird\n"
    return {
        "idx": dataset_input(0, *idx),
        "idx_split": dataset_input(0 | 0x04 | 0x10, *idx),
        "idx_classes_subsets": dataset_input(0 | 0x08 | 0x20 | 0x40 | 0x80, *idx),
        "idx_gzip": dataset_input(0, zlib.compress(idx[0], wbits=31), zlib.compress(idx[1], wbits=31)),
        "cifar10": dataset_input(1, cifar_records([3, 9], 1), names),
        "cifar10_plain_names": dataset_input(1 | 0x04, cifar_records([1, 0, 1], 1), b""),
        "cifar100": dataset_input(2 | 0x08, cifar_records([0, 1, 99], 2), b""),
        "csv": dataset_input(3, csv_train, b"x.png,1\ny.png,02\n"),
        "csv_named": dataset_input(3 | 0x04 | 0x08 | 0x10, csv_named, b"x.png,dog\n"),
    }


# ---- images (tests/fuzz/fuzz_image.cpp's input: 8 bytes of window and scale, then the encoded file) ----

def image_seeds():
    try:
        import numpy as np
        from PIL import Image
    except ImportError:
        print("make_fuzz_corpus: no Pillow/numpy here (use .venv/bin/python); fuzz_image gets no image seeds",
              file=sys.stderr)
        return {}
    rng = np.random.default_rng(0)
    rgb = Image.fromarray(rng.integers(0, 256, (12, 16, 3), dtype=np.uint8), "RGB")
    gray = rgb.convert("L")
    rgba = rgb.convert("RGBA")
    window = bytes([2, 3, 5, 6, 1, 0, 0, 0])  # top, left, height, width, scale code, reserved
    out = {}

    def add(name, image, fmt, **options):
        buffer = io.BytesIO()
        image.save(buffer, fmt, **options)
        out[name] = window + buffer.getvalue()

    add("rgb.jpg", rgb, "JPEG", quality=80)
    add("gray.jpg", gray, "JPEG", quality=80)
    add("progressive.jpg", rgb, "JPEG", quality=70, progressive=True)
    add("rgb.png", rgb, "PNG")
    add("gray.png", gray, "PNG")
    add("rgba.png", rgba, "PNG")
    add("gray16.png", Image.fromarray(np.asarray(gray).astype(np.uint16) * 257), "PNG")
    add("rgb.bmp", rgb, "BMP")
    add("rgb.webp", rgb, "WEBP", quality=80)
    add("rgb.ppm", rgb, "PPM")
    add("gray.pgm", gray, "PPM")
    add("rgb.tif", rgb, "TIFF")
    return out


GENERATORS = {"fuzz_safetensors": safetensors_seeds, "fuzz_model_file": model_seeds, "fuzz_config": config_seeds,
              "fuzz_datasets": dataset_seeds, "fuzz_image": image_seeds}


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build-sanitize", "fuzz-corpus")
    targets = sys.argv[2:] or TARGETS
    for target in targets:
        if target not in GENERATORS:
            sys.exit(f"make_fuzz_corpus: unknown target {target!r} (known: {', '.join(TARGETS)})")
        folder = os.path.join(out, target)
        os.makedirs(folder, exist_ok=True)
        seeds = GENERATORS[target]()
        for name, data in seeds.items():
            with open(os.path.join(folder, name), "wb") as f:
                f.write(data)
        print(f"make_fuzz_corpus: {len(seeds)} seeds in {folder}")


if __name__ == "__main__":
    main()
