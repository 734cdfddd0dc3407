"""The process finder: a ringserve instance's processes, from its launcher pid.

The tree is read from /proc (psutil), by role: the engine is the launcher's
child whose command line carries ``--arena INSTANCE`` (every engine command
gets it, the fake one too), the gunicorn master its other child (forked from
the launcher: gunicorn's ``gunicorn: master [ringserve]`` once setproctitle
renamed it, the launcher's own command line for the moment before), the
workers the master's children. Zombies (dead, not yet reaped) never
count. Also: killing a whole instance at once, as a crashed host would.
"""
from __future__ import annotations

import signal
import time

import psutil

from ipc.arena import Arena


def tree(pid: int) -> list[psutil.Process]:
    """The process and every process under it ([] once it is gone)."""
    try:
        me = psutil.Process(pid)
        return [me] + me.children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _live_children(pid: int) -> list[tuple[psutil.Process, str]]:
    out = []
    try:
        kids = psutil.Process(pid).children()
    except psutil.NoSuchProcess:
        return out
    for p in kids:
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                out.append((p, " ".join(p.cmdline())))
        except psutil.NoSuchProcess:
            pass
    return out


def is_master(cmd: str) -> bool:
    return "--arena" not in cmd.split()  # the engine's command line (frontends/process/procs.py) has it


def gunicorn(launcher: int) -> int:
    """Pid of the gunicorn master: the launcher's child that is not the engine."""
    for p, cmd in _live_children(launcher):
        if is_master(cmd):
            return p.pid
    raise LookupError("no gunicorn master")


def engine(launcher: int) -> int:
    """Pid of the engine: the launcher's live child that is not gunicorn (0: none now)."""
    for p, cmd in _live_children(launcher):
        if not is_master(cmd):
            return p.pid
    return 0


def workers(launcher: int) -> set[int]:
    """Pids of the gunicorn master's live workers."""
    try:
        return {p.pid for p, _ in _live_children(gunicorn(launcher))}
    except LookupError:
        return set()


def roles(launcher: int) -> dict[str, list[psutil.Process]]:
    """The tree by role: supervisor (the launcher), engine, http (the
    gunicorn master and its workers)."""
    out: dict[str, list[psutil.Process]] = {"supervisor": [], "engine": [], "http": []}
    procs = tree(launcher)
    if not procs:
        return out
    out["supervisor"].append(procs[0])
    try:
        master = gunicorn(launcher)
    except LookupError:
        master = 0
    for p in procs[1:]:
        try:
            http = p.pid == master or p.ppid() == master
        except psutil.NoSuchProcess:
            continue
        out["http" if http else "engine"].append(p)
    return out


def kill_all(launcher: int) -> float:
    """SIGKILL every process of the instance at once (a crashed host,
    ``docker kill``), wait until they are gone, and sweep the arena nobody
    is left to unlink. Returns the monotonic time once all are dead."""
    procs = tree(launcher)
    for p in procs:
        try:
            p.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=5)
    done = time.monotonic()
    Arena.sweep()
    return done
