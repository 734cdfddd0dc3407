"""Shared test plumbing: a leak-proof arena factory, and a
session check that the suite left no shared-memory objects or processes.

Why a session check: POSIX shm and named semaphores outlive their creator
(kernel persistence), so a test that forgets to unlink leaks into /dev/shm for
good. Only entries that appeared during the session are blamed, so a server
running beside the tests does not fail them.
"""
from __future__ import annotations

import os
import time
from typing import Callable, Iterator

import psutil
import pytest

from ipc import shm
from ipc.arena import Arena, Geometry

# The suite starts a few hundred Python processes (servers' launchers, engines and workers, the scripts'
# --quick runs). Where the environment sets PYTHONDONTWRITEBYTECODE (this workplace's containers do), each
# of them compiled this repository's modules anew: ~0.15 s a server start, measured. Writing bytecode into
# the checkout's __pycache__ (git-ignored) lets every process after the first load it.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)


_BEFORE = pytest.StashKey[set]()


def _rs_entries() -> set[str]:
    return {n for n in os.listdir(shm.SHM_DIR) if n.startswith(shm.PREFIX) or n.startswith("sem." + shm.PREFIX)}


def _ours(entry: str) -> bool:
    """False only for an instance whose launcher is alive and is not this
    session or one of its children (another program's live instance)."""
    m = shm._NAME_RE.match(entry)
    if m is None:
        return True
    try:
        pid = Arena.launcher_of(m.group(1))[0]
    except Exception:
        return True  # half created or half removed: judged again below
    mine = {os.getpid()} | {p.pid for p in psutil.Process().children(recursive=True)}
    return pid in mine or not shm.alive(pid)


def _leftovers(before: set[str]) -> list[str]:
    """New rs_* entries that are ours and persist (another program may be
    creating or removing its own instance at the moment we look)."""
    for _ in range(5):
        left = sorted(e for e in _rs_entries() - before if _ours(e))
        if not left:
            break
        time.sleep(0.3)
    return left


def _children() -> list[psutil.Process]:
    """Live children, except multiprocessing's own helpers (they exit with us)."""
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() == psutil.STATUS_ZOMBIE:
                continue
            cmd = " ".join(p.cmdline())
        except psutil.Error:
            continue
        if "resource_tracker" in cmd or "forkserver" in cmd:
            continue
        out.append(p)
    return out


@pytest.fixture(scope="session", autouse=True)
def no_leftovers() -> Iterator[None]:
    """Fail the session if it left live children (each process its own:
    an xdist worker its, the run without xdist all). /dev/shm is checked
    once, after every test, in ``pytest_sessionfinish`` below: under xdist
    another worker may be between killing an instance's launcher and
    checking what it left (the fault tests do that)."""
    yield
    deadline = time.monotonic() + 3.0
    while _children() and time.monotonic() < deadline:
        time.sleep(0.05)
    kids = _children()
    for p in kids:  # do not leave them behind even when failing
        p.kill()
    assert not kids, f"tests left processes running: {[p.pid for p in kids]}"


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[_BEFORE] = _rs_entries()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Fail the run if it left rs_* objects in /dev/shm: in the process that
    runs the session (xdist's controller, after its workers have ended, or
    the only one), never in a worker."""
    if hasattr(session.config, "workerinput"):
        return
    left = _leftovers(session.config.stash[_BEFORE])
    if left:
        tr = session.config.pluginmanager.get_plugin("terminalreporter")
        tr.write("\n")  # after the progress dots, which end without one
        tr.write_line(f"ERROR: tests left shared-memory objects: {left}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.hookimpl(optionalhook=True)  # xdist's hook: no error where xdist is not loaded (-p no:xdist)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """The two phases of tests/_phases.py, for xdist's default distribution."""
    if config.getvalue("dist") != "load":
        return None
    from _phases import Phases

    return Phases(config, log)


@pytest.fixture
def make_arena() -> Iterator[Callable[..., Arena]]:
    """Create arenas that are closed and unlinked whatever the test does."""
    made: list[Arena] = []

    def make(**geom: int) -> Arena:
        a = Arena.create(Geometry(**geom))
        made.append(a)
        return a

    yield make
    for a in made:
        a.unlink()
        a.close()


@pytest.fixture(scope="session")
def gemma_vocab():
    """The default model's vocabulary (a vocab-only llama_cpp.Llama), loaded
    once for every test that tokenizes or detokenizes: a load of the 262k
    vocabulary is ~0.6-0.9 s, and nine tests or fixtures each loaded their own. Read
    only (tokenize, detokenize, token_eos): a test must not close it."""
    from llama_cpp import Llama

    from engine.config import Config

    llm = Llama(Config().model_path(), vocab_only=True, verbose=False)
    yield llm
    llm.close()
