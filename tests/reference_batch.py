#!/usr/bin/env python3
"""Runs a round of the suite's reference requests in this one process (tests/reference_run.sh starts it).

  reference_batch.py ROOT REQUESTS.jsonl --reference PYTHON --reference-missing REASON

Imports the reference libraries once, writes ROOT/modules.json (which of them import here, and why not), then runs
each request of REQUESTS.jsonl in order: the test script (tests/reference_*.py, chromium_check.py, ...) as __main__
with the request's arguments, the global seeds as a fresh interpreter has them. Each request's result goes to
ROOT/results/ID.json: exit status, stdout, stderr, seconds, and the files the script wrote in the test's temporary
folders (which the C++ case copies into its own folders when it replays the call; tests/test_util.cpp).
"""
import argparse
import contextlib
import io
import json
import os
import random
import runpy
import shlex
import sys
import time
import traceback

# Every module a test may name in SKIP_WITHOUT_PYTHON or reference_python(); probed once here.
MODULES = ["numpy", "PIL", "safetensors", "torch", "timm", "transformers", "onnx", "onnxruntime"]
TESTS = os.path.dirname(os.path.abspath(__file__))


def probe(reference, missing):
    found = {}
    for name in MODULES:
        try:
            __import__(name)
            found[name] = ""
        except Exception as error:  # the reason a test prints when it skips
            found[name] = f"{type(error).__name__}: {error}"
    return {"python": sys.executable, "reference": reference, "reference_missing": missing, "modules": found}


def files_under(folders):
    # (relative name -> (size, mtime)) of every file below each folder, keyed "tmpN/relative/path".
    seen = {}
    for key, folder in folders.items():
        for parent, _, names in os.walk(folder):
            for name in names:
                path = os.path.join(parent, name)
                stat = os.stat(path)
                seen[key + "/" + os.path.relpath(path, folder)] = (stat.st_size, stat.st_mtime_ns)
    return seen


def run(request, torch):
    argv = shlex.split(request["args"])
    script = os.path.join(TESTS, request["script"])
    before = files_under(request["dirs"])
    out, err = io.StringIO(), io.StringIO()
    status = 0
    start = time.monotonic()
    # A fresh interpreter's global random state, so that each script sees what it saw when it ran alone.
    random.seed(0)
    if torch is not None:
        torch.manual_seed(torch_seed)
    old_argv = sys.argv
    sys.argv = [script] + argv
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            runpy.run_path(script, run_name="__main__")
    except SystemExit as exit:
        if exit.code not in (None, 0):
            status = exit.code if isinstance(exit.code, int) else 1
            if not isinstance(exit.code, int):
                err.write(str(exit.code) + "\n")
    except BaseException:
        status = 1
        err.write(traceback.format_exc())
    finally:
        sys.argv = old_argv
    after = files_under(request["dirs"])
    written = sorted(k for k, v in after.items() if before.get(k) != v)
    return {"id": request["id"], "test": request["test"], "call": request["call"], "script": request["script"],
            "args": request["args"], "dirs": request["dirs"], "inputs": request["inputs"], "status": status,
            "stdout": out.getvalue(), "stderr": err.getvalue(), "seconds": time.monotonic() - start,
            "outputs": written}


def main():
    global torch_seed
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("root")
    parser.add_argument("requests")
    parser.add_argument("--reference", required=True)
    parser.add_argument("--reference-missing", default="")
    a = parser.parse_args()
    sys.path.insert(0, TESTS)  # the scripts import each other (reference_explain uses reference_embed)
    start = time.monotonic()
    modules = probe(a.reference, a.reference_missing)
    with open(os.path.join(a.root, "modules.json"), "w") as f:
        json.dump(modules, f, indent=1)
    torch = sys.modules.get("torch")
    torch_seed = torch.initial_seed() if torch is not None else 0
    print(f"imports: {time.monotonic() - start:.1f} s", flush=True)
    os.makedirs(os.path.join(a.root, "results"), exist_ok=True)
    with open(a.requests) as f:
        requests = [json.loads(line) for line in f if line.strip()]
    failed = 0
    for request in requests:
        result = run(request, torch)
        failed += result["status"] != 0
        path = os.path.join(a.root, "results", request["id"] + ".json")
        with open(path + ".tmp", "w") as f:
            json.dump(result, f, indent=1)
        os.replace(path + ".tmp", path)
        print(f"{result['seconds']:6.2f} s  status {result['status']}  {request['test']} #{request['call']}: "
              f"{request['script']}", flush=True)
    print(f"{len(requests)} requests, {failed} failed, {time.monotonic() - start:.1f} s in all")


if __name__ == "__main__":
    main()
