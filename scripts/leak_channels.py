#!/usr/bin/env python3
"""Measure memory growth over N channel lifecycles (the seed's leak test).

llama-server's result queue kept every result still queued when its reader
went away (remove_waiting_task_ids never purged them): 56 bytes per
disconnect, unbounded. Here results live in a fixed ring inside the channel,
so a lifecycle that ends with a result still queued must cost nothing.

One lifecycle, all in this process (it measures the ipc code, not IPC):
lease, submit, the engine side takes the submission and pushes one token
record, then the lease is closed unread (a client disconnect: cancel and
release), and the engine takes the cancel and ends the request (a LAST
record, which lets the worker lease that channel again: ipc/client.py).

Usage: python scripts/leak_channels.py N [--warmup 1000]
Last line of output, exactly: rss_growth_kb=<integer>
(VmRSS from /proc/self/status after the warm-up vs after the N lifecycles.)
"""
from __future__ import annotations

import argparse
import gc
import sys
import time

from ipc.arena import Arena, Geometry
from ipc.client import WorkerPort
from ipc.layout import F_LAST, STOP_CANCEL, STOP_SHIFT, SUB_CANCEL, SUB_SUBMIT
from ipc.server import EnginePort

from frontends.testing.fake_engine import register_polled as register

N_VOCAB = 32000
PROMPT = list(range(1, 33))
PARAMS = {"n_predict": 16, "temperature": 0.8, "top_k": 40, "top_p": 0.95, "seed": 42}


def rss_kb() -> int:
    """Resident set size of this process in kB (VmRSS)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status")




def lifecycles(n: int, port: WorkerPort, engine: EnginePort, arena: Arena) -> dict[str, int]:
    """Run n lifecycles; returns counts that prove each step happened."""
    seen = {"submits": 0, "cancels": 0, "pushed": 0, "discarded_by_release": 0}
    for _ in range(n):
        lease = port.lease()
        lease.submit(PROMPT, PARAMS)
        for kind, c, rid, _arg in engine.poll():
            if kind == SUB_SUBMIT:
                seen["submits"] += 1
                ch = arena.channel(c)
                ch.read_request(N_VOCAB)
                seen["pushed"] += ch.push(rid, time.monotonic_ns(), 7, 0)
        ring = lease.channel.ring
        queued = len(ring)
        lease.close()  # unread: cancel, then release discards the queued token
        seen["discarded_by_release"] += queued - len(ring)
        for kind, c, rid, _arg in engine.poll():
            if kind == SUB_CANCEL:
                seen["cancels"] += 1
                arena.channel(c).push(rid, time.monotonic_ns(), -1, F_LAST | STOP_CANCEL << STOP_SHIFT)
        engine.wait(0)  # drain the doorbell, as the idle engine does
    return seen


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("n", type=int, help="lifecycles to measure")
    ap.add_argument("--warmup", type=int, default=1000)
    args = ap.parse_args()
    arena = Arena.create(Geometry(n_workers=2, n_chan=4, ring_cap=64, sub_cap=64, max_prompt=256, n_slots=1))
    try:
        engine = EnginePort(arena, lambda w, chans: None)
        engine.ready()
        port = WorkerPort(arena, 0)
        register(port, engine)
        lifecycles(args.warmup, port, engine, arena)
        gc.collect()
        before = rss_kb()
        t = time.perf_counter()
        seen = lifecycles(args.n, port, engine, arena)
        elapsed = time.perf_counter() - t
        gc.collect()
        after = rss_kb()
        ok = all(v == args.n for v in seen.values())
        print(f"lifecycles={args.n} warmup={args.warmup} us_per_lifecycle={elapsed / max(args.n, 1) * 1e6:.1f}")
        print(" ".join(f"{k}={v}" for k, v in seen.items()) + ("" if ok else "  (MISMATCH)"))
        print(f"rss_before_kb={before} rss_after_kb={after} leased_now={port.leased} unended_now={port.unended}")
        del engine, port
    finally:
        arena.unlink()
        arena.close()
    print(f"rss_growth_kb={after - before}")
    if not ok:
        sys.exit(1)


if __name__ == "__main__":
    main()
