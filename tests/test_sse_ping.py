"""SSE pings (llama-server's ``sse_ping_interval``, server-context.cpp
handle_completions_impl): once a stream's first event is out, a silence of
the engine past the interval is answered with the comment ``:\\n\\n`` and the
stream goes on; -1 (and 0) disable it, a request's field overrides
``--sse-ping-interval``, nothing is sent before the first event (llama-server
awaits the first result without pings) and a whole answer never has one.

The fake engine plays the silence (``Fake.gap``: GAP seconds after the first
token, or before it). Each test also checks a stream that must be pinged, so
with the feature off every test fails. Streams run side by side (8 slots),
so a test costs about one gap."""
from __future__ import annotations

import http.client
import json
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from frontends import testing
from frontends.testing import FakeServer, TestClient

GAP = 2.0  # seconds of engine silence; the interval is 1 s (pinged at ~1.0-1.3 s), its token comes at 2 s
PING = ":"  # one ping event of a body split on blank lines
CHAT = [{"role": "user", "content": "hi"}]
# every streaming API llama-server pings (one handler, handle_completions_impl, serves them all)
APIS = {
    "/completion": {"prompt": "Hello world"},
    "/v1/completions": {"prompt": "Hello world", "max_tokens": 4},
    "/v1/chat/completions": {"messages": CHAT, "max_tokens": 4},
    "/v1/responses": {"input": "hi", "max_output_tokens": 4},
    "/v1/messages": {"messages": CHAT, "max_tokens": 4},
}


@pytest.fixture(scope="module")
def srv():
    """The server's default interval (30 s): only a request's field pings within a test."""
    with TestClient("-np", "8", token_s=0.002) as c:
        yield c


def run(c: TestClient, reqs: list[tuple[str, dict]], gap: tuple[int, float] = (1, GAP)) -> list:
    """The requests side by side, the engine silent for ``gap`` (after token n, n 0: before the first)."""
    c.fake.gap = gap
    try:
        with ThreadPoolExecutor(len(reqs)) as ex:
            return list(ex.map(lambda r: c.simulate_post(r[0], json=r[1]), reqs))
    finally:
        c.fake.gap = (0, 0.0)


def split(body: str) -> tuple[list[str], int]:
    """(the events that are not pings, the pings); a ping is exactly ':' and a blank line."""
    assert body.endswith("\n\n"), body[-200:]
    evs = body[:-2].split("\n\n")
    return [e for e in evs if e != PING], sum(e == PING for e in evs)


def text_of(path: str, events: list[str]) -> str:
    """The answer's text from a stream's events (each API's own delta fields)."""
    out = []
    for e in events:
        data = e.split("data: ", 1)[1]
        if data == "[DONE]":
            continue
        d = json.loads(data)
        if path == "/completion":
            out.append(d["content"])
        elif path == "/v1/completions":
            out += [ch["text"] for ch in d["choices"]]
        elif path == "/v1/chat/completions":
            out += [ch["delta"].get("content") or "" for ch in d["choices"]]
        elif path == "/v1/responses" and d["type"] == "response.output_text.delta":
            out.append(d["delta"])
        elif path == "/v1/messages" and d["type"] == "content_block_delta":
            out.append(d["delta"].get("text", ""))
    return "".join(out)


def test_silent_stream_is_pinged_then_its_tokens_come_intact(srv):
    """Every streaming API: a request's sse_ping_interval of 1 s gets ':' comments
    during the engine's 2 s silence after the first token, never before the first
    event, and then the same answer as an unpinged stream (the strict SSE parse of
    the rest holds: the pings are whole events of their own)."""
    want = {p: run(srv, [(p, {**b, "stream": True})], (0, 0.0))[0].text for p, b in APIS.items()}
    got = run(srv, [(p, {**b, "stream": True, "sse_ping_interval": 1}) for p, b in APIS.items()])
    for (path, _), r in zip(APIS.items(), got):
        assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/event-stream"), path
        events, pings = split(r.text)
        assert pings >= 1, (path, r.text[:300])
        assert not r.text.startswith(PING), path  # the first event (and the headers) first
        assert text_of(path, events) == text_of(path, split(want[path])[0]) != "", (path, r.text)
        if path in ("/completion", "/v1/completions", "/v1/chat/completions"):
            testing.sse_events(("\n\n".join(events) + "\n\n").encode())  # strict: data lines only


def test_server_flag_pings_and_minus_one_or_zero_disables():
    """--sse-ping-interval 1 pings a silent stream that says nothing; a request's
    -1 (llama-server's 'disables') or 0 (its check is > 0) overrides it."""
    with TestClient("-np", "8", "--sse-ping-interval", "1", token_s=0.002) as c:
        body = {"prompt": "Hello world", "stream": True}
        flag, off, zero = run(c, [("/completion", body), ("/completion", {**body, "sse_ping_interval": -1}),
                                  ("/completion", {**body, "sse_ping_interval": 0})])
        assert split(flag.text)[1] >= 1, flag.text
        for r in (off, zero):
            events, pings = split(r.text)
            assert pings == 0 and text_of("/completion", events) == "Hello world", r.text


def test_no_ping_before_the_first_event(srv):
    """A long prompt (silence before the first token): llama-server awaits the first
    result without pings, so a stream's body starts with its first event and no
    ping at all here; with return_progress the first progress record is that first
    result, and the silence after it is pinged."""
    body = {"prompt": "Hello world", "stream": True, "sse_ping_interval": 1}
    plain, progress = run(srv, [("/completion", body), ("/completion", {**body, "return_progress": True})], (0, GAP))
    events, pings = split(plain.text)
    assert pings == 0 and text_of("/completion", events) == "Hello world", plain.text
    events, pings = split(progress.text)
    assert pings >= 1 and "prompt_progress" in events[0] and not progress.text.startswith(PING), progress.text


def test_whole_answers_are_never_pinged(srv):
    """stream false: one JSON document, however long the engine is silent; the same
    request streamed is pinged."""
    reqs = [("/completion", {"prompt": "Hello world", "sse_ping_interval": 1}),
            ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 4, "sse_ping_interval": 1}),
            ("/completion", {"prompt": "Hello world", "sse_ping_interval": 1, "stream": True})]
    native, chat, streamed = run(srv, reqs)
    assert ":\n\n" not in native.text and native.json["content"] == "Hello world", native.text
    assert ":\n\n" not in chat.text and chat.json["choices"][0]["message"]["content"], chat.text
    assert split(streamed.text)[1] >= 1, streamed.text


class Recording(httpx.WSGITransport):
    """The app's transport, keeping each response body as it went to the client."""

    def __init__(self, app):
        super().__init__(app=app)
        self.bodies: list[bytes] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        r = super().handle_request(request)
        self.bodies.append(r.read())
        return httpx.Response(r.status_code, headers=r.headers, content=self.bodies[-1], request=request)


def test_openai_client_reads_a_pinged_stream(srv):
    """The OpenAI SDK's SSE decoder skips the comments: the chunks are the same."""
    openai = pytest.importorskip("openai")
    wire = Recording(srv.app)
    c = openai.OpenAI(base_url="http://testserver/v1", api_key="none", http_client=httpx.Client(transport=wire))
    srv.fake.gap = (1, GAP)
    try:
        chunks = list(c.chat.completions.create(model="m", messages=CHAT, max_tokens=4, stream=True,
                                                extra_body={"sse_ping_interval": 1}))
    finally:
        srv.fake.gap = (0, 0.0)
    assert b"\n\n:\n\n" in wire.bodies[-1], wire.bodies[-1]  # the SDK did get pings
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[-1].choices[0].finish_reason == "length"
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == "user\nhi"  # the echo


def test_ping_on_the_wire_arrives_during_the_silence():
    """Through gunicorn and a real socket (the hangup watcher's 0.25 s reads): the
    ping is flushed while the engine is silent, no sooner than the interval after
    the first event, and before the next token."""
    s = FakeServer("--sse-ping-interval", "1", env={"FAKE_GAP": f"1:{GAP}"}).wait_ready()
    try:
        conn = http.client.HTTPConnection(testing.HOST, s.port, timeout=30)
        conn.request("POST", "/completion", json.dumps({"prompt": "Hello world", "stream": True}).encode(),
                     {"Content-Type": "application/json"})
        r = conn.getresponse()
        assert r.status == 200
        lines = [(time.monotonic(), ln) for ln in r if ln.strip()]
        conn.close()
    finally:
        s.stop()
    kinds = ["ping" if ln == b":\n" else "data" for _, ln in lines]
    assert kinds[0] == "data" and "ping" in kinds, kinds
    k = kinds.index("ping")
    assert lines[k][0] - lines[0][0] >= 0.95, lines  # silent past the interval (1 s) before the first ping
    assert kinds[k + 1:] and all(x in ("ping", "data") for x in kinds[k + 1:]) and kinds[-1] == "data", kinds
    text = "".join(json.loads(ln[6:])["content"] for _, ln in lines if ln.startswith(b"data: "))
    assert text == "Hello world", lines
