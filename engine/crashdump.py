"""Native-crash diagnostics: every ringserve process dumps its Python stack on
a fatal signal, and a hidden hook crashes on purpose to prove it.

Why: the engine is Python driving libllama through ctypes. A fault inside C
(SIGSEGV, SIGBUS, SIGFPE, SIGABRT from a GGML_ASSERT, SIGILL) kills the
process with no Python traceback; the log then ends at the last libllama
line and says nothing about which call died (issue 12: a load-time SIGSEGV
on a GPU that the log could not place). ``faulthandler`` writes every
thread's Python stack to stderr from the signal handler itself (async-signal
safe, no allocation), then re-raises the signal, so the exit status (-11 ...)
is unchanged. The engine's and gunicorn's stderr is the launcher's, so the
stack lands in the one server log.

The hook: ``RINGSERVE_CRASH_AT=<point>`` makes ``crash_point(point)`` read
address 0 (a real SIGSEGV in native code, not a Python exception). Points:
``load`` (engine, just before libllama loads the model). Tests use it to check
that the stack reaches the launcher's log; it is not a user setting.
"""
from __future__ import annotations

import ctypes
import faulthandler
import os
import sys

ENV = "RINGSERVE_CRASH_AT"


def enable() -> None:
    """faulthandler on, to stderr, all threads. Idempotent; survives fork
    (a gunicorn worker inherits the master's handlers and state)."""
    if not faulthandler.is_enabled():
        faulthandler.enable(file=sys.stderr, all_threads=True)


def crash_point(name: str) -> None:
    """SIGSEGV here if RINGSERVE_CRASH_AT names this point (test hook)."""
    if os.environ.get(ENV) == name:
        ctypes.string_at(0)  # NULL read inside libc's strlen: a native fault
