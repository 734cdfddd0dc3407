"""SmolLM2-135M-Instruct (ChatML, llama architecture), the real instruct
model, beside llama-server 0.3.36 (`--jinja`) on the same GGUF where the
point is to agree with it: /apply-template byte for byte (its BOS text
``<|im_start|>`` is not the tokenizer's to add, so it stays in the prompt),
chat and tools through the official clients, and under the DeepSeek R1
template (which opens ``<think>`` itself) the reasoning split of a
grammar-forced answer and the reasoning budget (greedy: both servers write
the same tokens). Few requests, short answers. llama-server's side skips
when its build is absent."""
from __future__ import annotations

import json
import os
from typing import Iterator

import anthropic
import openai
import pytest
import requests

from frontends import testing as S
from frontends.testing.server import Proc, free_port

SMOL = S.models.smollm2()
TEMPLATES = "/root/.cache/ringserve/llama.cpp-0.3.36/src/models/templates/"
R1 = TEMPLATES + "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja"
QWEN35 = TEMPLATES + "Qwen3.5-4B.jinja"  # opens "<think>\n" after "assistant\n": its tokens match the marker's
LS = "/root/.cache/ringserve/llama.cpp-0.3.36/build/bin/llama-server"
FLAGS = ("-m", SMOL, "-c", "2048", "-np", "2", "-t", "1", "-w", "1", "--threads-http", "4")
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "the weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
                          "required": ["city"]}}}
HI = [{"role": "user", "content": "Hi"}]
BODIES = [{"messages": [{"role": "system", "content": "S"}, *HI]},
          {"messages": HI},
          {"messages": [*HI, {"role": "assistant", "content": "A"}, {"role": "user", "content": "B"}]},
          {"messages": HI, "add_generation_prompt": False}]


def llama_server(*flags: str) -> Proc | None:
    if not os.path.exists(LS):
        return None
    port = free_port()
    return Proc([LS, "-m", SMOL, "--jinja", "--port", str(port), "-c", "2048", "-np", "1", "-t", "1", *flags],
                port, name="llama-server")


@pytest.fixture(scope="module")
def rs() -> Iterator[S.Server]:
    with S.server.running(*FLAGS) as s:
        yield s


def both(template: str) -> Iterator[tuple]:
    """ringserve and llama-server under ``template`` (llama-server None when absent)."""
    ls = None
    with S.server.running(*FLAGS, "--chat-template-file", template) as s:
        try:
            ls = llama_server("--chat-template-file", template)
            yield s, ls
        finally:
            if ls is not None:
                ls.stop()
                ls.cleanup()


@pytest.fixture(scope="module")
def r1() -> Iterator[tuple]:
    """Under the DeepSeek R1 template."""
    yield from both(R1)


def chat(base: str, body: dict) -> dict:
    r = requests.post(base + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.parametrize("template", ["", R1])
def test_apply_template_as_llama_server(template):
    if not os.path.exists(LS):
        pytest.skip("no llama-server build")
    flags = ("--chat-template-file", template) if template else ()
    ls = llama_server(*flags)
    try:
        with S.TestClient("-m", SMOL, *flags) as c:
            for body in BODIES:
                for path in ("/apply-template", "/v1/chat/completions/input_tokens"):
                    want = requests.post(ls.url(path), json=body, timeout=30)
                    got = c.simulate_post(path, json=body)
                    assert (got.status_code, got.json) == (want.status_code, want.json()), (path, body)
            assert c.simulate_post("/apply-template", json=BODIES[0]).json["prompt"].startswith(
                "<|im_start|>system\nS<|im_end|>" if not template else "<|im_start|>S<｜User｜>")
    finally:
        ls.stop()
        ls.cleanup()


def test_chat_and_tools(rs):
    c = openai.OpenAI(base_url=rs.url("/v1"), api_key="none", max_retries=0)
    r = c.chat.completions.create(model="m", messages=HI, max_tokens=8, temperature=0)
    assert r.choices[0].message.content and r.usage.completion_tokens <= 8
    assert r.usage.prompt_tokens == len(requests.post(rs.url("/tokenize"), json={
        "content": requests.post(rs.url("/apply-template"), json={"messages": HI}).json()["prompt"],
        "add_special": True, "parse_special": True}).json()["tokens"])
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = c.chat.completions.create(model="m", messages=ask, tools=[WEATHER], tool_choice="required", max_tokens=40,
                                  temperature=0)
    call = r.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather" and json.loads(call.function.arguments)["city"] in ("Paris", "Oslo")
    assert r.choices[0].finish_reason == "tool_calls"
    a = anthropic.Anthropic(base_url=rs.base, api_key="none", max_retries=0)
    m = a.messages.create(model="m", max_tokens=40, messages=ask, tool_choice={"type": "any"}, extra_body={"temperature": 0},
                          tools=[{"name": "get_weather", "input_schema": WEATHER["function"]["parameters"]}])
    assert m.stop_reason == "tool_use" and m.content[-1].type == "tool_use" and m.content[-1].input["city"]


FORCED = ["I think.</think>\n\nHello", "I think a lot about it", "<think>\nA\n</think>\n\nB"]
MEASURED = [("\nI think.", "\n\nHello"), ("\nI think a", ""), ("\n<think>\nA\n", "\n\nB")]  # llama-server's


@pytest.mark.parametrize("k", range(len(FORCED)))
def test_reasoning_split_as_llama_server(r1, k):
    """A grammar forces the model's text: both servers split it alike, streamed and not."""
    s, ls = r1
    body = {"messages": HI, "grammar": "root ::= " + json.dumps(FORCED[k]), "max_tokens": 30 if k != 1 else 3,
            "temperature": 0}  # greedy: the grammar fixes the text, not how it is cut into tokens
    m = chat(s.base, body)["choices"][0]["message"]
    assert (m.get("reasoning_content", ""), m["content"]) == MEASURED[k]
    ev = S.sse_events(requests.post(s.url("/v1/chat/completions"), json={**body, "stream": True}, timeout=60).content)
    deltas = [e["choices"][0]["delta"] for e in ev if isinstance(e, dict) and e.get("choices")]
    assert ("".join(d.get("reasoning_content") or "" for d in deltas),
            "".join(d.get("content") or "" for d in deltas)) == MEASURED[k]
    if ls is not None:
        want = chat(ls.base, body)["choices"][0]["message"]
        assert (m.get("reasoning_content"), m["content"]) == (want.get("reasoning_content"), want["content"])


@pytest.fixture(scope="module")
def q35() -> Iterator[tuple]:
    """Under the Qwen 3.5 template."""
    yield from both(QWEN35)


@pytest.mark.parametrize("budget, message", [(3, " Enough."), (0, "")])
def test_reasoning_budget_as_llama_server(q35, budget, message):
    """Greedy, so both servers write the same tokens: the budget ends the
    thinking after ``budget`` tokens with the message and ``</think>``."""
    s, ls = q35
    body = {"messages": HI, "max_tokens": 14, "temperature": 0, "reasoning_budget_tokens": budget,
            "reasoning_budget_message": message}
    got = chat(s.base, body)
    m = got["choices"][0]["message"]
    free = chat(s.base, {**body, "reasoning_budget_tokens": -1})["choices"][0]["message"]
    assert m != free and got["usage"]["completion_tokens"] <= 14
    assert m.get("reasoning_content", "").rstrip().endswith(message), m  # then the template's "\n" and </think>
    if ls is not None:
        want = chat(ls.base, body)
        w = want["choices"][0]["message"]
        assert (m.get("reasoning_content"), m["content"]) == (w.get("reasoning_content"), w["content"])


def test_budget_unseen_where_llama_server_does_not_see_it(r1):
    """Under the R1 template the prompt's ``><think>`` merges into other
    tokens, so llama.cpp's token matcher never starts the count: neither does ours."""
    s, ls = r1
    body = {"messages": HI, "max_tokens": 8, "temperature": 0}
    assert chat(s.base, {**body, "reasoning_budget_tokens": 2})["choices"] == chat(s.base, body)["choices"]
