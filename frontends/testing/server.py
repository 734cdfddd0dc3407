"""One way to run a server under test: ringserve (real model or the fake
engine), llama-server, or llama-cpp-python's server.

``Proc`` starts any server command on a free 127.0.0.1 port in a session of
its own that dies with us (PDEATHSIG), waits for its ready path, and stops
the whole process tree: SIGTERM, SIGKILL past the timeout, then any
descendant the server left behind is killed and reported. ``Server`` is a
``ringserve`` tree; ``FakeServer`` the frontend tests' fake-engine
instance; ``finish()`` is the teardown every fault test and script checks
(exit 0, nothing left in /dev/shm, no process left).

Why one module: every test, script and benchmark needs the same start,
probe and teardown; a copy drifting in each would test different servers.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Iterator

import psutil

from engine.process import ROOT
from ipc import shm
from ipc.arena import Arena

from frontends.process.procs import die_with_parent

from . import procs
from .http import get, wait_for

FAKE_ENGINE_CMD = f"{sys.executable} -m frontends.testing.fake_engine"  # RINGSERVE_ENGINE_CMD or --engine-cmd
HOST = "127.0.0.1"  # never anything else
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


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A currently free loopback port (the server binds it a moment later),
    below the kernel's ephemeral range. A port bound to 0 comes from that
    range, where every outgoing connection of the suite takes its local
    port, so one could hold it by the time the server binds (seen:
    llama-server's "couldn't bind HTTP server socket" in CI)."""
    lo = _ephemeral_low()
    for _ in range(100):
        port = random.randrange(10000, lo) if lo > 12000 else random.randrange(lo, 65536)
        with socket.socket() as s:
            try:
                s.bind((HOST, port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind((HOST, 0))
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
    """The arena instance a ringserve log names (post mortem: once the
    launcher is gone its control block is too)."""
    m = ARENA_LINE.search(log)
    return m.group(1) if m else ""


class Proc:
    """A server process tree on ``port``; a context manager that always stops it.

    ``cmd`` is run from the repository root; ``ready_path`` is polled until it
    answers 200 (``wait_ready``; at construction unless ``wait=False``).
    ``stop()`` returns the exit code; ``leftover`` then lists descendants
    that outlived the server (killed). The log stays until ``cleanup()``.
    """

    name = "server"

    def __init__(self, cmd: list[str], port: int, env: dict | None = None, ready_path: str = "/health",
                 ready_timeout: float = 60.0, wait: bool = True, name: str = ""):
        self.name = name or self.name
        self.port, self.ready_path, self.ready_timeout = port, ready_path, ready_timeout
        self.base = f"http://{HOST}:{port}"
        self.cmd = cmd
        self.log_path = tempfile.NamedTemporaryFile("w+", prefix=f"{self.name}-", suffix=".log", delete=False).name
        self._out = open(self.log_path, "w")
        # PDEATHSIG fires when the spawning *thread* ends: only from the main thread
        pdeath = die_with_parent if threading.current_thread() is threading.main_thread() else None
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=self._out,
                                     stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=pdeath)
        self.returncode: int | None = None
        self.leftover: list[int] = []
        if wait:
            self.wait_ready()

    def __enter__(self) -> "Proc":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def url(self, path: str) -> str:
        return self.base + path

    def log(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def log_tail(self, n: int = 3000) -> str:
        return self.log()[-n:]

    def on_ready(self) -> None:
        """Called once the ready path answered (subclasses note what they need)."""

    def wait_ready(self, timeout: float | None = None) -> "Proc":
        """Poll the ready path until 200; if the server exits or times out
        (default: the constructor's ready_timeout), stop the tree, then raise."""
        timeout = self.ready_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"{self.name} exited {self.proc.returncode}:\n{self.log_tail()}")
                if get(self.url(self.ready_path), timeout=2.0)[0] == 200:
                    self.on_ready()
                    return self
                time.sleep(0.03)  # a start is ~2 s: 0.1 s polls cost ~0.05 s a start, ~150 starts a suite
            raise TimeoutError(f"{self.name} not ready after {timeout} s:\n{self.log_tail()}")
        except BaseException:
            self.stop()
            raise

    def stop(self, timeout: float = 15.0) -> int:
        """SIGTERM, wait, SIGKILL the tree if it hangs; then kill (and list in
        ``leftover``) any descendant still alive: nothing outlives a test."""
        if self.returncode is not None:
            return self.returncode
        tree = procs.tree(self.proc.pid)  # before SIGTERM: children run in sessions of their own
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                for p in tree:
                    _kill(p)
                self.proc.wait()
        _, alive = psutil.wait_procs([p for p in tree if p.pid != self.proc.pid], timeout=2.0)
        self.leftover = [p.pid for p in alive]
        for p in alive:
            _kill(p)
        self.returncode = self.proc.returncode
        self._out.close()
        return self.returncode

    def cleanup(self) -> None:
        """Remove the log file (after ``stop``)."""
        try:
            os.unlink(self.log_path)
        except OSError:
            pass


def _kill(p: psutil.Process) -> None:
    try:
        p.kill()
    except psutil.Error:
        pass


class Server(Proc):
    """A ``ringserve`` process tree on a free port.

    ``Server(*flags, fake=True)`` runs testing/fake_engine.py instead of the
    model; it is ready once constructed (unless ``wait=False``). Its
    processes come from the process finder (``procs``), its instance from
    the arena's control block (the launcher pid it records).
    """

    name = "ringserve"

    def __init__(self, *flags: str, fake: bool = False, env: dict | None = None, ready_timeout: float = 60.0,
                 wait: bool = True, port: int = 0):
        e = dict(os.environ)
        e["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, e.get("PYTHONPATH")]))  # this tree, installed or not
        if fake:
            e["RINGSERVE_ENGINE_CMD"] = FAKE_ENGINE_CMD
        else:
            e.pop("RINGSERVE_ENGINE_CMD", None)
        e.update(env or {})
        self.flags = list(flags)
        self._instance = ""
        port = port or free_port()
        super().__init__([sys.executable, "-m", "frontends.process.cli", "--host", HOST, "--port", str(port), *flags],
                         port, e, "/health", ready_timeout, wait)

    # ------------------------------------------------------------ processes
    @property
    def instance(self) -> str:
        """The arena this launcher created (the control block's launcher
        pid; from the log once the launcher is gone)."""
        if not self._instance:
            self._instance = Arena.instance_of(self.proc.pid) if self.proc.poll() is None else ""
            self._instance = self._instance or instance_in(self.log())
        return self._instance

    def on_ready(self) -> None:
        self.instance  # noqa: B018  (noted while the launcher is alive)

    @property
    def engine_pid(self) -> int:
        return procs.engine(self.proc.pid)

    @property
    def master_pid(self) -> int:
        return procs.gunicorn(self.proc.pid)

    def worker_pids(self) -> list[int]:
        return sorted(procs.workers(self.proc.pid))

    def shm_entries(self) -> list[str]:
        return shm.instance_entries(self.instance)

    def arena(self) -> Arena:
        """Attach to the instance (white-box checks); the caller closes it."""
        return Arena.attach(self.instance)

    def finish(self) -> tuple[int, list[str]]:
        """Stop; what the instance left in /dev/shm and any process left
        running ("pid N"); remove the log. Safe in a ``finally`` even if the
        server never created its arena."""
        inst = self.instance if self.proc.poll() is None else instance_in(self.log())
        rc = self.stop()
        left = (shm.instance_entries(inst) if inst else []) + [f"pid {p}" for p in self.leftover]
        self.cleanup()
        return rc, left

    @classmethod
    def failed_start(cls, *flags: str, timeout: float = 90.0) -> tuple[int, list[str], str]:
        """Start with ``flags`` expecting the server to stop by itself (a
        model or flag it refuses): (exit code, what it left, its log)."""
        s = cls(*flags, wait=False)
        try:
            wait_for(lambda: s.proc.poll() is not None, timeout, "the server to stop")
            log = s.log()
            rc, left = s.finish()
        finally:
            s.stop()
        return rc, left, log


class FakeServer(Server):
    """A ``ringserve`` running the fake engine with the frontend tests'
    defaults: one gunicorn worker of 8 HTTP threads, ``-c 4096 -np 2``, the
    fake's event log (``events()``), and no wait at construction (some tests
    watch a server that is still loading or never gets ready):
    ``FakeServer(...).wait_ready()`` returns it ready (or stopped, raising).
    ``stop()`` also removes both logs."""

    def __init__(self, *flags: str, env: dict | None = None, workers: int = 1, ctx: int = 4096, np_: int = 2,
                 port: int = 0):
        self.engine_log = tempfile.NamedTemporaryFile("w+", suffix=".fake.log", delete=False).name
        super().__init__("-c", str(ctx), "-np", str(np_), "-w", str(workers), "--threads-http", "8", *flags,
                         fake=True, env={"FAKE_ENGINE_LOG": self.engine_log, **(env or {})}, ready_timeout=30.0,
                         wait=False, port=port)

    def events(self) -> list[tuple[str, int, int]]:
        """The fake engine's log: (submit|cancel|erase, rid or slot, CLOCK_MONOTONIC ns)."""
        with open(self.engine_log) as f:
            return [(a, int(b), int(c)) for a, b, c in (ln.split() for ln in f if ln.strip())]

    def stop(self, timeout: float = 10.0) -> int:
        rc = super().stop(timeout)
        self.cleanup()
        try:
            os.unlink(self.engine_log)
        except OSError:
            pass
        return rc


@contextlib.contextmanager
def running(*flags: str, **kw) -> Iterator[Server]:
    """A ``Server`` for a module fixture: stopped on exit, and the stop must
    leave no process and nothing in /dev/shm."""
    s = Server(*flags, **kw)
    try:
        yield s
    finally:
        rc, left = s.finish()
    assert rc == 0 and left == [], (rc, left)
