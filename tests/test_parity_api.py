"""llama-server parity of pure frontend behaviour (issue 16's first half),
in-process on the fake engine (testing.TestClient): CORS, names, chat
template options, input token counts, request-field edge cases. What
depends on the model is in tests/test_parity_real.py."""
from __future__ import annotations

import pytest

from engine.config import Config
from frontends import testing
from frontends.text.chat import ChatTemplate, normalize
from frontends.process.serve import binds
from frontends.testing import TestClient


@pytest.fixture(scope="module")
def srv():
    with TestClient("-a", "zeta, alpha,,alpha", "--tags", "t2, t1") as c:
        yield c


# ------------------------------------------------------------------ CORS
def test_cors_default_echoes_any_origin(srv):
    """llama-server's defaults (--cors-origins * with credentials): the
    Origin is echoed on every answer, errors included; empty without one."""
    r = srv.simulate_get("/health", headers={"Origin": "http://example.com:9"})
    assert r.status_code == 200 and r.headers["Access-Control-Allow-Origin"] == "http://example.com:9"
    r = srv.simulate_post("/completion", json={}, headers={"Origin": "https://a.b"})
    assert r.status_code == 400 and r.headers["Access-Control-Allow-Origin"] == "https://a.b"
    assert srv.simulate_get("/health").headers["Access-Control-Allow-Origin"] == ""


def test_cors_preflight_any_path(srv):
    for path in ("/v1/chat/completions", "/no/such/path"):
        r = srv.simulate_options(path, headers={"Origin": "http://localhost:3000",
                                                "Access-Control-Request-Method": "POST"})
        assert r.status_code == 200 and r.content == b""
        assert r.headers["Content-Type"].startswith("text/html")
        assert r.headers["Access-Control-Allow-Origin"] == "http://localhost:3000"
        assert r.headers["Access-Control-Allow-Credentials"] == "true"
        assert r.headers["Access-Control-Allow-Methods"] == "GET, POST, DELETE, OPTIONS"
        assert r.headers["Access-Control-Allow-Headers"] == "*"


def test_cors_flags_and_gates():
    """--cors-origins localhost reflects only local origins; a preflight
    passes the API-key gate and a loading server; a 401 keeps the header."""
    with TestClient("--cors-origins", "localhost", "--api-key", "k", "--no-cors-credentials",
                    "--cors-methods", "GET", "--cors-headers", "X-A", loading=True) as c:
        r = c.simulate_options("/v1/models", headers={"Origin": "http://127.0.0.1:5"})
        assert r.status_code == 200 and r.headers["Access-Control-Allow-Origin"] == "http://127.0.0.1:5"
        assert (r.headers["Access-Control-Allow-Credentials"], r.headers["Access-Control-Allow-Methods"],
                r.headers["Access-Control-Allow-Headers"]) == ("false", "GET", "X-A")
        c.ready()
        r = c.simulate_get("/v1/models", headers={"Origin": "http://[::1]:8"})
        assert r.status_code == 401 and r.headers["Access-Control-Allow-Origin"] == "http://[::1]:8"
        r = c.simulate_get("/v1/models", headers={"Origin": "http://evil.example", "X-Api-Key": "k"})
        assert r.status_code == 200 and "Access-Control-Allow-Origin" not in r.headers
    with TestClient("--cors-origins", "https://a.example,https://b.example", engine=False) as c:
        r = c.simulate_get("/openapi.json", headers={"Origin": "http://x"})
        assert r.headers["Access-Control-Allow-Origin"] == "https://a.example,https://b.example"


# ------------------------------------------------------------------ names
def test_alias_and_tags(srv):
    """Several --alias names and --tags, as llama-server keeps them (a
    sorted set): the first is the model's name everywhere."""
    m = srv.simulate_get("/v1/models").json
    d = m["data"][0]
    assert (d["id"], d["aliases"], d["tags"]) == ("alpha", ["alpha", "zeta"], ["t1", "t2"])
    assert m["models"][0]["name"] == "alpha"
    assert srv.simulate_get("/props").json["model_alias"] == "alpha"
    r = srv.simulate_post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}],
                                                        "max_tokens": 1})
    assert r.json["model"] == "alpha"


def test_several_hosts_bind():
    cfg = Config(host="127.0.0.1, ::1,/tmp/rs.sock,unix:/tmp/b,[fe80::1]", port=81)
    assert binds(cfg) == ["127.0.0.1:81", "[::1]:81", "unix:/tmp/rs.sock", "unix:/tmp/b", "[fe80::1]:81"]
    with pytest.raises(ValueError):
        binds(Config(host=" , "))



# ------------------------------------------------------------------ chat templates
HI = [{"role": "user", "content": "Hi"}]
PREFILL = HI + [{"role": "assistant", "content": "Hello the"}]


def apply(c, body) -> tuple[int, dict]:
    r = c.simulate_post("/apply-template", json=body)
    return r.status_code, r.json


def test_builtin_template_names_render_as_llama_cpp():
    """--chat-template NAME with llama.cpp's names renders through
    llama_chat_apply_template (byte-identical to llama-server's built-in
    route); /props shows the name; --chat-template-file takes a name too."""
    msgs = [{"role": "system", "content": "S"}, *HI, {"role": "assistant", "content": "A"},
            {"role": "user", "content": "U"}]
    want = {
        "llama3": "<|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|><|start_header_id|>user"
                  "<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nA<|eot_id|>"
                  "<|start_header_id|>user<|end_header_id|>\n\nU<|eot_id|><|start_header_id|>assistant"
                  "<|end_header_id|>\n\n",
        "command-r": "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>S<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|>"
                     "<|USER_TOKEN|>Hi<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>A"
                     "<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|USER_TOKEN|>U<|END_OF_TURN_TOKEN|>"
                     "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>",
        "chatml": "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nA"
                  "<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n",
    }
    for name, text in want.items():
        assert ChatTemplate.pick(name, "{{ 'gguf' }}", "<bos>", "<eos>", "gemma3").render(normalize(msgs)) == text
    with TestClient("--chat-template", "llama3") as c:
        assert apply(c, {"messages": msgs}) == (200, {"prompt": want["llama3"]})
        assert c.simulate_get("/props").json["chat_template"] == "llama3"
    import tempfile
    with tempfile.NamedTemporaryFile("w", suffix=".jinja") as f:
        f.write("{% for m in messages %}[{{ m.role }}:{{ m.content }}]{% endfor %}"
                "{% if add_generation_prompt %}[a:{% endif %}")
        f.flush()
        with TestClient("--chat-template-file", f.name) as c:
            assert apply(c, {"messages": HI}) == (200, {"prompt": "[user:Hi][a:"})
            assert c.simulate_get("/props").json["chat_template"].startswith("{% for m")


def test_assistant_prefill_and_continue_final_message(srv):
    """A final assistant message is continued (no end of turn); vLLM's
    continue_final_message needs add_generation_prompt false; both set,
    or two trailing assistant messages, are 400s in llama-server's shape."""
    gemma = "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"
    assert apply(srv, {"messages": PREFILL}) == (200, {"prompt": gemma + "Hello the"})
    assert apply(srv, {"messages": PREFILL, "continue_final_message": True, "add_generation_prompt": False}) == \
        (200, {"prompt": gemma + "Hello the"})
    assert apply(srv, {"messages": HI, "add_generation_prompt": False}) == \
        (200, {"prompt": "<start_of_turn>user\nHi<end_of_turn>\n"})
    for body, msg in (({"messages": PREFILL, "continue_final_message": True}, "Cannot set both"),
                      ({"messages": HI, "continue_final_message": "content"}, "Cannot set both"),
                      ({"messages": PREFILL + [{"role": "assistant", "content": "y"}]}, "2 or more assistant"),
                      ({"messages": HI, "add_generation_prompt": "yes"}, "add_generation_prompt")):
        for path in ("/apply-template", "/v1/chat/completions", "/chat/completions/input_tokens"):
            r = srv.simulate_post(path, json=body)
            assert r.status_code == 400 and msg in r.json["error"]["message"], (path, body, r.json)
            assert r.json["error"]["type"] == "invalid_request_error"
    with TestClient("--no-prefill-assistant") as c:
        assert apply(c, {"messages": PREFILL}) == (200, {"prompt": gemma + "Hello the<end_of_turn>\n<start_of_turn>model\n"})


def test_input_tokens(srv):
    """POST /chat/completions/input_tokens (and /v1/): the prompt's token
    count with BOS, as the chat request would be evaluated; no generation."""
    n = len(srv.simulate_post("/tokenize", json={
        "content": "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n", "add_special": True}).json["tokens"])
    for path in ("/chat/completions/input_tokens", "/v1/chat/completions/input_tokens"):
        r = srv.simulate_post(path, json={"messages": HI, "max_tokens": 5})
        assert r.status_code == 200 and r.json == {"input_tokens": n, "object": "response.input_tokens"}
    assert srv.simulate_post("/v1/chat/completions/input_tokens", json={}).status_code == 400
    assert srv.simulate_post("/v1/chat/completions/input_tokens", json={"messages": "x"}).status_code == 400


def test_verbose_field():
    """--verbose (or a request's verbose: true) adds __verbose, the native
    final result, to OpenAI-compatible answers, streamed (last chunk) or not."""
    with TestClient("--verbose") as c:
        r = c.simulate_post("/v1/chat/completions", json={"messages": HI, "max_tokens": 3}).json
        v = r["__verbose"]
        assert v["stop"] is True and v["tokens_predicted"] == 3 and v["content"] == r["choices"][0]["message"]["content"]
        assert "generation_settings" in v and v["prompt"].endswith("<start_of_turn>model\n")
        r = c.simulate_post("/v1/chat/completions", json={"messages": HI, "max_tokens": 3, "stream": True})
        ev = testing.sse_events(r.content)
        fin = [e for e in ev if isinstance(e, dict) and e.get("choices") and e["choices"][0]["finish_reason"]]
        assert len(fin) == 1 and fin[0]["__verbose"]["stop"] is True
        assert all("__verbose" not in e for e in ev if isinstance(e, dict) and e not in fin)
        r = c.simulate_post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2, "verbose": False}).json
        assert "__verbose" not in r
    with TestClient() as c:
        assert "__verbose" not in c.simulate_post("/v1/chat/completions", json={"messages": HI, "max_tokens": 1}).json
        r = c.simulate_post("/v1/completions", json={"prompt": "Hi", "max_tokens": 1, "verbose": True}).json
        assert r["__verbose"]["tokens_predicted"] == 1
        assert c.simulate_post("/v1/completions", json={"prompt": "Hi", "verbose": 3}).status_code == 400


def test_openapi_lists_new_paths_and_fields(srv):
    doc = srv.simulate_get("/openapi.json").json
    for path in ("/chat/completions/input_tokens", "/v1/chat/completions/input_tokens"):
        assert "post" in doc["paths"][path]
    chat = doc["paths"]["/v1/chat/completions"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    for k in ("continue_final_message", "add_generation_prompt", "verbose", "timings_per_token"):
        assert k in chat["properties"], k


# ------------------------------------------------------------------ small things, metrics
def test_ignore_eos_shows_the_eog_ban(srv):
    """generation_settings.logit_bias in llama-server's {bias, token} shape,
    ignore_eos's ban (bias null = -inf) of each end-of-generation token last."""
    r = srv.simulate_post("/completion", json={"prompt": "Hi", "n_predict": 1, "ignore_eos": True,
                                               "logit_bias": [[5, 1.5], [7, False]]}).json
    assert r["generation_settings"]["logit_bias"] == [
        {"bias": 1.5, "token": 5}, {"bias": None, "token": 7},
        {"bias": None, "token": 1}, {"bias": None, "token": 106}, {"bias": None, "token": 212}]
    r = srv.simulate_post("/completion", json={"prompt": "Hi", "n_predict": 1}).json
    assert r["generation_settings"]["logit_bias"] == []


def test_generation_rate_excludes_first_token(srv):
    """llama-server's timings: predicted_n counts every token, the rate and
    the per-token time count decode steps (one fewer: the first token comes
    with the prompt's logits)."""
    t = srv.simulate_post("/completion", json={"prompt": "Hi", "n_predict": 5, "ignore_eos": True}).json["timings"]
    assert t["predicted_n"] == 5 and t["predicted_ms"] > 0
    assert t["predicted_per_token_ms"] == pytest.approx(t["predicted_ms"] / 4)
    assert t["predicted_per_second"] == pytest.approx(4e3 / t["predicted_ms"])
    t = srv.simulate_post("/completion", json={"prompt": "Hi", "n_predict": 1}).json["timings"]
    assert t["predicted_n"] == 1 and t["predicted_per_token_ms"] == 0.0 and t["predicted_per_second"] == 0.0


def test_return_progress_and_timings_per_token_shapes(srv):
    """Streamed prompt_progress objects (total, cache, processed, time_ms)
    before the first token, in each endpoint's event shape; timings on every
    event with timings_per_token; neither without a stream."""
    body = {"prompt": "Hello world how", "n_predict": 2, "stream": True, "return_progress": True,
            "timings_per_token": True, "cache_prompt": False}
    ev = testing.sse_events(srv.simulate_post("/completion", json=body).content)
    prog = [e for e in ev if "prompt_progress" in e]
    assert [e["prompt_progress"]["processed"] for e in prog] == [0, 4]
    assert all(e["prompt_progress"]["total"] == 4 and e["prompt_progress"]["cache"] == 0 for e in prog)
    assert all(e["tokens"] == [0] and e["content"] == "" and e["tokens_predicted"] == 0 for e in prog)
    assert ev.index(prog[-1]) < min(i for i, e in enumerate(ev) if e.get("tokens_predicted", 0) > 0)
    toks = [e for e in ev if not e["stop"] and "prompt_progress" not in e]
    assert len(toks) == 2 and all(e["timings"]["predicted_n"] == k + 1 for k, e in enumerate(toks))
    assert toks[0]["timings"]["prompt_n"] == 4 and toks[1]["timings"]["predicted_per_second"] > 0
    chat = testing.sse_events(srv.simulate_post("/v1/chat/completions", json={
        "messages": HI, "max_tokens": 2, "stream": True, "return_progress": True}).content)
    prog = [e for e in chat if isinstance(e, dict) and "prompt_progress" in e]
    assert len(prog) == 2 and all(e["choices"][0]["delta"] == {"role": "assistant", "content": None} for e in prog)
    assert all("timings" not in e for e in chat[:-2] if isinstance(e, dict))  # no timings_per_token
    oai = testing.sse_events(srv.simulate_post("/v1/completions", json={
        "prompt": "x", "max_tokens": 2, "stream": True, "timings_per_token": True}).content)
    assert all("timings" in e and "prompt_progress" not in e for e in oai if isinstance(e, dict))
    r = srv.simulate_post("/completion", json={"prompt": "x", "n_predict": 1, "return_progress": True,
                                               "timings_per_token": True}).json
    assert "prompt_progress" not in r and r["generation_settings"]["timings_per_token"] is True
    for bad in ({"return_progress": 1}, {"timings_per_token": "yes"}):
        assert srv.simulate_post("/completion", json={"prompt": "x", **bad}).status_code == 400


def test_flags_parse():
    """The new llama-server flags are settings (not ignored): CORS, --tags,
    --prefill-assistant, -v/--verbose, --context-shift (accepted; ringserve
    stops at the context end as llama-server's default does, with a warning)."""
    from frontends.process.cli import parse

    cfg, ignored = parse(["--cors-origins", "localhost", "--no-cors-credentials", "--tags", "x", "-v",
                          "--no-prefill-assistant", "--context-shift"])
    assert ignored == []
    assert (cfg.cors_origins, cfg.cors_credentials, cfg.tags, cfg.verbose, cfg.prefill_assistant,
            cfg.context_shift) == ("localhost", False, "x", True, False, True)
    d, _ = parse(["--no-context-shift"])
    assert (d.cors_origins, d.cors_methods, d.cors_headers, d.cors_credentials, d.context_shift, d.verbose,
            d.prefill_assistant) == ("*", "GET, POST, DELETE, OPTIONS", "*", True, False, False, True)


def test_message_content_absent_or_null(srv):
    """content null is an empty message (as llama-server); no content key is
    llama-server's 400 (an assistant message may have tool_calls instead)."""
    assert apply(srv, {"messages": [{"role": "user", "content": None}]}) == \
        (200, {"prompt": "<start_of_turn>user\n<end_of_turn>\n<start_of_turn>model\n"})
    for msgs, msg in (([{"role": "user"}], "All non-assistant messages must contain 'content'"),
                      ([*HI, {"role": "assistant"}], "Assistant message must contain either 'content' or 'tool_calls'!")):
        for path in ("/apply-template", "/v1/chat/completions"):
            r = srv.simulate_post(path, json={"messages": msgs})
            assert r.status_code == 400 and r.json["error"]["message"] == msg, (path, r.json)


@pytest.mark.parametrize("tmpl", ["meta-llama-Llama-3.1-8B-Instruct.jinja", "Qwen-Qwen2.5-7B-Instruct.jinja"])
def test_text_part_prefill_joined_as_llama_server_on_native_tool_templates(tmpl):
    """A continued assistant message given as text parts goes on from the
    parts joined by a blank line (llama-server's render_content), also on a
    template with a native tool-call format, whose history is rebuilt
    (frontends/text/toolfmt/history.py; llama.cpp's
    test_chat_template_assistant_prefill)."""
    src = "/root/.cache/ringserve/llama.cpp-0.3.36/src/models/templates/" + tmpl
    import os

    if not os.path.exists(src):
        pytest.skip("the vendored llama.cpp templates are not here")
    with TestClient("--jinja", "--chat-template-file", src) as c:
        parts = [{"type": "text", "text": "Wh"}, {"type": "text", "text": "ill"}]
        r = c.simulate_post("/apply-template", json={"messages": [
            {"role": "user", "content": "What is the best book"}, {"role": "assistant", "content": parts}]})
        assert r.status_code == 200 and r.json["prompt"].endswith("Wh\n\nill"), r.json
