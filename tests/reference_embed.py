#!/usr/bin/env python3
"""References for `vit embed` (tests/test_embed.cpp), computed by timm.

  features WEIGHTS --model JSON --preprocess JSON --images A.png,B.png,... --ref FILE
      timm's VisionTransformer(**MODEL) with the tensors of WEIGHTS (a timm safetensors file, strict), each image
      through timm's eval transform (create_transform with PREPROCESS: mean, std, crop_pct, interpolation). --ref is a
      safetensors file: "pixels" (B, C, H, W), "logits" (B, K), "features" (timm's forward_head(forward_features(x),
      pre_logits=True), (B, D)) and, for every block i, from forward_intermediates (block outputs, no final norm):
      "block.<i>.none" (B, N, D: prefix tokens then patches), "block.<i>.cls" (B, D: token 0) and "block.<i>.avg"
      (B, D: the mean of the patch tokens).
"""
import argparse
import json

import torch
from PIL import Image
from safetensors.torch import load_file, save_file


def timm_model(weights, model_json, preprocess_json):
    """timm's VisionTransformer(**MODEL) in eval mode with WEIGHTS loaded strictly, and its eval transform."""
    from timm.data import create_transform
    from timm.models.vision_transformer import VisionTransformer

    model = VisionTransformer(**json.loads(model_json)).eval()
    model.load_state_dict(load_file(weights), strict=True)
    pre = json.loads(preprocess_json)
    size = model.patch_embed.img_size
    transform = create_transform(input_size=(3, *size), mean=tuple(pre["mean"]), std=tuple(pre["std"]),
                                 crop_pct=pre["crop_pct"], interpolation=pre["interpolation"])
    return model, transform


def features(a):
    model, transform = timm_model(a.weights, a.model, a.preprocess)
    pixels = torch.stack([transform(Image.open(path).convert("RGB")) for path in a.images.split(",")])
    out = {"pixels": pixels}
    with torch.no_grad():
        tokens = model.forward_features(pixels)
        out["features"] = model.forward_head(tokens, pre_logits=True)
        out["logits"] = model.forward_head(tokens)
        patches, prefix = zip(*model.forward_intermediates(pixels, indices=None, return_prefix_tokens=True,
                                                           norm=False, output_fmt="NLC", intermediates_only=True))
    for i, (p, q) in enumerate(zip(patches, prefix)):
        out[f"block.{i}.none"] = torch.cat([q, p], 1)
        out[f"block.{i}.cls"] = q[:, 0]
        out[f"block.{i}.avg"] = p.mean(1)
    save_file({k: v.contiguous() for k, v in out.items()}, a.ref)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("features")
    p.add_argument("weights")
    p.add_argument("--model", required=True)
    p.add_argument("--preprocess", required=True)
    p.add_argument("--images", required=True)
    p.add_argument("--ref", required=True)
    p.set_defaults(run=features)
    a = parser.parse_args()
    a.run(a)


if __name__ == "__main__":
    main()
