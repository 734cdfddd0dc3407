"""Small HTTP clients for the fault, soak, fuzz and churn scripts.

Plain http.client and raw sockets, so that a client costs little CPU: it
shares two cores with the server under test. Re-exported by ``_server``
(scripts and tests call them as ``_server.get`` and so on).
"""
from __future__ import annotations

import http.client
import json
import re
import socket
import struct
import threading
import time
from typing import Any

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


def busy_slots(base: str) -> int:
    """Slots /slots shows processing."""
    return sum(1 for s in slots(base) if s["is_processing"])


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
