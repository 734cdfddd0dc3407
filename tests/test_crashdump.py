"""A native crash leaves the Python stack in the log (engine/crashdump.py).

Why: a SIGSEGV inside libllama (issue 12: the engine died at load on a GPU)
otherwise ends the log at the last libllama line. These tests crash for
real (a NULL read in C, not a Python exception) and look for the stack where
an operator would: the child's stderr, and the ``ringserve`` launcher's log.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time

from frontends import testing as S

from engine.crashdump import ENV
from ipc.arena import Arena


def test_crash_point_dumps_the_python_stack() -> None:
    """A child started like the engine (python -m, crashdump.enable first)
    dies with SIGSEGV and its stderr holds the stack down to the faulting
    call; the exit status is still the signal's."""
    code = ("from engine import crashdump\n"
            "def load_weights():\n"
            "    crashdump.crash_point('load')\n"
            "crashdump.enable()\n"
            "load_weights()\n")
    p = subprocess.run([sys.executable, "-c", code], cwd=S.ROOT, env=dict(os.environ, PYTHONPATH=S.ROOT, **{ENV: "load"}),
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == -11, (p.returncode, p.stderr)
    assert "Fatal Python error: Segmentation fault" in p.stderr
    assert "in crash_point" in p.stderr and "in load_weights" in p.stderr, p.stderr
    # without the variable nothing happens
    q = subprocess.run([sys.executable, "-c", code], cwd=S.ROOT, env=dict(os.environ, PYTHONPATH=S.ROOT),
                       capture_output=True, text=True, timeout=60)
    assert q.returncode == 0, q.stderr


def _crash_at_load(*flags: str) -> tuple[int, str, list[str], str]:
    """A real-model server whose weights' load segfaults: (exit status, its
    log, what it left, the instance still naming it in /dev/shm)."""
    srv = S.Server("-np", "1", "-c", "512", "-t", "1", *flags, env={ENV: "load"}, wait=False)
    try:
        deadline = time.monotonic() + 90
        while srv.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        log = srv.log()
        mine = Arena.instance_of(srv.proc.pid)  # "": no object in /dev/shm names it as its launcher
        rc, left = srv.finish()
    finally:
        srv.stop()
    return rc, log, left, mine


def test_engine_segfault_at_load_is_in_the_launchers_log() -> None:
    """The real engine (real model path, exec'd as on a GPU build) segfaults where libllama
    would load the weights: the launcher reports exit -11, stops with 1, and its log
    carries the engine's Python stack through engine/weights.py's Weights.__init__."""
    rc, log, left, _ = _crash_at_load("--engine-start", "exec")
    assert rc == 1, log[-3000:]
    assert left == []
    assert "Fatal Python error: Segmentation fault" in log, log[-3000:]
    assert "engine/weights.py" in log and "in __init__" in log and "engine/__main__.py" in log, log[-3000:]
    assert "engine failed before it was ever ready (exit -11)" in log, log[-3000:]


def test_segfault_loading_the_weights_to_fork_from_leaves_nothing_behind() -> None:
    """Where the launcher loads the weights itself (a CPU build: engine/weights.py),
    a native crash in that load ends the launcher with the signal's status, as
    llama-server's own load would end it, with its Python stack in the log, no
    child started and nothing in /dev/shm (the load runs before the arena is created)."""
    rc, log, left, mine = _crash_at_load()
    assert rc == -11 and mine == "", (mine, log[-3000:])
    assert left == []
    assert "Fatal Python error: Segmentation fault" in log, log[-3000:]
    assert "engine/weights.py" in log and "frontends/process/launcher.py" in log, log[-3000:]
    assert "arena rs_" not in log and "engine started" not in log, log[-3000:]
