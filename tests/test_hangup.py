"""frontends/http/hangup.py: one epoll thread notices a peer's FIN or reset
at once, calls back once, and a stale handle never unwatches a newer socket
that reused its fd number."""
from __future__ import annotations

import socket
import threading
import time

from frontends.http import hangup


def pair():
    a, b = socket.socketpair()
    return a, b


def test_hangup_calls_back_at_once_and_only_once():
    a, b = pair()
    hit = []
    ev = threading.Event()
    h = hangup.watch(a, lambda: (hit.append(time.monotonic()), ev.set()))
    assert h is not None
    time.sleep(0.05)
    assert not hit, "no callback while the peer is there"
    b.sendall(b"pipelined bytes are not a hangup")
    time.sleep(0.05)
    assert not hit
    t0 = time.monotonic()
    b.close()
    assert ev.wait(1.0), "the watcher never saw the hangup"
    assert hit[0] - t0 < 0.05, hit[0] - t0
    time.sleep(0.05)
    assert len(hit) == 1
    hangup.unwatch(h)
    a.close()


def test_unwatched_socket_calls_nothing_and_a_stale_handle_keeps_the_new_watch():
    a, b = pair()
    hit = []
    h = hangup.watch(a, lambda: hit.append("old"))
    hangup.unwatch(h)
    b.close()
    time.sleep(0.05)
    assert hit == []
    fd = a.fileno()
    a.close()
    c, d = pair()  # the lowest free fds: c likely reuses a's number
    new = hangup.watch(c, lambda: hit.append("new"))
    if c.fileno() == fd:
        hangup.unwatch(h)  # the stale handle of the same fd number: a no-op
    d.close()
    deadline = time.monotonic() + 1
    while not hit and time.monotonic() < deadline:
        time.sleep(0.01)
    assert hit == ["new"]
    hangup.unwatch(new)
    c.close()


def test_no_socket_is_not_watched():
    assert hangup.watch(None, lambda: None) is None
