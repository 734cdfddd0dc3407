"""Crashes: a worker SIGKILLed while holding leases, and a launcher SIGKILLed
while its arena exists.

Why: a gunicorn worker can be killed at any instruction (timeout -> SIGABRT
-> SIGKILL, OOM killer), leaving semaphore units taken and counters half
stored; POSIX shm outlives a dead launcher. The engine must notice and
reclaim the index, a replacement worker must work, and the next start must
remove what a dead instance left in /dev/shm without touching a live one.
"""
from __future__ import annotations

import os
import signal
import time
from typing import Callable

import _procs
from _procs import tok
from ipc import shm
from ipc.arena import Arena
from ipc.client import WorkerPort
from ipc.layout import ST_STOPPING


def test_worker_death_is_detected_and_its_index_reused(make_arena: Callable[..., Arena]) -> None:
    a = make_arena(**_procs.SMALL)
    events, out = _procs.CTX.Queue(), _procs.CTX.Queue()
    eng = _procs.start(_procs.engine_main, a.instance, events, {"step_s": 0.002})
    holder = None
    try:
        _procs.wait_event(events, "ready")
        holder = _procs.start(_procs.holder_main, a.instance, 1, 3, out)
        _kind, w, chans = _procs.wait_event(out, "held", timeout=30)
        assert list(chans) and all(c in a.channels_of(1) for c in chans)
        deadline = time.monotonic() + 5
        while not all(len(a.channel(c).ring) > 5 for c in chans) and time.monotonic() < deadline:
            time.sleep(0.01)  # tokens pile up for the holder: mid-stream
        t_kill = time.monotonic_ns()
        os.kill(holder.pid, signal.SIGKILL)
        ev = _procs.wait_event(events, "reclaim", timeout=5, pred=lambda e: e[1] == 1 and e[2] > t_kill)
        detect_s = (ev[2] - t_kill) / 1e9
        print(f"worker death reclaimed {detect_s * 1e3:.1f} ms after SIGKILL")
        assert detect_s < 0.2, f"death noticed after {detect_s:.3f} s"
        time.sleep(0.02)  # the engine finishes the reset it reported
        for c in a.channels_of(1):
            r = a.channel(c).ring
            assert r.head == r.tail and r.items.value == 0 and r.space.value == r.cap, c
        sub = a.sub_ring(1)
        assert sub.head == sub.tail and sub.items.value == 0 and sub.space.value == sub.cap
        # a replacement worker for the same index registers and is served
        port = WorkerPort(a, 1)
        port.register(timeout=2.0)
        for tag in (61, 62):
            with port.lease() as lease:
                assert lease.channel.index in a.channels_of(1)
                lease.submit([tag], {"n_predict": 4})
                toks = [lease.read(timeout=2.0) for _ in range(4)]
                assert [t.token for t in toks] == [tok(tag, i) for i in range(4)] and toks[-1].last
                assert lease.read(timeout=0.05) is None
    finally:
        a.set("state", ST_STOPPING)
        _procs.stop(*(p for p in (holder, eng) if p is not None), timeout=5)


def test_sweep_removes_a_dead_launchers_objects_only(make_arena: Callable[..., Arena]) -> None:
    live = make_arena(**_procs.SMALL)  # launched by this (live) process
    out = _procs.CTX.Queue()
    rx, tx = _procs.CTX.Pipe(duplex=False)
    launcher = _procs.start(_procs.launcher_main, tx, _procs.SMALL)
    dead = None
    try:
        assert rx.poll(30)
        dead = rx.recv()
        before = set(os.listdir(shm.SHM_DIR))
        dead_entries = set(shm.instance_entries(dead))
        live_entries = set(shm.instance_entries(live.instance))
        assert dead_entries and live_entries and dead_entries | live_entries <= before
        os.kill(launcher.pid, signal.SIGKILL)
        launcher.join(5)  # reaped, as its parent would; its objects stay behind
        assert set(shm.instance_entries(dead)) == dead_entries
        sweeper = _procs.start(_procs.sweeper_main, out)
        removed = out.get(timeout=30)
        _procs.stop(sweeper)
        after = set(os.listdir(shm.SHM_DIR))
        assert dead in removed and live.instance not in removed
        assert not dead_entries & after, sorted(dead_entries & after)
        assert live_entries <= after
        again = Arena.attach(live.instance)  # the live instance still works
        assert again.geom == live.geom
        again.close()
    finally:
        _procs.stop(launcher, timeout=1)
        if dead is not None:
            shm.unlink_instance(dead)
