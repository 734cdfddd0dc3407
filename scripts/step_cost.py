#!/usr/bin/env python
"""What one engine step costs: llama_decode time of a batch holding g
generating tokens plus a c-token prompt chunk, through engine.model.Model.

The measurement behind the step budget's defaults (engine/budget.py,
docs/ARCHITECTURE.md): a pure decode step's time d(g), and what each prompt
token adds to it, (t(g, c) - d(g)) / c. Nothing is sampled; KV is rolled
back after each step so every repetition sees the same cache.

    python scripts/step_cost.py                    # g = 1 8, c = 0 32 64 128 256 512
    python scripts/step_cost.py -g 8 32 --json
    python scripts/step_cost.py --order 8:3:32 32:3,9,14,20,27:16   # batch order (engine/batch.py)
    python scripts/step_cost.py --steps 1x48 4x9 32x1 0:9,1:1,2:1,3:1   # speculation's step shapes

``--steps``: prompt-free steps as speculative decoding makes them, every
token with logits: ``SxT`` = S sequences of T tokens each (one ubatch), or
``id:count,...`` = those sequences with those counts (the ubatches that
llama.cpp's split_equal makes of it, engine/spec/plan.py, are printed
beside the time: each is a pass over the weights).
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from engine.config import Config
from engine.model import Model


def config(a, **kw) -> Config:
    """The engine Config of a measurement: -m (default: ringserve's model), -t, --fa, and ``kw``."""
    return Config(**({"model": a.model} if a.model else {}), threads=a.threads, flash_attn=a.fa, **kw)


def step_time(m: Model, g: int, c: int, past: int, prompt: np.ndarray, reps: int) -> float:
    """Median seconds of decode over g one-token sequences (each with
    ``past`` tokens of KV) plus a c-token chunk on sequence g."""
    ts = []
    for _ in range(reps):
        m.clear()
        for s in range(g):
            m.add(1000, past, s, True)
        if c:
            m.add_many(prompt[:c], 0, g, True)
        t0 = time.perf_counter()
        if m.decode() != 0:
            raise RuntimeError("decode failed")
        ts.append(time.perf_counter() - t0)
        for s in range(g + 1):
            m.seq_rm(s, past if s < g else 0, -1)
    return float(np.median(ts))


def emit(a, rows: list[dict], title: str, header: str, line) -> int:
    """The rows as JSON (--json) or as a markdown table under ``title``."""
    if a.json:
        json.dump(rows, sys.stdout, indent=1)
        print()
        return 0
    print(f"{title}, -t {a.threads} -fa {a.fa}\n")
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    for r in rows:
        print(line(r))
    return 0


def fill(m: Model, n_seq: int, past: int, rng) -> None:
    """Every sequence below n_seq gets ``past`` tokens of KV (random ids)."""
    for s in range(n_seq):
        m.clear()
        m.add_many(rng.integers(1000, 20000, past).astype(np.int32), 0, s, False)
        m.decode()


def spec_step(m: Model, seqs: list[tuple[int, int]], past: int, reps: int) -> float:
    """Median seconds of a prompt-free step: sequence s gets c tokens (last + drafted), all with logits,
    in the batch order of engine/loop.py (every sequence's first token by id, then the rest by id)."""
    ts = []
    for _ in range(reps):
        m.clear()
        for s, _c in seqs:
            m.add(1000, past, s, True)
        for s, c in seqs:
            for j in range(1, c):
                m.add(1000 + j, past + j, s, True)
        t0 = time.perf_counter()
        if m.decode() != 0:
            raise RuntimeError("decode failed")
        ts.append(time.perf_counter() - t0)
        for s, _c in seqs:
            m.seq_rm(s, past, -1)
    return float(np.median(ts))


def parse_step(v: str) -> list[tuple[int, int]]:
    if "x" in v:
        n, t = (int(x) for x in v.split("x"))
        return [(s, t) for s in range(n)]
    return sorted((int(a), int(b)) for a, b in (x.split(":") for x in v.split(",")))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-g", type=int, nargs="+", default=[1, 8], help="generating tokens per step")
    p.add_argument("-c", type=int, nargs="+", default=[0, 32, 64, 128, 256, 512], help="prompt chunk sizes")
    p.add_argument("--past", type=int, default=64, help="KV tokens each generating sequence has")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("-m", "--model", default="", help="GGUF (default: ringserve's default model)")
    p.add_argument("-t", "--threads", type=int, default=2)
    p.add_argument("--fa", default="auto", choices=("on", "off", "auto"))
    p.add_argument("--steps", nargs="+", default=[], help="speculation's step shapes (module doc)")
    p.add_argument("--order", nargs="+", default=[], metavar="G:HOLES:C",
                   help="batch order (engine/batch.py): G sequences, those in HOLES (comma list) prompting C "
                        "tokens, the rest generating; generating rows first (llama-server's) against id order")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    if a.steps:
        return steps(a)
    if a.order:
        return order(a)
    n_seq = max(a.g) + 1
    cfg = config(a, parallel=n_seq, ctx_size=n_seq * max(1024, max(a.c) + a.past + 16))
    rows = []
    with Model(cfg) as m:
        rng = np.random.default_rng(0)
        prompt = rng.integers(1000, 20000, max(a.c) + 1).astype(np.int32)
        fill(m, max(a.g), a.past, rng)
        step_time(m, max(a.g), max(a.c), a.past, prompt, 1)  # warm-up: compute buffers
        for g in a.g:
            d = step_time(m, g, 0, a.past, prompt, a.reps)
            for c in a.c:
                t = d if c == 0 else step_time(m, g, c, a.past, prompt, a.reps)
                rows.append({"g": g, "c": c, "ms": 1e3 * t, "x_pure": t / d,
                             "ms_per_prompt_token": 1e3 * (t - d) / c if c else None})
    per = lambda r: "-" if r["ms_per_prompt_token"] is None else f"{r['ms_per_prompt_token']:.2f}"  # noqa: E731
    return emit(a, rows, f"llama_decode ms per step (median of {a.reps})",
                "| g | c | step ms | x pure step | ms per prompt token |",
                lambda r: f"| {r['g']} | {r['c']} | {r['ms']:.1f} | {r['x_pure']:.2f} | {per(r)} |")


def steps(a) -> int:
    from engine.spec.plan import ubatches

    shapes = [parse_step(v) for v in a.steps]
    n_seq = max(s for sh in shapes for s, _ in sh) + 1
    most = max(sum(c for _, c in sh) for sh in shapes)
    cfg = config(a, parallel=max(n_seq, 2), ctx_size=max(n_seq, 2) * 1024, spec_type="ngram-map-k", prefix_cache=False)
    rows = []
    with Model(cfg) as m:
        if most > m.batch.max_out:
            raise SystemExit(f"{most} rows: more than the {m.batch.max_out} a decode may have")
        rng = np.random.default_rng(0)
        fill(m, n_seq, a.past, rng)
        spec_step(m, shapes[0], a.past, 2)  # warm-up
        for v, sh in zip(a.steps, shapes):
            t = spec_step(m, sh, a.past, a.reps)
            ub = ubatches([s for s, _ in sh], [c for _, c in sh], m.n_ubatch)
            rows.append({"step": v, "rows": sum(c for _, c in sh), "ubatches": ub, "ms": 1e3 * t})
    return emit(a, rows, f"prompt-free step ms (median of {a.reps}, {a.past} tokens of KV each)",
                "| step | rows | ubatches (rows each) | ms |",
                lambda r: f"| {r['step']} | {r['rows']} | {' + '.join(map(str, r['ubatches']))} | {r['ms']:.1f} |")


def order(a) -> int:
    """One step's llama_decode time in the two batch orders, alternating (A B A B) per repetition."""
    cases = [(int(g), [int(x) for x in h.split(",")], int(c)) for g, h, c in (v.split(":") for v in a.order)]
    n_seq = max(g for g, _, _ in cases)
    cfg = config(a, parallel=n_seq, ctx_size=n_seq * 1024, prefix_cache=False)
    rows = []
    with Model(cfg) as m:
        rng = np.random.default_rng(0)
        prompt = rng.integers(1000, 20000, max(c for _, _, c in cases)).astype(np.int32)
        fill(m, n_seq, a.past, rng)

        def step(seqs: list[int], holes: list[int], c: int) -> float:
            m.clear()
            for s in seqs:
                if s in holes:
                    m.add_many(prompt[:c], a.past, s, True)
                else:
                    m.add(1000, a.past, s, True)
            t0 = time.perf_counter()
            if m.decode() != 0:
                raise RuntimeError("decode failed")
            dt = time.perf_counter() - t0
            for s in seqs:
                m.seq_rm(s, a.past, -1)
            return dt

        for g, holes, c in cases:
            first = [s for s in range(g) if s not in holes] + holes
            step(first, holes, c)  # warm-up
            ta, tb = [], []
            for _ in range(a.reps):
                ta.append(step(first, holes, c))
                tb.append(step(list(range(g)), holes, c))
            ms_a, ms_b = 1e3 * float(np.median(ta)), 1e3 * float(np.median(tb))
            rows.append({"g": g, "holes": holes, "c": c, "gen_first_ms": ms_a, "by_id_ms": ms_b, "ratio": ms_b / ms_a})
    return emit(a, rows, f"llama_decode ms per step (median of {a.reps}, {a.past} tokens of KV each)",
                "| sequences | prompting (chunk) | generating first | id order | ratio |",
                lambda r: f"| {r['g']} | {','.join(map(str, r['holes']))} ({r['c']}) | {r['gen_first_ms']:.1f} | "
                          f"{r['by_id_ms']:.1f} | {r['ratio']:.3f} |")


if __name__ == "__main__":
    sys.exit(main())
