#!/usr/bin/env python3
"""Load and report steps of scripts/gpu_check.sh (stdlib at import: it runs
on a bare device machine with nothing but the kit's wheels; a --metrics load
also imports frontends.testing, from ringserve's own install there).

``load URL --concurrency C --requests N --n-predict P --mode greedy|sampled``
    runs scripts/gpu_loadgen.py in ceil(C / 32) processes side by side (one
    Python client process is GIL-bound near 10k SSE events/s, below a GPU's
    rate at 128 streams), sums their tokens over the longest wall time, and,
    with --metrics, diffs ringserve's /metrics around the load: engine phase
    seconds per decode step. Prints one JSON object.
``report OUT``
    reads OUT/ceiling.txt (llama-batched-bench's table) and OUT/results.jsonl
    and prints the throughput table (tok/s and ratio to the decode ceiling at
    the same number of sequences) and ringserve's phase table.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
MODES = {  # request fields over gpu_loadgen's defaults (temperature 0, top_k 1, seed 42)
    "greedy": {"ignore_eos": True},
    "sampled": {"ignore_eos": True, "temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05},
}
PHASES = ("intake", "build", "decode", "sample", "publish", "idle")
PER_PROC = 32  # streams per client process


def scrape(url: str) -> dict[str, float]:
    # prometheus_client's parser, as every script; imported here, not at the top: frontends.testing
    # takes ~0.4 s to import, and only a --metrics load needs it (not the report, nor the other loads)
    from frontends.testing import parse_metrics

    try:
        with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
            return parse_metrics(r.read().decode())
    except OSError:
        return {}


def phases(m0: dict, m1: dict) -> dict | None:
    """ringserve's tracer over the load: ms per decode step by phase, host share."""
    d = lambda k: m1.get(k, 0.0) - m0.get(k, 0.0)  # noqa: E731
    steps = d("ringserve:steps_total")
    if not m0 or not m1 or steps <= 0:
        return None
    sec = {p: d(f'ringserve:engine_phase_seconds_total{{phase="{p}"}}') for p in PHASES}
    host = sum(v for p, v in sec.items() if p not in ("decode", "idle"))
    return {"steps": steps, "tokens_per_step": d("ringserve:batch_tokens_total") / steps,
            "ms_per_step": {p: 1e3 * v / steps for p, v in sec.items()},
            "host_share": host / (host + sec["decode"]) if host + sec["decode"] else math.nan}


def load(a: argparse.Namespace) -> int:
    n_proc = max(1, math.ceil(a.concurrency / PER_PROC))
    extra = json.dumps(MODES[a.mode])
    m0 = scrape(a.url) if a.metrics else {}
    procs = []
    for k in range(n_proc):
        c = a.concurrency // n_proc + (1 if k < a.concurrency % n_proc else 0)
        n = a.requests // n_proc + (1 if k < a.requests % n_proc else 0)
        if c <= 0 or n <= 0:
            continue
        procs.append(subprocess.Popen(
            [sys.executable, os.path.join(HERE, "gpu_loadgen.py"), a.url, "--concurrency", str(c), "--requests",
             str(n), "--n-predict", str(a.n_predict), "--stream", "--json", "--extra", extra],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    t0 = time.perf_counter()
    parts, errors = [], []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=max(1.0, a.timeout - (time.perf_counter() - t0)))
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
            errors.append("timeout")
        try:
            parts.append(json.loads(out.strip().splitlines()[-1]))
        except (ValueError, IndexError):
            errors.append(out.strip()[-200:])
    m1 = scrape(a.url) if a.metrics else {}
    toks = sum(p.get("tokens", 0) for p in parts)
    wall = max((p.get("wall_s", 0.0) for p in parts), default=0.0)
    res = {"server": a.server, "mode": a.mode, "c": a.concurrency, "requests": sum(p.get("requests", 0) for p in parts),
           "errors": sum(p.get("errors", 0) for p in parts) + len(errors), "tokens": toks, "wall_s": wall,
           "tok_per_s": round(toks / wall, 1) if wall else 0.0,
           "ttft_p50_ms": max((p.get("ttft_p50_ms", math.nan) for p in parts), default=math.nan),
           "clients": len(procs)}
    if errors:
        res["first_error"] = errors[0]
    if a.metrics:
        res["phases"] = phases(m0, m1)
    print(json.dumps(res))
    return 0


def ceiling(path: str) -> dict[int, float]:
    """{sequences: S_TG t/s} from llama-batched-bench's markdown table."""
    out: dict[int, float] = {}
    try:
        lines = open(path).read().splitlines()
    except OSError:
        return out
    head = None
    for ln in lines:
        cols = [c.strip() for c in ln.strip().strip("|").split("|")]
        if "B" in cols and "S_TG t/s" in cols:
            head = cols
            continue
        if head and len(cols) == len(head):
            try:
                out[int(cols[head.index("B")])] = float(cols[head.index("S_TG t/s")])
            except ValueError:
                pass
    return out


def report(a: argparse.Namespace) -> int:
    ceil = ceiling(os.path.join(a.out, "ceiling.txt"))
    rows = []
    try:
        with open(os.path.join(a.out, "results.jsonl")) as f:
            rows = [json.loads(ln) for ln in f if ln.strip()]
    except OSError:
        pass
    print("\nthroughput (tok/s streamed; / ceiling = over llama-batched-bench S_TG at as many sequences)")
    print("| server | mode | c | tok/s | / ceiling | ceiling tok/s | done | errors | TTFT p50 ms |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        c = r.get("c", 0)
        cl = ceil.get(c)
        tps = r.get("tok_per_s", 0.0)
        ratio = f"{tps / cl:.2f}" if cl else "-"
        print(f"| {r.get('server')} | {r.get('mode')} | {c} | {tps:.1f} | {ratio} | {cl or '-'} | "
              f"{r.get('requests', 0)} | {r.get('errors', '-')} | {r.get('ttft_p50_ms', '-')} |")
    print("\nringserve engine phases (ms per decode step, from /metrics t_*_s; host share = non-decode busy time)")
    print("| server | mode | c | steps | tokens/step | " + " | ".join(PHASES) + " | host share |")
    print("|---|---|---|---|---|" + "---|" * len(PHASES) + "---|")
    for r in rows:
        ph = r.get("phases")
        if not ph:
            continue
        ms = " | ".join(f"{ph['ms_per_step'][p]:.3f}" for p in PHASES)
        print(f"| {r.get('server')} | {r.get('mode')} | {r.get('c')} | {ph['steps']:.0f} | "
              f"{ph['tokens_per_step']:.1f} | {ms} | {100 * ph['host_share']:.1f}% |")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    lp = sub.add_parser("load")
    lp.add_argument("url")
    lp.add_argument("--concurrency", type=int, required=True)
    lp.add_argument("--requests", type=int, required=True)
    lp.add_argument("--n-predict", type=int, default=128)
    lp.add_argument("--server", default="", help="name for the report")
    lp.add_argument("--mode", choices=tuple(MODES), default="greedy")
    lp.add_argument("--metrics", action="store_true", help="diff ringserve's /metrics around the load")
    lp.add_argument("--timeout", type=float, default=120.0)
    rp = sub.add_parser("report")
    rp.add_argument("out")
    a = ap.parse_args(argv)
    return load(a) if a.cmd == "load" else report(a)


if __name__ == "__main__":
    sys.exit(main())
