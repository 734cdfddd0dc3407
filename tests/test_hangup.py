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


def test_a_batch_stale_event_never_reaches_a_socket_that_reused_its_fd():
    """Two peers hang up in one epoll batch; the first callback is slow (the
    runner's lock, a full submission ring), and meanwhile the second socket
    is unwatched, closed and its fd number reused by a live connection. The
    batch's entries are taken before any callback runs, so the stale event
    calls the old watcher's callback, never the live one's."""
    fired = []
    slow = threading.Event()
    a, a_peer = pair()
    b, b_peer = pair()

    def on_a():
        fired.append("a")
        slow.set()
        time.sleep(0.3)

    hangup.watch(a, on_a)
    hb = hangup.watch(b, lambda: fired.append("b"))
    a_peer.close()
    b_peer.close()
    assert slow.wait(2)
    hangup.unwatch(hb)
    fd_b = b.fileno()
    b.close()
    c, c_peer = pair()
    live = c if c.fileno() == fd_b else c_peer
    try:
        assert live.fileno() == fd_b, "the kernel gave the new socket another fd number"
        hc = hangup.watch(live, lambda: fired.append("live"))
        time.sleep(0.6)
        assert "live" not in fired, fired
        hangup.unwatch(hc)
    finally:
        for s in (a, c, c_peer):
            s.close()
