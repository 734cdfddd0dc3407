#!/usr/bin/env python
"""What moving a slot's KV costs with per-slot streams (kv_unified=False):
llama_state_seq_get_data / set_data, seq_rm, cross-stream seq_cp, against
pure decode steps, and whether the copies are exact.

Why: issue 14's second design keeps the per-slot streams (their decode speed)
and moves cached prefixes between slots and a host-RAM tier by copying KV.
Whether that fits "no decode step of other slots waits more than one step's
time" depends on these figures. Through engine.model.Model (default model,
swa_full), ``-np 4`` with ``--cells`` cells per slot:

1. a sequence of N tokens: state size, bytes per token, get_size, get_data
   into a preallocated (already touched) buffer and into a fresh one,
   set_data into another emptied slot, seq_rm cutting it to N/2; the
   ON_DEVICE snapshot (get/set_data_ext, flag 2) and PARTIAL_ONLY size;
2. cross-stream ``llama_memory_seq_cp``: llama.cpp copies the whole stream
   buffer at the next decode (llama_kv_cache::update), so this times a
   one-token decode on the destination with and without the pending copy;
3. pure decode steps at g generating streams (scripts/step_cost.py's
   step_time, a separate context of max(g) slots) to state each copy in steps;
4. exactness: A's KV copied to B (get/set), both cut to m: the next token's
   logits on A and on B are bit-identical (np.array_equal); likewise after a
   round trip A -> bytes -> A and after seq_cp(A, C); and the sliding window:
   pos_min of a long sequence, and what a get/set carries below the window.

Medians of --reps; everything runs on the calling thread, as the engine's
loop would run it (llama_context is not thread-safe: get_data synchronizes
the scheduler and reads every stream's cell metadata, set_data allocates
cells; neither may overlap a llama_decode on another thread).

What the exactness rows show (llama.cpp of llama-cpp-python 0.3.36):
get_data leaves out SWA cells more than n_swa behind the sequence's end
(llama_kv_cache::state_write, is_masked_swa), so a copy continues exactly
only from its own end (a cut below the window leaves no SWA cell and
llama_decode silently attends to nothing there), and its SWA cells sit
in fewer cells than the original's: a decode of that one sequence alone
then differs in the last bits (the CPU flash-attention kernel splits the
KV of a lone one-token query by n_kv / threads), while a batch of several
streams, as engine steps are, is bit-identical.

    python scripts/bench_kv_copy.py                 # N = 128 512 2048 8000, g = 4 8 32
    python scripts/bench_kv_copy.py --quick --json
"""
from __future__ import annotations

import argparse
import ctypes
import json
import sys
import time

import numpy as np

import llama_cpp as L

from engine.config import Config
from engine.model import Model
from step_cost import step_time  # scripts/step_cost.py

U8 = ctypes.POINTER(ctypes.c_uint8)
ON_DEVICE = getattr(L, "LLAMA_STATE_SEQ_FLAGS_ON_DEVICE", 2)
PARTIAL_ONLY = getattr(L, "LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY", 1)
A, B, C = 0, 1, 2  # slots (= sequences = streams)
# must be bit-identical (the others are reported: see the docstring)
EXACT = ("get_set", "round_trip", "seq_cp", "long_full_pair", "long_full_seq_cp", "long_full_both_restored",
         "cut_then_copy_pair")


def ms(t: float) -> float:
    return 1e3 * t


def timed(f, reps: int) -> float:
    """Median seconds of f() over reps calls."""
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts))


def fill(m: Model, seq: int, tokens: np.ndarray) -> None:
    """Evaluate tokens at positions 0.. of seq (emptied first), n_batch at a time."""
    m.seq_clear(seq)
    for p in range(0, len(tokens), m.n_batch):
        m.clear()
        m.add_many(tokens[p:p + m.n_batch], p, seq, False)
        if m.decode() != 0:
            raise RuntimeError(f"prefill of seq {seq} failed at {p}")


def one(m: Model, seq: int, tok: int, pos: int) -> tuple[int, np.ndarray | None, float]:
    """Decode one token of seq at pos: (rc, copy of its logits, seconds)."""
    m.clear()
    m.add(tok, pos, seq, True)
    t0 = time.perf_counter()
    rc = m.decode()
    L.llama_synchronize(m.ctx)
    dt = time.perf_counter() - t0
    return rc, (m.logits(0).copy() if rc == 0 else None), dt


def get(m: Model, seq: int, buf: np.ndarray | None = None, flags: int = 0) -> np.ndarray:
    """The state of seq as bytes (into buf when given, else a fresh array)."""
    n = L.llama_state_seq_get_size_ext(m.ctx, seq, flags)
    if buf is None:
        buf = np.empty(n, np.uint8)
    got = L.llama_state_seq_get_data_ext(m.ctx, buf.ctypes.data_as(U8), n, seq, flags)
    if got != n:
        raise RuntimeError(f"get_data({seq}) wrote {got} of {n} bytes")
    return buf[:n]


def put(m: Model, buf: np.ndarray, seq: int, flags: int = 0) -> None:
    if L.llama_state_seq_set_data_ext(m.ctx, buf.ctypes.data_as(U8), len(buf), seq, flags) == 0:
        raise RuntimeError(f"set_data({seq}) failed")


def sizes(m: Model, n: int, toks: np.ndarray, reps: int) -> dict:
    """Item 1 and 2 for a sequence of n tokens on A."""
    fill(m, A, toks[:n])
    size = L.llama_state_seq_get_size(m.ctx, A)
    pre = np.empty(size, np.uint8)
    pre.fill(0)  # touched: no page faults in the timing
    t_size = timed(lambda: L.llama_state_seq_get_size(m.ctx, A), reps)
    t_get = timed(lambda: get(m, A, pre), reps)
    t_fresh = timed(lambda: get(m, A), reps)
    data = get(m, A, pre)
    ts, tr = [], []
    for _ in range(reps):
        m.seq_clear(B)
        t0 = time.perf_counter()
        put(m, data, B)
        ts.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        m.seq_rm(B, n // 2, -1)
        tr.append(time.perf_counter() - t0)
    m.seq_clear(B)
    dev_n = L.llama_state_seq_get_size_ext(m.ctx, A, ON_DEVICE)
    dev = np.empty(dev_n, np.uint8)
    t_dget = timed(lambda: get(m, A, dev, ON_DEVICE), reps)

    def dset() -> None:
        m.seq_clear(B)
        put(m, dev, B, ON_DEVICE)
    t_dset = timed(dset, reps)
    # cross-stream seq_cp: one-token decode on C holding A's n tokens, with and without a pending copy
    m.seq_cp(A, C)
    one(m, C, 1000, n)  # the pending copy happens here, outside the timings
    m.seq_rm(C, n, -1)
    base, with_cp, t_cp_call = [], [], []
    for _ in range(reps):
        base.append(one(m, C, 1000, n)[2])
        m.seq_rm(C, n, -1)
        t0 = time.perf_counter()
        m.seq_cp(A, C)
        t_cp_call.append(time.perf_counter() - t0)
        with_cp.append(one(m, C, 1000, n)[2])
        m.seq_rm(C, n, -1)
    m.seq_clear(C)
    m.seq_clear(B)
    return {"n": n, "bytes": size, "bytes_per_token": size / n,
            "partial_bytes": L.llama_state_seq_get_size_ext(m.ctx, A, PARTIAL_ONLY),
            "get_size_ms": ms(t_size), "get_ms": ms(t_get), "get_fresh_ms": ms(t_fresh),
            "set_ms": ms(float(np.median(ts))), "seq_rm_half_ms": ms(float(np.median(tr))),
            "dev_get_ms": ms(t_dget), "dev_set_ms": ms(t_dset),
            "seq_cp_call_ms": ms(float(np.median(t_cp_call))),
            "decode1_ms": ms(float(np.median(base))),
            "seq_cp_copy_ms": ms(float(np.median(with_cp)) - float(np.median(base)))}


def next_logits(m: Model, seq: int, toks: np.ndarray, pos: int) -> np.ndarray | None:
    """Logits of toks[pos] decoded alone on seq at pos (None if llama_decode
    refused); the token is removed again, so seq keeps positions < pos."""
    rc, lg, _ = one(m, seq, int(toks[pos]), pos)
    m.seq_rm(seq, pos, -1)
    return lg


def pair_logits(m: Model, s1: int, s2: int, toks: np.ndarray, pos: int) -> tuple:
    """toks[pos] at pos on s1 and on s2 in ONE batch (two streams, as an
    engine step has them): both rows of logits; the tokens are removed again."""
    m.clear()
    m.add(int(toks[pos]), pos, s1, True)
    m.add(int(toks[pos]), pos, s2, True)
    if m.decode() != 0:
        return None, None
    out = m.logits(0).copy(), m.logits(1).copy()
    m.seq_rm(s1, pos, -1)
    m.seq_rm(s2, pos, -1)
    return out


def compare(a: np.ndarray | None, b: np.ndarray | None) -> dict:
    """Bit-identical?, max |difference|, same argmax (greedy token)."""
    if a is None or b is None:
        return {"equal": False, "max_diff": None, "same_argmax": False}
    return {"equal": bool(np.array_equal(a, b)), "max_diff": float(np.max(np.abs(a - b))),
            "same_argmax": bool(np.argmax(a) == np.argmax(b))}


def exactness(m: Model, toks: np.ndarray, p: int, m_cut: int, long_n: int, refill: bool = True) -> dict:
    """Item 4: every comparison is of the logits of one token decoded alone
    (same batch shape) on two sequences that should hold the same KV.
    refill=False (--quick) gets the cut test's full own-stream A back by
    seq_cp(C, A) instead of a second prefill: C is that whole-stream copy,
    checked bit-exact above (long_full_seq_cp), and cut_src_pos_min says A
    again has every cell from 0."""
    r: dict = {"prompt": p, "m": m_cut}
    fill(m, A, toks[:p])
    put(m, get(m, A).copy(), B)
    m.seq_rm(A, m_cut, -1)
    m.seq_rm(B, m_cut, -1)
    ref = next_logits(m, A, toks, m_cut)
    r["get_set"] = compare(ref, next_logits(m, B, toks, m_cut))
    data = get(m, A).copy()  # round trip A -> bytes -> A
    m.seq_clear(A)
    put(m, data, A)
    r["round_trip"] = compare(ref, next_logits(m, A, toks, m_cut))
    m.seq_cp(A, C)
    r["seq_cp"] = compare(ref, next_logits(m, C, toks, m_cut))
    fill(m, C, toks[:m_cut])  # from scratch: one batch of m tokens instead of p, then cut
    r["scratch"] = compare(ref, next_logits(m, C, toks, m_cut))
    # sliding window: a sequence several windows long, copied by get/set
    n, half = long_n, long_n // 2
    fill(m, A, toks[:n])
    r.update(n_swa=m.n_swa, long_n=n, long_pos_min=m.pos_min(A),  # the SWA cache's (iswa seq_pos_min)
             long_bytes=L.llama_state_seq_get_size(m.ctx, A))
    put(m, get(m, A).copy(), B)
    m.seq_cp(A, C)
    r["copy_pos"] = (m.pos_min(B), m.pos_max(B))
    ref = next_logits(m, A, toks, n)
    r["long_full"] = compare(ref, next_logits(m, B, toks, n))
    r["long_full_pair"] = compare(*pair_logits(m, A, B, toks, n))
    r["long_full_seq_cp"] = compare(ref, next_logits(m, C, toks, n))
    data = get(m, A).copy()  # A restored from bytes: B's cell layout
    m.seq_clear(A)
    put(m, data, A)
    r["long_full_both_restored"] = compare(next_logits(m, A, toks, n), next_logits(m, B, toks, n))
    if refill:  # A restored from bytes has only the window: a full own-stream A again
        fill(m, A, toks[:n])
    else:
        m.seq_clear(A)
        m.seq_cp(C, A)
    r["cut_src_pos_min"] = m.pos_min(A)
    # cut below the copy's window: B keeps no SWA cell
    m.seq_rm(A, half, -1)
    m.seq_rm(B, half, -1)
    r["cut_pos"] = (m.pos_min(B), m.pos_max(B))
    ref = next_logits(m, A, toks, half)
    r["long_cut"] = compare(ref, next_logits(m, B, toks, half))
    put(m, get(m, A).copy(), B)  # cut first, then copied: the window below `half` comes along
    r["cut_then_copy_pos"] = (m.pos_min(B), m.pos_max(B))
    r["cut_then_copy"] = compare(ref, next_logits(m, B, toks, half))
    r["cut_then_copy_pair"] = compare(*pair_logits(m, A, B, toks, half))
    for s in (A, B, C):
        m.seq_clear(s)
    return r


def steps(gs: list[int], past: int, threads: int, fa: str, reps: int) -> dict[int, float]:
    """Item 3: ms of one pure decode step at g streams, each with `past` tokens of KV."""
    n = max(gs)
    cfg = Config(parallel=n + 1, ctx_size=(n + 1) * max(1024, past + 256), threads=threads,
                 flash_attn=fa)
    with Model(cfg) as m:
        rng = np.random.default_rng(1)
        for s in range(n):
            fill(m, s, rng.integers(1000, 20000, past).astype(np.int32))
        step_time(m, n, 0, past, np.zeros(1, np.int32), 1)  # warm-up
        return {g: ms(step_time(m, g, 0, past, np.zeros(1, np.int32), reps)) for g in gs}


def report(rows: list[dict], st: dict[int, float], ex: dict, a: argparse.Namespace) -> None:
    print(f"KV copies with per-slot streams: -np 4, {a.cells} cells per slot, -t {a.threads} -fa {a.fa}, swa_full, "
          f"medians of {a.reps}; ms\n")
    gs = sorted(st)
    print("| N | bytes | bytes/token | get_size | get (prealloc) | get (fresh) | set | seq_rm N/2 | "
          + " | ".join(f"get+set in steps@{g}" for g in gs)
          + " | seq_cp call | seq_cp copy at decode | dev get | dev set | PARTIAL_ONLY bytes |")
    print("|" + "---|" * (13 + len(gs)))
    for r in rows:
        gset = r["get_ms"] + r["set_ms"]
        print(f"| {r['n']} | {r['bytes']} | {r['bytes_per_token']:.0f} | {r['get_size_ms']:.3f} | "
              f"{r['get_ms']:.2f} | {r['get_fresh_ms']:.2f} | {r['set_ms']:.2f} | {r['seq_rm_half_ms']:.3f} | "
              + " | ".join(f"{gset / st[g]:.2f}" for g in gs)
              + f" | {r['seq_cp_call_ms']:.3f} | {r['seq_cp_copy_ms']:.1f} (decode {r['decode1_ms']:.1f}) | "
              f"{r['dev_get_ms']:.2f} | {r['dev_set_ms']:.2f} | {r['partial_bytes']} |")
    print(f"\npure decode step (scripts/step_cost.py step_time, {a.past} tokens of KV each):\n")
    print("| streams | step ms |\n|---|---|")
    for g in gs:
        print(f"| {g} | {st[g]:.2f} |")
    print("\nexactness: one token decoded alone on each side; bit-identical logits "
          "(np.array_equal), max |diff|, same argmax:\n")
    print("| check | equal | max diff | same argmax |\n|---|---|---|---|")
    p, mc, n, h = ex["prompt"], ex["m"], ex["long_n"], ex["long_n"] // 2
    for key, what in (("get_set", f"get/set A->B, both cut to m={mc} of {p}"),
                      ("round_trip", f"round trip A -> bytes -> A, m={mc}"),
                      ("seq_cp", f"seq_cp(A, C) whole stream, m={mc}"),
                      ("scratch", f"from-scratch prefill of m={mc} (not asserted)"),
                      ("long_full", f"{n} tokens (n_swa {ex['n_swa']}): get/set A->B, continued at {n}"),
                      ("long_full_pair", f"{n} tokens: the same, A and B in one batch"),
                      ("long_full_seq_cp", f"{n} tokens: seq_cp(A, C), continued at {n}"),
                      ("long_full_both_restored", f"{n} tokens: A restored from bytes vs B, at {n}"),
                      ("long_cut", f"{n} tokens copied, both cut to {h}"),
                      ("cut_then_copy", f"{n} tokens, A cut to {h}, then get/set A->B"),
                      ("cut_then_copy_pair", f"the same, A and B in one batch")):
        c = ex[key]
        d = "-" if c["max_diff"] is None else f"{c['max_diff']:.3g}"
        print(f"| {what} | {c['equal']} | {d} | {c['same_argmax']} |")
    print(f"\nsliding window: pos_min..max of the {n}-token sequence on its own stream: "
          f"{ex['long_pos_min']}..{n - 1}; its get/set copy: {ex['long_bytes']} bytes, "
          f"{ex['copy_pos'][0]}..{ex['copy_pos'][1]}; cut to {h}: {ex['cut_pos'][0]}..{ex['cut_pos'][1]}; "
          f"cut, then copied: {ex['cut_then_copy_pos'][0]}..{ex['cut_then_copy_pos'][1]} "
          "(llama_memory_seq_pos_min/max report the SWA cache)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-N", "--tokens", type=int, nargs="+", default=[128, 512, 2048, 8000])
    ap.add_argument("-g", "--streams", type=int, nargs="+", default=[4, 8, 32], help="decode steps compared")
    ap.add_argument("--cells", type=int, default=8192, help="cells per slot")
    ap.add_argument("--past", type=int, default=256, help="KV tokens per stream in the decode steps")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--fa", default="auto", choices=("on", "off", "auto"))
    ap.add_argument("--quick", action="store_true", help="small sizes (the test)")
    ap.add_argument("--json", action="store_true", help="also print the figures as one JSON line")
    a = ap.parse_args(argv)
    if a.quick:
        a.tokens, a.streams, a.cells, a.past, a.reps = [128, 512], [4, 8], 2048, 64, 3
    long_n = min(a.cells - 256, 4096 if not a.quick else 1536)
    cfg = Config(parallel=4, ctx_size=4 * a.cells, threads=a.threads, flash_attn=a.fa)
    with Model(cfg) as m:
        toks = np.random.default_rng(0).integers(1000, 20000, a.cells).astype(np.int32)
        ex = exactness(m, toks, 300, 200, long_n, refill=not a.quick)
        rows = [sizes(m, n, toks, a.reps) for n in a.tokens if n < m.n_ctx_slot]
    st = steps(a.streams, a.past, a.threads, a.fa, a.reps)
    report(rows, st, ex, a)
    if a.json:
        print(json.dumps({"rows": rows, "steps_ms": st, "exact": ex}))
    ok = all(ex[k]["equal"] for k in EXACT)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
