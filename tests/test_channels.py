"""Result channels against the defects of llama-server's shared result queue
(shared/seed/llama-server-result-queue-pr.txt), as cases that must hold.

Why real processes: the guarantees are about a producer (the engine) and
readers (gunicorn workers) that share nothing but the arena. Each test runs a
fake engine (tests/_procs.engine_main: one token per request per step) in its
own process; the test process, or further spawned processes, are the workers.
"""
from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any, Callable, Iterator

import numpy as np
import posix_ipc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import _procs
from _procs import tok
from ipc import shm
from ipc.arena import Arena
from ipc.channel import BadRequest
from ipc.client import EngineUnavailable, WorkerPort
from ipc.layout import MAX_BIAS, MAX_GRAMMAR, MAX_PROBS, PARAMS, ST_STOPPING, STOP_ERROR, STOP_SHUTDOWN, SUB_SUBMIT


@pytest.fixture
def engine(make_arena: Callable[..., Arena]) -> Iterator[Callable[..., tuple[Arena, Any]]]:
    """Start a fake engine process on a fresh arena; stopped (then killed if
    need be) at teardown, draining its event queue so it can exit."""
    started: list[tuple[Arena, Any, Any]] = []

    def start(**opts: Any) -> tuple[Arena, Any]:
        a = make_arena(**_procs.SMALL)
        events = _procs.CTX.Queue()
        p = _procs.start(_procs.engine_main, a.instance, events, opts)
        started.append((a, events, p))
        _procs.wait_event(events, "ready")
        return a, events

    yield start
    for a, events, p in started:
        a.set("state", ST_STOPPING)
        deadline = time.monotonic() + 5
        while p.is_alive() and time.monotonic() < deadline:
            while not events.empty():
                events.get_nowait()
            p.join(0.05)
        _procs.stop(p, timeout=0.1)


def done_event(events: Any, rid: int) -> tuple:
    return _procs.wait_event(events, "done", pred=lambda ev: ev[2] == rid)


def test_readers_never_see_each_others_results(engine: Callable[..., tuple[Arena, Any]]) -> None:
    """Two worker processes x 4 threads, requests back to back, a third of them
    abandoned mid-stream: every reader gets exactly its own tokens, in order."""
    a, _ = engine(step_s=0.001)
    out = _procs.CTX.Queue()
    procs = [_procs.start(_procs.reader_main, a.instance, w, 4, 6, 25, out) for w in (0, 1)]
    try:
        res = sorted(out.get(timeout=60) for _ in procs)
    finally:
        _procs.stop(*procs)
    for _kind, w, served, errors in res:
        assert errors == [], errors
        assert served == 4 * 6, f"worker {w} completed {served} of 24 requests"


def test_result_sent_before_the_reader_waits_is_delivered(engine: Callable[..., tuple[Arena, Any]]) -> None:
    """No missed wake-up: tokens published while nobody waits are there when the
    reader comes; a reader parked before the request even reaches the engine
    is woken by the first token, not by its timeout."""
    a, events = engine()
    port = WorkerPort(a, 0)
    port.register()
    with port.lease() as lease:
        lease.submit([5], {"n_predict": 3})
        done_event(events, lease.rid)  # all three published, nobody reading
        for i in range(3):
            t = time.monotonic()
            tk = lease.read(timeout=2.0)
            assert tk is not None and tk.token == tok(5, i)
            assert time.monotonic() - t < 0.05
        assert lease.done
    with port.lease() as lease:
        got: list = []
        reader = threading.Thread(target=lambda: got.append((lease.read(timeout=5.0), time.monotonic())))
        reader.start()
        time.sleep(0.1)  # the reader is parked before the engine knows the request
        t = time.monotonic()
        lease.submit([6], {"n_predict": 1})
        reader.join()
        tk, woke = got[0]
        assert tk is not None and tk.token == tok(6, 0) and tk.last
        assert woke - t < 0.1, f"woken {woke - t:.3f} s after the submit"


def test_timed_read_returns_on_time(engine: Callable[..., tuple[Arena, Any]]) -> None:
    a, _ = engine()
    port = WorkerPort(a, 0)
    port.register()
    with port.lease() as lease:
        for timeout in (0.2, 0.05, 0.2):
            t = time.monotonic()
            assert lease.read(timeout=timeout) is None
            assert timeout <= time.monotonic() - t < timeout + 0.05
        t = time.monotonic()
        assert lease.read(timeout=0) is None
        assert time.monotonic() - t < 0.01


def test_timed_read_keeps_one_deadline_while_stale_records_arrive(engine: Callable[..., tuple[Arena, Any]]) -> None:
    """Records of an earlier lease keep arriving (an engine that goes on
    publishing for a request its worker took for finished): dropping them
    must not restart the reader's timeout."""
    a, events = engine(check_owner=False, honour_cancel=False, step_s=0.01)
    port = WorkerPort(a, 0)
    port.register()
    with port.lease() as old:
        old.submit([9], {"n_predict": 150})  # ~1.5 s of records at one per 10 ms
        assert old.read(timeout=2.0).token == tok(9, 0)
        index = old.channel.index
        # Taken for finished: the channel goes straight back to the free list.
        # (Released unfinished it would not, until the engine's end of it:
        # test_cancelled_channel_waits_for_the_engines_end.)
        old.done = True
    with port.lease() as lease:
        assert lease.channel.index == index
        head = lease.channel.ring.head
        t = time.monotonic()
        assert lease.read(timeout=0.2) is None
        elapsed = time.monotonic() - t
        stale = lease.channel.ring.head - head
    assert elapsed < 0.3, f"read(timeout=0.2) took {elapsed:.2f} s"
    assert stale >= 5, f"only {stale} stale records arrived during the read: the case was not exercised"


def test_result_for_a_released_lease_never_reaches_the_next(engine: Callable[..., tuple[Arena, Any]]) -> None:
    """The engine goes on publishing for the old rid into a channel that now
    belongs to a new request (a misbehaving engine: its worker took the old
    request for finished): the new reader sees only its own tokens."""
    a, events = engine(check_owner=False, honour_cancel=False, step_s=0.002)
    port = WorkerPort(a, 1)
    port.register()
    with port.lease() as old:
        old.submit([11], {"n_predict": 100})
        assert [old.read(timeout=2.0).token for _ in range(2)] == [tok(11, 0), tok(11, 1)]
        index = old.channel.index
        old.done = True  # as in the test above: straight back to the free list
    with port.lease() as lease:
        assert lease.channel.index == index
        head = lease.channel.ring.head
        lease.submit([12], {"n_predict": 30})
        toks = []
        while not lease.done:
            tk = lease.read(timeout=2.0)
            assert tk is not None
            toks.append(tk.token)
        stale = lease.channel.ring.head - head - len(toks)
    assert toks == [tok(12, i) for i in range(30)]
    assert stale >= 10, f"only {stale} records of the old lease were published: the case was not exercised"


def test_release_with_results_queued_leaves_nothing_for_the_next_lease(
        engine: Callable[..., tuple[Arena, Any]]) -> None:
    a, events = engine()
    port = WorkerPort(a, 0)
    port.register()
    with port.lease() as old:
        old.submit([13], {"n_predict": 10})
        done_event(events, old.rid)
        assert old.read(timeout=1.0).token == tok(13, 0)
        assert len(old.channel.ring) == 9
        index = old.channel.index
    with port.lease() as lease:
        assert lease.channel.index == index
        assert len(lease.channel.ring) == 0
        assert lease.read(timeout=0.1) is None
        lease.submit([14], {"n_predict": 3})
        assert [lease.read(timeout=1.0).token for _ in range(3)] == [tok(14, i) for i in range(3)]
        assert lease.done and lease.read(timeout=0.05) is None


def test_shutdown_wakes_parked_readers_promptly(engine: Callable[..., tuple[Arena, Any]]) -> None:
    """Stopping the engine publishes a LAST/STOP_SHUTDOWN record on every leased
    channel: parked and streaming readers in two processes all return at once."""
    a, _ = engine()
    out = _procs.CTX.Queue()
    procs = [_procs.start(_procs.parked_main, a.instance, w, 3, 1, out) for w in (0, 1)]
    try:
        for _ in procs:
            _procs.wait_event(out, "parked", timeout=30)
        time.sleep(0.2)  # every reader is now inside its wait
        t = time.monotonic()
        a.set("state", ST_STOPPING)
        woke = [_procs.wait_event(out, "woke", timeout=5) for _ in procs]
        assert time.monotonic() - t < 1.0
    finally:
        _procs.stop(*procs)
    results = [r for ev in woke for r in ev[2]]
    assert len(results) == 8
    assert all(stop == STOP_SHUTDOWN for _s, stop, _l in results), results
    worst = max(lat for _s, _stop, lat in results) / 1e9
    print(f"shutdown: slowest of {len(results)} readers woke {worst * 1e3:.2f} ms after the record")
    assert worst < 0.05, f"slowest reader woke {worst * 1e3:.1f} ms after the shutdown record"


# ------------------------------------------------------------------ signals
def test_semaphore_wait_retries_on_signals(make_arena: Callable[..., Arena]) -> None:
    """gunicorn's handlers make sem_timedwait fail with EINTR; ipc.shm.wait must
    retry with what is left of its deadline, in a worker thread and in the
    main thread, with and without SA_RESTART."""
    a = make_arena(**_procs.SMALL)
    sem = a.sem("db")
    hits: list[int] = []
    old = signal.signal(signal.SIGUSR1, lambda s, f: hits.append(s))

    def in_thread(fn: Callable[[], Any], release_at: float | None = None) -> tuple[Any, float]:
        res: list = []

        def body() -> None:
            t = time.monotonic()
            try:
                r = fn()
            except posix_ipc.SignalError:
                r = "EINTR"
            res.append((r, time.monotonic() - t))

        th = threading.Thread(target=body)
        th.start()
        t0 = time.monotonic()
        while th.is_alive():
            if release_at is not None and time.monotonic() - t0 >= release_at:
                sem.release()
                release_at = None
            signal.pthread_kill(th.ident, signal.SIGUSR1)
            time.sleep(0.01)
        th.join()
        return res[0]

    try:
        for restart in (False, True):
            signal.siginterrupt(signal.SIGUSR1, not restart)
            assert in_thread(lambda: sem.acquire(0.5))[0] == "EINTR"  # the hazard is real
            r, el = in_thread(lambda: shm.wait(sem, 0.3))
            assert r is False and 0.3 <= el < 0.36, (r, el)
            r, el = in_thread(lambda: shm.wait(sem, 2.0), release_at=0.2)
            assert r is True and 0.2 <= el < 0.3, (r, el)
            r, el = in_thread(lambda: shm.wait(sem, None), release_at=0.2)
            assert r is True and 0.2 <= el < 0.3, (r, el)
        # the main thread, signalled process-wide (where Python runs the handler)
        stop = threading.Event()

        def killer() -> None:
            while not stop.wait(0.01):
                os.kill(os.getpid(), signal.SIGUSR1)

        k = threading.Thread(target=killer)
        k.start()
        try:
            t = time.monotonic()
            assert shm.wait(sem, 0.3) is False
            assert 0.3 <= time.monotonic() - t < 0.36
        finally:
            stop.set()
            k.join()
        assert len(hits) > 50
        # Ctrl-C still gets through (posix_ipc keeps KeyboardInterrupt; any other
        # exception a handler raises is swallowed, so handlers must set flags)
        old_int = signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGINT)).start()
            t = time.monotonic()
            with pytest.raises(KeyboardInterrupt):
                shm.wait(sem, 2.0)
            assert time.monotonic() - t < 0.5
        finally:
            signal.signal(signal.SIGINT, old_int)
    finally:
        signal.signal(signal.SIGUSR1, old)


# ------------------------------------------------------------------ registration
def test_registration_handshake(engine: Callable[..., tuple[Arena, Any]]) -> None:
    a, events = engine()
    epoch = a.get("epoch")
    port = WorkerPort(a, 2)
    for _ in range(2):  # a first registration and a re-registration
        t = time.monotonic()
        port.register(timeout=2.0)
        assert time.monotonic() - t < 0.2
        row = a.workers[2]
        assert port.epoch == epoch == int(row["epoch"])
        assert int(row["ack_seq"]) == int(row["req_seq"]) and int(row["pid"]) == os.getpid()
        _procs.wait_event(events, "reclaim", pred=lambda ev: ev[1] == 2)  # the engine reset index 2 for us
    with port.lease() as lease:
        lease.submit([21], {"n_predict": 2})
        assert [lease.read(timeout=1.0).token for _ in range(2)] == [tok(21, 0), tok(21, 1)]
    parked = port.lease()
    assert parked.engine_ok()
    os.kill(a.get("engine_pid"), signal.SIGKILL)
    time.sleep(0.1)
    assert not parked.engine_ok()  # a reader that times out can tell the engine is gone
    parked.close()
    t = time.monotonic()
    with pytest.raises(EngineUnavailable):
        port.register(timeout=2.0)
    with pytest.raises(EngineUnavailable):
        port.lease()
    assert time.monotonic() - t < 0.2


# ------------------------------------------------------------------ validation
GARBAGE = {
    "random bytes": None,
    "no prompt": {"n_prompt": 0},
    "prompt too long": {"n_prompt": _procs.SMALL["max_prompt"] + 1},
    "token out of vocab": {"n_prompt": 2, "prompt": [1, _procs.N_VOCAB]},
    "negative token": {"n_prompt": 1, "prompt": [-3]},
    "nan temperature": {"n_prompt": 1, "temperature": np.nan},
    "inf top_p": {"n_prompt": 1, "top_p": np.inf},
    "huge grammar": {"n_prompt": 1, "n_grammar": MAX_GRAMMAR + 1},
    "huge bias": {"n_prompt": 1, "n_bias": 2**32 - 1},
    "too many probs": {"n_prompt": 1, "n_probs": MAX_PROBS + 1},
    "negative probs": {"n_prompt": 1, "n_probs": -1},
}


def scribble(lease: Any, spec: dict | None, rng: np.random.Generator) -> None:
    """Write garbage straight into a leased channel's request areas."""
    ch = lease.channel
    if spec is None:
        ch.params.view(np.uint8)[:] = rng.integers(0, 256, PARAMS.itemsize, dtype=np.uint8)
        ch.prompt.view(np.uint8)[:] = rng.integers(0, 256, ch.prompt.nbytes, dtype=np.uint8)
        return
    ch.params[:] = np.zeros(1, PARAMS)
    ch.prompt[:] = 1
    for k, v in spec.items():
        if k == "prompt":
            ch.prompt[: len(v)] = np.array(v, dtype=np.int64).astype(np.int32)
        else:
            ch.params[k] = v


def test_garbage_request_is_refused_not_fatal(engine: Callable[..., tuple[Arena, Any]]) -> None:
    """A hostile or buggy worker writes garbage and submits it: the engine's
    read_request raises BadRequest, the request ends with STOP_ERROR, and the
    engine goes on serving."""
    a, events = engine()
    port = WorkerPort(a, 3)
    port.register()
    rng = np.random.default_rng(3)
    for name, spec in GARBAGE.items():
        with port.lease() as lease:
            scribble(lease, spec, rng)
            lease.post(SUB_SUBMIT)
            tk = lease.read(timeout=2.0)
            assert tk is not None and tk.last and tk.stop == STOP_ERROR, name
            _procs.wait_event(events, "bad")
    with port.lease() as lease:
        lease.submit([31], {"n_predict": 1})
        assert lease.read(timeout=1.0).token == tok(31, 0)


def test_read_request_fuzz(make_arena: Callable[..., Arena]) -> None:
    """Whatever the request areas hold, read_request returns something the
    engine can act on safely, or raises BadRequest: never anything else."""
    ch = make_arena(**_procs.SMALL).channel(0)
    n_vocab = 1000
    i32, u32 = st.integers(-(2**31), 2**31 - 1), st.integers(0, 2**32 - 1)
    f32 = st.floats(width=32) | st.sampled_from([np.nan, np.inf, -np.inf, 0.0])
    fields = st.fixed_dictionaries({
        "n_prompt": st.integers(0, 20) | u32, "n_predict": i32, "temperature": f32, "top_p": f32,
        "min_p": f32, "repeat_penalty": f32, "frequency_penalty": f32, "n_probs": st.integers(-2, 22) | i32,
        "n_grammar": st.integers(0, MAX_GRAMMAR + 2) | u32, "n_bias": st.integers(0, MAX_BIAS + 2) | u32,
    })
    ids = st.lists(st.integers(-5, n_vocab + 5) | i32, min_size=16, max_size=16)

    @given(raw=st.binary(min_size=PARAMS.itemsize, max_size=PARAMS.itemsize), fld=fields | st.none(),
           prompt=ids, bias=ids)
    @settings(max_examples=300, deadline=None)
    def check(raw: bytes, fld: dict | None, prompt: list, bias: list) -> None:
        ch.params.view(np.uint8)[:] = np.frombuffer(raw, np.uint8)
        for k, v in (fld or {}).items():
            ch.params[k] = v
        ch.prompt[:] = prompt
        ch.bias["id"][:16] = bias
        try:
            p, params, grammar, b = ch.read_request(n_vocab)
        except BadRequest:
            return
        assert 0 < len(p) <= ch.max_prompt and p.min() >= 0 and p.max() < n_vocab
        assert len(grammar) <= MAX_GRAMMAR and len(b) <= MAX_BIAS
        assert len(b) == 0 or (b["id"].min() >= 0 and b["id"].max() < n_vocab)
        assert 0 <= params["n_probs"] <= MAX_PROBS
        assert all(np.isfinite(params[k]) for k in ("temperature", "top_p", "min_p", "repeat_penalty"))

    check()
