"""The four token-delivery transports scripts/bench_ipc.py compares.

Each has a reader (``reader_proc``, run in spawned processes) and a producer
side (``setup``): ring (Arena, EnginePort / WorkerPort + Lease.read),
notify_all (one shared store behind one mp.Condition), mp_queue (one Queue
per reader) and unix_socket (one SOCK_SEQPACKET socket per reader). Kept
apart from the driver so that each file stays one thing.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import socket
import struct
import threading
import time
from typing import Any, Callable

import numpy as np

from ipc.arena import Arena, Geometry
from ipc.client import WorkerPort
from ipc.layout import F_LAST, SUB_SUBMIT
from ipc.server import EnginePort

IMPLS = ("ring", "notify_all", "mp_queue", "unix_socket")
CTX = mp.get_context("spawn")
REC = struct.Struct("<qq")  # t_ns, value (unix socket)
LAST = 1 << 40  # value flag for the baselines: the final token


class Stats:
    """What one reader thread saw."""

    def __init__(self, rid: int) -> None:
        self.rid, self.count, self.bad, self.last_ns, self.lat = rid, 0, 0, 0, []

    def got(self, t_ns: int, value: int) -> None:
        now = time.monotonic_ns()
        self.lat.append(now - t_ns)
        self.bad += value != self.count  # values are step numbers: order and completeness
        self.count += 1
        self.last_ns = now

    def result(self) -> dict:
        return {"rid": self.rid, "count": self.count, "bad": self.bad, "last_ns": self.last_ns,
                "lat": np.asarray(self.lat, np.int64)}


def reader_proc(impl: str, p: int, ids: list[int], shared: Any, conn: Any) -> None:
    """One reader process: a thread per reader id, each receiving until LAST."""
    ready = threading.Barrier(len(ids) + 1, timeout=60)
    stats = [Stats(r) for r in ids]
    arena = port = None
    if impl == "ring":
        arena = Arena.attach(shared)
        port = WorkerPort(arena, p)
        port.register(timeout=30)

    def body(st: Stats) -> None:
        if impl == "ring":
            with port.lease() as lease:
                lease.submit([st.rid + 1], {"n_predict": 1})
                ready.wait()
                while True:
                    tk = lease.read(timeout=30.0)
                    if tk is not None:
                        st.got(tk.t_ns, tk.token)
                    if tk is None or tk.last:
                        return
        elif impl == "notify_all":
            cond, arr, count = shared
            cursor = 0
            ready.wait()
            while True:
                mine = []
                with cond:
                    while not mine:
                        n = count.value
                        for i in range(cursor, n):  # scan everything new for our id
                            if arr[3 * i] == st.rid:
                                mine.append((arr[3 * i + 1], arr[3 * i + 2]))
                        cursor = n
                        if not mine and not cond.wait(30.0):
                            return
                for t_ns, value in mine:
                    st.got(t_ns, value & ~LAST)
                if mine[-1][1] & LAST:
                    return
        elif impl == "mp_queue":
            q = shared[st.rid]
            ready.wait()
            while True:
                t_ns, value = q.get(timeout=30.0)
                st.got(t_ns, value & ~LAST)
                if value & LAST:
                    return
        else:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            s.connect(shared)
            s.sendall(struct.pack("<q", st.rid))
            ready.wait()
            with s:
                while True:
                    t_ns, value = REC.unpack(s.recv(REC.size))
                    st.got(t_ns, value & ~LAST)
                    if value & LAST:
                        return

    threads = [threading.Thread(target=body, args=(st,), daemon=True) for st in stats]
    for th in threads:
        th.start()
    ready.wait()
    conn.send("ready")
    for th in threads:
        th.join()
    conn.send([st.result() for st in stats])
    if arena is not None:
        arena.close()


# ------------------------------------------------------------------ producers
def wait_until(cond: Callable[[], bool], timeout: float = 60.0) -> None:
    """Poll ``cond``; a reader that failed to start must not hang the run."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise RuntimeError("readers did not get ready")
        time.sleep(0.001)


def setup(impl: str, n: int, steps: int, groups: list[list[int]], tmp: str) -> tuple[Any, Callable, Callable]:
    """Shared objects for one run; returns (shared, connect, cleanup). connect()
    runs while the readers start and returns the per-step send function."""
    if impl == "ring":
        arena = Arena.create(Geometry(n_workers=len(groups), n_chan=max(map(len, groups)), ring_cap=256,
                                      sub_cap=256, max_prompt=4, n_slots=1))
        engine = EnginePort(arena, lambda w, chans: None)
        engine.ready()

        def connect(is_ready: Callable[[], bool]) -> Callable:
            targets = []

            def intake() -> bool:  # registrations and the N submissions
                for kind, c, rid, _ in engine.poll():
                    if kind == SUB_SUBMIT:
                        ch = arena.channel(c)
                        ch.read_request(n + 1)
                        targets.append((ch.push, rid))
                return len(targets) == n and is_ready()
            wait_until(intake)
            mono = time.monotonic_ns

            def send_step(value: int, last: bool) -> int:
                flags = F_LAST if last else 0
                full = 0
                for push, rid in targets:
                    # a reader 256 tokens behind: the engine would pause or cancel; dropped, counted
                    full += not push(rid, mono(), value, flags)
                return full
            return send_step

        return arena.instance, connect, lambda: (arena.unlink(), arena.close())
    if impl == "notify_all":
        cond = CTX.Condition(CTX.Lock())
        arr = CTX.RawArray("q", 3 * n * steps)
        count = CTX.RawValue("q", 0)

        def connect(is_ready: Callable[[], bool]) -> Callable:
            wait_until(is_ready)
            mono = time.monotonic_ns

            def send_step(value: int, last: bool) -> int:
                v = value | (LAST if last else 0)
                for r in range(n):
                    with cond:  # one shared store, one lock, wake everybody
                        i = count.value
                        arr[3 * i], arr[3 * i + 1], arr[3 * i + 2] = r, mono(), v
                        count.value = i + 1
                        cond.notify_all()
                return 0
            return send_step
        return (cond, arr, count), connect, lambda: None
    if impl == "mp_queue":
        queues = [CTX.Queue() for _ in range(n)]

        def connect(is_ready: Callable[[], bool]) -> Callable:
            wait_until(is_ready)
            mono = time.monotonic_ns

            def send_step(value: int, last: bool) -> int:
                v = value | (LAST if last else 0)
                for q in queues:
                    q.put((mono(), v))
                return 0
            return send_step

        # the run is over: never hang on a dead reader's pipe
        return queues, connect, lambda: [(q.cancel_join_thread(), q.close()) for q in queues]
    path = os.path.join(tmp, f"bench-{n}.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    srv.bind(path)
    srv.listen(n)
    socks: list[socket.socket] = []

    def connect(is_ready: Callable[[], bool]) -> Callable:
        srv.settimeout(60)  # a reader that failed to start must not hang the run
        by_id = {}
        for _ in range(n):
            s, _ = srv.accept()
            by_id[struct.unpack("<q", s.recv(8))[0]] = s
        socks.extend(by_id[r] for r in range(n))
        wait_until(is_ready)
        mono = time.monotonic_ns
        sends = [s.send for s in socks]

        def send_step(value: int, last: bool) -> int:
            v = value | (LAST if last else 0)
            for send in sends:
                send(REC.pack(mono(), v))
            return 0
        return send_step

    return path, connect, lambda: ([s.close() for s in socks], srv.close(), os.unlink(path))
