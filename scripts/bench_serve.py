#!/usr/bin/env python3
"""HTTP classification under load: `vit serve` (dynamic batching) against FastAPI + uvicorn + timm, as a user sees it.

    .venv/bin/python scripts/bench_serve.py --vit build/vit [--threads N] [--repeats 3] [--duration 30] [--quick]

Writes a ViT-Ti/16 model file with random weights under timm's names (bench_predict.py's save_timm_file), a config
naming its preset with timm's eval preprocessing for it (so both sides resize, crop and normalise alike), and 16
photo-sized JPEGs (500x375, bench_predict.py's write_jpegs). Then, for each side in turn, R times: starts the server on
a free port (`vit serve --checkpoint F --config C --threads N`, its batching at the defaults; scripts/serve_timm.py:
one uvicorn worker, one image per forward in Starlette's thread pool), waits for GET /readyz, checks one answer, and
drives POST /v1/classify?topk=5 with wrk (one JPEG per request, the 16 in rotation) at 1, 8 and 64 connections for S
seconds each; then SIGTERM, and `vit serve` must exit 0. wrk is closed-loop: each connection sends its next request
when the answer comes, so img/s is what the server sustains at that concurrency (successful answers / duration);
p50 and p99 are wrk's per-request latencies; errors are socket errors of every kind plus non-2xx/3xx answers.
In the same rounds: `vit predict` over a folder of ~400 of the JPEGs at batch 32 (img/s = (files - 1) / (its wall
time - a one-image run's), which removes start-up and model load) and `vit bench --mode infer` at batch 1 (forward
latency p50). The c1 reference "one image's decode + forward" is that forward p50 plus vit serve's mean decode time
during its c1 run (its GET /metrics histogram vit_decode_seconds, _sum / _count).
Prints medians over the repeats (errors: summed), the ratios and whether the goals are met. wrk runs on the same
cores as the servers (threads: 1 at c1, else 2), as on a one-machine deployment behind a proxy.
"""
import argparse
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

PRESET = "vit_tiny_patch16_224"
CONCURRENCY = (1, 8, 64)
JPEGS = 16
SIDES = ("vit", "fastapi")
SETUP_HINT = "VIT_SETUP_BENCH_EXTRAS=1 scripts/setup.sh"
SCRIPTS = os.path.dirname(os.path.abspath(__file__))

# Each wrk thread reads the JPEGs named after `--` and posts them in turn; done() prints the exact counts and
# percentiles (microseconds) as one JSON line, rather than the rounded text of --latency.
WRK_SCRIPT = r"""
local bodies, next_body = {}, 1
function init(args)
  for i, path in ipairs(args) do
    local f = assert(io.open(path, "rb"))
    bodies[i] = f:read("*a")
    f:close()
  end
end
function request()
  local body = bodies[next_body]
  next_body = next_body % #bodies + 1
  return wrk.format("POST", nil, {["Content-Type"] = "image/jpeg"}, body)
end
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format('BENCH_SERVE {"requests": %d, "duration_us": %d, "connect": %d, "read": %d, "write": %d, '
    .. '"status": %d, "timeout": %d, "p50_us": %d, "p99_us": %d}\n', summary.requests, summary.duration, e.connect,
    e.read, e.write, e.status, e.timeout, latency:percentile(50), latency:percentile(99)))
end
"""


def check_tools():
    """One line naming what to install, before any work."""
    if shutil.which("wrk") is None:
        sys.exit(f"bench_serve: wrk is not installed (run {SETUP_HINT})")
    missing = []
    for module in ("fastapi", "uvicorn", "timm", "torch", "safetensors", "PIL", "numpy"):
        try:
            __import__(module)
        except ImportError:
            missing.append(module)
    if missing:
        sys.exit(f"bench_serve: {sys.executable} cannot import {', '.join(missing)} (run {SETUP_HINT})")


def prepare(work, predict_files):
    """The model file, its config, the JPEGs and the folder for `vit predict` (the JPEGs repeated, hard-linked)."""
    import timm
    from timm.data import resolve_data_config
    sys.path.insert(0, SCRIPTS)
    from bench_predict import save_timm_file, write_jpegs

    model, config = f"{work}/{PRESET}.safetensors", f"{work}/{PRESET}.json"
    save_timm_file(model, PRESET)
    timm_data = resolve_data_config({}, model=timm.create_model(PRESET, pretrained=False))
    with open(config, "w") as f:
        json.dump({"model": {"preset": PRESET},
                   "data": {"mean": list(timm_data["mean"]), "std": list(timm_data["std"]),
                            "interpolation": timm_data["interpolation"], "crop_pct": timm_data["crop_pct"]}}, f)
    write_jpegs(f"{work}/images", JPEGS)
    jpegs = sorted(f"{work}/images/{name}" for name in os.listdir(f"{work}/images"))
    os.makedirs(f"{work}/folder")
    for i in range(predict_files):
        os.link(jpegs[i % len(jpegs)], f"{work}/folder/img_{i:04d}.jpg")
    return model, config, jpegs


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(url, body=None, timeout=30):
    """(status, text) of a GET, or of a POST of a JPEG body."""
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "image/jpeg"} if body else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return answer.status, answer.read().decode(errors="replace")
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode(errors="replace")


class Server:
    """A server subprocess on a free port: started, ready (GET /readyz 200 within 120 s), stopped with SIGTERM."""

    def __init__(self, name, command, log):
        self.name, self.log = name, log
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        with open(log, "w") as out:
            self.process = subprocess.Popen(command + ["--port", str(self.port)], stdout=out, stderr=subprocess.STDOUT)

    def fail(self, why):
        self.process.kill()
        self.process.wait()
        with open(self.log) as f:
            tail = "".join(f.readlines()[-20:])
        sys.exit(f"bench_serve: {self.name}: {why}\n{' '.join(self.process.args)}\n{tail}")

    def wait_ready(self, timeout=120):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.fail(f"exited with {self.process.returncode} before it was ready")
            try:
                if http(f"{self.url}/readyz", timeout=2)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        self.fail(f"GET /readyz did not answer 200 within {timeout} s")

    def check_answer(self, jpeg):
        """One POST, answered in vit serve's shape; also the first, cold request, kept out of the timings."""
        with open(jpeg, "rb") as f:
            status, text = http(f"{self.url}/v1/classify?topk=5", f.read())
        try:
            entry = json.loads(text)[0]
            good = status == 200 and len(entry["topk"]) == 5 and all({"index", "prob"} <= set(t) for t in entry["topk"])
        except (ValueError, LookupError, TypeError):
            good = False
        if not good:
            self.fail(f"POST /v1/classify?topk=5 answered {status}, not a list with one entry of 5 classes: {text[:300]}")

    def stop(self):
        """Exit code after SIGTERM (killed after 60 s: then the code is negative)."""
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()


def run_wrk(url, lua, jpegs, concurrency, duration, log):
    command = ["wrk", f"-t{min(concurrency, 2)}", f"-c{concurrency}", f"-d{duration}s", "--latency", "--timeout", "30s",
               "-s", lua, f"{url}/v1/classify?topk=5", "--"] + jpegs
    out = subprocess.run(command, capture_output=True, text=True)
    with open(log, "a") as f:
        f.write(f"$ {' '.join(command[:9])} ...\n{out.stdout}{out.stderr}\n")
    line = next((line for line in out.stdout.splitlines() if line.startswith("BENCH_SERVE ")), None)
    if out.returncode != 0 or line is None:
        sys.exit(f"bench_serve: wrk failed ({out.returncode}):\n{out.stdout}{out.stderr}")
    r = json.loads(line.split(" ", 1)[1])
    return {"img_per_s": (r["requests"] - r["status"]) / (r["duration_us"] / 1e6),
            "p50_ms": r["p50_us"] / 1e3, "p99_ms": r["p99_us"] / 1e3,
            "errors": r["connect"] + r["read"] + r["write"] + r["timeout"] + r["status"]}


def histogram(text, name):
    """(_sum, _count) of a Prometheus histogram, summed over its label sets; None where absent."""
    totals = {}
    for line in text.splitlines():
        match = re.match(rf"{name}_(sum|count)(?:\{{[^}}]*\}})?\s+(\S+)", line)
        if match:
            totals[match[1]] = totals.get(match[1], 0.0) + float(match[2])
    return (totals["sum"], totals["count"]) if {"sum", "count"} <= set(totals) else None


def metrics(url):
    try:
        status, text = http(f"{url}/metrics", timeout=10)
    except OSError:
        return None
    return histogram(text, "vit_decode_seconds") if status == 200 else None


def measure_server(name, command, jpegs, lua, duration, log):
    """One server's run: {concurrency: wrk result}, its exit code, vit's mean decode ms over the c1 run (or None)."""
    server = Server(name, command, log)
    try:
        server.wait_ready()
        server.check_answer(jpegs[0])
        results, decode_ms = {}, None
        for concurrency in CONCURRENCY:
            print(f"[serve] {name} c{concurrency} {duration} s", file=sys.stderr)
            before = metrics(server.url) if concurrency == 1 and name == "vit" else None
            results[concurrency] = run_wrk(server.url, lua, jpegs, concurrency, duration, log)
            after = metrics(server.url) if before else None
            if after and after[1] > before[1]:
                decode_ms = 1e3 * (after[0] - before[0]) / (after[1] - before[1])
    except BaseException:
        server.process.kill()
        raise
    return results, server.stop(), decode_ms


def wall(command):
    """Wall seconds of one process, its output discarded; a failure stops the benchmark with its errors."""
    start = time.perf_counter()
    out = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if out.returncode != 0:
        sys.exit(f"bench_serve: {' '.join(command)} failed ({out.returncode}):\n{out.stderr}")
    return time.perf_counter() - start


def forward_ms(vit, model_args, threads, quick):
    steps, warmup = (10, 2) if quick else (40, 5)
    out = subprocess.run([vit, "bench", *model_args, "--mode", "infer", "--device", "cpu", "--threads", str(threads),
                          "--batch-size", "1", "--steps", str(steps), "--warmup", str(warmup), "--json"],
                         capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"bench_serve: vit bench failed ({out.returncode}):\n{out.stderr}")
    return json.loads(out.stdout)["latency_ms_p50"]


def version(command):
    try:
        out = subprocess.run(command, capture_output=True, text=True)
        return (out.stdout + out.stderr).strip().splitlines()[0]
    except (OSError, IndexError):
        return "?"


def report(runs, predict_runs, forward_runs, args, loads):
    import fastapi, timm, torch, uvicorn

    cpu = open("/proc/cpuinfo").read().split("model name")[1].split(":")[1].splitlines()[0].strip()
    print(f"\nCPU: {cpu}, {os.cpu_count()} cores; {args.threads} threads per server; {args.duration} s per "
          f"concurrency; medians of {args.repeats} alternating runs (errors: all runs)")
    print(f"vit: {version([args.vit, '--version'])}; FastAPI {fastapi.__version__}, uvicorn {uvicorn.__version__}, "
          f"timm {timm.__version__}, torch {torch.__version__}; {version(['wrk', '-v'])}\n")
    print("| concurrency | vit img/s | p50 ms | p99 ms | errors | FastAPI+timm img/s | p50 ms | p99 ms | errors "
          "| vit / FastAPI img/s |")
    print("|---" * 10 + "|")
    table = {}
    for c in CONCURRENCY:
        for side in SIDES:
            mine = [results[c] for s, results, _, _ in runs if s == side]
            table[side, c] = {key: statistics.median(r[key] for r in mine) for key in ("img_per_s", "p50_ms", "p99_ms")}
            table[side, c]["errors"] = sum(r["errors"] for r in mine)
        cells = " | ".join(f"{table[s, c]['img_per_s']:.1f} | {table[s, c]['p50_ms']:.1f} | {table[s, c]['p99_ms']:.1f} "
                           f"| {table[s, c]['errors']}" for s in SIDES)
        print(f"| {c} | {cells} | {table['vit', c]['img_per_s'] / table['fastapi', c]['img_per_s']:.2f}x |")

    top = CONCURRENCY[-1]
    # Each round's c64 pair (the runs alternate vit, FastAPI): the ratio's spread, not only the medians'.
    per_run = {side: [results[top]["img_per_s"] for s, results, _, _ in runs if s == side] for side in SIDES}
    pairs = "; ".join(f"{v:.1f} / {f:.1f} = {v / f:.2f}x" for v, f in zip(per_run["vit"], per_run["fastapi"]))
    print(f"\nc{top} img/s by round, vit / FastAPI+timm: {pairs}")
    walls_folder = statistics.median(r[0] for r in predict_runs)
    walls_one = statistics.median(r[1] for r in predict_runs)
    predict = (args.predict_files - 1) / (walls_folder - walls_one)
    serve_over_predict = table["vit", top]["img_per_s"] / predict
    forward = statistics.median(forward_runs)
    decodes = [d for s, _, _, d in runs if s == "vit" and d is not None]
    decode = statistics.median(decodes) if decodes else None
    print(f"\nvit predict, {args.predict_files} JPEGs at batch 32: {predict:.1f} img/s (wall {walls_folder:.2f} s "
          f"less one image's {walls_one:.2f} s); vit serve c{top} / predict: {serve_over_predict:.2f}x")
    c1 = table["vit", 1]["p50_ms"]
    if decode is None:
        c1_ratio = None
        print(f"one image's decode + forward: n/a (no vit_decode_seconds in vit serve's /metrics); forward p50 "
              f"(vit bench, batch 1) {forward:.1f} ms; vit serve c1 p50 {c1:.1f} ms")
    else:
        c1_ratio = c1 / (decode + forward)
        print(f"one image's decode + forward: {decode:.1f} + {forward:.1f} = {decode + forward:.1f} ms (decode: vit "
              f"serve's mean over its c1 run; forward: vit bench p50, batch 1); vit serve c1 p50 {c1:.1f} ms: "
              f"{c1_ratio:.2f}x")
    exits = [code for s, _, code, _ in runs if s == "vit"]

    ratio = table["vit", top]["img_per_s"] / table["fastapi", top]["img_per_s"]
    met = lambda ok: "met" if ok else "NOT met"
    print("\nGoals:")
    print(f"  c{top} img/s vit / FastAPI+timm >= 2x: {ratio:.2f}x, {met(ratio >= 2)}")
    print(f"  c{top} errors 0 on both sides: vit {table['vit', top]['errors']}, FastAPI+timm "
          f"{table['fastapi', top]['errors']}, {met(table['vit', top]['errors'] == 0 == table['fastapi', top]['errors'])}")
    print(f"  vit serve c{top} >= 0.9x vit predict img/s: {serve_over_predict:.2f}x, {met(serve_over_predict >= 0.9)}")
    print(f"  vit serve c1 p50 <= 1.2x one image's decode + forward: " +
          (f"{c1_ratio:.2f}x, {met(c1_ratio <= 1.2)}" if c1_ratio is not None else "n/a, NOT met"))
    print(f"  vit serve exits 0 on SIGTERM: exit codes {', '.join(map(str, exits))}, {met(set(exits) == {0})}")
    print(f"\nload average at start {loads[0]}, at end {loads[1]}: other work on the machine distorts these timings; "
          "rerun on an idle machine if they are not ~0")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vit", required=True)
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="threads per server (default: all cores)")
    parser.add_argument("--repeats", type=int, help="runs per side (default 3; --quick: 1)")
    parser.add_argument("--duration", type=int, help="seconds per concurrency (default 30; --quick: 5)")
    parser.add_argument("--quick", action="store_true", help="a smoke test of the script, not a measurement")
    args = parser.parse_args()
    args.repeats = args.repeats or (1 if args.quick else 3)
    args.duration = args.duration or (5 if args.quick else 30)
    args.predict_files = 64 if args.quick else 400
    check_tools()
    if not os.access(args.vit, os.X_OK):
        sys.exit(f"bench_serve: no vit binary at {args.vit} (build it, or pass --vit PATH)")

    with tempfile.TemporaryDirectory() as work:
        model, config, jpegs = prepare(work, args.predict_files)
        lua = f"{work}/post_jpegs.lua"
        with open(lua, "w") as f:
            f.write(WRK_SCRIPT)
        model_args = ["--checkpoint", model, "--config", config]
        commands = {"vit": [args.vit, "serve", *model_args, "--threads", str(args.threads)],
                    "fastapi": [sys.executable, f"{SCRIPTS}/serve_timm.py", "--arch", PRESET, "--weights", model,
                                "--threads", str(args.threads)]}
        predict = [args.vit, "predict", *model_args, "--threads", str(args.threads), "--batch-size", "32", "--topk", "1"]
        loads = [open("/proc/loadavg").read().split()[0]]
        runs, predict_runs, forward_runs = [], [], []
        for r in range(1, args.repeats + 1):  # alternating, so that drift in machine load hits every side
            for side in SIDES:
                print(f"[serve] {side} run {r}/{args.repeats}", file=sys.stderr)
                runs.append((side, *measure_server(side, commands[side], jpegs, lua, args.duration,
                                                   f"{work}/{side}-{r}.log")))
            print(f"[serve] vit predict and vit bench run {r}/{args.repeats}", file=sys.stderr)
            predict_runs.append((wall(predict + [f"{work}/folder"]), wall(predict + [jpegs[0]])))
            forward_runs.append(forward_ms(args.vit, model_args, args.threads, args.quick))
        loads.append(open("/proc/loadavg").read().split()[0])
        report(runs, predict_runs, forward_runs, args, loads)


if __name__ == "__main__":
    main()
