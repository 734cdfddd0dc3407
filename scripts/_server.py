"""Shared plumbing for the fault, soak, fuzz and churn scripts and their tests.

One way to start a ``ringserve`` on a free 127.0.0.1 port (real model or the
fake engine), find its processes, read its metrics and shared memory, and
stop it checking exit code and /dev/shm. The small HTTP clients live in
``_clients`` and are re-exported here, so callers need one import.

Why a module of its own: every script and test here needs the same start,
probe and teardown, and a copy of it drifting in each would test different
servers. Import it as ``_server`` with ``scripts/`` on sys.path.
"""
from __future__ import annotations

import hashlib
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import psutil  # noqa: E402

from ipc import shm  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _clients import (  # noqa: E402,F401  (re-exported: scripts call _server.get etc.)
    HealthPoller, Streamer, busy_slots, content, get, metrics, parse_metrics, post, raw_request, reset_close, slots,
    sse_events, stream, table, wait_for,
)

FAKE_ENGINE = os.path.join(ROOT, "tests", "fake_engine.py")
FAKE_ENGINE_CMD = f"{sys.executable} {FAKE_ENGINE}"  # for RINGSERVE_ENGINE_CMD or --engine-cmd
# The seed's four prompts (greedy, one md5 each); distinct from the first token on.
PROMPTS = [
    "The capital of France is",
    "Here is a short poem about the sea:",
    "def fibonacci(n):",
    "Question: What is 12 times 12?\nAnswer:",
]
# Batch-invariant settings: with -ub 1 llama.cpp evaluates every token in a
# graph of its own, so a greedy output does not depend on what else shares
# the step (CPU matmul kernels change with the batch width: repacked Q4_K
# gemm from 4 columns, other paths from 8). Outputs under any concurrency
# then equal a control run byte for byte. It costs about half the aggregate
# decode throughput at 8 slots, the same in the control and the test. -b 16
# bounds a step to 16 such graphs: with the default 2048 a step taking
# every new prompt at once could last seconds, and everything (worker
# registrations included) waits for the step to end.
INVARIANT = ("-b", "16", "-ub", "1")
# How long a test may wait for "within 1 s" figures (a freed slot, an ended
# request): the 1 s, with room when the box's load says the engine's
# steps are being starved (its checks run between steps; a step can take 0.5 s).
WITHIN = 1.0 if os.getloadavg()[0] < 2.0 else 3.0


def free_port() -> int:
    """A currently free loopback port (the server binds it a moment later)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def md5(text: str) -> str:
    return hashlib.md5(text.encode("utf-8", "surrogatepass")).hexdigest()


def rss_kb(pid: int) -> int:
    """VmRSS of a process in kB (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


ARENA_LINE = re.compile(r"arena (rs_[0-9a-f]{16})")  # the supervisor's "arena rs_...: ..." log line


def instance_in(log: str) -> str:
    """The arena instance a ringserve log names."""
    return ARENA_LINE.search(log).group(1)


class Server:
    """A ``ringserve`` process tree on a free port.

    ``Server(*flags, fake=True)`` runs tests/fake_engine.py instead of the
    model; it is ready once constructed (unless ``wait=False``). ``stop()``
    sends SIGTERM and returns the exit code, ``finish()`` also lists what the
    instance left in /dev/shm; the log stays readable until ``cleanup()``
    (``log()``). Nothing is left running even if the caller forgets: use it
    as a context manager.
    """

    def __init__(self, *flags: str, fake: bool = False, env: dict | None = None, ready_timeout: float = 60.0,
                 wait: bool = True):
        self.ready_timeout = ready_timeout
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = tempfile.NamedTemporaryFile("w+", suffix=".ringserve.log", delete=False).name
        e = dict(os.environ, PYTHONPATH=ROOT)
        if fake:
            e["RINGSERVE_ENGINE_CMD"] = FAKE_ENGINE_CMD
        else:
            e.pop("RINGSERVE_ENGINE_CMD", None)
        e.update(env or {})
        self.flags = list(flags)
        self._out = open(self.log_path, "w")
        self.proc = subprocess.Popen([sys.executable, "-m", "frontends.cli", "--host", "127.0.0.1", "--port",
                                      str(self.port), *flags], cwd=ROOT, env=e, stdout=self._out,
                                     stderr=subprocess.STDOUT)
        self.returncode: int | None = None
        if wait:
            self.wait_ready()

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def url(self, path: str) -> str:
        return self.base + path

    def log(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def wait_ready(self, timeout: float | None = None) -> "Server":
        """Poll /health until 200; if it exits or times out (default: the
        constructor's ready_timeout), stop the tree first, then raise."""
        timeout = self.ready_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"ringserve exited {self.proc.returncode}:\n{self.log()[-3000:]}")
                if get(self.url("/health"), timeout=2.0)[0] == 200:
                    return self
                time.sleep(0.1)
            raise TimeoutError(f"ringserve not ready after {timeout} s:\n{self.log()[-3000:]}")
        except BaseException:
            self.stop()
            raise

    # ------------------------------------------------------------ processes
    @property
    def instance(self) -> str:
        return instance_in(self.log())

    @property
    def engine_pid(self) -> int:
        return int(re.findall(r"engine started: pid (\d+)", self.log())[-1])

    @property
    def master_pid(self) -> int:
        return int(re.search(r"gunicorn master started: pid (\d+)", self.log()).group(1))

    def worker_pids(self) -> list[int]:
        try:
            return sorted(p.pid for p in psutil.Process(self.master_pid).children()
                          if p.status() != psutil.STATUS_ZOMBIE)
        except psutil.Error:
            return []

    def shm_entries(self) -> list[str]:
        return shm.instance_entries(self.instance)

    def arena(self):
        """Attach to the instance (white-box checks); the caller closes it."""
        from ipc.arena import Arena

        return Arena.attach(self.instance)

    # ------------------------------------------------------------------ stop
    def stop(self, timeout: float = 15.0) -> int:
        """SIGTERM, wait, and (only if it hangs) SIGKILL the tree."""
        if self.returncode is not None:
            return self.returncode
        if self.proc.poll() is None:
            kids = []
            try:
                kids = psutil.Process(self.proc.pid).children(recursive=True)
            except psutil.Error:
                pass
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                for p in kids + [psutil.Process(self.proc.pid)]:
                    try:
                        p.kill()
                    except psutil.Error:
                        pass
                self.proc.wait()
        self.returncode = self.proc.returncode
        self._out.close()
        return self.returncode

    def cleanup(self) -> None:
        """Remove the log file (after ``stop``)."""
        try:
            os.unlink(self.log_path)
        except OSError:
            pass

    def finish(self) -> tuple[int, list[str]]:
        """Stop, list what the instance left in /dev/shm, remove the log: the
        teardown every fault test and script checks (exit 0, nothing left).
        Safe in a ``finally`` even if the server never named its arena."""
        m = ARENA_LINE.search(self.log())  # before stop: a subclass's stop may remove the log
        rc = self.stop()
        left = shm.instance_entries(m.group(1)) if m else []
        self.cleanup()
        return rc, left
