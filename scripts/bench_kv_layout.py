#!/usr/bin/env python
"""Pure decode through engine.model.Model: per-slot KV streams vs one unified pool.

Why: the prefix cache (engine/prefix.py) needs cells shared between
sequences. A unified pool shares them with no copy, but every decode step
then builds its attention mask over every used cell of the pool, cached
ones included; per-slot streams attend over their own cells only. For each
concurrency n this decodes G steps of n streams (P-token prompts, fixed
fed-back token, nothing sampled, as scripts/ceiling.py) in:

* streams: kv_unified=False, n_seq_max = n (today's layout);
* unified: kv_unified=True (the hidden setting), n_seq_max = n, same cells;
* unified+held: the same with --held more cells occupied by cached
  prefixes of other sequences (what the tree keeps between requests).

Configurations alternate within each repetition; tokens/s medians and the
ratio to `streams` are printed.

    python scripts/bench_kv_layout.py -n 8 32 --held 4096 --reps 3
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np

import llama_cpp as L

from ceiling import prefill  # scripts/ceiling.py
from engine.config import Config
from engine.model import Model

TOKEN = 1000


def build(n: int, P: int, G: int, layout: str, held: int, threads: int) -> Model:
    per = -(-(P + G + 16) // 256) * 256
    extra = held if layout == "unified+held" else 0
    cfg = Config(parallel=n, ctx_size=n * per + extra, threads=threads, prefix_cache=False,
                 kv_unified=layout != "streams")
    return Model(cfg)


def once(m: Model, n: int, P: int, G: int, held: int, rng: np.random.Generator) -> float:
    m.kv_clear()
    base = 2 * n + 1  # holder sequence ids, as prefix.py numbers them
    m.clear()
    left, h = held, 0
    while left > 0:  # cached prefixes of 512 tokens, each held by a holder and the keeper
        k = min(512, left)
        m.add_many(rng.integers(0, m.n_vocab, k), 0, base + h, False)
        assert m.decode() == 0
        m.clear()
        m.seq_cp(base + h, 2 * n, 0, k)
        left -= k
        h += 1
    prefill(m, n, P, rng)
    t0 = time.perf_counter()
    for g in range(G):
        m.clear()
        for s in range(n):
            m.add(TOKEN, P + g, s, True)
        rc = m.decode()
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")
    L.llama_synchronize(m.ctx)
    return n * G / (time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", "--concurrency", type=int, nargs="+", default=[8, 32])
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--held", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args(argv)
    layouts = ["streams", "unified", "unified+held"]
    print(f"{'n':>4} {'layout':>14} {'cells':>7} {'decode t/s (median)':>20} {'ratio':>7}")
    for n in a.concurrency:
        models = {k: build(n, a.prompt_len, a.gen, k, a.held, a.threads) for k in layouts}
        res: dict[str, list[float]] = {k: [] for k in layouts}
        try:
            rng = np.random.default_rng(0)
            for k, m in models.items():  # warm-up: compute buffers
                once(m, n, a.prompt_len, 4, a.held if k == "unified+held" else 0, rng)
            for _ in range(a.reps):
                for k, m in models.items():
                    res[k].append(once(m, n, a.prompt_len, a.gen, a.held if k == "unified+held" else 0, rng))
        finally:
            cells = {k: m.n_ctx for k, m in models.items()}
            for m in models.values():
                m.close()
        base = float(np.median(res["streams"]))
        for k in layouts:
            med = float(np.median(res[k]))
            print(f"{n:>4} {k:>14} {cells[k]:>7} {med:>20.1f} {med / base:>7.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
