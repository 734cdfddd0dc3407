"""One thread per worker process that notices clients hanging up.

Why (issue 26): a request waiting for the engine used to wake every
``gen.POLL`` (30 ms) only to peek at its socket. At 32 concurrent requests
that is ~1,000 wakeups a second in the worker, ~0.8 s of its CPU over a
17 s prompt burst; on a small host each one can preempt one of the engine's
llama.cpp threads, and its partner then spins at the next barrier: prompt
throughput at 32 streams measured 5-10% below llama-server's, level with
the wakeups gone. Here one epoll waits on every watched socket at once for
``EPOLLRDHUP | EPOLLHUP | EPOLLERR`` (the peer's FIN or a reset: what
``gen.peer_gone`` reads as gone), so a waiting request sleeps on its ring
until a record comes, and a hangup is acted on at once instead of within
two polls.

Lifetime rule: ``watch`` returns a handle; ``unwatch(handle)`` must run
before the socket is closed (Runner.close does). A stale handle whose fd
number was reused by a newer watch never removes the newer one (entries are
matched by identity). The callback runs in the watcher thread: it must only
take locks that are never held while waiting on this module.
"""
from __future__ import annotations

import logging
import select
import socket
import threading
from typing import Callable

log = logging.getLogger("ringserve")

EVENTS = select.EPOLLRDHUP | select.EPOLLHUP | select.EPOLLERR


class _Watcher:
    def __init__(self) -> None:
        self.ep = select.epoll()
        self.lock = threading.Lock()
        self.by_fd: dict[int, tuple[object, Callable[[], None]]] = {}
        threading.Thread(target=self._loop, name="ringserve-hangup", daemon=True).start()

    def watch(self, fd: int, on_gone: Callable[[], None]) -> object:
        token = object()
        with self.lock:
            if fd in self.by_fd:  # a closed socket's entry (its fd reused): the kernel dropped it already
                try:
                    self.ep.unregister(fd)
                except OSError:
                    pass
            self.by_fd[fd] = (token, on_gone)
            self.ep.register(fd, EVENTS)
        return token

    def unwatch(self, fd: int, token: object) -> None:
        with self.lock:
            cur = self.by_fd.get(fd)
            if cur is None or cur[0] is not token:
                return
            del self.by_fd[fd]
            try:
                self.ep.unregister(fd)
            except OSError:
                pass

    def _loop(self) -> None:
        while True:
            try:
                events = self.ep.poll()
            except InterruptedError:
                continue
            # Lifetime: the whole batch's entries are taken before any callback runs. A callback
            # can be slow (the runner's lock, a full submission ring), and meanwhile another
            # socket of this batch may be unwatched, closed and its fd number reused by a new
            # watch: taken by fd at handling time, its stale event would cancel the live request.
            # Between epoll's answer and this lock the socket may also have been closed and its fd
            # reused by a new watch: each entry taken is checked for a hangup of the socket it
            # names now, and one that did not hang up is watched again.
            due = []
            with self.lock:
                for fd, _ in events:
                    cur = self.by_fd.pop(fd, None)
                    if cur is None:
                        continue
                    try:
                        self.ep.unregister(fd)  # fire once: level-triggered HUP would repeat
                    except OSError:
                        pass
                    if _hung(fd):
                        due.append(cur)
                    else:
                        self.by_fd[fd] = cur
                        try:
                            self.ep.register(fd, EVENTS)
                        except OSError:
                            self.by_fd.pop(fd, None)
            for _, on_gone in due:
                try:
                    on_gone()
                except Exception:  # a callback's failure must not end the watcher
                    log.exception("hangup callback failed")


def _hung(fd: int) -> bool:
    """Has the socket now at ``fd`` hung up (or is the fd gone)? A zero-timeout poll."""
    p = select.poll()
    p.register(fd, select.POLLRDHUP | select.POLLHUP | select.POLLERR)
    try:
        return bool(p.poll(0))
    except OSError:
        return True


_watcher: _Watcher | None = None
_start = threading.Lock()


def watch(sock: socket.socket | None, on_gone: Callable[[], None]) -> tuple[int, object] | None:
    """Call ``on_gone()`` (in the watcher thread) once the peer of ``sock``
    hangs up; None when it cannot be watched (no socket, not a plain one)."""
    global _watcher
    if sock is None:
        return None
    try:
        fd = sock.fileno()
    except (OSError, ValueError, AttributeError):
        return None
    if fd < 0:
        return None
    with _start:
        if _watcher is None:
            _watcher = _Watcher()
    try:
        return fd, _watcher.watch(fd, on_gone)
    except OSError:  # e.g. a socket type epoll refuses
        return None


def unwatch(handle: tuple[int, object] | None) -> None:
    if handle is not None and _watcher is not None:
        _watcher.unwatch(*handle)
