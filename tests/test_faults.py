"""Process deaths against a real ringserve with the real model (issue 6, items 2 and 3).

Why the real engine: what must hold is the whole chain (gunicorn reaping and
replacing a worker, the engine noticing a dead reader, the launcher noticing
a dead engine and reloading the model), each within its second. Timing
bounds are the issue's (1 s); everything else waits generously, because the
box is a noisy 2-core VM.
"""
from __future__ import annotations

import os
import signal
import sys
import time

import psutil
import pytest

from frontends import testing as S
from ipc.layout import CH_LEASED

FLAGS = ("-c", "4096", "-np", "8", "-t", "2", "-w", "2", "--threads-http", "8", "--metrics")
LONG = {"prompt": "Write a long story about a lighthouse keeper.", "n_predict": 100000, "temperature": 0}
CONTROL = {"prompt": S.PROMPTS[0], "n_predict": 16, "temperature": 0, "cache_prompt": False}


def leased_by(arena) -> dict[tuple[int, int], int]:
    """(channel, request id) -> owner pid of every leased channel. The request
    id is part of the key: a channel released by the previous request and
    leased again by the next one is a new lease."""
    out = {}
    for i in range(arena.geom.n_channels):
        h = arena.channel(i).hdr[0]
        if int(h["state"]) == CH_LEASED:
            out[(i, int(h["rid"]))] = int(h["owner_pid"])
    return out


def open_stream(srv: S.Server, arena, body: dict) -> tuple[S.Stream, int, int]:
    """Start a stream, wait for its first event; (streamer, channel, worker pid)."""
    before = leased_by(arena)
    st = S.Stream(srv.url("/completion"), body)
    st.start()
    assert st.first.wait(60) and st.events and st.error is None, (st.status, st.error)
    new = {c: p for c, p in leased_by(arena).items() if c not in before}
    assert len(new) == 1, new
    ((chan, _rid), pid), = new.items()
    return st, chan, pid


@pytest.fixture(scope="module")
def server():
    """One server for both tests (a start is seconds of the suite): each test
    begins from an idle server (no busy slot, no leased channel) whatever the
    other did to it, a killed worker being replaced and a killed engine
    restarted by design; the server must still shut down clean after both."""
    srv = S.Server(*FLAGS)
    arena = srv.arena()
    try:
        yield srv, arena
    finally:
        arena.close()
        rc, left = srv.finish()
    assert rc == 0 and left == []


def idle(srv: S.Server, arena) -> None:
    """Wait until the previous test's requests are gone (dropped streams end within a step or two)."""
    srv.wait_ready(60)
    S.wait_for(lambda: S.busy_slots(srv.base) == 0 and not leased_by(arena), 30,
               "the shared server going idle between tests")


def test_worker_sigkill_frees_its_slots_and_spares_the_others(server) -> None:
    srv, arena = server
    idle(srv, arena)
    streams: dict[int, list[tuple[S.Stream, int]]] = {}
    try:
        victim = None
        for _ in range(40):  # the kernel picks the worker: keep 4 on one, 2 on the other
            st, chan, pid = open_stream(srv, arena, dict(LONG, n_predict=200))
            victim = victim or pid
            mine = streams.setdefault(pid, [])
            if len(mine) >= (4 if pid == victim else 2):
                st.drop()
                st.join(10)
                continue
            mine.append((st, chan))
            if len(streams.get(victim, [])) == 4 and sum(len(v) for p, v in streams.items() if p != victim) >= 1:
                break
        others = [x for p, v in streams.items() if p != victim for x in v]
        assert len(streams[victim]) == 4 and others, "could not place 4 streams on one worker and 1 on the other"
        assert S.wait_for(lambda: S.busy_slots(srv.base) == 4 + len(others), 10) is not None
        sent = {id(st): len(st.events) for st, _ in others}
        t0 = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        freed = S.waited(lambda: S.busy_slots(srv.base) == len(others), 5, step=0.01)
        print(f"worker SIGKILL: its 4 slots free after {freed:.3f} s")
        assert freed is not None and freed < S.WITHIN, freed
        # its channels: rings empty, headers free (the engine reclaimed the index)
        for _, chan in streams[victim]:
            ch = arena.channel(chan)
            assert ch.ring.head == ch.ring.tail and int(ch.hdr[0]["state"]) != CH_LEASED
        assert S.wait_for(lambda: S.metrics(srv.base).get("ringserve:channels_leased") == len(others), 5) is not None
        # gunicorn forks a replacement, and it serves at once
        new = S.wait_for(lambda: len([p for p in srv.worker_pids() if p != victim]) == 2, 30)
        assert new is not None, srv.log()[-2000:]
        fresh = [p for p in srv.worker_pids() if p not in streams][0]
        for _ in range(40):
            # long enough to be still leased when its first event arrives (4 tokens could end first)
            st, _chan, pid = open_stream(srv, arena, dict(LONG, n_predict=24))
            st.join(60)
            assert st.done and st.error is None
            if pid == fresh:
                break
        else:
            raise AssertionError("the replacement worker never served a request")
        served = time.monotonic() - t0
        print(f"replacement worker {fresh} served {served:.2f} s after the SIGKILL")
        assert served < 60  # includes probes the kernel routed to the old worker; the figure is printed
        # the other worker's streams go on untouched: more tokens after the kill, no error
        for st, _ in others:
            grew = S.wait_for(lambda: st.done or len(st.events) >= sent[id(st)] + 5, 300, step=0.1)
            assert grew is not None and st.error is None, (st.error, len(st.events), sent[id(st)])
    finally:
        for v in streams.values():
            for st, _ in v:
                st.drop()


def test_engine_sigkill_fails_inflight_fast_then_restarts_clean(server) -> None:
    srv, arena = server
    idle(srv, arena)
    streams: list[S.Stream] = []
    plain: list[tuple] = []
    try:
        status, before = S.post(srv.url("/completion"), CONTROL)
        assert status == 200
        entries = srv.shm_entries()
        old = srv.engine_pid
        for i in range(4):
            st = S.Stream(srv.url("/completion"), dict(LONG, prompt=f"{LONG['prompt']} Part {i}."))
            st.start()
            streams.append(st)
        import threading

        def nonstream(i: int) -> None:
            res = S.post(srv.url("/completion"), dict(LONG, prompt=f"Describe city number {i}."), timeout=60)
            plain.append((time.monotonic(), res))

        th = [threading.Thread(target=nonstream, args=(i,)) for i in range(2)]
        for t in th:
            t.start()
        assert all(st.first.wait(60) and st.error is None for st in streams)
        assert S.wait_for(lambda: S.busy_slots(srv.base) == 6, 30) is not None
        t0 = time.monotonic()
        os.kill(old, signal.SIGKILL)
        # new requests and /health: 503 while the engine is down
        status, body = S.post(srv.url("/completion"), CONTROL, timeout=10)
        health = S.get(srv.url("/health"))[0]
        assert status == 503 and body["error"]["type"] == "unavailable_error", (status, body)
        assert health == 503
        for st in streams:
            st.join(10)
        for t in th:
            t.join(10)
        ends = [st.t_end - t0 for st in streams] + [t - t0 for t, _ in plain]
        print(f"engine SIGKILL: in-flight requests ended after {max(ends):.3f} s (max)")
        assert len(ends) == 6 and max(ends) < S.WITHIN, ends
        for st in streams:
            assert st.error is not None and st.error.get("type") == "unavailable_error", st.error
        for _t, (status, body) in plain:
            assert status == 503 and body["error"]["type"] == "unavailable_error", (status, body)
        # restarted automatically, model reloaded, same greedy answer
        srv.wait_ready(60)
        assert srv.engine_pid != old and not psutil.pid_exists(old)
        status, after = S.post(srv.url("/completion"), CONTROL)
        assert status == 200 and after["content"] == before["content"]
        # nothing left from the dead engine
        assert srv.shm_entries() == entries
        assert S.busy_slots(srv.base) == 0 and S.metrics(srv.base).get("ringserve:channels_leased") == 0
        assert [c for c, p in leased_by(arena).items()] == []
    finally:
        for st in streams:
            st.drop()


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v", "-s"]))
