#!/usr/bin/env python3
"""Serves a timm classifier over HTTP the way a Python user writes it, the other side of scripts/bench_serve.py's
`vit serve`.

    .venv/bin/python scripts/serve_timm.py --arch vit_tiny_patch16_224 --weights W.safetensors
        [--threads N] [--host 127.0.0.1] [--port 8000]

FastAPI on uvicorn, one process and one worker. timm.create_model with a plain timm-named safetensors file (strict
load), timm's own eval transform (resolve_data_config + create_transform), eval() and inference_mode. Each request
is decoded with PIL and run through the model alone (batch 1, no batching across requests) in Starlette's thread pool,
so the event loop keeps accepting while a forward runs; concurrent requests run concurrently on PyTorch's threads.

    POST /v1/classify?topk=5   body: one image (Content-Type: image/jpeg)
        -> [{"image": "body", "topk": [{"index": i, "label": "i", "prob": p}, ...]}]   (vit serve's shape)
    GET /readyz                -> 200 once the model is loaded

uvicorn's access log is off (one line per request would only slow this side down).
"""
import argparse
import io
import os

import timm
import torch
import uvicorn
from fastapi import FastAPI, HTTPException, Query, Request
from PIL import Image, UnidentifiedImageError
from safetensors.torch import load_file
from starlette.concurrency import run_in_threadpool
from timm.data import create_transform, resolve_data_config


def load_model(arch, weights):
    model = timm.create_model(arch, pretrained=False, num_classes=1000)
    model.load_state_dict(load_file(weights), strict=True)
    model.eval()
    return model, create_transform(**resolve_data_config({}, model=model))


def create_app(model, transform):
    app = FastAPI()

    @torch.inference_mode()  # per thread: it must wrap what runs in the pool's thread, not the endpoint
    def classify_one(body, topk):
        try:
            with Image.open(io.BytesIO(body)) as image:
                pixels = transform(image.convert("RGB")).unsqueeze(0)  # (1, 3, H, W)
        except (UnidentifiedImageError, OSError) as error:
            raise HTTPException(status_code=400, detail=f"cannot decode the body as an image: {error}")
        probs, indices = model(pixels).softmax(-1)[0].topk(min(topk, model.num_classes))
        return [{"image": "body",
                 "topk": [{"index": i, "label": str(i), "prob": p} for i, p in zip(indices.tolist(), probs.tolist())]}]

    @app.post("/v1/classify")
    async def classify(request: Request, topk: int = Query(5, ge=1)):
        body = await request.body()
        return await run_in_threadpool(classify_one, body, topk)

    @app.get("/readyz")
    def readyz():
        return {"status": "ready"}

    return app


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", required=True, help="timm model name, e.g. vit_tiny_patch16_224")
    parser.add_argument("--weights", required=True, help="plain timm-named safetensors file")
    parser.add_argument("--threads", type=int, default=0, help="PyTorch intra-op threads, 0 = all cores")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    torch.set_num_threads(args.threads or os.cpu_count())
    model, transform = load_model(args.arch, args.weights)
    uvicorn.run(create_app(model, transform), host=args.host, port=args.port, workers=1, access_log=False,
                log_level="warning")


if __name__ == "__main__":
    main()
