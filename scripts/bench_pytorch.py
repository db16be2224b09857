#!/usr/bin/env python3
"""The reference for `vit bench`: the same ViT and training step written timm's way in PyTorch 2.x (fused qkv Linear,
F.scaled_dot_product_attention as timm's fused_attn path, torch.optim.AdamW with timm's two parameter groups, fused
where this PyTorch has a fused CPU kernel, gradient clipping), eager or through torch.compile, timed the same way on
the same synthetic inputs. Reads the model section of the same JSON config (preset + overrides).

    .venv/bin/python scripts/bench_pytorch.py --config CFG [--mode train|infer|both] [--batch-size N]
        [--steps S] [--warmup W] [--threads N] [--compile] [--amp bf16] [--json]

--amp bf16 runs the forward passes (and so their backward) under torch.autocast("cpu", torch.bfloat16), as timm's
train.py --amp --amp-dtype bfloat16 does on the CPU: linear layers and the patch convolution in bfloat16.

--compile wraps the model in torch.compile (default mode); as timm's train.py --torchcompile, the loss and the
optimizer stay eager. The warmup calls absorb the compilation; "compile_s" is the time of the first calls.
scripts/bench_predict.py (and through it scripts/bench.sh) imports PRESETS, DEFAULTS and VisionTransformer from
here to write model files with random weights under timm's names.
"""
import argparse
import json
import resource
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from bench_report import percentile, print_result

PRESETS = {
    "vit_tiny_patch16_224": dict(embed_dim=192, depth=12, num_heads=3),
    "vit_small_patch16_224": dict(embed_dim=384, depth=12, num_heads=6),
    "vit_base_patch16_224": dict(embed_dim=768, depth=12, num_heads=12),
    "vit_large_patch16_224": dict(embed_dim=1024, depth=24, num_heads=16),
}
DEFAULTS = dict(img_size=224, patch_size=16, in_chans=3, num_classes=1000, embed_dim=768, depth=12, num_heads=12,
                mlp_ratio=4.0, qkv_bias=True, class_token=True, global_pool="token", layer_norm_eps=1e-6)
# Keys that do not change the cost of a step (dropout rates are 0 in the benchmarks) or are not modelled here.
IGNORED = {"drop_rate", "pos_drop_rate", "attn_drop_rate", "proj_drop_rate", "drop_path_rate"}


def model_args(path):
    with open(path) as f:
        section = json.load(f).get("model", {})
    args = dict(DEFAULTS)
    if "preset" in section:
        args.update(PRESETS[section["preset"]])
    for key, value in section.items():
        if key == "preset" or key in IGNORED:
            continue
        if key in ("init_values", "rel_pos_bias") and not value:
            continue
        if key not in DEFAULTS:
            sys.exit(f"{path}: model.{key} is not modelled by this reference")
        args[key] = value
    size = args.pop("img_size")
    args["img_h"], args["img_w"] = (size, size) if isinstance(size, int) else size
    return args


class Attention(nn.Module):
    def __init__(self, dim, num_heads, qkv_bias):
        super().__init__()
        self.num_heads = num_heads
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, C // self.num_heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)  # (B, nh, N, hd)
        x = F.scaled_dot_product_attention(q, k, v)  # (B, nh, N, hd), scaled by hd ** -0.5
        x = x.transpose(1, 2).reshape(B, N, C)
        return self.proj(x)


class Mlp(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, dim, num_heads, mlp_ratio, qkv_bias, eps):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=eps)
        self.attn = Attention(dim, num_heads, qkv_bias)
        self.norm2 = nn.LayerNorm(dim, eps=eps)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class VisionTransformer(nn.Module):
    def __init__(self, img_h, img_w, patch_size, in_chans, num_classes, embed_dim, depth, num_heads, mlp_ratio,
                 qkv_bias, class_token, global_pool, layer_norm_eps):
        super().__init__()
        self.global_pool = global_pool
        self.patch_embed = nn.Conv2d(in_chans, embed_dim, patch_size, stride=patch_size)
        patches = (img_h // patch_size) * (img_w // patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim)) if class_token else None
        self.pos_embed = nn.Parameter(torch.randn(1, patches + (1 if class_token else 0), embed_dim) * 0.02)
        self.blocks = nn.Sequential(*[Block(embed_dim, num_heads, mlp_ratio, qkv_bias, layer_norm_eps)
                                      for _ in range(depth)])
        self.norm = nn.LayerNorm(embed_dim, eps=layer_norm_eps)
        self.head = nn.Linear(embed_dim, num_classes) if num_classes > 0 else nn.Identity()

    def forward(self, x):
        x = self.patch_embed(x).flatten(2).transpose(1, 2)  # (B, N, D)
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        x = self.blocks(x + self.pos_embed)
        x = self.norm(x)
        prefix = 0 if self.cls_token is None else 1  # timm: the patch tokens after num_prefix_tokens
        x = x[:, prefix:].mean(1) if self.global_pool == "avg" else x[:, 0]
        return self.head(x)



def timed(fn, warmup, steps):
    """Seconds of each timed call, and of the first warmup call (where torch.compile compiles)."""
    first = 0.0
    for i in range(warmup):
        start = time.perf_counter()
        fn()
        if i == 0:
            first = time.perf_counter() - start
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times, first


def adamw(model):
    """torch.optim.AdamW with timm's two parameter groups (no weight decay on biases, norms, pos_embed, cls_token),
    fused where this PyTorch has a fused kernel for the parameters' device, else the multi-tensor (foreach) path."""
    decay = [p for n, p in model.named_parameters() if p.ndim > 1 and n not in ("pos_embed", "cls_token")]
    no_decay = [p for n, p in model.named_parameters() if not (p.ndim > 1 and n not in ("pos_embed", "cls_token"))]
    groups = [{"params": decay, "weight_decay": 0.05}, {"params": no_decay, "weight_decay": 0.0}]
    try:
        return torch.optim.AdamW(groups, lr=1e-4, fused=True), "fused"
    except RuntimeError:  # "`fused=True` requires all the params to be floating point Tensors of supported devices"
        return torch.optim.AdamW(groups, lr=1e-4, foreach=True), "foreach"


def sgemm_peak(seconds=0.5, n=1024):
    a, b = torch.randn(n, n), torch.randn(n, n)
    out = torch.empty(n, n)
    torch.mm(a, b, out=out)
    best, start = float("inf"), time.perf_counter()
    while time.perf_counter() - start < seconds:
        t = time.perf_counter()
        torch.mm(a, b, out=out)
        best = min(best, time.perf_counter() - t)
    return 2.0 * n ** 3 / best / 1e9


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--mode", choices=["train", "infer", "both"], default="both")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--compile", action="store_true", help="torch.compile the model (default mode)")
    parser.add_argument("--amp", choices=["off", "bf16"], default="off", help="CPU autocast to bfloat16")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if int(torch.__version__.split(".")[0]) < 2:
        sys.exit(f"{sys.executable} has PyTorch {torch.__version__}; this reference needs PyTorch 2.x "
                 "(run it with the project's .venv/bin/python: VIT_SETUP_TEST_EXTRAS=1 scripts/setup.sh)")
    if args.compile and args.warmup < 1:
        sys.exit("--compile needs --warmup >= 1: the first call compiles and must not be timed")

    threads = args.threads or torch.get_num_threads()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    margs = model_args(args.config)
    model = VisionTransformer(**margs)
    forward = torch.compile(model) if args.compile else model
    # Forward MACs of the matmuls and the patch convolution, counted as vit's flops.cpp counts them.
    D, P, L = margs["embed_dim"], margs["patch_size"], margs["depth"]
    patches = (margs["img_h"] // P) * (margs["img_w"] // P)
    N = patches + (1 if margs["class_token"] else 0)
    hidden = int(D * margs["mlp_ratio"])
    macs = patches * margs["in_chans"] * P * P * D + L * (N * D * 3 * D + 2 * N * N * D + N * D * D + 2 * N * D * hidden)
    macs += D * margs["num_classes"]
    peak = sgemm_peak()
    B = args.batch_size
    result = {"framework": "pytorch " + torch.__version__, "compile": args.compile, "threads": threads,
              "batch_size": B, "gmacs": macs / 1e9, "peak_gflops": peak, "amp": args.amp}
    autocast = lambda: torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.amp == "bf16")
    first_calls = []

    if args.mode in ("train", "both"):
        optimizer, result["adamw"] = adamw(model)
        images = torch.randn(B, margs["in_chans"], margs["img_h"], margs["img_w"])
        labels = torch.randint(0, max(1, margs["num_classes"]), (B,))
        model.train()

        def step():
            optimizer.zero_grad(set_to_none=True)
            with autocast():
                loss = F.cross_entropy(forward(images), labels, label_smoothing=0.1)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            loss.item()

        times, first = timed(step, args.warmup, args.steps)
        first_calls.append(first)
        result.update(img_per_s=B * len(times) / sum(times), step_ms_p50=percentile(times, 50) * 1e3,
                      step_ms_p95=percentile(times, 95) * 1e3)
        result["gflops"] = 6.0 * macs * result["img_per_s"] / 1e9

    if args.mode in ("infer", "both"):
        model.eval()
        with torch.inference_mode(), autocast():
            one = torch.randn(1, margs["in_chans"], margs["img_h"], margs["img_w"])
            batch = torch.randn(B, margs["in_chans"], margs["img_h"], margs["img_w"])
            times, first = timed(lambda: forward(one), args.warmup, args.steps)
            first_calls.append(first)
            result.update(latency_ms_p50=percentile(times, 50) * 1e3, latency_ms_p95=percentile(times, 95) * 1e3)
            times, first = timed(lambda: forward(batch), args.warmup, args.steps)
            first_calls.append(first)
            result.update(batch_latency_ms_p50=percentile(times, 50) * 1e3,
                          batch_latency_ms_p95=percentile(times, 95) * 1e3,
                          infer_img_per_s=B * len(times) / sum(times))
        if "gflops" not in result:
            result["img_per_s"] = result["infer_img_per_s"]
            result["gflops"] = 2.0 * macs * result["infer_img_per_s"] / 1e9

    if args.compile:
        result["compile_s"] = sum(first_calls)  # each phase's first call: train, eval and a new shape recompile
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    result["peak_fraction"] = result["gflops"] / peak
    print_result(result, args.json)


if __name__ == "__main__":
    main()
