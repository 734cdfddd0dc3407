"""Every endpoint's shapes, SSE framing and the OpenAI client, in-process:
testing.TestClient runs one worker's app over a real arena with the fake
engine (frontends/testing/fake_engine.py) in a thread. What needs sockets and
gunicorn is in test_frontends_errors/_proc/_real and test_lifecycle."""
from __future__ import annotations


import httpx
import pytest

from frontends import testing
from frontends.testing import TestClient


@pytest.fixture(scope="module")
def srv():
    with TestClient("--metrics", "-a", "fake-model", "--threads-http", "32", token_s=0.002) as c:
        yield c


def post(srv, path, body):
    return srv.simulate_post(path, json=body)


def sse(resp) -> list:
    """The strict SSE parse of frontends/testing (one per 'data: ' event)."""
    return testing.sse_events(resp.content)


# ------------------------------------------------------------------ misc
def test_health_props_models(srv):
    assert srv.simulate_get("/health").json == {"status": "ok"}
    assert srv.simulate_get("/v1/health").status_code == 200
    p = srv.simulate_get("/props").json
    assert p["total_slots"] == 2 and p["model_alias"] == "fake-model" and p["bos_token"] == "<bos>"
    assert p["default_generation_settings"]["n_ctx"] == 2048
    assert p["default_generation_settings"]["params"]["top_k"] == 40
    for path in ("/models", "/v1/models"):
        m = srv.simulate_get(path).json
        assert m["object"] == "list" and m["data"][0]["id"] == "fake-model"
        assert m["data"][0]["owned_by"] == "llamacpp" and m["data"][0]["meta"]["n_vocab"] == 262144
        assert m["models"][0]["name"] == "fake-model"
        # llama-server's figures (llama_ftype_name, llama_model_n_params), not general.file_type's number and 0
        assert m["data"][0]["meta"]["ftype"] == "Q4_K - Medium" and m["data"][0]["meta"]["n_params"] == 268098176
    assert p["model_ftype"] == "Q4_K - Medium"


def test_head_answers_as_get_without_a_body(srv):
    """llama-server's httplib serves HEAD by the GET handler: ``curl -I
    /health`` and ``wget --spider`` health checks get 200, not 404."""
    for path in ("/health", "/v1/models", "/props", "/slots", "/metrics"):
        r = srv.simulate_head(path)
        assert r.status_code == 200 and r.content == b"", (path, r.status_code)
    assert srv.simulate_head("/nothing-here").status_code == 404


def test_tokenize_detokenize(srv):
    r = post(srv, "/tokenize", {"content": "Hello world"}).json
    assert r == {"tokens": [9259, 1902]}
    r = post(srv, "/tokenize", {"content": "Hello", "add_special": True, "with_pieces": True}).json
    assert r["tokens"] == [{"id": 2, "piece": "<bos>"}, {"id": 9259, "piece": "Hello"}]
    assert post(srv, "/detokenize", {"tokens": [9259, 1902]}).json == {"content": "Hello world"}
    assert post(srv, "/detokenize", {"tokens": [99999999]}).status_code == 400


def test_apply_template(srv):
    r = post(srv, "/apply-template", {"messages": [{"role": "user", "content": "hi"}]}).json
    assert r == {"prompt": "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n"}


def test_openapi(srv):
    doc = srv.simulate_get("/openapi.json").json
    assert doc["openapi"].startswith("3.") and "/v1/chat/completions" in doc["paths"]


# ------------------------------------------------------------------ /completion
def test_completion_string(srv):
    r = post(srv, "/completion", {"prompt": "Hello world, how", "n_predict": 5, "return_tokens": True})
    assert r.status_code == 200
    j = r.json
    assert j["content"] == "Hello world, howHello" and j["stop_type"] == "limit" and j["stop"] is True
    assert j["tokens_predicted"] == 5 and j["tokens_evaluated"] == 5 and len(j["tokens"]) == 5
    assert j["model"] == "fake-model" and j["prompt"] == "<bos>Hello world, how"
    assert j["generation_settings"]["n_predict"] == 5 and j["truncated"] is False
    assert j["generation_settings"]["backend_sampling"] is False  # llama-server's field; -bs sets the default
    t = j["timings"]
    assert set(t) >= {"cache_n", "prompt_n", "prompt_ms", "prompt_per_token_ms", "prompt_per_second", "predicted_n",
                      "predicted_ms", "predicted_per_token_ms", "predicted_per_second"}
    assert t["prompt_n"] + t["cache_n"] == 5 and t["predicted_n"] == 5
    assert "completion_probabilities" not in j and j["tokens_cached"] == 10


def test_more_prompts_than_channels_run_in_waves(srv):
    """A worker has one channel per HTTP thread (32 here); a request of 40
    prompts, or 17 x n=2, leased one each and got 429 on an idle server.
    llama-server takes any number: the runner submits them in waves."""
    words = [f"w{i} x" for i in range(40)]
    arr = post(srv, "/completion", {"prompt": words, "n_predict": 1}).json
    assert isinstance(arr, list) and [a["index"] for a in arr] == list(range(40))
    one = post(srv, "/completion", {"prompt": words[7], "n_predict": 1}).json
    assert arr[7]["content"] == one["content"]
    r = post(srv, "/v1/completions", {"prompt": words[:17], "n": 2, "max_tokens": 2, "stream": True})
    assert r.status_code == 200
    fins = [c["index"] for e in sse(r) if isinstance(e, dict) for c in e.get("choices", []) if c.get("finish_reason")]
    assert sorted(fins) == list(range(34))
    assert srv.simulate_get("/slots").status_code == 200  # and the server is fine


def test_completion_eos_ids_mixed_and_multi(srv):
    j = post(srv, "/completions", {"prompt": [9259, 1902]}).json
    assert j["content"] == "Hello world" and j["stop_type"] == "eos" and j["tokens"] == []
    j = post(srv, "/completion", {"prompt": [9259, " world"], "n_predict": 2}).json
    assert j["content"] == "Hello world"
    arr = post(srv, "/completion", {"prompt": ["Hello", "world"], "n_predict": 1}).json
    assert isinstance(arr, list) and [a["content"] for a in arr] == ["Hello", "world"]
    assert [a["index"] for a in arr] == [0, 1]


def test_completion_n_cmpl(srv):
    """llama-server's n_cmpl (n its alias) on /completion: that many results
    per prompt, an array, 1 to the slots (it was ignored)."""
    for key in ("n_cmpl", "n"):
        arr = post(srv, "/completion", {"prompt": "Hello", "n_predict": 1, key: 2}).json
        assert isinstance(arr, list) and [a["index"] for a in arr] == [0, 1] and arr[0]["content"] == "Hello"
    r = post(srv, "/completion", {"prompt": "Hello", "n_predict": 1, "n_cmpl": 3})  # the fixture has 2 slots
    assert r.status_code == 400 and "n_cmpl" in r.json["error"]["message"]


def test_completion_stop_word_and_probs(srv):
    j = post(srv, "/completion", {"prompt": "a b c d e", "n_predict": 50, "stop": [" d"], "n_probs": 2}).json
    assert j["content"] == "a b c" and j["stop_type"] == "word" and j["stopping_word"] == " d"
    cp = j["completion_probabilities"]
    # llama-server leaves out as many entries as the stop word has tokens (" d": one), whose text is not there
    assert [p["token"] for p in cp] == ["a", " b", " c"] and j["tokens_predicted"] == 4, (cp, j["tokens_predicted"])
    assert cp[0]["logprob"] == -0.5
    assert [p["logprob"] for p in cp[0]["top_logprobs"]] == [-0.5, -1.5]
    assert cp[0]["bytes"] == list(b"a")
    j = post(srv, "/completion", {"prompt": "a b", "n_predict": 1, "logprobs": 2}).json  # llama-server's alias
    assert len(j["completion_probabilities"][0]["top_logprobs"]) == 2
    j = post(srv, "/completion", {"prompt": "a b", "n_predict": 1, "n_probs": 1, "post_sampling_probs": True}).json
    assert "prob" in j["completion_probabilities"][0] and "top_probs" in j["completion_probabilities"][0]


def test_completion_context_full_truncates(srv):
    ids = [9259] * 2040
    j = post(srv, "/completion", {"prompt": ids, "n_predict": 100}).json
    assert j["stop_type"] == "limit" and j["truncated"] is True and j["tokens_predicted"] < 10


def test_completion_stream_framing(srv):
    r = post(srv, "/completion", {"prompt": "Hello world", "stream": True, "n_probs": 1})
    assert r.headers["Content-Type"].startswith("text/event-stream")
    assert r.headers["Cache-Control"] == "no-cache" and r.headers["X-Accel-Buffering"] == "no"
    ev = sse(r)
    assert "[DONE]" not in ev
    parts, last = ev[:-1], ev[-1]
    assert all(p["stop"] is False and len(p["tokens"]) == 1 for p in parts)
    assert "".join(p["content"] for p in parts) == "Hello world"
    assert all(len(p["completion_probabilities"]) == 1 for p in parts)
    assert last["stop"] is True and last["content"] == "" and last["stop_type"] == "eos" and "timings" in last


def test_stream_partial_stop_held_back(srv):
    ev = sse(post(srv, "/completion", {"prompt": "x ab ac", "stream": True, "stop": ["acd"]}))
    texts = [e["content"] for e in ev]
    assert "".join(texts) == "x ab ac" and ev[-1]["stop_type"] == "eos"
    assert not any(t.endswith(" a") or t == "a" for t in texts[:-2])  # "a"/"ac" never sent before it was decided


# ------------------------------------------------------------------ OpenAI
def test_v1_completions(srv):
    j = post(srv, "/v1/completions", {"model": "x", "prompt": "Hello world", "max_tokens": 2, "logprobs": 1}).json
    assert j["object"] == "text_completion" and j["id"].startswith("chatcmpl-") and j["model"] == "fake-model"
    c = j["choices"][0]
    assert c["text"] == "Hello world" and c["finish_reason"] == "length" and c["index"] == 0
    assert len(c["logprobs"]["content"]) == 2 and j["system_fingerprint"]
    u = j["usage"]
    assert u["prompt_tokens"] == 3 and u["completion_tokens"] == 2 and u["total_tokens"] == 5
    assert "cached_tokens" in u["prompt_tokens_details"]
    ev = sse(post(srv, "/v1/completions", {"prompt": "Hello world", "stream": True}))
    assert ev[-1] == "[DONE]" and ev[-2]["choices"][0]["finish_reason"] == "stop" and "usage" in ev[-2]
    assert "".join(e["choices"][0]["text"] for e in ev[:-1]) == "Hello world"
    assert len({e["id"] for e in ev[:-1]}) == 1


def test_chat_completions(srv):
    body = {"model": "x", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "n": 2,
            "logprobs": True, "top_logprobs": 2}
    j = post(srv, "/v1/chat/completions", body).json
    assert j["object"] == "chat.completion" and len(j["choices"]) == 2
    ch = j["choices"][0]
    assert ch["message"]["role"] == "assistant" and ch["message"]["content"] == "user\n"
    assert ch["finish_reason"] == "length" and len(ch["logprobs"]["content"][0]["top_logprobs"]) == 2
    assert j["usage"]["completion_tokens"] == 6
    body = {"messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": 4,
            "stream_options": {"include_usage": True}}
    ev = sse(post(srv, "/chat/completions", body))
    assert ev[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
    assert ev[-1] == "[DONE]" and ev[-2]["choices"] == [] and ev[-2]["usage"]["completion_tokens"] == 4
    assert ev[-3]["choices"][0]["finish_reason"] == "length" and ev[-3]["choices"][0]["delta"] == {}
    assert all(e["object"] == "chat.completion.chunk" for e in ev[:-1])


def test_chat_response_format(srv):
    msgs = [{"role": "user", "content": "hi"}]
    for rf in ({"type": "json_object"}, {"type": "json_schema", "json_schema": {"schema": {"type": "object"}}}):
        assert post(srv, "/v1/chat/completions", {"messages": msgs, "max_tokens": 1, "response_format": rf}).status_code == 200
    r = post(srv, "/v1/chat/completions", {"messages": msgs, "response_format": {"type": "yaml"}})
    assert r.status_code == 400
    # as llama-server's oaicompat_chat_params_parse (they were 400s): json_schema without a schema is any object,
    # json_object takes the request's own json_schema, a response_format that is no object is no format
    from frontends.text.params import schema_grammar

    with TestClient("-v") as c:
        def grammar(**body) -> str:
            r = post(c, "/v1/chat/completions", {"messages": msgs, "max_tokens": 1, **body})
            assert r.status_code == 200, r.json
            return r.json["__verbose"]["generation_settings"]["grammar"]

        assert grammar(response_format={"type": "json_schema"}) == schema_grammar({"type": "object"})
        assert grammar(response_format={"type": "json_object"}, json_schema={"type": "integer"}) == \
            schema_grammar({"type": "integer"})
        assert grammar(response_format="x") == ""


def test_openai_client(srv):
    openai = pytest.importorskip("openai")
    c = openai.OpenAI(base_url="http://testserver/v1", api_key="none",
                      http_client=httpx.Client(transport=httpx.WSGITransport(app=srv.app)))
    assert [m.id for m in c.models.list()] == ["fake-model"]
    r = c.completions.create(model="m", prompt="Hello world", max_tokens=2)
    assert r.choices[0].text == "Hello world" and r.usage.completion_tokens == 2
    r = c.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=3)
    assert r.choices[0].message.content == "user\n" and r.choices[0].finish_reason == "length"
    chunks = list(c.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}],
                                            max_tokens=3, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == "user\n"
    chunks = list(c.completions.create(model="m", prompt="Hello world", stream=True))
    assert "".join(ch.choices[0].text for ch in chunks) == "Hello world"


# ------------------------------------------------------------------ slots, metrics
def test_slots_and_erase(srv):
    post(srv, "/completion", {"prompt": "Hello", "n_predict": 1, "id_slot": 1})
    slots = srv.simulate_get("/slots").json
    assert [s["id"] for s in slots] == [0, 1] and slots[1]["n_ctx"] == 2048
    assert slots[1]["is_processing"] is False and "params" in slots[1] and "next_token" in slots[1]
    r = srv.simulate_post("/slots/1?action=erase")
    assert r.status_code == 200 and r.json["id_slot"] == 1
    assert srv.simulate_post("/slots/x?action=erase").status_code == 400
    assert srv.simulate_post("/slots/1?action=dance").status_code == 400


def test_speculation_settings_shown_as_they_are(srv):
    """/slots' ``speculative`` is llama-server's can_speculate() (a drafter
    is configured; it was always false) and generation_settings show the
    request's speculative.n_max / n_min / p_min and the server's
    speculative.types (they showed 16 / 0 / 0.75 whatever was asked)."""
    assert [s["speculative"] for s in srv.simulate_get("/slots").json] == [False, False]
    g = post(srv, "/completion", {"prompt": "Hello", "n_predict": 1}).json["generation_settings"]
    assert g["speculative.types"] == "none"
    with TestClient("--spec-type", "ngram-simple,ngram-map-k", "--spec-draft-n-max", "5") as c:
        assert [s["speculative"] for s in c.simulate_get("/slots").json] == [True, True]
        g = post(c, "/completion", {"prompt": "Hello", "n_predict": 1}).json["generation_settings"]
        assert (g["speculative.types"], g["speculative.n_max"], g["speculative.n_min"]) == \
            ("ngram-simple,ngram-map-k", 5, 0), g
        g = post(c, "/completion", {"prompt": "Hello", "n_predict": 1, "speculative.n_max": 0,
                                    "speculative.n_min": 7, "speculative.p_min": 0.25}).json["generation_settings"]
        assert (g["speculative.n_max"], g["speculative.n_min"], g["speculative.p_min"]) == (0, 7, 0.25), g


def test_t_max_predict_ms_stops_at_a_newline_past_it():
    """t_max_predict_ms (FIM clients send it): once that long has passed since
    the first token, the next newline ends the answer as a limit, streamed or
    not (it was accepted and ignored); -1 (the default) and 0 are no limit."""
    prompt = "".join(f"line {i}\n" for i in range(20))  # the fake engine echoes it, a token each 10 ms
    with TestClient(token_s=0.01) as c:
        whole = post(c, "/completion", {"prompt": prompt, "n_predict": 60}).json
        assert whole["tokens_predicted"] == 60
        for stream in (False, True):
            r = post(c, "/completion", {"prompt": prompt, "n_predict": 60, "t_max_predict_ms": 50, "stream": stream})
            last = sse(r)[-1] if stream else r.json
            text = "".join(e["content"] for e in sse(r)) if stream else last["content"]
            assert last["stop_type"] == "limit" and text.endswith("\n") and whole["content"].startswith(text), last
            assert 0 < last["tokens_predicted"] < 30, last
        assert post(c, "/completion", {"prompt": prompt, "n_predict": 60, "t_max_predict_ms": 0}).json[
            "tokens_predicted"] == 60
        assert post(c, "/completion", {"prompt": "a", "t_max_predict_ms": -2}).status_code == 400


def test_n_indent_stops_at_a_less_indented_line(srv):
    """n_indent (llama.vim and llama.vscode send it to /infill): a line that
    starts with text less indented than n_indent ends the answer as a limit,
    cut before that text (it ran to n_predict: accepted and ignored)."""
    body = {"prompt": "x\n    y\nz w", "n_predict": 12}
    whole = post(srv, "/completion", body).json
    assert whole["tokens_predicted"] == 12 and whole["content"].startswith("x\n    y\nz")
    j = post(srv, "/completion", {**body, "n_indent": 4}).json
    assert j["content"] == "x\n    y\n" and j["stop_type"] == "limit" and j["tokens_predicted"] < 12, j
    assert post(srv, "/completion", {**body, "n_indent": 2}).json["content"] == "x\n    y\n"
    assert post(srv, "/completion", {**body, "n_indent": 0}).json["tokens_predicted"] == 12
    assert post(srv, "/completion", {**body, "n_indent": -1}).status_code == 400


def test_a_body_with_a_byte_order_mark_is_json(srv):
    r = srv.simulate_post("/completion", body=b"\xef\xbb\xbf" + b'{"prompt": "Hello", "n_predict": 1}',
                          headers={"Content-Type": "application/json"})
    assert r.status_code == 200, r.text


def test_response_fields_pick_keys_of_the_final_object(srv):
    """response_fields (llama.vim asks for a few): the final object holds only
    those paths, each under its whole path, streamed (the last event) or not;
    a path that does not exist is left out, a value of the wrong type ignored."""
    f = ["content", "generation_settings/n_predict", "timings/prompt_n", "nope/x"]
    j = post(srv, "/completion", {"prompt": "Hello", "n_predict": 2, "response_fields": f}).json
    assert set(j) == {"content", "generation_settings/n_predict", "timings/prompt_n"}, j
    assert j["generation_settings/n_predict"] == 2 and isinstance(j["timings/prompt_n"], int)
    ev = sse(post(srv, "/completion", {"prompt": "Hello", "n_predict": 2, "stream": True, "response_fields": f}))
    assert ev[-1] == {"content": "", "generation_settings/n_predict": 2, "timings/prompt_n": ev[-1]["timings/prompt_n"]}
    assert ev[0]["stop"] is False and "tokens_predicted" in ev[0]  # partial events are whole
    assert "stop_type" in post(srv, "/completion", {"prompt": "Hello", "n_predict": 2, "response_fields": 5}).json


def test_no_jinja_refuses_tools_as_llama_server():
    """--no-jinja (llama.cpp's server tests pass it): a chat request with tools
    or a tool_choice other than "auto" is llama-server's 500 "... requires
    --jinja flag"; without them the request runs (it was accepted and ignored:
    tools ran)."""
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
    msgs = [{"role": "user", "content": "hi"}]
    with TestClient("--no-jinja") as c:
        for extra, what in (({"tools": [tool]}, "tools"), ({"tool_choice": "required"}, "tool_choice")):
            r = post(c, "/v1/chat/completions", {"messages": msgs, "max_tokens": 2, **extra})
            assert r.status_code == 500 and r.json["error"]["message"] == f"{what} param requires --jinja flag", r.json
        assert post(c, "/v1/chat/completions", {"messages": msgs, "max_tokens": 2}).status_code == 200
    with TestClient() as c:
        assert post(c, "/v1/chat/completions", {"messages": msgs, "max_tokens": 2, "tools": [tool]}).status_code == 200


def test_metrics_parse(srv):
    from prometheus_client.parser import text_string_to_metric_families

    r = srv.simulate_get("/metrics")
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/plain")
    fams = {f.name: f for f in text_string_to_metric_families(r.text)}
    for name in ("llamacpp:prompt_tokens", "llamacpp:tokens_predicted", "llamacpp:n_decode",
                 "llamacpp:prompt_tokens_seconds", "llamacpp:predicted_tokens_seconds", "llamacpp:requests_processing",
                 "llamacpp:requests_deferred", "llamacpp:n_busy_slots_per_decode", "ringserve:ring_pushes",
                 "ringserve:channels_leased", "ringserve:engine_phase_seconds"):
        assert name in fams, name
    assert fams["llamacpp:tokens_predicted"].samples[0].value > 0


def test_concurrent_streams(srv):
    from concurrent.futures import ThreadPoolExecutor

    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"] * 4

    def one(i):
        prompt = f"{words[i]} {i} {words[(i + 3) % len(words)]}"
        ev = sse(post(srv, "/completion", {"prompt": prompt, "stream": True}))
        return prompt, "".join(e["content"] for e in ev), ev[-1]["stop_type"]

    with ThreadPoolExecutor(32) as ex:
        for prompt, text, stop in ex.map(one, range(32)):
            assert text == prompt and stop == "eos"


def test_post_props_needs_the_flag(srv):
    """server-context.cpp post_props: 501 not_supported without --props,
    {"success": true} with it; GET /props says which, and the KV types."""
    r = srv.simulate_post("/props", json={})
    assert r.status_code == 501 and r.json["error"]["type"] == "not_supported_error", r.json
    p = srv.simulate_get("/props").json
    assert p["endpoint_props"] is False and p["kv_cache"]["type_k"] == p["kv_cache"]["type_v"] == "f16"
    with TestClient("--props", "-ctk", "q8_0", "-ctv", "q4_0", "-fa", "on") as c:
        assert c.simulate_post("/props", json={"n_ctx": 1}).json == {"success": True}
        p = c.simulate_get("/props").json
        assert p["endpoint_props"] is True and (p["kv_cache"]["type_k"], p["kv_cache"]["type_v"]) == ("q8_0", "q4_0")
