"""llama-server parity with the real default model (issue 16's first half):
what depends on the engine or the model -- prompt progress, per-token
timings, the generation rate, slot gauges, the context end, assistant
prefill, input token counts -- plus CORS, names and addresses through
gunicorn. The pure frontend cases are in tests/test_parity_api.py.

One small server for the module (-c 512 -np 2: a slot holds 256 tokens,
so "generate to the end of the context" takes seconds; -b 16: a prompt is
evaluated in chunks of at most 16 tokens, so progress has several steps).
Tests run in file order; the metrics test runs first, on a fresh server.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Iterator

import pytest
import requests

from frontends import testing as S

N_CTX_SLOT = 256
FLAGS = ("-c", str(2 * N_CTX_SLOT), "-np", "2", "-t", "2", "-w", "1", "--threads-http", "8", "--metrics",
         "-b", "16", "--alias", "b, a", "--tags", "t2,t1", "--host", "127.0.0.1,127.0.0.2")
HI = [{"role": "user", "content": "Name three colours."}]


@pytest.fixture(scope="module")
def srv() -> Iterator[S.Server]:
    s = S.Server(*FLAGS)
    yield s  # the teardown below runs whatever the tests did
    assert s.finish() == (0, [])  # exit 0, nothing left in /dev/shm, no process left


def post(srv: S.Server, path: str, body: Any, **kw: Any) -> requests.Response:
    r = requests.post(srv.url(path), json=body, timeout=120, **kw)
    assert r.ok, (path, r.status_code, r.text[:500])
    return r


def events(srv: S.Server, path: str, body: dict) -> list:
    return S.sse_events(post(srv, path, dict(body, stream=True)).content)


def scrape(srv: S.Server) -> tuple[dict[str, float], requests.Response]:
    r = requests.get(srv.url("/metrics"), timeout=10)
    assert r.status_code == 200
    return S.parse_metrics(r.text), r


def test_metrics_rate_excludes_first_token_and_gauges_return_to_idle(srv: S.Server) -> None:
    """llamacpp:predicted_tokens_seconds counts decode steps (tokens less
    each request's first), the busy gauges read 0 as soon as an answer is
    back, and /metrics carries Process-Start-Time-Unix."""
    t0 = time.time()
    m0, _ = scrape(srv)
    for n in (8, 5):
        before = m0 if n == 8 else m
        j = post(srv, "/completion", {"prompt": "Once upon a time", "n_predict": n, "ignore_eos": True}).json()
        assert j["tokens_predicted"] == n
        m, r = scrape(srv)  # right after the answer: idle again
        assert m["llamacpp:requests_processing"] == 0 and m["ringserve:slots_busy"] == 0
        assert not any(s["is_processing"] for s in requests.get(srv.url("/slots"), timeout=10).json())
        # the rate is over the window since the previous scrape (llama-server's per-scrape bucket)
        dt = m["llamacpp:tokens_predicted_seconds_total"] - before["llamacpp:tokens_predicted_seconds_total"]
        assert m["llamacpp:predicted_tokens_seconds"] == pytest.approx((n - 1) / dt)
    assert m["llamacpp:tokens_predicted_total"] - m0["llamacpp:tokens_predicted_total"] == 13
    assert m["llamacpp:prompt_tokens_cached_total"] == m["ringserve:prompt_tokens_cached_total"] > 0
    start = int(r.headers["Process-Start-Time-Unix"])
    assert t0 - 600 < start <= t0 + 1
    t = j["timings"]
    assert t["predicted_per_second"] == pytest.approx(4e3 / t["predicted_ms"])


def test_return_progress_and_timings_per_token(srv: S.Server) -> None:
    """A prompt of ~60 tokens in chunks of <= 16: prompt_progress objects
    rise to the total before the first token; a second identical request
    reports its cached prefix; timings on every event with timings_per_token."""
    prompt = "The quick brown fox jumps over the lazy dog. " * 6
    body = {"prompt": prompt, "n_predict": 3, "return_progress": True, "timings_per_token": True,
            "temperature": 0, "id_slot": 0}
    for run in range(2):
        ev = events(srv, "/completion", body)
        prog = [e["prompt_progress"] for e in ev if "prompt_progress" in e]
        total = ev[-1]["tokens_evaluated"]
        assert len(prog) >= 1 + (total - prog[0]["cache"] + 15) // 16, prog
        assert all(p["total"] == total and p["cache"] == prog[0]["cache"] for p in prog)
        done = [p["processed"] for p in prog]
        assert done[0] == prog[0]["cache"] and done[-1] == total and done == sorted(done)
        assert prog[-1]["time_ms"] >= prog[0]["time_ms"] >= 0
        first_tok = next(i for i, e in enumerate(ev) if e.get("tokens_predicted"))
        assert all("prompt_progress" not in e for e in ev[first_tok:])
        toks = ev[first_tok:-1]
        assert [e["timings"]["predicted_n"] for e in toks] == [1, 2, 3]
        assert toks[0]["timings"]["prompt_n"] == total - prog[0]["cache"]
        if run == 0:
            assert prog[0]["cache"] <= 1  # at most the BOS of the slot's last prompt
        else:
            assert prog[0]["cache"] >= total - 2  # the slot's KV held the same prompt
    chat = events(srv, "/v1/chat/completions", {"messages": HI, "max_tokens": 2, "return_progress": True})
    prog = [e for e in chat if isinstance(e, dict) and "prompt_progress" in e]
    assert prog and prog[-1]["prompt_progress"]["processed"] == prog[-1]["prompt_progress"]["total"]


def test_context_end(srv: S.Server) -> None:
    """No max_tokens and an empty (null) message: generation runs to the
    slot's context end and stops there as llama-server's does (its
    --no-context-shift default): prompt + generated = n_ctx, finish_reason
    "length"; the native stream's last event says truncated, stop_type limit.
    A message with no content key at all is llama-server's 400, at once."""
    t = time.monotonic()
    r = requests.post(srv.url("/v1/chat/completions"), json={"messages": [{"role": "user"}]}, timeout=10)
    assert r.status_code == 400 and time.monotonic() - t < 5
    assert r.json()["error"]["message"] == "All non-assistant messages must contain 'content'"
    body = {"messages": [{"role": "user", "content": None}], "temperature": 0, "ignore_eos": True}
    got: dict = {}  # the two run at once on the two slots (counts only are compared: the suite's time)
    t = threading.Thread(target=lambda: got.update(chat=post(srv, "/v1/chat/completions", body).json()))
    t.start()
    ev = events(srv, "/completion", {"prompt": "Once upon a time", "temperature": 0, "ignore_eos": True})
    t.join(120)
    j = got["chat"]
    u = j["usage"]
    assert j["choices"][0]["finish_reason"] == "length" and u["total_tokens"] == N_CTX_SLOT
    last = ev[-1]
    assert last["stop"] is True and last["truncated"] is True and last["stop_type"] == "limit"
    assert last["tokens_predicted"] + last["tokens_evaluated"] == N_CTX_SLOT
    assert last["generation_settings"]["logit_bias"] == [{"bias": None, "token": t} for t in (1, 106, 212)]


def test_prefill_continues_and_input_tokens_count(srv: S.Server) -> None:
    """A final assistant message is continued: the chat answer equals the
    greedy /completion of the rendered prompt, which ends with the prefill;
    /v1/chat/completions/input_tokens equals the answer's prompt_tokens."""
    msgs = HI + [{"role": "assistant", "content": "Here are three colours: red,"}]
    prompt = post(srv, "/apply-template", {"messages": msgs}).json()["prompt"]
    assert prompt.endswith("<start_of_turn>model\nHere are three colours: red,")
    # no cache reuse: both evaluate the same prompt in the same chunks (CPU kernels are not batch invariant)
    chat = post(srv, "/v1/chat/completions", {"messages": msgs, "max_tokens": 8, "temperature": 0,
                                              "cache_prompt": False}).json()
    cmpl = post(srv, "/completion", {"prompt": prompt, "n_predict": 8, "temperature": 0, "cache_prompt": False}).json()
    assert chat["choices"][0]["message"]["content"] == cmpl["content"]
    n = post(srv, "/v1/chat/completions/input_tokens", {"messages": msgs}).json()
    assert n == {"input_tokens": chat["usage"]["prompt_tokens"], "object": "response.input_tokens"}
    r = requests.post(srv.url("/v1/chat/completions"), json={"messages": msgs, "continue_final_message": True},
                      timeout=30)
    assert r.status_code == 400 and "Cannot set both" in r.json()["error"]["message"]


def busy_params(srv: S.Server, body: dict) -> dict:
    """/slots' params of the slot running ``body`` (a /completion sent on a thread), read while it runs."""
    t = threading.Thread(target=lambda: post(srv, "/completion", body))
    t.start()
    try:
        return S.wait_for(lambda: [x for x in requests.get(srv.url("/slots"), timeout=10).json()
                                   if x["is_processing"] and x.get("params")], 60, "a busy slot")[0]["params"]
    finally:
        t.join(120)


def test_dry_xtc_and_the_samplers_order_change_the_answer(srv: S.Server) -> None:
    """Sampling fields that were accepted and ignored now change the text,
    end to end (the greedy loop of a repetitive prompt; engine/sampling/chain.py),
    and generation_settings says what ran."""
    prompt = "one two three four five, " * 6 + "one two three"
    base = {"prompt": prompt, "n_predict": 4, "temperature": 0, "cache_prompt": False}
    plain = post(srv, "/completion", base).json()
    dry = post(srv, "/completion", {**base, "dry_multiplier": 2.0, "dry_penalty_last_n": 128,
                                    "dry_sequence_breakers": ["\n"]}).json()
    assert plain["content"] != dry["content"], plain["content"]
    gs = dry["generation_settings"]
    assert (gs["dry_multiplier"], gs["dry_penalty_last_n"], gs["dry_sequence_breakers"]) == (2.0, 128, ["\n"])
    story = {**base, "prompt": "Once upon a time", "top_k": 0, "top_p": 1.0, "min_p": 0.0}
    xtc = post(srv, "/completion", {**story, "xtc_probability": 1.0, "xtc_threshold": 0.01}).json()
    assert xtc["content"] != post(srv, "/completion", story).json()["content"]
    only = post(srv, "/completion", {**base, "samplers": ["temperature"], "top_k": 0}).json()
    assert only["content"] == plain["content"] and only["generation_settings"]["samplers"] == ["temperature"]
    # /slots shows a running request's own order (its chain header), an idle slot the server's
    busy = busy_params(srv, {**base, "n_predict": 48, "ignore_eos": True, "samplers": "kt"})
    assert busy["samplers"] == ["top_k", "temperature"], busy
    idle = requests.get(srv.url("/slots"), timeout=10).json()
    assert all(x["params"]["samplers"][:2] == ["penalties", "dry"] for x in idle if "params" in x), idle
    # the next request on that channel (the worker's free list is LIFO) sends no header: the old one,
    # still in the grammar area past what it wrote, is not shown
    busy = busy_params(srv, {**base, "n_predict": 48, "ignore_eos": True})
    assert busy["samplers"][:2] == ["penalties", "dry"], busy


def test_cors_names_and_hosts_through_gunicorn(srv: S.Server) -> None:
    """Through gunicorn: the preflight, the Origin echoed on a stream, the
    aliases and tags in /v1/models, both --host addresses listening."""
    r = requests.options(srv.url("/v1/chat/completions"), headers={"Origin": "http://localhost:5173"}, timeout=10)
    assert r.status_code == 200 and r.headers["Access-Control-Allow-Origin"] == "http://localhost:5173"
    assert r.headers["Access-Control-Allow-Methods"] == "GET, POST, DELETE, OPTIONS"
    r = post(srv, "/v1/chat/completions", {"messages": HI, "max_tokens": 2, "stream": True},
             headers={"Origin": "https://app.example"})
    assert r.headers["Access-Control-Allow-Origin"] == "https://app.example"
    for host in ("127.0.0.1", "127.0.0.2"):
        d = requests.get(f"http://{host}:{srv.port}/v1/models", timeout=10).json()["data"][0]
        assert (d["id"], d["aliases"], d["tags"]) == ("a", ["a", "b"], ["t1", "t2"])


def _llama_server() -> str:
    import os
    from pathlib import Path

    d = Path(os.environ.get("RINGSERVE_CACHE", Path.home() / ".cache" / "ringserve")) / "llama.cpp-0.3.36"
    b = d / "build" / "bin" / "llama-server"
    return str(b) if b.exists() else ""


@pytest.mark.skipif(not _llama_server(), reason="no CPU llama-server build (sh scripts/build_llama_server.sh)")
def test_same_answers_as_llama_server() -> None:
    """Side by side with llama-server 0.3.36 itself (its built-in template
    route, --no-jinja): /apply-template and input_tokens for a built-in
    name, the CORS headers, the names in /v1/models."""
    from engine.config import Config
    from frontends.testing.server import Proc, free_port

    flags = ["--chat-template", "llama3", "--alias", "b, a", "--tags", "t2,t1"]
    port = free_port()
    ls = Proc([_llama_server(), "-m", Config().model_path(), "--port", str(port), "-c", "256", "-np", "1", "-t", "1",
               "--no-jinja", *flags], port, name="llama-server")
    try:
        with S.TestClient(*flags) as rs:
            bodies = [{"messages": [{"role": "system", "content": "S"}, *HI]},
                      {"messages": [*HI, {"role": "assistant", "content": "A"}, {"role": "user", "content": "B"}]},
                      {"messages": HI, "add_generation_prompt": False},
                      {"messages": [{"role": "user", "content": None}]}]
            for body in bodies:
                for path in ("/apply-template", "/v1/chat/completions/input_tokens"):
                    want = requests.post(ls.url(path), json=body, timeout=30)
                    got = rs.simulate_post(path, json=body)
                    assert (got.status_code, got.json) == (want.status_code, want.json()), (path, body)
            for method, path, hdrs in (("GET", "/health", {}), ("GET", "/health", {"Origin": "http://x.example"}),
                                       ("OPTIONS", "/v1/chat/completions", {"Origin": "http://localhost:3000"}),
                                       ("OPTIONS", "/nope", {})):
                want = requests.request(method, ls.url(path), headers=hdrs, timeout=10)
                got = rs.simulate_request(method, path, headers=hdrs)
                assert got.status_code == want.status_code
                cors = lambda h: {k.lower(): v for k, v in h.items() if k.lower().startswith("access-control")}  # noqa
                assert cors(got.headers) == cors(want.headers), (method, path, hdrs)
            want = requests.get(ls.url("/v1/models"), timeout=10).json()["data"][0]
            got = rs.simulate_get("/v1/models").json["data"][0]
            assert [got[k] for k in ("id", "aliases", "tags")] == [want[k] for k in ("id", "aliases", "tags")]
    finally:
        ls.stop()
        ls.cleanup()


@pytest.mark.skipif(not _llama_server(), reason="no CPU llama-server build (sh scripts/build_llama_server.sh)")
def test_samplers_draw_what_llama_server_draws() -> None:
    """DRY, XTC, mirostat, dynamic temperature and a request's own sampler
    order, side by side with llama-server 0.3.36 on the same flags: the same
    text, token for token, greedy and seeded (engine/sampling/chain.py builds
    the chain as common/sampling.cpp; measured 18 of 18 cases over two prompts)."""
    from engine.config import Config
    from frontends.testing.server import Proc, free_port

    flags = ["-c", "512", "-np", "1", "-t", "2"]
    port = free_port()
    ls = Proc([_llama_server(), "-m", Config().model_path(), "--port", str(port), *flags], port,
              name="llama-server", wait=False)
    rs = S.Server(*flags, "-w", "1")
    try:
        ls.wait_ready()
        loop = "one two three four five, " * 6 + "one two three"
        cases = [(loop, {"dry_multiplier": 2.0, "dry_penalty_last_n": 128, "temperature": 0}),
                 ("Once upon a time", {"xtc_probability": 1.0, "xtc_threshold": 0.05, "temperature": 0, "top_k": 0,
                                       "top_p": 1.0, "min_p": 0.0}),
                 ("Once upon a time", {"mirostat": 2, "temperature": 0.8, "seed": 42}),
                 ("Once upon a time", {"dynatemp_range": 0.5, "temperature": 0.8, "seed": 42}),
                 ("Once upon a time", {"samplers": ["min_p", "temperature"], "temperature": 0.8, "seed": 3})]
        for prompt, c in cases:
            body = {"prompt": prompt, "n_predict": 10, "cache_prompt": False, **c}
            want = requests.post(ls.url("/completion"), json=body, timeout=60).json()["content"]
            assert post(rs, "/completion", body).json()["content"] == want, c
    finally:
        ls.stop()
        ls.cleanup()
        assert rs.finish() == (0, [])
