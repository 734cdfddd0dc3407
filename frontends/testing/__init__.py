"""Test plumbing shared by tests/ and scripts/, in the role of falcon.testing.

* ``server``: one helper to run ringserve (real or fake engine),
  llama-server or llama-cpp-python's server: start on a free port, wait
  ready, stop the whole tree, nothing left in /dev/shm (``Server``,
  ``FakeServer``, ``Proc``).
* ``procs``: the process finder (launcher -> engine, gunicorn master,
  workers) and ``kill_all``.
* ``http``: small clients, the one SSE reader (``iter_sse``, strict
  ``sse_events``), the streaming client ``Stream``, /metrics through
  prometheus_client's parser, ``wait_for``.
* ``models``: where the test models' GGUFs lie (``models.smollm2()``).
* ``client``: ``TestClient``, an in-process client over
  ``frontends.api.app.build(cfg, None, w)``: validation, error, auth and
  OpenAPI tests without spawning a process.

Import as ``from frontends import testing`` (tests and scripts alike; the
package is installed, so nobody edits sys.path).
"""
from __future__ import annotations

from . import models, procs
from .http import (
    HealthPoller, Stream, busy_slots, content, get, iter_sse, metrics, parse_metrics, post, raw_request,
    reset_close, slots, sse_events, stream, table, wait_for, waited,
)
from .server import (
    FAKE_ENGINE_CMD, HOST, INVARIANT, PROMPTS, ROOT, WITHIN, FakeServer, Proc, Server, free_port,
    instance_in, md5, rss_kb,
)

__all__ = [
    "FAKE_ENGINE_CMD", "HOST", "INVARIANT", "PROMPTS", "ROOT", "WITHIN", "FakeServer",
    "HealthPoller", "Proc", "Server", "Stream", "busy_slots", "content", "free_port", "get", "instance_in",
    "iter_sse", "md5", "metrics", "parse_metrics", "post", "procs", "raw_request", "reset_close", "rss_kb",
    "slots", "sse_events", "stream", "table", "wait_for", "waited",
]


def __getattr__(name: str):
    # the in-process client imports falcon apps and the vocabulary: only on use
    if name == "TestClient":
        from .client import TestClient

        return TestClient
    raise AttributeError(name)
