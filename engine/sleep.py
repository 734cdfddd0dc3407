"""--sleep-idle-seconds N: unload the model after N idle seconds, reload on demand.

llama-server's semantics (server-queue.cpp start_loop, server-context.cpp
handle_sleeping_state): once no task has come for N seconds and nothing
runs, the context and model are freed (every slot's KV and the prompt cache
go with them); /health, /props (``is_sleeping: true``), /models and
/metrics keep answering without waking it; any other request wakes it and
waits for the reload.

Here the engine process keeps running while it sleeps (it owns the arena's
engine end and the launcher's watchdog relation): ``Sleeper.due`` watches
the idle clock between steps (the last submission, ``EnginePort.t_work``,
or the last busy step), ``doze`` frees the Engine and its Model, sets the
``sleeping`` counter and waits on the doorbell, keeping the heartbeat; the
first ring (a submission, or a worker's wake-up call,
frontends/api/sleep.py) builds a new Model and Engine, which take the
queued submissions in their first intake. The ``sleeping`` counter is
cleared only once the new Engine exists, so a worker waiting for it to drop
submits to an engine that can take the request.
"""
from __future__ import annotations

import logging
import time
from typing import Callable

from ipc.layout import CNT

log = logging.getLogger("ringserve.engine")


class Sleeper:
    """The idle clock of one engine process (``seconds`` < 0: never sleeps)."""

    def __init__(self, seconds: int, port):
        self.seconds, self.port = seconds, port
        self.t_busy = time.monotonic()

    def due(self, eng) -> bool:
        """Called after each step: has nothing run nor come for ``seconds``?"""
        if self.seconds < 0:
            return False
        now = time.monotonic()
        files = getattr(eng, "files", None)
        if (eng.queue or any(not s.idle for s in eng.slots) or (files is not None and files.pending)
                or self.port.waiting()):
            # port.waiting: a submission or registration that came during the step's idle wait, whose
            # doorbell ring that wait took; dozing now would leave it in its ring until another ring
            # (a stream hung, a registration's 30 s timeout)
            self.t_busy = now
            return False
        return now - max(self.t_busy, self.port.t_work) >= self.seconds

    @staticmethod
    def freeze(arena) -> None:
        """Before the Engine is freed: copy the counters into the arena's
        ``asleep`` block, which /metrics renders while ``sleeping`` is set
        (llama-server's cached_metrics, taken on entering sleep). Ordering:
        written here, before ``doze`` sets ``sleeping`` (one writer, x86
        stores in program order); a scraper reads the flag, then the copy."""
        arena.asleep[:] = arena.counters

    def doze(self, arena, heartbeat_s: float, stop: Callable[[], bool]) -> bool:
        """Sleep until the doorbell rings (True) or ``stop()`` (False). The
        caller has freed the Engine and the Model; it builds them again on
        True and then calls ``woke``."""
        c = arena.counters
        c[CNT["sleeping"]] = 1
        c[CNT["sleeps_total"]] += 1
        log.info("server is entering sleeping state (idle %d s): model unloaded", self.seconds)
        while not stop():
            arena.ctl["heartbeat_ns"] = time.monotonic_ns()
            if self.port.wait(heartbeat_s):
                log.info("server is exiting sleeping state: reloading the model")
                return True
        return False

    @staticmethod
    def awake(arena) -> None:
        """A starting engine is awake, whatever the one before it was: the
        ``sleeping`` counter outlives an engine that died asleep (killed, or
        its reload failed), and left set it kept every request in the
        workers' wake loop and /props and /metrics saying asleep."""
        arena.counters[CNT["sleeping"]] = 0

    def woke(self, arena) -> None:
        self.t_busy = time.monotonic()
        self.awake(arena)
