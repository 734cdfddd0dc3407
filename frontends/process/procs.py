"""The engine child process, shared by both ways to run.

Used by the ``ringserve`` supervisor (launcher.py) and by the hooks of a
plain ``gunicorn -c frontends/gunicorn_conf.py`` master (hooks.py); both
create the arena with engine/process.py's ``prepare`` and ``create_arena``,
as the tests and benchmarks do. The engine is watched with a pidfd, never
with gunicorn's hooks: gunicorn's arbiter reaps any child with waitpid(-1),
so an exit status may never reach us, but the pidfd still becomes readable
when the engine dies.
"""
from __future__ import annotations

import ctypes
import logging
import os
import select
import shlex
import signal
import subprocess
import sys
import time

from engine.config import Config
from engine.process import ROOT, child_env
from ipc.arena import Arena
from ipc.layout import ST_DOWN, ST_FAILED, ST_READY

GRACEFUL_DEFAULT = 2  # gunicorn graceful_timeout when neither flag nor file sets it: "SIGTERM: exit within about 5 s"

log = logging.getLogger("ringserve")

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """preexec: SIGTERM this child when the process that started it dies."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass


def leave(code: int) -> None:
    """End this process now: atexit handlers (memtrace's exit dump), the
    loggers and stdio flushed, then ``os._exit``, without the interpreter's
    teardown. For the launcher once it released everything (freeing the
    262k-token vocabulary and unloading the app's modules took ~0.1 s of
    every stop) and for the forked master (no finalizer of the launcher's
    objects may run in it)."""
    import atexit

    atexit._run_exitfuncs()
    logging.shutdown()
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except Exception:  # noqa: BLE001 - a closed stream must not keep us alive
            pass
    os._exit(code)


def spawn(cmd: list[str], env: dict) -> subprocess.Popen:
    """A child in its own session (a terminal's Ctrl-C reaches only the
    supervisor, which then stops children in order) that dies with us."""
    return subprocess.Popen(cmd, env=env, cwd=ROOT, start_new_session=True, preexec_fn=die_with_parent)


class EngineProc:
    """The engine child: start, notice death (pidfd), restart, stop."""

    def __init__(self, arena: Arena, cfg: Config):
        self.arena, self.cfg = arena, cfg
        base = shlex.split(cfg.engine_cmd) or [sys.executable, "-m", "engine"]  # tests: a fake engine
        self.cmd = base + ["--arena", arena.instance]
        self.proc: subprocess.Popen | None = None
        self.pidfd = -1
        self.starts = 0
        self.was_ready = False  # this engine reached READY at least once
        self.backoff = 0.5
        self.next_start = 0.0
        self.hopeless = False  # it died failing to load: restarting would not help

    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc else 0

    def start(self) -> None:
        self.proc = spawn(self.cmd, child_env(self.cfg))
        self.pidfd = os.pidfd_open(self.proc.pid)
        self.starts += 1
        self.was_ready = False
        log.info("engine started: pid %d (%s)", self.proc.pid, " ".join(self.cmd))

    def poll_ready(self) -> bool:
        if not self.was_ready and self.alive() and self.arena.state == ST_READY:
            self.was_ready = True
            self.backoff = 0.5
            log.info("engine ready: pid %d", self.pid)
        return self.was_ready

    def alive(self) -> bool:
        if self.pidfd < 0:
            return False
        r, _, _ = select.select([self.pidfd], [], [], 0)
        return not r

    def reap(self) -> int | None:
        """After the pidfd fired: collect the status (None if someone else,
        e.g. gunicorn's arbiter, reaped it), mark the arena down."""
        code = None
        try:
            _, status = os.waitpid(self.proc.pid, 0)
            code = os.waitstatus_to_exitcode(status)
        except ChildProcessError:
            pass
        os.close(self.pidfd)
        self.pidfd = -1
        if self.arena.state != ST_FAILED:
            self.arena.set("state", ST_DOWN)
        return code

    def died(self) -> str:
        """Handle a death: returns why, schedules the restart with backoff."""
        code = self.reap()
        reason = self.arena.get("reason")
        reason = reason.decode("utf-8", "replace") if isinstance(reason, bytes) else str(reason)
        self.next_start = time.monotonic() + self.backoff
        self.backoff = min(self.backoff * 2, 30.0)
        self.hopeless = code == 3 or self.arena.state == ST_FAILED  # the model cannot load: no restart
        return f"exit {code}" + (f": {reason}" if reason and self.arena.state == ST_FAILED else "")

    def stop(self, timeout: float = 3.0) -> None:
        """SIGTERM, wait up to ``timeout``, SIGKILL."""
        if self.pidfd < 0:
            return
        try:
            os.kill(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        r, _, _ = select.select([self.pidfd], [], [], timeout)
        if not r:
            log.warning("engine %d ignored SIGTERM for %.1f s: SIGKILL", self.proc.pid, timeout)
            try:
                os.kill(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            select.select([self.pidfd], [], [], 2.0)
        self.reap()
