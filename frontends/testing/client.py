"""``TestClient``: one worker's app in the test process, no server spawned.

``TestClient(*flags)`` parses ringserve flags, builds the Falcon app with
``frontends.api.app.build(cfg, arena, 0)`` and drives it through
falcon.testing (``simulate_get``, ``simulate_post``, ...). With
``engine=True`` (the default) a real arena is created and the fake engine
(testing/fake_engine.py) runs in a thread, so requests go through the real
ipc protocol end to end (``loading=True``: the engine stays in LOADING
until ``ready()``); ``engine=False`` builds ``build(cfg, None, 0)``: no
arena, every path but /openapi.json answers 503 "Loading model".

What it cannot show: anything of the socket (disconnects, chunked bodies,
back-pressure), gunicorn and process lifecycles; those stay on ``Server``.
``close()`` (or the context manager) stops the engine thread and unlinks
the arena. The vocabulary is loaded once per process and shared.
"""
from __future__ import annotations

import functools
import threading

import falcon.testing

from engine.process import create_arena, prepare
from ipc.arena import Arena

from frontends.api.app import build
from frontends.process.cli import parse
from frontends.text.tokenizer import Vocab

from .fake_engine import Fake


@functools.lru_cache(maxsize=4)
def vocab(path: str) -> Vocab:
    """A GGUF's vocabulary, loaded once per process (read-only after load)."""
    return Vocab(path)


class TestClient(falcon.testing.TestClient):
    __test__ = False  # not a pytest class

    def __init__(self, *flags: str, engine: bool = True, token_s: float = 0.0, loading: bool = False,
                 headers: dict | None = None):
        cfg, _ = parse(["-c", "4096", "-np", "2", "-w", "1", "--threads-http", "8", *flags])
        self.cfg = prepare(cfg)
        self.arena: Arena | None = None
        self.fake: Fake | None = None
        self._thread: threading.Thread | None = None
        if engine:
            self.arena = create_arena(self.cfg)
            try:
                self.fake = Fake(self.arena, token_s, None)
                if not loading:
                    self.ready()
            except BaseException:
                self.close()
                raise
        try:
            app = build(self.cfg, self.arena, 0, vocab(self.cfg.model))
        except BaseException:
            self.close()
            raise
        super().__init__(app, headers=headers)

    def ready(self) -> None:
        """The engine publishes READY and starts answering."""
        self.fake.ready(self.cfg)
        self._thread = threading.Thread(target=self.fake.run, name="fake-engine", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop the engine thread (it ends every request), unlink the arena."""
        if self.fake is not None and self._thread is not None:
            self.fake.stop = True
            self._thread.join(5)
        if self.arena is not None:
            self.arena.close()
            self.arena.unlink()
            self.arena = None

    def __enter__(self) -> "TestClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
