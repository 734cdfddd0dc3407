"""Waking a sleeping engine (--sleep-idle-seconds, engine/sleep.py).

llama-server answers /health, /metrics, /props and /models from what it
cached on entering sleep (server-context.cpp create_response(bypass_sleep));
every other request first wakes the server and waits for the model to load
again. ``Wake`` does the same after the readiness and key gates (a refused
request wakes nothing): while the engine's ``sleeping`` counter is set it
rings the doorbell (the engine dozes on it) and waits, polling, until the
engine has built its new context and cleared the counter. Generation
requests would wake it with their own submission; waiting here too keeps one
rule for every path (tokenize and the token counters, which need no engine
here, wake it as llama-server's do).
"""
from __future__ import annotations

import time

import falcon

from ipc.layout import CNT

from .webui import PATHS as PAGE

# llama-server's bypass_sleep handlers (and what never reaches the model here)
AWAKE_NOT_NEEDED = frozenset({"/health", "/v1/health", "/metrics", "/models", "/v1/models", "/openapi.json"})
WAKE_TIMEOUT_S = 300.0  # a reload of a big model from a cold page cache


def sleeping(ctx) -> bool:
    a = ctx.arena
    return a is not None and a.counters is not None and bool(a.counters[CNT["sleeping"]])


class Wake:
    """Falcon middleware: a request that needs the model wakes the engine first."""

    def __init__(self, ctx):
        self.ctx = ctx
        self.on = ctx.cfg.sleep_idle_seconds > 0
        self.skip = AWAKE_NOT_NEEDED | PAGE

    def process_request(self, req: falcon.Request, resp: falcon.Response) -> None:
        if not self.on or req.method == "OPTIONS" or req.path in self.skip or not sleeping(self.ctx):
            return
        if req.path == "/props" and req.method == "GET":
            return
        a = self.ctx.arena
        deadline = time.monotonic() + WAKE_TIMEOUT_S
        while sleeping(self.ctx):
            if not a.engine_alive() or time.monotonic() > deadline:
                raise self.ctx.not_ready()
            a.doorbell.release()  # the dozing engine wakes on it; extra rings are drained
            time.sleep(0.01)
