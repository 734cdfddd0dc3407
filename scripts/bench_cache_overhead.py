#!/usr/bin/env python
"""Plain decode throughput with and without the prefix cache, side by side.

The prefix cache's cost where nothing can be reused: per round, for each
tree (this one with the cache on; a baseline tree, e.g. /work/main without
it, or this one without it) and each concurrency n, a fresh
engine first serves a wave of n unique requests (their KV stays in the
slots, and goes to host RAM when the next wave takes the slots), then the
measured wave of n unique requests (prompt --prompt-len, --gen greedy
tokens, ignore_eos, cache_prompt on: every lookup and save happens, no
reuse can) read by n threads; reported: the
steady-state decode tokens/s of bench_engine.py (tokens arriving while all
n streams generate, over that window). Trees alternate within each round;
medians over rounds and their ratio are printed.

    python scripts/bench_cache_overhead.py --base /work/main -n 8 32 --reps 3
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def one(n: int, P: int, G: int, cache: bool) -> dict:
    """One measurement in this process's tree (PYTHONPATH decides which; this
    script runs from scripts/, so Python already has its folder on sys.path)."""
    from bench_engine import GREEDY, _figures, _read_all, prompt_ids, wave

    from engine.config import Config
    from engine.process import EngineProcess
    from ipc.client import WorkerPort

    model = Config().model_path()
    prompts = prompt_ids(model, 2 * n + 1, P)
    per = -(-(P + G + 16) // 256) * 256
    kw = dict(model=model, parallel=n, ctx_size=2 * n * per, threads=2, http_threads=max(n, 4), workers=1,
              batch_size=max(2048, n), ubatch_size=512)
    kw["prefix_cache"] = cache  # explicit: the default changed (on since the per-stream cache)
    cfg = Config(**kw)
    with EngineProcess(cfg, n_workers=2) as eng:
        port = WorkerPort(eng.arena, 0)
        _read_all(port, prompts[-1][:8], cfg.sampling(**GREEDY, n_predict=4, ignore_eos=1, cache_prompt=0))
        # cache_prompt on, unique prompts: every lookup, save and copy the cache makes happens, no reuse can
        p = cfg.sampling(**GREEDY, n_predict=G, ignore_eos=1, cache_prompt=1)
        pre = cfg.sampling(**GREEDY, n_predict=16, ignore_eos=1, cache_prompt=1)
        wave(port, prompts[n:2 * n], pre)
        c0 = eng.arena.counters.copy()
        arrivals: list[list[float]] = [[] for _ in range(n)]
        t0, t1 = wave(port, prompts[:n], p, arrivals)
        r = _figures(arrivals, t0, t1, eng.arena.counters.copy() - c0)
    return {"n": n, "tokens_per_s": r["tokens_per_s"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", "--concurrency", type=int, nargs="+", default=[8, 32])
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--base", default="", help="baseline tree (default: this tree without the prefix cache)")
    ap.add_argument("--cache-off", action="store_true",
                    help="run this tree without the cache too (what the default costs against --base)")
    ap.add_argument("--one", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--no-cache", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        print(json.dumps(one(a.one, a.prompt_len, a.gen, not a.no_cache)))
        return 0
    trees = {"cache": (HERE, a.cache_off), "base": (a.base or HERE, True)}  # base: never --prefix-cache
    res: dict[tuple[str, int], list[float]] = {}
    for rep in range(a.reps):
        for n in a.concurrency:
            for name, (root, nocache) in trees.items():
                env = {**os.environ, "PYTHONPATH": root}
                cmd = [sys.executable, os.path.join(HERE, "scripts", "bench_cache_overhead.py"), "--one", str(n),
                       "--prompt-len", str(a.prompt_len), "--gen", str(a.gen)] + (["--no-cache"] if nocache else [])
                out = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=root, timeout=900)
                if out.returncode != 0:
                    print(out.stderr[-3000:], file=sys.stderr)
                    return 1
                tps = json.loads(out.stdout.strip().splitlines()[-1])["tokens_per_s"]
                res.setdefault((name, n), []).append(tps)
                print(f"round {rep + 1} n={n} {name}: {tps:.1f} t/s", file=sys.stderr, flush=True)
    base = a.base or "this tree, no prefix cache"
    print(f"decode tokens/s, medians of {a.reps} rounds (prompt {a.prompt_len}, gen {a.gen}; baseline: {base})")
    print(f"| n | baseline t/s | {'this tree, no cache' if a.cache_off else 'prefix cache'} t/s | ratio |")
    print("|---|---|---|---|")
    for n in a.concurrency:
        b, c = float(np.median(res[("base", n)])), float(np.median(res[("cache", n)]))
        print(f"| {n} | {b:.1f} | {c:.1f} | {c / b:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
