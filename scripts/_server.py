"""Shared plumbing for the fault, soak, fuzz and churn scripts and their tests.

One way to start a ``ringserve`` on a free 127.0.0.1 port (real model or the
fake engine), find its processes, read its metrics and shared memory, and
stop it checking exit code and /dev/shm; plus small HTTP clients that cost
little CPU (the client shares two cores with the server under test).

Why a module of its own: every script and test here needs the same start,
probe and teardown, and a copy of it drifting in each would test different
servers. Import it as ``_server`` with ``scripts/`` on sys.path.
"""
from __future__ import annotations

import hashlib
import http.client
import json
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import psutil  # noqa: E402

from ipc import shm  # noqa: E402

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


# ------------------------------------------------------------------- clients
def get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    """(status, body); status 0 if the connection failed."""
    host, port, path = _split(url)
    try:
        c = http.client.HTTPConnection(host, port, timeout=timeout)
        c.request("GET", path)
        r = c.getresponse()
        body = r.read()
        c.close()
        return r.status, body
    except (OSError, http.client.HTTPException):
        return 0, b""


def post(url: str, body: Any, timeout: float = 120.0, headers: dict | None = None) -> tuple[int, Any]:
    """POST JSON (or raw bytes); (status, parsed JSON or raw bytes)."""
    host, port, path = _split(url)
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    h = {"Content-Type": "application/json"}
    h.update(headers or {})
    try:
        c = http.client.HTTPConnection(host, port, timeout=timeout)
        c.request("POST", path, data, h)
        r = c.getresponse()
        raw = r.read()
        c.close()
    except (OSError, http.client.HTTPException) as e:
        return 0, str(e)
    try:
        return r.status, json.loads(raw)
    except ValueError:
        return r.status, raw


def stream(url: str, body: dict, timeout: float = 120.0) -> tuple[int, list[dict]]:
    """A streaming POST read to its end: (status, parsed events)."""
    host, port, path = _split(url)
    c = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        c.request("POST", path, json.dumps(dict(body, stream=True)).encode(), {"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            return r.status, [json.loads(r.read() or b"{}")]
        events = []
        for line in r:
            if line.startswith(b"data: ") and line.strip() != b"data: [DONE]":
                events.append(json.loads(line[6:]))
        return 200, events
    except (OSError, http.client.HTTPException, ValueError) as e:
        return 0, [{"error": {"message": str(e)}}]
    finally:
        c.close()


class Streamer(threading.Thread):
    """One streaming request read event by event in its own thread, so a
    test can watch many at once, see when each ended and how, or drop it.

    After the thread ends: ``status`` (0: no response), ``events``,
    ``error`` (the error object of an error event or non-200 body),
    ``done`` (a final event with stop true arrived), ``t_end`` (monotonic).
    """

    def __init__(self, base: str, body: dict, path: str = "/completion", timeout: float = 300.0):
        super().__init__(daemon=True)
        self.host, self.port, _ = _split(base)
        self.path, self.body, self.timeout = path, dict(body, stream=True), timeout
        self.status = 0
        self.events: list[dict] = []
        self.error: dict | None = None
        self.done = False
        self.t_end = 0.0
        self.first = threading.Event()
        self.conn: http.client.HTTPConnection | None = None

    def run(self) -> None:
        try:
            self.conn = c = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
            c.request("POST", self.path, json.dumps(self.body).encode(), {"Content-Type": "application/json"})
            r = c.getresponse()
            self.status = r.status
            if r.status != 200:
                self.error = json.loads(r.read() or b"{}").get("error", {"code": r.status})
                return
            for line in r:
                if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                    continue
                ev = json.loads(line[6:])
                self.events.append(ev)
                self.first.set()
                if "error" in ev:
                    self.error = ev["error"]
                elif ev.get("stop") is True or (ev.get("choices") and ev["choices"][0].get("finish_reason")):
                    self.done = True
        except (OSError, http.client.HTTPException, ValueError) as e:
            if self.error is None and not self.done:
                self.error = {"message": f"connection: {e}"}
        finally:
            self.t_end = time.monotonic()
            self.first.set()
            if self.conn is not None:
                self.conn.close()

    @property
    def text(self) -> str:
        return content(self.events)

    def drop(self, reset: bool = True) -> None:
        """Abandon the request (RST by default, like a killed client)."""
        c = self.conn
        sock = c.sock if c is not None else None
        if sock is None:
            return
        if reset:
            _linger0(sock)
        try:
            sock.shutdown(socket.SHUT_RDWR)  # wakes our reader thread (a bare close would not)
        except OSError:
            pass


def content(events: list[dict]) -> str:
    return "".join(e.get("content", "") for e in events)


def raw_request(path: str, body: dict, extra_headers: str = "") -> bytes:
    data = json.dumps(body).encode()
    return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n{extra_headers}\r\n").encode() + data


def reset_close(sock: socket.socket) -> None:
    """Close with SO_LINGER {1, 0}: the peer gets an RST, not a FIN."""
    _linger0(sock)
    sock.close()


def _linger0(sock: socket.socket) -> None:
    """SO_LINGER {1, 0}: the socket's close (or shutdown) sends an RST."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass


def metrics(base: str) -> dict[str, float]:
    """/metrics as {name: value} (unlabelled series; labelled ones as name{labels})."""
    status, body = get(base + "/metrics")
    return parse_metrics(body.decode()) if status == 200 else {}


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text -> {'name{labels}': value} (comments dropped)."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, val = line.rpartition(" ")
            try:
                out[name] = float(val)
            except ValueError:
                pass
    return out


def slots(base: str) -> list[dict]:
    status, body = get(base + "/slots")
    return json.loads(body) if status == 200 else []


def wait_for(pred, timeout: float, step: float = 0.02) -> float | None:
    """Seconds until pred() held, or None after timeout."""
    t0 = time.monotonic()
    while True:
        if pred():
            return time.monotonic() - t0
        if time.monotonic() - t0 > timeout:
            return None
        time.sleep(step)


class HealthPoller(threading.Thread):
    """GET /health at ``hz`` until stopped; keeps every status code."""

    def __init__(self, base: str, hz: float = 2.0):
        super().__init__(daemon=True)
        self.base, self.period = base, 1.0 / hz
        self.codes: list[int] = []
        self._halt = threading.Event()

    def run(self) -> None:
        nxt = time.monotonic()
        while not self._halt.is_set():
            self.codes.append(get(self.base + "/health", timeout=5.0)[0])
            nxt += self.period
            self._halt.wait(max(nxt - time.monotonic(), 0))

    def stop(self) -> list[int]:
        self._halt.set()
        self.join(10)
        return self.codes


def table(headers: list[str], rows: list[list[Any]]) -> str:
    """A plain text table (tab-free, aligned) for the closing notes."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    w = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    line = lambda r: "  ".join(c.ljust(w[i]) for i, c in enumerate(r)).rstrip()  # noqa: E731
    return "\n".join([line(cells[0]), "  ".join("-" * x for x in w)] + [line(r) for r in cells[1:]])


def _split(url: str) -> tuple[str, int, str]:
    m = re.match(r"http://([^:/]+):(\d+)(.*)", url)
    return m.group(1), int(m.group(2)), m.group(3) or "/"
