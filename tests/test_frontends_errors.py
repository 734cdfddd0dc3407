"""Error codes and shapes, limits, and cancellation of vanished clients.

Validation and error shapes run in-process (testing.TestClient: the worker's
app over a real arena, the fake engine in a thread); what needs a socket
(chunked bodies, vanished clients) runs against a real ringserve."""
from __future__ import annotations

import socket
import time

import pytest
import requests

from frontends.testing import FakeServer as Server
from frontends.testing import TestClient

LIMIT = 20000


@pytest.fixture(scope="module")
def srv():
    s = Server("--max-body", str(LIMIT), env={"FAKE_TOKEN_S": "0.005"}).wait_ready()
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def app():
    with TestClient("--max-body", str(LIMIT), token_s=0.005) as c:
        yield c


def raw(app: TestClient, path: str, data: bytes, ctype: str = "application/json"):
    return app.simulate_post(path, body=data, headers={"Content-Type": ctype})


def shape(r, code: int, type_: str) -> dict:
    """The error object of a requests.Response or a falcon.testing.Result."""
    assert r.status_code == code, r.text
    e = (r.json() if callable(r.json) else r.json)["error"]
    assert e["code"] == code and e["type"] == type_ and isinstance(e["message"], str)
    return e


def submits(app: TestClient) -> int:
    return int(app.arena.count("requests_total"))


@pytest.mark.parametrize("path", ["/completion", "/v1/completions", "/v1/chat/completions", "/tokenize"])
def test_bad_bodies(app, path):
    before = submits(app)
    for data in (b"{", b"", b"   ", b'{"prompt": "\xff\xfe"}', b'{"prompt": "\\ud800"}', b"[1,2]", b"null",
                 b'"str"', b'{"prompt": "a", "n_predict": NaN}'):
        shape(raw(app, path, data), 400, "invalid_request_error")
    assert submits(app) == before  # nothing reached the engine


def test_wrong_types_and_ranges(app):
    before = submits(app)
    bad = [("/completion", {}), ("/completion", {"prompt": 5}), ("/completion", {"prompt": "a", "n_predict": "x"}),
           ("/completion", {"prompt": "a", "temperature": "hot"}), ("/completion", {"prompt": "a", "top_p": [3]}),
           ("/completion", {"prompt": "a", "stop": 7}), ("/completion", {"prompt": [-5]}),
           ("/completion", {"prompt": "a", "n_predict": -2}), ("/completion", {"prompt": "a", "seed": "7"}),
           ("/completion", {"prompt": "a", "repeat_last_n": -1}), ("/completion", {"prompt": "a", "n_keep": -2}),
           ("/v1/chat/completions", {}), ("/v1/chat/completions", {"messages": "hi"}),
           ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "n": 0}),
           ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}),
           ("/v1/completions", {"prompt": "a", "logprobs": "50"}), ("/detokenize", {"tokens": "x"})]
    for path, body in bad:
        shape(app.simulate_post(path, json=body), 400, "invalid_request_error")
    e = shape(app.simulate_post("/v1/chat/completions", json={}), 400, "invalid_request_error")
    assert e["message"] == "'messages' is required"
    assert submits(app) == before


def test_exceed_context(app):
    r = app.simulate_post("/completion", json={"prompt": [9259] * 3000})
    e = shape(r, 400, "exceed_context_size_error")
    assert e["n_prompt_tokens"] == 3000 and e["n_ctx"] == 2048
    r = app.simulate_post("/completion", json={"prompt": [9259] * 3000, "stream": True})
    shape(r, 400, "exceed_context_size_error")  # plain JSON even when streaming, as llama-server


def test_not_found_and_method(app):
    shape(app.simulate_get("/nope"), 404, "not_found_error")
    e = shape(app.simulate_get("/completion"), 404, "not_found_error")
    assert e["message"] == "File Not Found"


def test_body_too_large(app, srv):
    shape(raw(app, "/completion", b'{"prompt": "' + b"a" * LIMIT + b'"}'), 413, "invalid_request_error")

    def chunks():  # no Content-Length: the limit still holds
        yield b'{"prompt": "'
        for _ in range(24):
            yield b"a" * 1024
        yield b'"}'

    r = requests.post(srv.url("/completion"), data=chunks(), headers={"Content-Type": "application/json"})
    shape(r, 413, "invalid_request_error")


@pytest.mark.parametrize("path,body", [
    ("/completion", {"prompt": "a"}),
    ("/v1/completions", {"prompt": "a"}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "a"}]}),
    ("/v1/responses", {"input": "a"}),
    ("/v1/messages", {"messages": [{"role": "user", "content": "a"}], "max_tokens": 4}),
])
@pytest.mark.parametrize("stream", [False, True])
def test_engine_error_passes_through(app, path, body, stream):
    """The engine refuses (the fake's sampler-init failure, as a bad grammar
    does): 400 with llama-server's JSON on every path, streamed or not: before
    the first event nothing is sent (chat's role delta and the Responses
    opening events used to go first, making it a 200 with the error in-band)."""
    r = app.simulate_post(path, json={**body, "seed": 999999, "stream": stream})
    shape(r, 400, "invalid_request_error")


def _cancel_latency(srv, request: bytes, wait_first: bytes | None) -> float:
    s = socket.create_connection(("127.0.0.1", srv.port))
    s.sendall(request)
    if wait_first:
        buf = b""
        while wait_first not in buf:
            buf += s.recv(4096)
    else:
        time.sleep(0.3)
    n = len(srv.events())
    t0 = time.monotonic_ns()
    s.close()
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        got = [ev for ev in srv.events()[n:] if ev[0] == "cancel"]
        if got:
            return (got[0][2] - t0) / 1e9
        time.sleep(0.01)
    raise AssertionError("the engine never saw a cancel")


def _req(body: bytes) -> bytes:
    return (b"POST /completion HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body))


def test_disconnect_cancels_within_100ms(srv):
    # non-streaming: nothing is written while it waits, only the socket poll can notice
    lat = _cancel_latency(srv, _req(b'{"prompt": "a b c", "n_predict": 5000}'), None)
    assert lat < 0.1, lat
    # streaming, while tokens flow
    lat = _cancel_latency(srv, _req(b'{"prompt": "a b c", "n_predict": 5000, "stream": true}'), b"data: ")
    assert lat < 0.1, lat
    # the slot is free again
    deadline = time.monotonic() + 1
    while time.monotonic() < deadline:
        if not any(s["is_processing"] for s in requests.get(srv.url("/slots")).json()):
            break
        time.sleep(0.02)
    else:
        raise AssertionError("slot still busy")
