"""The gunicorn worker class: gthread, with a drain that loses no connection.

Why: a stopping gthread worker stops polling its listening sockets but keeps
them open until its in-flight requests are done (up to graceful_timeout).
The kernel keeps completing handshakes on a socket that is still open, so
during a drain new connections pile up in the accept queue, unanswered, and
are reset when the last process holding the socket closes it. A balancer has
already sent its request on such a connection, so it may not retry it (nginx
never retries a POST once sent): a drained instance would lose requests.

Here a stopping worker (SIGTERM, from a shutdown or a SIGHUP/TTOU
replacement) accepts what is already queued and closes its listeners at once.
Once every process has closed them, new connections are refused, which a
balancer retries elsewhere; the accepted ones are served (with
``Connection: close``) with the in-flight ones. During a SIGHUP the master
and the new workers still hold the sockets, so nothing is refused.
"""
from __future__ import annotations

import threading

from gunicorn.workers.gthread import ThreadWorker

from engine import memory

PRESTART_S = 10.0  # how long the pool's threads wait for each other at boot


class DrainWorker(ThreadWorker):
    def get_thread_pool(self):
        """The pool with every thread started now, not on the first burst of
        traffic that needs it.

        Why (issue 18): a new thread gets a malloc arena of its own (glibc
        makes up to 8 per core) and touches a fresh stack, a step of a few
        hundred kB of RSS. Started lazily, the pool grows whenever traffic
        first reaches a new concurrency, hours into a run; started here, the
        worker's memory is at its level before it serves. Each submitted task
        waits for all the others, so no thread is idle while the next one is
        submitted and the executor starts a new one for each.
        """
        pool = super().get_thread_pool()
        n = self.cfg.threads
        gate = threading.Barrier(n)
        for _ in range(n):
            pool.submit(gate.wait, PRESTART_S)
        return pool

    def load_wsgi(self) -> None:
        """Load the app, then give back what the imports freed (engine/memory.py)."""
        super().load_wsgi()
        memory.settle()

    def set_accept_enabled(self, enabled: bool) -> None:
        super().set_accept_enabled(enabled)
        if not enabled and not self.alive:
            self.close_listeners()

    def close_listeners(self) -> None:
        """Accept every queued connection (served by the drain), then close."""
        for listener in self.sockets:
            if getattr(listener, "sock", listener) is None:
                continue  # already closed
            listener.setblocking(False)
            while True:
                before = self.nr_conns
                self.accept(listener)  # one connection; EAGAIN when the queue is empty
                if self.nr_conns == before:
                    break
            listener.close()
