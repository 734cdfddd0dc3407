"""Pure-decode ceiling of this machine through engine.model.Model.

The Python equivalent of `llama-batched-bench -npp P -ntg G -npl 1,8,32`:
for each concurrency n, n sequences get a P-token prompt (one prefill
batch), then G steps each decode one token per sequence with its logits
requested, as batched-bench does, but nothing is sampled: the fed-back token
is a fixed id, so the number is what the engine loop could reach if
scheduling, sampling and IPC were free. Reported: decode tokens/s = n*G /
decode time (best of --reps, and the median: the machine is shared; "TG
p10" is n / the 10th-percentile step time, the cost of a step that ran
without interference),
plus the share of each step spent outside llama_decode (building the batch
in Python).

    python scripts/ceiling.py                 # n = 1 8 32, P 16, G 128, fa auto
    python scripts/ceiling.py -n 1 8 32 --fa off --json
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

import llama_cpp as L

from engine.config import Config
from engine.model import Model

TOKEN = 1000  # fixed id fed back every step


def prefill(m: Model, n: int, P: int, rng: np.random.Generator) -> None:
    """Sequences 0..n-1 get P random tokens each, in as few batches as n_batch allows."""
    m.clear()
    for s in range(n):
        if m.batch.n + P > m.batch.cap:
            assert m.decode() == 0
            m.clear()
        m.add_many(rng.integers(0, m.n_vocab, P), 0, s, True)
    assert m.decode() == 0
    L.llama_synchronize(m.ctx)


def once(m: Model, n: int, P: int, G: int, rng: np.random.Generator) -> tuple[float, float, float, list[float]]:
    """Prefill n x P tokens, then G one-token-per-sequence steps:
    (t_pp, t_tg, t_build) seconds and every step's duration."""
    m.kv_clear()
    t0 = time.perf_counter()
    prefill(m, n, P, rng)
    t_pp = time.perf_counter() - t0
    t_build = 0.0
    steps = []
    t0 = time.perf_counter()
    for g in range(G):
        tb = time.perf_counter()
        m.clear()
        for s in range(n):
            m.add(TOKEN, P + g, s, True)
        t_build += time.perf_counter() - tb
        rc = m.decode()
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc} at step {g}")
        L.llama_synchronize(m.ctx)
        steps.append(time.perf_counter() - tb)
    return t_pp, time.perf_counter() - t0, t_build, steps


def run(n: int, P: int, G: int, fa: str, threads: int, batch: int, ubatch: int, reps: int = 3, model: str = "") -> dict:
    """One concurrency level in a fresh context sized n * (P + G + 16);
    `reps` repetitions (the machine is shared and noisy: best and median)."""
    per = -(-(P + G + 16) // 256) * 256  # llama.cpp pads each sequence's cells to 256
    cfg = Config(model=model, parallel=n, ctx_size=n * per, threads=threads, flash_attn=fa,
                 batch_size=max(batch, n), ubatch_size=ubatch)
    m = Model(cfg)
    try:
        rng = np.random.default_rng(0)
        m.clear()  # warm-up, as batched-bench: 16 tokens on sequence 0
        m.add_many(rng.integers(0, m.n_vocab, 16), 0, 0, False)
        assert m.decode() == 0
        runs = [once(m, n, P, G, rng) for _ in range(reps)]
        tg = sorted(n * G / r[1] for r in runs)
        pp = sorted(n * P / r[0] for r in runs)
        # 10th-percentile step: what a step costs when no other process runs
        p10 = float(np.percentile([x for r in runs for x in r[3]], 10))
        return {
            "n": n, "P": P, "G": G, "fa": fa, "fa_on": m.flash_attn_on, "threads": cfg.n_threads, "n_ctx": m.n_ctx,
            "n_ubatch": m.n_ubatch, "reps": reps, "pp_tps": round(pp[-1], 1), "tg_tps": round(tg[-1], 1),
            "tg_tps_median": round(tg[len(tg) // 2], 1), "step_ms": round(n / tg[-1] * 1e3, 2),
            "tg_tps_p10step": round(n / p10, 1), "step_ms_p10": round(p10 * 1e3, 2),
            "python_pct": round(100 * min(r[2] / r[1] for r in runs), 2),
        }
    finally:
        m.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", "--concurrency", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--fa", choices=["on", "off", "auto"], default="auto")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=2048)
    ap.add_argument("--ubatch", type=int, default=512)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--model", default="")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    rows = [run(n, a.prompt_len, a.gen, a.fa, a.threads, a.batch, a.ubatch, a.reps, a.model) for n in a.concurrency]
    if a.json:
        print(json.dumps(rows))
    else:
        print(f"{'n':>4} {'fa':>5} {'thr':>4} {'PP t/s':>9} {'TG t/s':>9} {'TG med':>9} {'TG p10':>9} "
              f"{'step ms':>9} {'python %':>9}")
        for r in rows:
            print(f"{r['n']:>4} {r['fa']:>5} {r['threads']:>4} {r['pp_tps']:>9} {r['tg_tps']:>9} "
                  f"{r['tg_tps_median']:>9} {r['tg_tps_p10step']:>9} {r['step_ms']:>9} {r['python_pct']:>9}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
