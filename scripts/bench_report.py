"""What the Python sides of scripts/bench.sh share: the percentile `vit bench` uses, and printing a result the way
`vit bench` prints it (one JSON object with --json, else one aligned key-value line per field). No torch import, so
the onnxruntime side's process holds no second thread pool."""
import json
import math


def percentile(values, q):
    """The nearest-rank q-th percentile of values, as `vit bench` computes it."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100.0 * len(ordered)) - 1))]


def print_result(result, as_json):
    if as_json:
        print(json.dumps(result))
        return
    for key, value in result.items():
        print(f"{key:22s} {value:.4g}" if isinstance(value, float) else f"{key:22s} {value}")
