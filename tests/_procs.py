"""Process bodies for the cross-process tests, started with the 'spawn' context.

Why a module of its own: spawn children import their target by module name,
so targets must live in an importable module, not inside a test. Every body
attaches to the arena by instance name (``Arena.attach``), as the real engine
and gunicorn workers do, and never unlinks it (only the creator does).
"""
from __future__ import annotations

import multiprocessing as mp
import os
import random
import threading
import time
from typing import Any

from ipc.arena import Arena
from ipc.channel import BadRequest
from ipc.client import WorkerPort
from ipc.layout import (
    CH_LEASED,
    F_FIRST,
    F_LAST,
    ST_STOPPING,
    STOP_CANCEL,
    STOP_ERROR,
    STOP_LIMIT,
    STOP_SHIFT,
    STOP_SHUTDOWN,
    SUB_CANCEL,
    SUB_SUBMIT,
)
from ipc.server import EnginePort

CTX = mp.get_context("spawn")
# Small geometry: cheap to create, rings small enough to fill and wrap.
SMALL = dict(n_workers=4, n_chan=4, ring_cap=32, sub_cap=32, max_prompt=16, n_slots=2)
N_VOCAB = 1 << 20
MIX = 0x9E3779B97F4A7C15
MASK63 = (1 << 63) - 1


def start(target: Any, *args: Any) -> mp.Process:
    """Start ``target(*args)`` in a fresh spawned interpreter."""
    p = CTX.Process(target=target, args=args, daemon=True)
    p.start()
    return p


def stop(*procs: mp.Process, timeout: float = 10.0) -> None:
    """Join, killing whatever does not exit in time (no process is left behind)."""
    for p in procs:
        p.join(timeout)
        if p.is_alive():
            p.kill()
            p.join()


def tok(tag: int, i: int) -> int:
    """Token value the fake engine sends as the i-th token of request ``tag``."""
    return tag * 1000 + i


def checksum(i: int) -> int:
    """A field that depends on every bit of the sequence number."""
    return ((i * MIX) ^ (i >> 7)) & MASK63


# ------------------------------------------------------------------ engine
def engine_main(instance: str, events: Any, opts: dict) -> None:
    """A fake engine: one token per active request per step, like a decode loop.

    The first prompt id is the request's tag; the i-th token is tok(tag, i).
    opts: step_s (pause between steps), check_owner (stop requests whose lease
    changed, as the real engine does; False simulates the race window in which
    the engine has not yet seen a release), honour_cancel.
    A request it stops early it ends, as the real engine does, with a LAST
    record (STOP_CANCEL): a worker leases a channel released unfinished again
    only after that end (ipc/client.py).
    """
    a = Arena.attach(instance)
    active: dict[tuple[int, int], list[int]] = {}  # (channel, rid) -> [tag, n, i]
    ended: dict[tuple[int, int], int] = {}  # stopped early, its LAST record not pushed yet (ring full)

    def on_reclaim(w: int, chans: range) -> None:
        for d in (active, ended):
            for key in [k for k in d if k[0] in chans]:
                del d[key]
        events.put(("reclaim", w, time.monotonic_ns()))

    port = EnginePort(a, on_reclaim)
    port.ready()
    events.put(("ready", os.getpid(), port.epoch))
    step_s = opts.get("step_s", 0.002)
    try:
        while a.state != ST_STOPPING:
            for kind, c, rid, _arg in port.poll():
                ch = a.channel(c)
                if kind == SUB_SUBMIT:
                    try:
                        prompt, params, _g, _b = ch.read_request(N_VOCAB)
                    except BadRequest as e:
                        ch.push(rid, time.monotonic_ns(), -1, F_LAST | STOP_ERROR << STOP_SHIFT)
                        events.put(("bad", c, str(e)))
                        continue
                    active[(c, rid)] = [int(prompt[0]), params["n_predict"], 0]
                elif kind == SUB_CANCEL and opts.get("honour_cancel", True):
                    if active.pop((c, rid), None) is not None:
                        ended[(c, rid)] = STOP_CANCEL
            for (c, rid), stop in list(ended.items()):
                if a.channel(c).push(rid, time.monotonic_ns(), -1, F_LAST | stop << STOP_SHIFT):
                    del ended[(c, rid)]
            if not active:
                port.wait(0.02 if not ended else 0.002)
                continue
            for (c, rid), req in list(active.items()):
                tag, n, i = req
                if opts.get("check_owner", True) and not port.owner_ok(c, rid):
                    del active[(c, rid)]
                    ended[(c, rid)] = STOP_CANCEL
                    continue
                last = i + 1 == n
                flags = (F_FIRST if i == 0 else 0) | ((F_LAST | STOP_LIMIT << STOP_SHIFT) if last else 0)
                if a.channel(c).push(rid, time.monotonic_ns(), tok(tag, i), flags):
                    req[2] = i + 1
                    if last:
                        del active[(c, rid)]
                        events.put(("done", c, rid, time.monotonic_ns()))
            time.sleep(step_s)
        # Shutdown: one LAST record to every leased channel wakes its reader.
        for c in range(a.geom.n_channels):
            ch = a.channel(c)
            h = ch.hdr[0]
            if h["state"] == CH_LEASED:
                ch.push(int(h["rid"]), time.monotonic_ns(), -1, F_LAST | STOP_SHUTDOWN << STOP_SHIFT)
        events.put(("stopped", time.monotonic_ns()))
    finally:
        a.close()


def wait_event(events: Any, kind: str, timeout: float = 10.0, pred: Any = None) -> tuple:
    """The next event of ``kind`` (satisfying ``pred``), skipping others."""
    deadline = time.monotonic() + timeout
    while True:
        ev = events.get(timeout=max(deadline - time.monotonic(), 0.01))
        if ev[0] == kind and (pred is None or pred(ev)):
            return ev


# ------------------------------------------------------------------ readers
def reader_main(instance: str, w: int, n_threads: int, n_requests: int, n_predict: int, out: Any) -> None:
    """Worker process ``w``: threads run requests back to back, each checking
    that it sees exactly its own tokens, in order. Every third request is
    abandoned after a few tokens so released channels still receive records."""
    a = Arena.attach(instance)
    port = WorkerPort(a, w)
    errors: list[str] = []
    served = [0]
    lock = threading.Lock()

    def body(t: int) -> None:
        for r in range(n_requests):
            tag = 1 + w * 10000 + t * 100 + r
            abandon = r % 3 == 2
            with port.lease() as lease:
                lease.submit([tag], {"n_predict": n_predict})
                for i in range(3 if abandon else n_predict):
                    tk = lease.read(timeout=5.0)
                    if tk is None or tk.token != tok(tag, i):
                        with lock:
                            errors.append(f"w{w} t{t} r{r} i{i}: got {tk and tk.token}, want {tok(tag, i)}")
                        return
                    if tk.last != (i + 1 == n_predict):
                        with lock:
                            errors.append(f"w{w} t{t} r{r} i{i}: LAST flag {tk.last}")
                with lock:
                    served[0] += 1

    try:
        port.register()
        threads = [threading.Thread(target=body, args=(t,)) for t in range(n_threads)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        out.put(("reader", w, served[0], errors))
    finally:
        a.close()


def parked_main(instance: str, w: int, n_parked: int, n_streaming: int, out: Any) -> None:
    """Worker ``w`` with readers parked on empty channels and readers mid-stream;
    each reports how long after the engine stamped the final record it woke."""
    a = Arena.attach(instance)
    port = WorkerPort(a, w)
    results: list[tuple] = []
    lock = threading.Lock()
    ready = threading.Barrier(n_parked + n_streaming + 1)

    def body(streaming: bool) -> None:
        with port.lease() as lease:
            if streaming:
                lease.submit([7], {"n_predict": 1 << 30})
            ready.wait()
            while True:
                tk = lease.read(timeout=10.0)
                now = time.monotonic_ns()
                if tk is None or tk.last:
                    with lock:
                        results.append((streaming, tk and tk.stop, (now - tk.t_ns) if tk else None))
                    return

    try:
        port.register()
        threads = [threading.Thread(target=body, args=(i < n_streaming,)) for i in range(n_parked + n_streaming)]
        for th in threads:
            th.start()
        ready.wait()
        out.put(("parked", w))
        for th in threads:
            th.join()
        out.put(("woke", w, results))
    finally:
        a.close()


def holder_main(instance: str, w: int, n_leases: int, out: Any) -> None:
    """Worker ``w`` that leases channels, submits endless requests and then
    sits there until it is SIGKILLed (a gunicorn worker dying mid-stream)."""
    a = Arena.attach(instance)
    port = WorkerPort(a, w)
    port.register()
    leases = [port.lease() for _ in range(n_leases)]
    for i, lease in enumerate(leases):
        lease.submit([50 + i], {"n_predict": 1 << 30})
    leases[0].read(timeout=5.0)  # one reader mid-stream
    out.put(("held", w, [lease.channel.index for lease in leases]))
    time.sleep(60)


def launcher_main(conn: Any, geom: dict) -> None:
    """Create an arena, say its name, and wait to be killed. It answers on a
    Pipe, not a Queue: a process killed right after Queue.put may die holding
    the queue's shared write lock."""
    from ipc.arena import Geometry

    a = Arena.create(Geometry(**geom))
    conn.send(a.instance)
    time.sleep(60)


def sweeper_main(out: Any) -> None:
    """Run the start-up sweep from a fresh process."""
    out.put(Arena.sweep())


# ------------------------------------------------------------------ stress
def stress_producer(instance: str, n: int, seed: int, out: Any) -> None:
    """Push n checksummed SUB records into submission ring 0, never blocking:
    a full ring makes it back off and retry; random pauses shake the timing."""
    a = Arena.attach(instance)
    ring = a.sub_ring(0)
    push = ring.push
    rng = random.Random(seed)
    full = 0
    i = 0
    nxt = rng.randrange(1, 20000)
    try:
        while i < n:
            if push(i, i & 0xFFFFFFFF, 1, 0, checksum(i)):
                i += 1
                if i == nxt:
                    nxt += rng.randrange(1, 20000)
                    time.sleep(rng.uniform(0, 0.002))
            else:
                full += 1  # never wait on the ring: back off and retry
                time.sleep(0.00005)
        out.put(("producer", i, full))
    finally:
        a.close()


def stress_consumer(instance: str, n: int, seed: int, out: Any) -> None:
    """Pop n records from submission ring 0 and check each one's position,
    payload and checksum: nothing lost, duplicated or reordered."""
    a = Arena.attach(instance)
    ring = a.sub_ring(0)
    pop = ring.pop
    rng = random.Random(seed + 1)
    errors: list[str] = []
    i = 0
    nxt = rng.randrange(1, 20000)
    try:
        base = ring.tail
        while i < n:
            rec = pop(0)
            if rec is None:
                rec = pop(5.0)
                if rec is None:
                    errors.append(f"stalled at {i}")
                    break
            seq, rid, ch, kind, _pad, arg = rec
            if seq != base + i or rid != i or ch != i & 0xFFFFFFFF or kind != 1 or arg != checksum(i):
                errors.append(f"record {i}: {rec}")
                if len(errors) > 10:
                    break
            i += 1
            if i == nxt:
                nxt += rng.randrange(1, 20000)
                time.sleep(rng.uniform(0, 0.002))
        extra = pop(0.2)
        if extra is not None:
            errors.append(f"extra record after {n}: {extra}")
        out.put(("consumer", i, errors))
    finally:
        a.close()


def kv_residency(lazy: bool, out: str) -> None:
    """tests/test_memory.py's real-model half, in a fresh interpreter (as the
    engine is: a long test process's heap has free chunks that glibc hands a
    new buffer before it maps one, and those are not new mappings): load the
    weights, make the context with the zero-page rule on or off, write the
    KV's size, the bytes given back, the whole process's RSS growth and 8
    greedy steps' logits to ``out`` (.npz)."""
    import gc

    import numpy as np

    from engine import memory
    from engine.config import Config
    from engine.model import Model
    from engine.weights import Weights

    def rss() -> int:
        with open("/proc/self/smaps_rollup") as f:
            return next(int(x.split()[1]) * 1024 for x in f if x.startswith("Rss:"))

    if not lazy:
        memory.drop_zero_pages = lambda ranges: 0  # the control: every page resident
    cfg = Config(parallel=4, ctx_size=4096, batch_size=256, ubatch_size=256, threads=2, flash_attn="on")
    w = Weights(cfg)
    gc.collect()
    rss0 = rss()  # after the weights: their buffers (repacked tensors) hold data
    with Model(cfg, w) as m:
        grew = rss() - rss0
        prompt = m.tokenize("The quick brown fox jumps over the lazy dog. " * 8)
        m.clear()
        last = m.add_many(prompt, 0, 0, True)
        assert m.decode() == 0
        logits = [m.logits(last).copy()]
        for pos in range(len(prompt), len(prompt) + 7):
            m.clear()
            m.add(int(logits[-1].argmax()), pos, 0, True)
            assert m.decode() == 0
            logits.append(m.logits(0).copy())
        np.savez(out, kv=m.kv_bytes, dropped=m.zero_dropped, grew=grew, logits=np.stack(logits))
    w.close()
