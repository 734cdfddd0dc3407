"""The gunicorn master as the supervisor's forked child (not an exec'd one).

Why fork: the supervisor has already paid for the interpreter, numpy and our
config and ipc modules; once it has started the engine it also imports
gunicorn, falcon and the app and loads the vocabulary (libllama, ~0.7 s for
Gemma's 262k tokens). The forked master starts
with all of it, shared copy-on-write with the supervisor and, through the
master's own forks, with every worker: one copy of the vocabulary and the
libraries for the whole HTTP side, and about 0.5 s less before the first
worker answers than an exec'd master that imports and loads it all again.

Fork safety (invariant): when ``Master.start`` forks, the supervisor runs no
thread but its main one and has never created a libllama context or thread
pool; the child resets what the
supervisor set up for itself (signal handlers and their wakeup fd, its
descriptors, the root logger) before gunicorn takes over, and always leaves
through ``procs.leave``: the atexit handlers run (memtrace's exit dump, each
guarded by the pid it was installed in), then ``os._exit``, so no finalizer
of the supervisor's objects runs in it.
"""
from __future__ import annotations

import logging
import os
import signal
import sys
import traceback

from engine.config import Config

from .procs import die_with_parent, leave


class VocabLoad:
    """The vocabulary the master will serve with, or what its load raised:
    the master re-raises it, so a model that cannot load stops the HTTP side
    as an exec'd master's own load would have.

    Loaded in the supervisor's main thread, after the engine was started and
    the app imported, not in a thread beside those imports: on two cores a
    third runnable thread slows the engine's own model load, the path a
    real-model start waits on (measured: +0.2-0.35 s a start)."""

    def __init__(self, path: str):
        self.vocab = None
        self.error: BaseException | None = None
        try:
            from frontends.text.tokenizer import Vocab

            self.vocab = Vocab(path)
        except Exception as e:  # noqa: BLE001 - re-raised in the master
            self.error = e

    def result(self):
        if self.error is not None:
            raise self.error
        return self.vocab


class Master:
    """The forked gunicorn master, watched by the supervisor through a pidfd."""

    def __init__(self) -> None:
        self.pid = 0
        self.pidfd = -1

    def start(self, env: dict, vocab: VocabLoad, close: list[int]) -> None:
        """Fork; the child becomes the gunicorn master (frontends/process/serve.py)
        with ``env`` as its environment and never returns. ``close``: the
        supervisor's own descriptors (its signal pipe, the engine's pidfd)."""
        parent = os.getpid()
        for f in (sys.stdout, sys.stderr):
            f.flush()
        # Signals stay blocked across the fork until the child has reset the supervisor's handlers:
        # one delivered before that would run our handler and write its number into the supervisor's
        # wakeup pipe, which the child shares (a SIGTERM meant for the master would stop the supervisor).
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
        pid = os.fork()
        if pid == 0:
            leave(_child(parent, env, vocab, close, mask))
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        self.pid = pid
        self.pidfd = os.pidfd_open(pid)

    def wait(self) -> int:
        _, status = os.waitpid(self.pid, 0)
        return os.waitstatus_to_exitcode(status)


def _child(parent: int, env: dict, vocab: VocabLoad, close: list[int], mask) -> int:
    code = 1
    try:
        os.setsid()  # a terminal's Ctrl-C reaches only the supervisor, which stops us in order
        die_with_parent()
        if os.getppid() != parent:  # it died before the prctl took effect
            return 1
        signal.set_wakeup_fd(-1)
        for s in signal.valid_signals():  # whatever the supervisor handles in Python: gunicorn installs its own
            h = signal.getsignal(s)
            if callable(h) and h is not signal.default_int_handler:
                signal.signal(s, signal.default_int_handler if s == signal.SIGINT else signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        for fd in close:
            try:
                os.close(fd)
            except OSError:
                pass
        root = logging.getLogger()
        for h in root.handlers[:]:  # as in an exec'd process: gunicorn's loggers only
            root.removeHandler(h)
        os.environ.clear()
        os.environ.update(env)
        from .serve import Serve

        Serve(Config.from_env(), vocab).run()  # the Config as an exec'd child reads it
        code = 0
    except SystemExit as e:  # gunicorn's halt
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        traceback.print_exc()
    return code
