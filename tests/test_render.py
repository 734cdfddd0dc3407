"""vLLM's render endpoints (frontends/api/render.py) on the worker's app with
the fake engine (testing.TestClient): the ids they return are the ones the
generating endpoints submit. The fake engine echoes a prompt without its
BOS, so a completion of len(prompt) - 1 tokens with return_tokens shows
exactly the ids the engine got, and usage.prompt_tokens their count."""
from __future__ import annotations

import pytest

from frontends.testing import TestClient

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]
CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"},
     {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Tell me a <b>joke</b>."}],
]


@pytest.fixture(scope="module")
def srv():
    with TestClient("-a", "fake-model") as c:
        yield c


def post(srv, path, body):
    return srv.simulate_post(path, json=body)


def engine_ids(srv, path: str, body: dict, n: int) -> tuple[list[int], int]:
    """(BOS + what the fake engine echoed, usage.prompt_tokens) of a real completion of ``n`` prompt tokens."""
    r = post(srv, path, {**body, "max_tokens": n - 1, "return_tokens": True, "verbose": True, "temperature": 0})
    assert r.status_code == 200, r.text
    j = r.json
    v = j["__verbose"]
    return [2] + v["tokens"], j["usage"]["prompt_tokens"]


@pytest.mark.parametrize("prompt", ["Hello world, the <start_of_turn> is special.", "x",
                                    [2, 9259, 1902], ["one string", 1902, 1902], "  spaces\n\nand lines "])
def test_completions_render_is_what_v1_completions_submits(srv, prompt):
    r = post(srv, "/v1/completions/render", {"model": "fake-model", "prompt": prompt})
    assert r.status_code == 200, r.text
    (one,) = r.json
    ids = one["token_ids"]
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        assert ids == prompt  # token ids are echoed verbatim
    got, n = engine_ids(srv, "/v1/completions", {"prompt": prompt}, len(ids))
    assert ids[0] == 2 and got == ids and n == len(ids)
    if isinstance(prompt, str):
        tok = post(srv, "/tokenize", {"content": prompt, "add_special": True}).json["tokens"]
        assert tok == ids


def test_completions_render_one_element_per_prompt(srv):
    prompts = ["first prompt", "the second one is longer than the first"]
    r = post(srv, "/v1/completions/render", {"prompt": prompts})
    assert r.status_code == 200
    out = [x["token_ids"] for x in r.json]
    assert len(out) == 2
    for p, ids in zip(prompts, out):
        assert ids == post(srv, "/v1/completions/render", {"prompt": p}).json[0]["token_ids"]
        assert ids == engine_ids(srv, "/v1/completions", {"prompt": p}, len(ids))[0]


@pytest.mark.parametrize("extra", [{}, {"tools": TOOLS}, {"chat_template_kwargs": {"foo": 1}},
                                   {"add_generation_prompt": False}])
@pytest.mark.parametrize("messages", CHATS)
def test_chat_render_is_what_chat_completions_submits(srv, messages, extra):
    body = {"model": "fake-model", "messages": messages, **extra}
    r = post(srv, "/v1/chat/completions/render", body)
    assert r.status_code == 200, r.text
    ids = r.json["token_ids"]
    assert isinstance(ids, list) and ids[0] == 2
    got, n = engine_ids(srv, "/v1/chat/completions", body, len(ids))
    assert got == ids and n == len(ids)
    assert post(srv, "/v1/chat/completions/input_tokens", body).json["input_tokens"] == len(ids)
    if not extra.get("tools"):  # the template alone, tokenized as a chat is
        text = post(srv, "/apply-template", body).json["prompt"]
        assert post(srv, "/tokenize", {"content": text, "add_special": True}).json["tokens"] == ids


@pytest.mark.parametrize("path,render,body", [
    ("/v1/completions", "/v1/completions/render", {}),
    ("/v1/completions", "/v1/completions/render", {"prompt": [1, 10 ** 9]}),
    ("/v1/completions", "/v1/completions/render", {"prompt": {"nope": 1}}),
    ("/v1/completions", "/v1/completions/render", {"prompt": "hi", "temperature": "hot"}),
    ("/v1/completions", "/v1/completions/render", {"prompt": "hi", "n": 99}),
    ("/v1/completions", "/v1/completions/render", {"prompt": [7] * 3000}),
    ("/v1/chat/completions", "/v1/chat/completions/render", {}),
    ("/v1/chat/completions", "/v1/chat/completions/render", {"messages": "hello"}),
    ("/v1/chat/completions", "/v1/chat/completions/render",
     {"messages": CHATS[0], "top_logprobs": 3}),
    ("/v1/chat/completions", "/v1/chat/completions/render",
     {"messages": CHATS[0], "response_format": {"type": "xml"}}),
    ("/v1/chat/completions", "/v1/chat/completions/render",
     {"messages": [{"role": "user", "content": "word " * 3000}]}),
])
def test_render_errors_are_the_endpoints_errors(srv, path, render, body):
    a, b = post(srv, path, body), post(srv, render, body)
    assert a.status_code == b.status_code == 400, (a.text, b.text)
    assert a.json == b.json and set(b.json["error"]) >= {"code", "message", "type"}


def test_render_not_json_and_get(srv):
    r = srv.simulate_post("/v1/completions/render", body=b"{nope", headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and r.json["error"]["code"] == 400
    # a GET is answered as the generating endpoint answers it
    assert srv.simulate_get("/v1/chat/completions/render").json == srv.simulate_get("/v1/chat/completions").json
