"""Helpers for tests that run, signal and kill whole ringserve instances.

Used by test_lifecycle.py and test_nginx.py on top of ``fake_engine.Server``
(which starts one instance): finding an instance's processes, killing all of
them at once as a crashed host would, and streaming a completion while
noting when each event arrived.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

import psutil
import requests

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from fake_engine import Server  # noqa: E402

from ipc.arena import Arena  # noqa: E402


def tree(srv: Server) -> list[psutil.Process]:
    """The launcher and every process under it."""
    try:
        me = psutil.Process(srv.proc.pid)
        return [me] + me.children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def gunicorn(srv: Server) -> psutil.Process:
    """The gunicorn master: the launcher's child running frontends.serve."""
    for p in psutil.Process(srv.proc.pid).children():
        try:
            if "frontends.serve" in " ".join(p.cmdline()):
                return p
        except psutil.NoSuchProcess:
            pass
    raise LookupError("no gunicorn master")


def engine(srv: Server) -> int:
    """Pid of the engine: the launcher's child that is not gunicorn."""
    for p in psutil.Process(srv.proc.pid).children():
        try:
            if "frontends.serve" not in " ".join(p.cmdline()):
                return p.pid
        except psutil.NoSuchProcess:
            pass
    raise LookupError("no engine")


def workers(srv: Server) -> set[int]:
    """Pids of the gunicorn master's live workers (zombies excluded)."""
    out = set()
    for p in gunicorn(srv).children():
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                out.add(p.pid)
        except psutil.NoSuchProcess:
            pass
    return out


def wait_for(cond, timeout: float, what: str, step: float = 0.05):
    """Poll ``cond()`` until it returns something truthy; fail with ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(step)


def kill_all(srv: Server) -> float:
    """SIGKILL every process of the instance at once (a crashed host,
    ``docker kill``), wait until they are gone, and sweep the arena nobody
    is left to unlink. Returns the monotonic time once all are dead."""
    procs = tree(srv)
    for p in procs:
        try:
            p.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=5)
    srv.proc.wait(5)
    done = time.monotonic()
    Arena.sweep()
    return done


class Stream:
    """One streamed /completion: each SSE event and when it arrived.

    Why per-event times: the proxy tests compare first-token times and check
    that events arrive one by one rather than in one buffered burst. A cut
    stream (a killed instance) is recorded, not raised: the caller decides
    whether it was allowed. ``Stream(...).run()`` streams here;
    ``.start()`` in a thread (``times`` and ``events`` fill up live).
    """

    def __init__(self, url: str, prompt: str = "a b c d", n_predict: int = 10, timeout: float = 30.0):
        self.url, self.body, self.timeout = url, {"prompt": prompt, "n_predict": n_predict, "stream": True}, timeout
        self.t0 = self.t1 = 0.0
        self.times: list[float] = []
        self.events: list[dict] = []
        self.status, self.headers, self.error = 0, {}, None
        self.thread: threading.Thread | None = None

    def run(self) -> "Stream":
        self.t0 = time.monotonic()
        try:
            r = requests.post(self.url, json=self.body, stream=True, timeout=self.timeout)
            self.status, self.headers = r.status_code, r.headers
            for line in r.iter_lines():
                if line.startswith(b"data: "):
                    self.times.append(time.monotonic())
                    self.events.append(json.loads(line[6:]))
        except (requests.RequestException, ValueError) as e:
            self.error = e
        self.t1 = time.monotonic()
        return self

    def start(self) -> "Stream":
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()
        return self

    def join(self, timeout: float = 30.0) -> "Stream":
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"stream to {self.url} still running after {timeout} s"
        return self

    @property
    def complete(self) -> bool:
        """The final event arrived and says the generation ended normally."""
        if self.status != 200 or self.error is not None or not self.events:
            return False
        last = self.events[-1]
        return last.get("stop") is True and last.get("stop_type") in ("eos", "limit", "word")

    @property
    def ttft(self) -> float:
        """Seconds from sending the request to the first event."""
        return self.times[0] - self.t0
