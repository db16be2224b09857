#!/usr/bin/env python3
"""References for the timm ViT family tests (tests/test_family.cpp), computed by timm.

  snapshot OUT --arch NAME --args JSON --sizes HxW[,HxW...] --ref FILE
      timm.create_model(NAME, pretrained=False, **ARGS), every weight perturbed, saved with save_for_hf (safetensors)
      to OUT and read back through "local-dir:OUT". For each size i, --ref holds "pixels.i" (2 random images),
      "logits.i" (timm's output: logits, or pooled features without a head), "attn.i.b" (block b's softmax
      probabilities, (2, nh, N, N), from timm's explicit path) and, with a MAP head, "pool.i" ((2, nh, 1, Np)).
      Sizes other than the trained one need "dynamic_img_size": true in ARGS (timm's rule). With --resample HxW,
      "resampled_pos_embed" is the position embedding timm's checkpoint filter makes when the folder is loaded into
      a model of that img_size (create_model("local-dir:OUT", pretrained=True, img_size=(H, W))).
  dynamic OUT --arch NAME --args JSON --sizes HxW[,HxW...]
      timm.create_model(NAME, pretrained=False, **ARGS), every weight perturbed, saved with save_for_hf to OUT/snapshot
      (mean and std 0.5, crop_pct 1.0, the first size as input size), then loaded back with dynamic_img_size=True.
      For each size i: OUT/image.i.png, random RGB of exactly HxW (vit's preprocessing makes no resize), and in
      OUT/ref.safetensors "logits.i" (the dynamic_img_size model on ToTensor + Normalize of the PNG), "attn.i.b"
      (block b's probabilities, (1, nh, N, N)) and "fixed.i" (the logits of the folder created at img_size (H, W)
      without dynamic_img_size: timm's checkpoint filter resamples pos_embed at load).
  dinov3-hf OUT --args JSON --sizes HxW[,HxW...] --ref FILE
      transformers' DINOv3ViTModel(DINOv3ViTConfig(**ARGS)), every weight perturbed, saved with save_pretrained to OUT
      and read back with eager attention. For each size i, --ref holds "pixels.i" (2 random images), "logits.i" (the
      pooler output: the class token after the final norm) and "attn.i.b" (block b's attention probabilities).
  shapes NAMES_FILE --out FILE
      For each architecture name (one per line, optionally followed by the one block's num_kv_heads), timm's model at
      depth 1 on the meta device: its state-dict shapes,
      norms' kinds and epsilon, MLP activation, input size and prefix-token count, as JSON.
"""
import argparse
import json

import torch
from safetensors.torch import save_file

from reference_models import randomise  # every weight perturbed, so that each one matters


def attention_probs(model, pixels):
    """timm's logits, and the softmax probabilities of every block (and of a MAP head) from its explicit path."""
    blocks, pool = [], []
    hooks = []
    for blk in model.blocks:
        blk.attn.fused_attn = False
        hooks.append(blk.attn.attn_drop.register_forward_hook(lambda m, i, o: blocks.append(i[0].detach().clone())))
    if getattr(model, "attn_pool", None) is not None:
        ap = model.attn_pool

        def pool_hook(module, inputs):
            x = inputs[0]
            B, N, C = x.shape
            q = ap.q(ap.latent.expand(B, -1, -1)).reshape(B, ap.latent_len, ap.num_heads, ap.head_dim).transpose(1, 2)
            k = ap.kv(x).reshape(B, N, 2, ap.num_heads, ap.head_dim).permute(2, 0, 3, 1, 4)[0]
            q, k = ap.q_norm(q), ap.k_norm(k)
            pool.append(((q * ap.scale) @ k.transpose(-2, -1)).softmax(-1).detach().clone())

        hooks.append(ap.register_forward_pre_hook(pool_hook))
    with torch.no_grad():
        model(pixels)
    for h in hooks:
        h.remove()
    for blk in model.blocks:
        blk.attn.fused_attn = True
    return blocks, pool


def snapshot(a):
    import timm
    from timm.models._hub import save_for_hf

    model_args = json.loads(a.args)
    # The preprocessing size of a coherent snapshot is the model's (a pretrained one's pretrained_cfg says so too).
    size = model_args.get("img_size", 224)
    size = [size, size] if isinstance(size, int) else size
    overlay = dict(input_size=(model_args.get("in_chans", 3), *size))
    model = timm.create_model(a.arch, pretrained=False, pretrained_cfg_overlay=overlay, **model_args).eval()
    randomise(model, 3)
    save_for_hf(model, a.out, model_args=model_args, safe_serialization=True)
    model = timm.create_model("local-dir:" + a.out, pretrained=True).eval()
    out = {"num_params": torch.tensor([sum(p.numel() for p in model.parameters())], dtype=torch.int64)}
    gen = torch.Generator().manual_seed(5)
    for i, size in enumerate(a.sizes.split(",")):
        h, w = (int(v) for v in size.split("x"))
        pixels = torch.randn(2, model.patch_embed.proj.in_channels, h, w, generator=gen)
        with torch.no_grad():
            out[f"logits.{i}"] = model(pixels).contiguous()  # timm's default path (fused attention)
        blocks, pool = attention_probs(model, pixels)
        out[f"pixels.{i}"] = pixels.contiguous()
        for b, probs in enumerate(blocks):
            out[f"attn.{i}.{b}"] = probs.contiguous()
        if pool:
            out[f"pool.{i}"] = pool[0].contiguous()
    if a.resample:
        h, w = (int(v) for v in a.resample.split("x"))
        resized = timm.create_model("local-dir:" + a.out, pretrained=True, img_size=(h, w))
        out["resampled_pos_embed"] = resized.pos_embed.detach().contiguous()
    save_file(out, a.ref)


def dynamic(a):
    import os

    import timm
    from PIL import Image
    from timm.models._hub import save_for_hf

    model_args = json.loads(a.args)
    sizes = [tuple(int(v) for v in size.split("x")) for size in a.sizes.split(",")]
    overlay = dict(input_size=(3, *sizes[0]), mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5), crop_pct=1.0)
    model = timm.create_model(a.arch, pretrained=False, pretrained_cfg_overlay=overlay, img_size=sizes[0],
                              **model_args).eval()
    randomise(model, 11)
    snap = os.path.join(a.out, "snapshot")
    save_for_hf(model, snap, model_args=dict(model_args, img_size=list(sizes[0])), safe_serialization=True)
    model = timm.create_model("local-dir:" + snap, pretrained=True, dynamic_img_size=True).eval()
    out = {}
    gen = torch.Generator().manual_seed(9)
    for i, (h, w) in enumerate(sizes):
        pixels = torch.randint(0, 256, (h, w, 3), dtype=torch.uint8, generator=gen)
        Image.fromarray(pixels.numpy()).save(os.path.join(a.out, f"image.{i}.png"))
        x = ((pixels.permute(2, 0, 1).float().div(255.0) - 0.5) / 0.5).unsqueeze(0)  # ToTensor, Normalize
        with torch.no_grad():
            out[f"logits.{i}"] = model(x).contiguous()
        blocks, _ = attention_probs(model, x)
        for b, probs in enumerate(blocks):
            out[f"attn.{i}.{b}"] = probs.contiguous()
        fixed = timm.create_model("local-dir:" + snap, pretrained=True, img_size=(h, w)).eval()
        with torch.no_grad():
            out[f"fixed.{i}"] = fixed(x).contiguous()
    save_file(out, os.path.join(a.out, "ref.safetensors"))


def dinov3_hf(a):
    from transformers import DINOv3ViTConfig, DINOv3ViTModel

    model = DINOv3ViTModel(DINOv3ViTConfig(**json.loads(a.args))).eval()
    randomise(model, 13)
    model.save_pretrained(a.out)
    model = DINOv3ViTModel.from_pretrained(a.out, attn_implementation="eager").eval()
    out = {}
    gen = torch.Generator().manual_seed(5)
    for i, size in enumerate(a.sizes.split(",")):
        h, w = (int(v) for v in size.split("x"))
        pixels = torch.randn(2, model.config.num_channels, h, w, generator=gen)
        with torch.no_grad():
            result = model(pixel_values=pixels, output_attentions=True)
        out[f"pixels.{i}"] = pixels.contiguous()
        out[f"logits.{i}"] = result.pooler_output.contiguous()
        for b, probs in enumerate(result.attentions):
            out[f"attn.{i}.{b}"] = probs.contiguous()
    save_file(out, a.ref)


def shapes(a):
    import timm

    with open(a.names) as f:
        names = [line.split() for line in f if line.strip()]
    out = {}
    for name, *kv_heads in names:
        extra = {"num_kv_heads": int(kv_heads[0])} if kv_heads else {}
        with torch.device("meta"):
            model = timm.create_model(name, pretrained=False, depth=1, **extra)
        norms = [m for m in model.modules() if type(m).__name__ in ("LayerNorm", "RmsNorm")]
        act = model.blocks[0].mlp.act
        act_name = {"GELU": "gelu", "QuickGELU": "quick_gelu", "GELUTanh": "gelu_tanh", "SiLU": "silu"}.get(
                                                                                          type(act).__name__,
                                                                                          type(act).__name__)
        if act_name == "gelu" and getattr(act, "approximate", "none") == "tanh":
            act_name = "gelu_tanh"
        out[name] = {
            "state": {k: list(v.shape) for k, v in model.state_dict().items()},
            "eps": sorted({m.eps for m in norms}),
            "norms": sorted({type(m).__name__.lower() for m in norms}),
            "act": act_name,
            "img_size": list(model.patch_embed.img_size),
            "num_prefix_tokens": model.num_prefix_tokens,
        }
    with open(a.out, "w") as f:
        json.dump(out, f)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("snapshot")
    p.add_argument("out")
    p.add_argument("--arch", required=True)
    p.add_argument("--args", default="{}")
    p.add_argument("--sizes", required=True)
    p.add_argument("--resample")
    p.add_argument("--ref", required=True)
    p.set_defaults(run=snapshot)
    p = sub.add_parser("dynamic")
    p.add_argument("out")
    p.add_argument("--arch", required=True)
    p.add_argument("--args", default="{}")
    p.add_argument("--sizes", required=True)
    p.set_defaults(run=dynamic)
    p = sub.add_parser("dinov3-hf")
    p.add_argument("out")
    p.add_argument("--args", default="{}")
    p.add_argument("--sizes", required=True)
    p.add_argument("--ref", required=True)
    p.set_defaults(run=dinov3_hf)
    p = sub.add_parser("shapes")
    p.add_argument("names")
    p.add_argument("--out", required=True)
    p.set_defaults(run=shapes)
    args = parser.parse_args()
    torch.set_num_threads(2)
    args.run(args)


if __name__ == "__main__":
    main()
