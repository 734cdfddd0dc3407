"""The gunicorn master as the supervisor's forked child (not an exec'd one).

Why fork: the supervisor has already paid for the interpreter, numpy and our
config and ipc modules; once it has started the engine it also imports
gunicorn, falcon and the app and holds the vocabulary (libllama, ~0.7 s to
load for Gemma's 262k tokens: the weights' own where the engine was forked
from them, engine/weights.py, else a vocabulary-only load). The forked
master starts with all of it, shared copy-on-write with the supervisor and,
through the master's own forks, with every worker: one copy of the
vocabulary and the libraries for the whole HTTP side (and the engine's, when
it was forked from the same weights), and about 0.5 s less before the first
worker answers than an exec'd master that imports and loads it all again.
The fork itself, and what it resets, is procs.py's ``fork``. The
vocabulary is loaded in the supervisor's main thread, after the engine was
started and the app imported, not in a thread beside those imports: on two
cores a third runnable thread slows the engine's own model load, the path a
real-model start waits on (measured: +0.2-0.35 s a start).
"""
from __future__ import annotations

import os

from engine.config import Config

from .procs import Attempt, fork


class Master:
    """The forked gunicorn master, watched by the supervisor through a pidfd."""

    def __init__(self) -> None:
        self.pid = 0
        self.pidfd = -1

    def start(self, env: dict, vocab: Attempt, close: list[int]) -> None:
        """Fork; the child becomes the gunicorn master (frontends/process/serve.py)
        with ``env`` as its environment and never returns. ``close``: the
        supervisor's own descriptors (its signal pipe, the engine's pidfd).
        ``vocab``: the HTTP side's ``frontends.text.tokenizer.Vocab``, loaded
        (or failed) in the supervisor; a failure stops the master with it."""
        self.pid = fork(lambda: _serve(vocab), env, close)
        self.pidfd = os.pidfd_open(self.pid)

    def wait(self) -> int:
        _, status = os.waitpid(self.pid, 0)
        return os.waitstatus_to_exitcode(status)


def _serve(vocab: Attempt) -> int:
    from .serve import Serve

    Serve(Config.from_env(), vocab).run()  # the Config as an exec'd child reads it
    return 0
