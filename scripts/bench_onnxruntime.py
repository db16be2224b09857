#!/usr/bin/env python3
"""The onnxruntime side of scripts/bench.sh: forward latency of an ONNX file (our `vit export --format onnx`) on
onnxruntime's CPU provider, with the thread settings `vit bench` uses (N intra-op threads, one inter-op, sequential),
every graph optimisation on, random inputs of the model's own input shape; prints the same keys `vit bench` does.

    .venv/bin/python scripts/bench_onnxruntime.py --model MODEL.onnx [--batch-size N] [--steps S] [--warmup W]
        [--threads N] [--json]
"""
import argparse
import resource
import sys
import time

import numpy as np
import onnxruntime as ort

from bench_report import percentile, print_result



def session(path, threads):
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads  # 0: onnxruntime's default, one per physical core
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def input_batch(model_input, batch_size):
    """Random float32 images shaped as the model's input, its (dynamic) batch dimension set to batch_size."""
    shape = list(model_input.shape)
    if any(not isinstance(d, int) for d in shape[1:]):
        sys.exit(f"input {model_input.name} has shape {shape}: only the batch dimension may be dynamic")
    if isinstance(shape[0], int) and shape[0] != batch_size:
        sys.exit(f"input {model_input.name} has a fixed batch of {shape[0]}, not --batch-size {batch_size}")
    if model_input.type != "tensor(float)":
        sys.exit(f"input {model_input.name} is {model_input.type}; this benchmark feeds tensor(float)")
    shape[0] = batch_size
    return np.random.default_rng(0).standard_normal(shape, dtype=np.float32)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="ONNX file")
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    start = time.perf_counter()
    runner = session(args.model, args.threads)
    load_s = time.perf_counter() - start
    model_input = runner.get_inputs()[0]
    feed = {model_input.name: input_batch(model_input, args.batch_size)}
    for _ in range(args.warmup):
        runner.run(None, feed)
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        runner.run(None, feed)
        times.append(time.perf_counter() - start)

    result = {"framework": "onnxruntime " + ort.__version__, "providers": runner.get_providers(),
              "threads": args.threads, "batch_size": args.batch_size, "input": model_input.name,
              "session_load_s": load_s, "latency_ms_p50": percentile(times, 50) * 1e3,
              "latency_ms_p95": percentile(times, 95) * 1e3,
              "img_per_s": args.batch_size * len(times) / sum(times),
              "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0}
    print_result(result, args.json)


if __name__ == "__main__":
    main()
