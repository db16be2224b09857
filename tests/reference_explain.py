#!/usr/bin/env python3
"""References for `vit export-attention --method ...` (tests/test_explain.cpp), written from the papers' code.

  maps WEIGHTS --model JSON --preprocess JSON --images A.png,B.png --class K --start-layer S --ref FILE
      timm's VisionTransformer(**MODEL) with the tensors of WEIGHTS (strict), each image through timm's eval
      transform. The attention probabilities are caught where timm's Attention applies attn_drop (fused attention
      off), with their gradients from backward() of the class logit (K, or the arg-max when K < 0). Per image stem,
      --ref (safetensors) holds "<stem>/<key>" (grid_h, grid_w) float32 for key in raw, rollout, grad_rollout,
      attribution, gradcam, and "<stem>/class" (the explained class).

      The readout r is the row the head reads: the class token for global_pool "token", the mean of the patch
      rows for "avg" (timm's pool leaves the prefix tokens out). Every map is r @ M over the patches, / max:
        raw          M = mean over heads of the last block's attention
        rollout      M = prod over blocks (later on the left) of rownorm(mean_h A + I)          (Abnar & Zuidema)
        grad_rollout M = prod over blocks of rownorm(mean_h(A * relu(G)) + I)         (jacobgil's grad_rollout)
        attribution  R = I; R = R + mean_h(relu(G * A)) @ R for blocks >= S   (Chefer et al., ICCV 2021, generic)
        gradcam      last block: w_h = mean over patches of (r @ G_h); relu(mean_h w_h (r @ A_h))   (Chefer's
                     baseline "generate_cam_attn")
"""
import argparse

import torch
from PIL import Image
from safetensors.torch import save_file

from reference_embed import timm_model


class Catch(torch.nn.Module):
    """Stands in for attn_drop (identity in eval): keeps the probabilities and their gradient."""

    def __init__(self):
        super().__init__()
        self.attention = None

    def forward(self, attn):
        attn.retain_grad()
        self.attention = attn
        return attn


def normalise(m):
    peak = m.max()
    return m / peak if peak > 0 else torch.zeros_like(m)


def maps(a):
    model, transform = timm_model(a.weights, a.model, a.preprocess)  # as the embed references load it
    catches = []
    for block in model.blocks:
        block.attn.fused_attn = False
        block.attn.attn_drop = Catch()
        catches.append(block.attn.attn_drop)
    grid = model.patch_embed.grid_size
    p = model.num_prefix_tokens
    out = {}
    for path in a.images.split(","):
        stem = path.rsplit("/", 1)[-1].rsplit(".", 1)[0]
        x = transform(Image.open(path).convert("RGB")).unsqueeze(0)
        model.zero_grad()
        logits = model(x)
        k = a.cls if a.cls >= 0 else int(logits.argmax(-1))
        logits[0, k].backward()
        A = [c.attention[0].detach().double() for c in catches]       # (nh, N, N)
        G = [c.attention.grad[0].detach().double() for c in catches]  # (nh, N, N)
        n = A[0].shape[-1]
        r = torch.zeros(n, dtype=torch.float64)
        if model.global_pool == "token":
            r[0] = 1.0
        else:
            r[p:] = 1.0 / (n - p)
        eye = torch.eye(n, dtype=torch.float64)

        def to_map(m):
            return normalise((r @ m)[p:].reshape(grid)).float()

        def rownorm(m):
            m = m + eye
            return m / m.sum(-1, keepdim=True)

        out[f"{stem}/raw"] = to_map(A[-1].mean(0))
        rollout, grad_rollout = eye.clone(), eye.clone()
        for attn, grad in zip(A, G):
            rollout = rownorm(attn.mean(0)) @ rollout
            grad_rollout = rownorm((attn * grad.clamp(min=0)).mean(0)) @ grad_rollout
        out[f"{stem}/rollout"] = to_map(rollout)
        out[f"{stem}/grad_rollout"] = to_map(grad_rollout)
        relevance = eye.clone()
        for attn, grad in list(zip(A, G))[a.start_layer:]:
            cam = (grad * attn).clamp(min=0).mean(0)
            relevance = relevance + cam @ relevance
        out[f"{stem}/attribution"] = to_map(relevance)
        rows = torch.einsum("n,hnm->hm", r, A[-1])[:, p:]
        weights = torch.einsum("n,hnm->hm", r, G[-1])[:, p:].mean(-1, keepdim=True)
        out[f"{stem}/gradcam"] = normalise((weights * rows).mean(0).clamp(min=0).reshape(grid)).float()
        out[f"{stem}/class"] = torch.tensor([k], dtype=torch.int64)
    save_file({k: v.contiguous() for k, v in out.items()}, a.ref)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("maps")
    p.add_argument("weights")
    p.add_argument("--model", required=True)
    p.add_argument("--preprocess", required=True)
    p.add_argument("--images", required=True)
    p.add_argument("--class", dest="cls", type=int, default=-1)
    p.add_argument("--start-layer", type=int, default=0)
    p.add_argument("--ref", required=True)
    p.set_defaults(run=maps)
    a = parser.parse_args()
    a.run(a)


if __name__ == "__main__":
    main()
