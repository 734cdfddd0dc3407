"""Small HTTP clients for tests and scripts: requests, one SSE reader, one
streaming client, /metrics through prometheus_client's parser, wait_for.

Plain http.client and raw sockets, so that a client costs little CPU: it
shares two cores with the server under test. Re-exported by
``frontends.testing`` (callers write ``testing.get`` and so on).
"""
from __future__ import annotations

import http.client
import json
import re
import socket
import struct
import threading
import time
from typing import Any, Iterable, Iterator

from prometheus_client.parser import text_string_to_metric_families


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
        return 200, list(iter_sse(r))
    except (OSError, http.client.HTTPException, ValueError) as e:
        return 0, [{"error": {"message": str(e)}}]
    finally:
        c.close()


class Stream(threading.Thread):
    """One streaming POST read event by event, in its own thread
    (``start()``) or here (``run()``), so a test can watch many at once, see
    when each event arrived, when and how each ended, or drop it.

    After it ends: ``status`` (0: no response), ``headers``, ``events``,
    ``times`` (monotonic arrival of each), ``error`` (the error object of an
    error event or non-200 body, or {"message": "connection: ..."}),
    ``done`` (a final event arrived), ``complete`` (done with eos, limit or
    word), ``t0``/``t_end`` (monotonic). ``first`` is set at the first event
    or the end. A cut stream is recorded, not raised.
    """

    def __init__(self, url: str, body: dict, timeout: float = 300.0):
        super().__init__(daemon=True)
        self.host, self.port, self.path = _split(url)
        self.body, self.timeout = dict(body, stream=True), timeout
        self.status = 0
        self.headers: Any = {}
        self.events: list[dict] = []
        self.times: list[float] = []
        self.error: dict | None = None
        self.done = False
        self.t0 = self.t_end = 0.0
        self.first = threading.Event()
        self.conn: http.client.HTTPConnection | None = None

    def start(self) -> "Stream":
        super().start()
        return self

    def join(self, timeout: float | None = 30.0) -> "Stream":
        super().join(timeout)
        assert not self.is_alive(), f"stream to {self.path} still running after {timeout} s"
        return self

    def run(self) -> "Stream":
        self.t0 = time.monotonic()
        try:
            self.conn = c = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
            c.request("POST", self.path, json.dumps(self.body).encode(), {"Content-Type": "application/json"})
            r = c.getresponse()
            self.status, self.headers = r.status, r.headers
            if r.status != 200:
                self.error = json.loads(r.read() or b"{}").get("error", {"code": r.status})
                return self
            for ev in iter_sse(r):
                self.times.append(time.monotonic())
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
        return self

    @property
    def text(self) -> str:
        return content(self.events)

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
    """/metrics as {name: value}; a labelled sample as 'name{k="v",...}'."""
    status, body = get(base + "/metrics")
    return parse_metrics(body.decode()) if status == 200 else {}


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text, through prometheus_client's own parser."""
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = float(s.value)
    return out


def slots(base: str) -> list[dict]:
    status, body = get(base + "/slots")
    return json.loads(body) if status == 200 else []


def busy_slots(base: str) -> int:
    """Slots /slots shows processing."""
    return sum(1 for s in slots(base) if s["is_processing"])


def iter_sse(lines: Iterable[bytes]) -> Iterator[dict]:
    """The one SSE reader: each 'data: ' line's JSON, in order, from any
    iterable of lines (a response, a socket file); '[DONE]' and other
    lines are skipped."""
    for line in lines:
        if line.startswith(b"data: ") and line.strip() != b"data: [DONE]":
            yield json.loads(line[6:])


def sse_events(raw: bytes) -> list:
    """A whole SSE body, parsed strictly: every event is exactly
    'data: <json or [DONE]>' and a blank line; ValueError otherwise."""
    text = raw.decode()
    if not text.endswith("\n\n"):
        raise ValueError(f"SSE body does not end with a blank line: {text[-200:]!r}")
    out: list = []
    for ev in text[:-2].split("\n\n"):
        if not ev.startswith("data: ") or "\n" in ev:
            raise ValueError(f"not one 'data: ' line: {ev[:200]!r}")
        out.append(ev[6:] if ev[6:] == "[DONE]" else json.loads(ev[6:]))
    return out


def wait_for(cond, timeout: float, what="the condition", step: float = 0.02):
    """Poll ``cond()`` until it returns something truthy and return that;
    TimeoutError (naming ``what``) after ``timeout`` seconds. Time it with
    ``waited``. ``what`` may be a callable, called at the timeout (a
    server's log tail: what it says once it failed, not before)."""
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout} s waiting for {what() if callable(what) else what}")
        time.sleep(step)


def waited(cond, timeout: float, what: str = "the condition", step: float = 0.02) -> float:
    """Seconds ``wait_for(cond, ...)`` took."""
    t0 = time.monotonic()
    wait_for(cond, timeout, what, step)
    return time.monotonic() - t0


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
