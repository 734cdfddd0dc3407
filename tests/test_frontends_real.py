"""Every generating endpoint against a real ringserve with the default model
(gemma-3 270M): answers, SSE framing, the official OpenAI client, 32
concurrent streams, disconnects, slot erase and /metrics.

Why the real model: tests/test_frontends_api.py checks shapes against the
fake engine, which echoes the prompt. What only a model shows is that the
whole chain (tokenize, plan, channel, engine, detokenize, JSON or SSE) gives
the model's own greedy answer, to the right client, and that the counters,
slot states and cache figures the server reports match what the engine did.

Why -b 16 -ub 1 (testing.INVARIANT): llama.cpp's CPU kernels are not batch
invariant, so a greedy answer decoded beside other sequences may differ from
the same answer decoded alone. With one token per graph it cannot, so here
"equals the single-slot engine run" and "each of 32 concurrent streams equals
its solo answer" are exact checks (a token delivered to the wrong channel, a
lost or repeated token, a wrong prompt would all show), not likelihoods. The
single-slot engine run uses the server's own parsed settings (slot context,
batch sizes, flash attention, swa_full, threads), with one slot.

One server for the module; tests run in file order and never overlap, so a
request that must run alone does (the solo answers, the metrics window).
"""
from __future__ import annotations

import dataclasses
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterator

import orjson
import pytest
import requests

from frontends import testing as S

FLAGS = ("-c", "2048", "-np", "4", "-t", "2", "-w", "2", "--threads-http", "32", "--metrics", *S.INVARIANT)
N = 8  # tokens per greedy answer: enough for a wrong, lost or repeated token to show, half the time of 16
CHAT = [{"role": "user", "content": "Name three colours."}]


def greedy(prompt: str, **kw: Any) -> dict:
    """A greedy /completion body (ignore_eos: every answer is N tokens)."""
    return {"prompt": prompt, "n_predict": N, "temperature": 0, "ignore_eos": True, "cache_prompt": False, **kw}


def chat_body(**kw: Any) -> dict:
    return {"messages": CHAT, "max_tokens": N, "temperature": 0, **kw}


@pytest.fixture(scope="module")
def srv() -> Iterator[S.Server]:
    s = S.Server(*FLAGS)
    try:
        yield s
    finally:
        rc, left = s.finish()
    assert rc == 0 and left == [], (rc, left)


def post(srv: S.Server, path: str, body: Any) -> requests.Response:
    r = requests.post(srv.url(path), json=body, timeout=120)
    assert r.status_code == 200, (path, r.status_code, r.text[:500])
    return r


def stream(srv: S.Server, path: str, body: dict) -> tuple[requests.Response, list]:
    r = post(srv, path, dict(body, stream=True))
    assert r.headers["Content-Type"].startswith("text/event-stream")
    return r, S.sse_events(r.content)


def scrape(srv: S.Server) -> dict[str, float]:
    """/metrics through prometheus_client's parser (testing.parse_metrics)."""
    r = requests.get(srv.url("/metrics"), timeout=10)
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/plain")
    return S.parse_metrics(r.text)


@pytest.fixture(scope="module")
def solo(srv: S.Server) -> dict[str, dict]:
    """Each prompt's greedy /completion, sent alone: prompt -> response."""
    return {p: post(srv, "/completion", greedy(p, return_tokens=True)).json() for p in S.PROMPTS}


# ------------------------------------------------------------------ 1
def test_greedy_completion_equals_single_slot_engine(srv: S.Server, solo: dict[str, dict], gemma_vocab) -> None:
    """/completion (plain, streamed) and /v1/completions give, token for token,
    what the engine gives one sequence driven through a channel, no HTTP."""

    from engine.direct import generate
    from engine.process import EngineProcess
    from frontends.process.cli import parse
    from ipc.client import WorkerPort

    cfg, _ = parse(list(FLAGS))
    cfg = dataclasses.replace(cfg, parallel=1, ctx_size=cfg.n_ctx_slot, workers=1, http_threads=2, metrics=False)
    vocab = gemma_vocab  # FLAGS serve the default model
    with EngineProcess(cfg) as eng:
        port = WorkerPort(eng.arena, 0)
        for p, j in solo.items():
            ids = vocab.tokenize(p.encode(), add_bos=True, special=True)
            want = generate(port, ids, cfg.sampling(temperature=0.0, n_predict=N, ignore_eos=1, cache_prompt=0))
            assert want.stop == "limit" and len(want.tokens) == N
            assert j["tokens"] == want.tokens, p
            assert j["content"] == vocab.detokenize(want.tokens).decode("utf-8", "replace"), p
            assert j["tokens_evaluated"] == len(ids) == j["timings"]["prompt_n"] and j["timings"]["cache_n"] == 0
            assert j["tokens_predicted"] == N and j["stop_type"] == "limit" and j["truncated"] is False
    for p, j in solo.items():
        _, ev = stream(srv, "/completion", greedy(p))
        assert [t for e in ev[:-1] for t in e["tokens"]] == j["tokens"]
        assert "".join(e["content"] for e in ev) == j["content"]
        v1 = post(srv, "/v1/completions", {"prompt": p, "max_tokens": N, "temperature": 0, "ignore_eos": True}).json()
        assert v1["choices"][0]["text"] == j["content"] and v1["choices"][0]["finish_reason"] == "length"
        assert v1["usage"]["completion_tokens"] == N and v1["usage"]["prompt_tokens"] == j["tokens_evaluated"]


# ------------------------------------------------------------------ 2
def test_openai_client(srv: S.Server, solo: dict[str, dict]) -> None:
    """The official client, unchanged: models, completions, chat, both streamed."""
    import openai

    c = openai.OpenAI(base_url=srv.url("/v1"), api_key="anything", max_retries=0, timeout=120)
    model = requests.get(srv.url("/v1/models"), timeout=10).json()["data"][0]["id"]
    assert [m.id for m in c.models.list()] == [model]
    p = S.PROMPTS[0]
    r = c.completions.create(model=model, prompt=p, max_tokens=N, temperature=0, extra_body={"ignore_eos": True})
    assert r.choices[0].text == solo[p]["content"] and r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == N and r.usage.prompt_tokens == solo[p]["tokens_evaluated"]
    chunks = list(c.completions.create(model=model, prompt=p, max_tokens=N, temperature=0, stream=True,
                                       extra_body={"ignore_eos": True}))
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == solo[p]["content"]
    assert chunks[-1].choices[0].finish_reason == "length"
    want = post(srv, "/v1/chat/completions", chat_body()).json()["choices"][0]
    r = c.chat.completions.create(model=model, messages=CHAT, max_tokens=N, temperature=0)
    got = r.choices[0]
    assert got.message.role == "assistant" and got.message.content == want["message"]["content"]
    assert got.finish_reason == want["finish_reason"] and got.message.content.strip()
    assert r.usage.completion_tokens > 0 and r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    chunks = list(c.chat.completions.create(model=model, messages=CHAT, max_tokens=N, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == want["message"]["content"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == r.usage.completion_tokens
    assert len({ch.id for ch in chunks}) == 1


# ------------------------------------------------------------------ 3
def test_32_concurrent_streams(srv: S.Server, solo: dict[str, dict]) -> None:
    """32 streams at once on 4 slots (28 wait): all complete, well framed,
    each equal to its prompt's solo answer (batch invariant settings)."""
    gate = threading.Barrier(32)

    def one(i: int) -> tuple[str, list]:
        p = S.PROMPTS[i % len(S.PROMPTS)]
        gate.wait(30)
        r = requests.post(srv.url("/completion"), json=greedy(p, stream=True), timeout=300)
        assert r.status_code == 200, r.text[:300]
        return p, S.sse_events(r.content)

    t0 = time.monotonic()
    with ThreadPoolExecutor(32) as ex:
        results = list(ex.map(one, range(32)))
    print(f"32 streams of {N} tokens on 4 slots: {time.monotonic() - t0:.1f} s")
    for p, ev in results:
        parts, last = ev[:-1], ev[-1]
        assert "[DONE]" not in ev and all(e["stop"] is False and len(e["tokens"]) == 1 for e in parts)
        assert last["stop"] is True and last["tokens_predicted"] == N == last["timings"]["predicted_n"]
        toks = [e["tokens"][0] for e in parts]
        text = "".join(e["content"] for e in ev)
        assert toks == solo[p]["tokens"] and text == solo[p]["content"], (p, text, solo[p]["content"])
        assert post(srv, "/detokenize", {"tokens": toks}).json()["content"] == text
    assert S.wait_for(lambda: S.busy_slots(srv.base) == 0, 5) is not None


# ------------------------------------------------------------------ 4
@pytest.mark.parametrize("reset", [False, True], ids=["fin", "rst"])
def test_disconnect_mid_stream_frees_slot(srv: S.Server, reset: bool) -> None:
    """A client that goes away (FIN or RST) mid-stream: its slot is idle
    in /slots within a second, its channel released."""
    st = S.Stream(srv.url("/completion"), {"prompt": "Write a long story about a lighthouse.", "n_predict": 400,
                               "ignore_eos": True, "temperature": 0})
    st.start()
    assert st.first.wait(60) and st.error is None, (st.status, st.error)
    assert S.wait_for(lambda: S.busy_slots(srv.base) == 1, 10) is not None
    st.drop(reset=reset)
    freed = S.waited(lambda: S.busy_slots(srv.base) == 0, 10, step=0.01)
    print(f"disconnect ({'RST' if reset else 'FIN'}): slot idle after {freed} s")
    st.join(10)
    assert freed is not None and freed < S.WITHIN, freed
    assert not st.done and len(st.events) < 400
    assert S.wait_for(lambda: scrape(srv)["ringserve:channels_leased"] == 0, 5) is not None


def test_client_that_stops_reading_pauses_its_slot_then_resumes(srv: S.Server) -> None:
    """A client that stops reading (2 kB receive buffer): its slot pauses
    after its receive window, 2 KiB unsent (gen.HOLD_UNSENT) and one ring
    (64 records) of tokens, about 100, not after the send buffer's ~150
    events more; once the client reads again the slot resumes and the
    answer completes, every token in it."""
    n = 200  # past the pause (at most 160 tokens, asserted) with room to resume
    body = {"prompt": "Write a very long story about a dragon.", "n_predict": n, "stream": True,
            "temperature": 0, "ignore_eos": True, "cache_prompt": False}
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
    sock.connect(("127.0.0.1", srv.port))
    try:
        sock.sendall(S.raw_request("/completion", body))

        def paused() -> int:
            for s in S.slots(srv.base):
                nt = (s.get("next_token") or [{}])[0]
                if s["is_processing"] and not nt.get("has_next_token", True) and nt.get("n_decoded", 0) > 0:
                    return nt["n_decoded"]
            return 0

        assert S.wait_for(lambda: paused() > 0, 60, step=0.05) is not None, S.slots(srv.base)
        time.sleep(0.5)
        at = paused()
        print(f"a client that stops reading: its slot paused after {at} tokens")
        assert 0 < at <= 160, at  # window ~35 + unsent ~16 + ring 64; the send buffer would add ~150
        sock.settimeout(120)
        raw = b""
        while not raw.endswith(b"\r\n0\r\n\r\n"):  # the chunked body's last chunk
            chunk = sock.recv(65536)
            if not chunk:
                break  # the server closed after the body
            raw += chunk
    finally:
        sock.close()
    events = [orjson.loads(line[6:]) for line in raw.split(b"\r\n") if line.startswith(b"data: ")]
    final = events[-1]
    assert final["stop"] is True and final["tokens_predicted"] == n and final["stop_type"] == "limit", final
    assert sum(1 for e in events[:-1] if e.get("tokens")) >= n - 1  # every token reached the client
    assert S.wait_for(lambda: S.busy_slots(srv.base) == 0, 5) is not None


# ------------------------------------------------------------------ 5
def test_slot_erase(srv: S.Server) -> None:
    """POST /slots/0?action=erase drops slot 0's cache: the next request on
    it evaluates its whole prompt; erasing another slot does not."""
    body = {"prompt": "The history of the printing press in Europe began", "n_predict": 4, "temperature": 0,
            "id_slot": 0, "cache_prompt": True}
    first = post(srv, "/completion", body).json()
    n = first["tokens_evaluated"]
    again = post(srv, "/completion", body).json()
    assert again["id_slot"] == 0 and again["content"] == first["content"]
    assert again["timings"]["cache_n"] == n - 1 and again["timings"]["prompt_n"] == 1
    assert again["tokens_cached"] > 0
    r = requests.post(srv.url("/slots/1?action=erase"), timeout=10)  # another slot: slot 0 keeps its cache
    assert r.status_code == 200 and r.json()["id_slot"] == 1
    assert post(srv, "/completion", body).json()["timings"]["cache_n"] == n - 1
    r = requests.post(srv.url("/slots/0?action=erase"), timeout=10)
    assert r.status_code == 200 and r.json()["id_slot"] == 0 and r.json()["n_erased"] > 0
    after = post(srv, "/completion", body).json()
    assert after["id_slot"] == 0 and after["content"] == first["content"]
    assert after["timings"]["cache_n"] == 0 and after["timings"]["prompt_n"] == n
    # tokens_cached is llama-server's: the slot's n_past at the end (prompt + answer), never 0 after a request
    assert after["tokens_cached"] == again["tokens_cached"] == first["tokens_cached"]


# ------------------------------------------------------------------ 6
def test_metrics_agree_with_timings(srv: S.Server) -> None:
    """Counter deltas between two scrapes equal the sums of the timings the
    requests in between reported (nothing else runs meanwhile)."""
    p = S.PROMPTS[1]
    before = scrape(srv)
    timings = [post(srv, "/completion", dict(greedy(p), cache_prompt=True)).json()["timings"],
               post(srv, "/completion", dict(greedy(p), cache_prompt=True)).json()["timings"],  # cached prefix
               stream(srv, "/completion", greedy(S.PROMPTS[2]))[1][-1]["timings"],
               post(srv, "/v1/completions", {"prompt": p, "max_tokens": 5, "temperature": 0}).json()["timings"],
               stream(srv, "/v1/chat/completions", chat_body())[1][-2]["timings"]]
    after = scrape(srv)
    d = {k: after[k] - before[k] for k in before}
    total = {k: sum(t[k] for t in timings) for k in ("prompt_n", "predicted_n", "cache_n")}
    assert total["cache_n"] > 0, timings
    assert d["llamacpp:tokens_predicted_total"] == total["predicted_n"], (d, timings)
    assert d["llamacpp:prompt_tokens_total"] == total["prompt_n"], (d, timings)
    assert d["ringserve:prompt_tokens_cached_total"] == total["cache_n"], (d, timings)
    assert d["ringserve:requests_total"] == len(timings)
    assert d["llamacpp:n_decode_total"] >= total["predicted_n"] and d["llamacpp:prompt_seconds_total"] > 0
    # the engine marks a slot free before its reader can see the end: no lag
    assert after["llamacpp:requests_processing"] == after["llamacpp:requests_deferred"] == 0, after


# ------------------------------------------------------------------ 7
def test_sse_framing(srv: S.Server, solo: dict[str, dict]) -> None:
    """Native stream: 'data: {...}' events, no [DONE], a last event with stop
    and timings. Chat stream: the role first, [DONE] last, same text as plain."""
    p = S.PROMPTS[3]
    r, ev = stream(srv, "/completion", greedy(p))
    assert r.headers["Cache-Control"] == "no-cache" and r.content.endswith(b"}\n\n")
    assert "[DONE]" not in ev and len(ev) == N + 1
    assert all(e["stop"] is False for e in ev[:-1]) and "".join(e["content"] for e in ev) == solo[p]["content"]
    last = ev[-1]
    assert last["stop"] is True and last["stop_type"] == "limit" and last["content"] == ""
    assert last["timings"]["predicted_n"] == N and last["timings"]["prompt_n"] == solo[p]["tokens_evaluated"]
    want = post(srv, "/v1/chat/completions", chat_body()).json()
    r, ev = stream(srv, "/v1/chat/completions", chat_body())
    assert r.content.endswith(b"data: [DONE]\n\n") and ev[-1] == "[DONE]" and "[DONE]" not in ev[:-1]
    chunks = ev[:-1]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks)
    assert all("role" not in c["choices"][0]["delta"] for c in chunks[1:])
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == \
        want["choices"][0]["message"]["content"]
    fin = chunks[-1]["choices"][0]
    assert fin["finish_reason"] == want["choices"][0]["finish_reason"] and fin["delta"] == {}
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
    assert chunks[-1]["timings"]["predicted_n"] == want["usage"]["completion_tokens"]
