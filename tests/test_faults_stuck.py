"""A client that stops reading mid-stream, against an engine crash and
against llama-server's read/write timeout (``-to``). Fake engine: what is
under test is the worker's side (its leases, its registration, its socket).

Why: gunicorn's gthread hands a request's socket to its thread blocking and
without a timeout, so a stream whose client stopped reading (a paused
process, a partition without a FIN) held its thread in ``sendall`` with the
request's lease for as long as the client stayed. A worker holding a lease
refused to register with a restarted engine, and answered 503 to everyone
until that client went away.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import time

import pytest

from frontends import testing as S
from frontends.testing.http import get, post

SMALL = {"prompt": "hi", "n_predict": 4}


def wedge(port: int, n_probs: int = 20) -> socket.socket:
    """A streaming request from a client with a 1 KiB receive buffer that never
    reads: 20 top-probabilities a token fill the worker's send buffer within
    one of its back-pressure checks, so its thread blocks inside a write;
    without them the runner holds its rings first (gen.HOLD_UNSENT) and
    never writes again."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
    s.connect(("127.0.0.1", port))
    body = json.dumps({"prompt": "hello world " * 20, "n_predict": 100000, "stream": True, "n_probs": n_probs}).encode()
    s.sendall(b"POST /completion HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % len(body) + body)
    return s


def test_a_worker_with_a_wedged_stream_serves_again_right_after_an_engine_restart() -> None:
    srv = S.FakeServer(env={"FAKE_TOKEN_S": "0.001"}).wait_ready()
    stuck = None
    try:
        stuck = wedge(srv.port)
        time.sleep(1.0)  # the stream runs until the worker's write blocks (within ~0.2 s)
        assert post(srv.url("/completion"), SMALL)[0] == 200
        epid = srv.engine_pid
        os.kill(epid, signal.SIGKILL)
        S.wait_for(lambda: srv.engine_pid not in (0, epid) and get(srv.url("/health"))[0] == 200, 30,
                   "the engine's restart")
        codes = []
        t0 = time.monotonic()
        while time.monotonic() - t0 < 10:  # before: 503 "waiting for in-flight requests to end", for ever
            st, body = post(srv.url("/completion"), SMALL, timeout=10)
            codes.append(st)
            if st == 200:
                break
            time.sleep(0.5)
        assert codes[-1] == 200, (codes, body)
        assert len(codes) <= 3, codes  # a restart's first moments may still say 503
    finally:
        if stuck is not None:
            stuck.close()
        rc, left = srv.finish()
    assert rc == 0 and left == []


@pytest.fixture(scope="module")
def to1():
    """One server with ``-to 1`` for both ways a client can stop reading."""
    srv = S.FakeServer("-to", "1", env={"FAKE_TOKEN_S": "0.001"}).wait_ready()
    try:
        yield srv
    finally:
        rc, left = srv.finish()
    assert rc == 0 and left == []


@pytest.mark.parametrize("n_probs", [20, 0], ids=["blocked-write", "held-rings"])
def test_a_client_that_stops_reading_is_cut_off_after_the_timeout(to1, n_probs: int) -> None:
    """``-to 1``: the worker's blocked write fails after 1 s (the socket's
    timeout), or its hold on the rings ends after 1 s (the runner's), the
    connection is closed and the request's channel goes back."""
    srv = to1
    stuck = None
    try:
        stuck = wedge(srv.port, n_probs)
        arena = srv.arena()
        try:
            S.wait_for(lambda: arena.workers[0]["pid"] != 0 and _leased(arena) == 1, 10, "the wedged stream's lease")
            S.wait_for(lambda: _leased(arena) == 0, 15, "the wedged stream's lease to end after -to 1")
        finally:
            arena.close()
        stuck.settimeout(10)
        got = b""
        while True:  # what the kernel holds, then the server's FIN: the stream never finished
            chunk = stuck.recv(1 << 16)
            if not chunk:
                break
            got += chunk
        assert b"data: " in got and b'"stop":true' not in got, got[-300:]
        assert post(srv.url("/completion"), SMALL)[0] == 200
    finally:
        if stuck is not None:
            stuck.close()


def _leased(arena) -> int:
    from ipc.layout import CH_LEASED
    return sum(int(arena.channel(i).hdr[0]["state"]) == CH_LEASED for i in range(arena.geom.n_channels))
