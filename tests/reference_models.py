#!/usr/bin/env python3
"""References for the snapshot and export tests (tests/test_interop.cpp), computed by timm and transformers.

Every model is random-initialised here (never downloaded), saved the way the library publishes it, and run through
the library's own preprocessing, so the C++ side is compared with what a user of timm or transformers gets.

  timm-snapshot OUT --arch NAME --args JSON [--labels JSON] [--dtype f32|f16|bf16] --image PNG --ref FILE
  hf-snapshot   OUT --config JSON [--processor JSON] [--dtype ...] [--max-shard-size SIZE] --image PNG --ref FILE
  check-timm    DIR --inputs FILE --image PNG --ref FILE   (our export, loaded by timm)
  check-hf      DIR --inputs FILE --image PNG --ref FILE   (our export, loaded by transformers)
  check-hf-images DIR --images PNG... --ref FILE        (our export's processor and model on each image: "pixels.<i>",
                                                           "pixels_torchvision.<i>", "logits.<i>")

--image is written (a smooth non-square RGB PNG) by the snapshot commands and read by the check commands. --ref is a
safetensors file: "pixels" (the library's preprocessed image), "logits" (its logits for it), and for the checks
"logits.<k>" for each input "x.<k>" of --inputs.
"""
import argparse
import json

import numpy as np
import torch
from PIL import Image
from safetensors.torch import load_file, save_file

DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


def write_image(path, height=37, width=50, seed=0):
    # Smooth but different in every channel, so that resize filters and crops matter.
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    channels = [127 + 100 * np.sin(x / (3.0 + c) + y / (5.0 + 2 * c) + c) for c in range(3)]
    image = np.stack(channels, -1) + rng.normal(0, 8, (height, width, 3))
    Image.fromarray(np.clip(image, 0, 255).astype(np.uint8), "RGB").save(path)


def randomise(model, seed):
    # Default inits leave biases, norms and tokens near zero or one: perturb all so every tensor matters.
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.05)


def round_to(model, dtype):
    # The weights as the file will hold them, so the reference sees exactly what a loader reads back.
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(dtype).to(torch.float32))


def timm_snapshot(a):
    import timm
    from timm.data import create_transform, resolve_data_config
    from timm.models._hub import save_for_hf

    model_args = json.loads(a.args)
    model = timm.create_model(a.arch, pretrained=False, **model_args).eval()
    randomise(model, 1)
    dtype = DTYPES[a.dtype]
    round_to(model, dtype)
    config = {}
    if a.labels:
        config["label_names"] = json.loads(a.labels)
    model.to(dtype)
    save_for_hf(model, a.out, model_config=config, model_args=model_args, safe_serialization=True)
    # What a user of timm gets from the folder: the model and its preprocessing as timm reads them back.
    model = timm.create_model("local-dir:" + a.out, pretrained=True).eval().to(torch.float32)
    write_image(a.image)
    transform = create_transform(**resolve_data_config({}, model=model))
    pixels = transform(Image.open(a.image).convert("RGB")).unsqueeze(0)
    with torch.no_grad():
        logits = model(pixels)
    save_file({"pixels": pixels.contiguous(), "logits": logits.contiguous()}, a.ref)


def hf_snapshot(a):
    from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor

    torch.manual_seed(0)
    config = ViTConfig(**json.loads(a.config))
    model = ViTForImageClassification(config).eval()
    randomise(model, 2)
    dtype = DTYPES[a.dtype]
    round_to(model, dtype)
    model.to(dtype)
    if a.max_shard_size:  # transformers' sharded layout: model.safetensors.index.json and its shards
        model.save_pretrained(a.out, safe_serialization=True, max_shard_size=a.max_shard_size)
    else:
        model.save_pretrained(a.out, safe_serialization=True)
    model.to(torch.float32)
    # Saved as the Hub's ViT repositories are; the reference is its PIL backend (transformers >= 5 also has a
    # torchvision one, ViTImageProcessor itself, whose antialiased resize differs from PIL by a level here and there).
    ViTImageProcessor(**json.loads(a.processor or "{}")).save_pretrained(a.out)
    write_image(a.image)
    out = processors_pixels(a.out, a.image)
    with torch.no_grad():
        out["logits"] = model(pixel_values=out["pixels"]).logits.contiguous()
    save_file(out, a.ref)


def processors(folder):
    # As a user loads a folder's processor: AutoImageProcessor, with its PIL backend (the reference) and its
    # torchvision one (transformers 5's default, whose antialiased resize differs from PIL by a level here and there).
    from transformers import AutoImageProcessor

    return (AutoImageProcessor.from_pretrained(folder, backend="pil"),
            AutoImageProcessor.from_pretrained(folder, backend="torchvision"))


def processors_pixels(folder, image, suffix=""):
    image = Image.open(image).convert("RGB")
    pil, tv = processors(folder)
    return {"pixels" + suffix: pil(images=image, return_tensors="pt")["pixel_values"].contiguous(),
            "pixels_torchvision" + suffix: tv(images=image, return_tensors="pt")["pixel_values"].contiguous()}


def run_inputs(model, inputs, out):
    with torch.no_grad():
        for name, x in inputs.items():
            if name.startswith("x."):
                y = model(x)
                out["logits." + name[2:]] = (y.logits if hasattr(y, "logits") else y).contiguous()


def check_timm(a):
    import timm
    from timm.data import create_transform, resolve_data_config

    model = timm.create_model("local-dir:" + a.dir, pretrained=True).eval()
    # The same weights through a strict load_state_dict into a model built from the config alone.
    with open(a.dir + "/config.json") as f:
        config = json.load(f)
    fresh = timm.create_model(config["architecture"], pretrained=False, **config["model_args"]).eval()
    fresh.load_state_dict(load_file(a.dir + "/model.safetensors"), strict=True)
    out = {}
    inputs = load_file(a.inputs)
    run_inputs(model, inputs, out)
    strict = {}
    run_inputs(fresh, inputs, strict)
    for k in out:
        assert torch.equal(out[k], strict[k]), "local-dir and strict load_state_dict disagree"
    transform = create_transform(**resolve_data_config({}, model=model))
    out["pixels"] = transform(Image.open(a.image).convert("RGB")).unsqueeze(0).contiguous()
    save_file(out, a.ref)
    print(json.dumps({"label_names": model.pretrained_cfg.get("label_names")}))


def check_hf(a):
    from transformers import ViTForImageClassification

    model, info = ViTForImageClassification.from_pretrained(a.dir, output_loading_info=True)
    problems = {k: v for k, v in info.items() if v}
    assert not problems, f"transformers loaded with problems: {problems}"
    model.eval()
    out = processors_pixels(a.dir, a.image)
    run_inputs(model, load_file(a.inputs), out)
    save_file(out, a.ref)
    print(json.dumps({"id2label": model.config.id2label}))


def check_hf_images(a):
    # Each image through the folder's own processor and model, as a transformers user runs it.
    from transformers import ViTForImageClassification

    model = ViTForImageClassification.from_pretrained(a.dir).eval()
    out = {}
    for i, image in enumerate(a.images):
        out.update(processors_pixels(a.dir, image, f".{i}"))
        with torch.no_grad():
            out[f"logits.{i}"] = model(pixel_values=out[f"pixels.{i}"]).logits.contiguous()
    save_file(out, a.ref)
    pil, tv = processors(a.dir)
    print(json.dumps({"processor": type(pil).__name__, "processor_torchvision": type(tv).__name__}))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("timm-snapshot")
    p.add_argument("out")
    p.add_argument("--arch", required=True)
    p.add_argument("--args", default="{}")
    p.add_argument("--labels")
    p.add_argument("--dtype", default="f32", choices=DTYPES)
    p.add_argument("--image", required=True)
    p.add_argument("--ref", required=True)
    p.set_defaults(run=timm_snapshot)
    p = sub.add_parser("hf-snapshot")
    p.add_argument("out")
    p.add_argument("--config", required=True)
    p.add_argument("--processor")
    p.add_argument("--dtype", default="f32", choices=DTYPES)
    p.add_argument("--max-shard-size")
    p.add_argument("--image", required=True)
    p.add_argument("--ref", required=True)
    p.set_defaults(run=hf_snapshot)
    for name, run in (("check-timm", check_timm), ("check-hf", check_hf)):
        p = sub.add_parser(name)
        p.add_argument("dir")
        p.add_argument("--inputs", required=True)
        p.add_argument("--image", required=True)
        p.add_argument("--ref", required=True)
        p.set_defaults(run=run)
    p = sub.add_parser("check-hf-images")
    p.add_argument("dir")
    p.add_argument("--images", nargs="+", required=True)
    p.add_argument("--ref", required=True)
    p.set_defaults(run=check_hf_images)
    args = parser.parse_args()
    torch.set_num_threads(2)
    args.run(args)


if __name__ == "__main__":
    main()
