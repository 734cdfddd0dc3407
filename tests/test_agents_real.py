"""/v1/responses, /v1/messages and /infill with the real default model
(gemma 3 270M), through the official openai and anthropic clients.

Both APIs take the chat completion path (template, parameter table, the same
Runner), so with greedy sampling and the batch-invariant flags
(testing.INVARIANT: one token per graph) their text equals the chat
completion's for the same conversation, exactly; streamed or not. Bad input
is a 4xx and the next request is answered as before."""
from __future__ import annotations

from typing import Iterator

import anthropic
import openai
import pytest
import requests

from frontends import testing as S
from frontends.testing.server import running

FLAGS = ("-c", "2048", "-np", "2", "-t", "1", "-w", "1", "--threads-http", "8", *S.INVARIANT)
N = 12
SYSTEM = "Answer in one short sentence."
USER = "Name three colours."
GREEDY = {"temperature": 0}


@pytest.fixture(scope="module")
def srv() -> Iterator[S.Server]:
    with running(*FLAGS) as s:
        yield s


@pytest.fixture(scope="module")
def chat_text(srv) -> str:
    """The chat completion's greedy answer: what both APIs must say."""
    body = {"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}],
            "max_tokens": N, "temperature": 0}
    r = requests.post(srv.url("/v1/chat/completions"), json=body, timeout=120)
    assert r.status_code == 200
    text = r.json()["choices"][0]["message"]["content"]
    assert text
    return text


def test_responses_openai_client(srv, chat_text):
    c = openai.OpenAI(base_url=srv.url("/v1"), api_key="x", max_retries=0, timeout=120)
    r = c.responses.create(model="m", instructions=SYSTEM, input=USER, max_output_tokens=N, temperature=0)
    assert r.output_text == chat_text and r.status == "incomplete" and r.usage.output_tokens == N
    items = [{"role": "system", "content": SYSTEM},
             {"role": "user", "content": [{"type": "input_text", "text": USER}]}]
    r2 = c.responses.create(model="m", input=items, max_output_tokens=N, temperature=0)
    assert r2.output_text == chat_text and r2.usage.input_tokens == r.usage.input_tokens
    events = list(c.responses.create(model="m", instructions=SYSTEM, input=USER, max_output_tokens=N,
                                     temperature=0, stream=True))
    types = [e.type for e in events]
    assert types[0] == "response.created" and types[-1] == "response.incomplete"
    assert "response.output_text.done" in types and "response.output_item.done" in types
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == chat_text
    assert events[-1].response.output_text == chat_text


def test_messages_anthropic_client(srv, chat_text):
    # the SDK has no sampling arguments any more: they go in the body as llama-server reads them
    c = anthropic.Anthropic(base_url=srv.url(""), api_key="x", max_retries=0, timeout=120)
    msgs = [{"role": "user", "content": USER}]
    m = c.messages.create(model="m", system=SYSTEM, max_tokens=N, extra_body=GREEDY, messages=msgs)
    assert m.content[0].text == chat_text and m.stop_reason == "max_tokens" and m.usage.output_tokens == N
    with c.messages.stream(model="m", system=SYSTEM, max_tokens=N, extra_body=GREEDY, messages=msgs) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text == chat_text and final.stop_reason == "max_tokens" and final.usage.output_tokens == N
    # a stop sequence taken from the answer itself ends it there
    word = chat_text.strip().split()[1] if len(chat_text.split()) > 1 else chat_text.strip()[:2]
    m = c.messages.create(model="m", system=SYSTEM, max_tokens=N, extra_body=GREEDY, messages=msgs,
                          stop_sequences=[word])
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == word
    assert chat_text.startswith(m.content[0].text if m.content else "") and word not in (m.content or [""])[0].text
    # an end of turn: the EOS token pushed to the top by a logit bias
    m = c.messages.create(model="m", max_tokens=N, extra_body={**GREEDY, "logit_bias": {"1": 100}},
                          messages=[{"role": "user", "content": USER}])
    assert m.stop_reason == "end_turn" and m.content == [] and m.usage.output_tokens == 1, m


def test_infill_without_fim_tokens(srv):
    """gemma 3 has no FIM tokens: the 501 llama-server answers."""
    r = requests.post(srv.url("/infill"), json={"input_prefix": "def add(a, b):\n    return ", "input_suffix": "\n"},
                      timeout=30)
    assert r.status_code == 501 and r.json()["error"]["type"] == "not_supported_error"
    assert "Infill is not supported by this model" in r.json()["error"]["message"]


@pytest.mark.parametrize("path, body, words", [
    ("/v1/responses", {"input": 3}, "'input' must be"),
    ("/v1/responses", {"input": "x", "max_output_tokens": -2}, "max_output_tokens"),  # 1.5 is 1, as llama-server's
    ("/v1/messages", {"messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
    ("/v1/messages", {"max_tokens": 5, "messages": [{"role": "tool", "content": "x"}]}, "'role'"),
    ("/v1/messages", {"max_tokens": 5, "messages": [{"role": "user", "content": "x" * 9000}]}, "context size"),
])
def test_bad_input_then_fine(srv, chat_text, path, body, words):
    r = requests.post(srv.url(path), json=body, timeout=30)
    assert r.status_code == 400, r.text
    assert words in r.json()["error"]["message"]
    ok = requests.post(srv.url("/v1/messages"), timeout=120, json={
        "system": SYSTEM, "max_tokens": N, "temperature": 0, "messages": [{"role": "user", "content": USER}]})
    assert ok.status_code == 200 and ok.json()["content"][0]["text"] == chat_text
