"""The engine child process, shared by both ways to run, and the fork that
makes the supervisor's children.

Used by the ``ringserve`` supervisor (launcher.py) and by the hooks of a
plain ``gunicorn -c frontends/gunicorn_conf.py`` master (hooks.py); both
create the arena with engine/process.py's ``prepare`` and ``create_arena``,
as the tests and benchmarks do. The engine is watched with a pidfd, never
with gunicorn's hooks: gunicorn's arbiter reaps any child with waitpid(-1),
so an exit status may never reach us, but the pidfd still becomes readable
when the engine dies. The engine is exec'd (``python -m engine``) or, where
the supervisor loaded the weights (engine/weights.py ``forkable``), forked
from them by ``fork``, which also makes the gunicorn master (master.py).

Fork safety (invariant): when ``fork`` forks, the supervisor runs no thread
of its own but its main one (OpenBLAS's pool, started by numpy's import,
stops itself across fork) and has never created a libllama context or
thread pool; the child resets what the supervisor set up for itself (signal
handlers and their wakeup fd, its descriptors, the root logger, the
environment) before it runs, and always leaves through ``leave``: the atexit
handlers run (memtrace's exit dump, each guarded by the pid it was
installed in), then ``os._exit``, so no finalizer of the supervisor's
objects runs in it.
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
import traceback

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


class Attempt:
    """``fn(*args)`` called now, in the supervisor: its ``value``, or the
    exception it raised, which ``result()`` re-raises in the child that uses
    it. So a model the supervisor cannot load fails in the child that needs
    it (the engine reports it as its own load failure, the master stops the
    HTTP side), as an exec'd child's own load did."""

    def __init__(self, fn, *args) -> None:
        self.value = None
        self.error: BaseException | None = None
        try:
            self.value = fn(*args)
        except Exception as e:  # noqa: BLE001 - re-raised where it is used
            self.error = e

    def result(self):
        if self.error is not None:
            raise self.error
        return self.value


def fork(run, env: dict, close: list[int], title: str = "") -> int:
    """Fork a child of the supervisor that runs ``run()`` (its exit code)
    with ``env`` as its environment, in its own session, dying with us; it
    never returns here. ``close``: the supervisor's own descriptors (its
    signal pipe, the other children's pidfds). ``title``: its command line
    as ``ps`` and the process finder read it (setproctitle)."""
    parent = os.getpid()
    for f in (sys.stdout, sys.stderr):
        f.flush()
    # Signals stay blocked across the fork until the child has reset the supervisor's handlers:
    # one delivered before that would run our handler and write its number into the supervisor's
    # wakeup pipe, which the child shares (a SIGTERM meant for the child would stop the supervisor).
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
    pid = os.fork()
    if pid == 0:
        leave(_child(parent, run, env, close, title, mask))
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    return pid


def _child(parent: int, run, env: dict, close: list[int], title: str, mask) -> int:
    code = 1
    try:
        if title:
            import setproctitle

            setproctitle.setproctitle(title)
        os.setsid()  # a terminal's Ctrl-C reaches only the supervisor, which stops us in order
        die_with_parent()
        if os.getppid() != parent:  # it died before the prctl took effect
            return 1
        signal.set_wakeup_fd(-1)
        for s in signal.valid_signals():  # whatever the supervisor handles in Python: the child sets its own
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
        for h in root.handlers[:]:  # as in an exec'd process
            root.removeHandler(h)
        os.environ.clear()
        os.environ.update(env)
        code = run()
    except SystemExit as e:  # gunicorn's halt
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        traceback.print_exc()
    return code


def spawn(cmd: list[str], env: dict) -> subprocess.Popen:
    """A child in its own session (a terminal's Ctrl-C reaches only the
    supervisor, which then stops children in order) that dies with us."""
    return subprocess.Popen(cmd, env=env, cwd=ROOT, start_new_session=True, preexec_fn=die_with_parent)


class EngineProc:
    """The engine child: start, notice death (pidfd), restart, stop."""

    def __init__(self, arena: Arena, cfg: Config, weights=None, close=None):
        """``weights``: a callable returning the supervisor's loaded weights
        (or raising what their load raised): the engine is then forked from
        them (engine/weights.py), else exec'd. ``close``: a callable listing
        the supervisor's descriptors a forked engine must not keep."""
        self.arena, self.cfg = arena, cfg
        self.weights, self.close = weights, close or (lambda: [])
        base = shlex.split(cfg.engine_cmd) or [sys.executable, "-m", "engine"]  # tests: a fake engine
        self.cmd = base + ["--arena", arena.instance]
        self._pid = 0  # the live or last engine's
        # a spawned engine's Popen, kept referenced: one collected while its child runs is reaped by
        # subprocess's own cleanup (waitpid) on the next spawn, and reap() would lose the exit status
        self.proc: subprocess.Popen | None = None
        self.pidfd = -1
        self.starts = 0
        self.was_ready = False  # this engine reached READY at least once
        self.backoff = 0.5
        self.next_start = 0.0
        self.hopeless = False  # it died failing to load: restarting would not help

    @property
    def pid(self) -> int:
        return self._pid

    def start(self) -> None:
        if self.weights is not None:
            from engine.run import run

            weights, instance = self.weights, self.arena.instance
            self._pid = fork(lambda: run(instance, weights), child_env(self.cfg), self.close(),
                             f"ringserve: engine --arena {instance}")
            how = "forked from the loaded weights"
        else:
            self.proc = spawn(self.cmd, child_env(self.cfg))
            self._pid = self.proc.pid  # reaped by pid (reap), as a forked one
            how = " ".join(self.cmd)
        self.pidfd = os.pidfd_open(self._pid)
        self.starts += 1
        self.was_ready = False
        log.info("engine started: pid %d (%s)", self._pid, how)

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
            _, status = os.waitpid(self._pid, 0)
            code = os.waitstatus_to_exitcode(status)
        except ChildProcessError:
            pass
        os.close(self.pidfd)
        self.pidfd = -1
        if self.arena.state != ST_FAILED:
            self.arena.set("state", ST_DOWN)
        return code

    def died(self) -> str:
        """Handle a death: returns why, schedules the restart with backoff.
        ``was_ready`` first takes the arena's ``ready_pid`` (the last engine to
        reach READY, never cleared): the supervisor notices READY only when
        it polls (``poll_ready``, every 0.5 s), so an engine that got there
        and died before the next poll was ready all the same (one killed
        right after its first answer, or ending through run()'s DOWN, was
        taken for one that never loaded, and the server stopped instead of
        restarting it)."""
        self.was_ready = self.was_ready or self.arena.get("ready_pid") == self._pid
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
            os.kill(self._pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        r, _, _ = select.select([self.pidfd], [], [], timeout)
        if not r:
            log.warning("engine %d ignored SIGTERM for %.1f s: SIGKILL", self._pid, timeout)
            try:
                os.kill(self._pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            select.select([self.pidfd], [], [], 2.0)
        self.reap()
