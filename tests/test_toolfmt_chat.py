"""Native tool calls through /v1/chat/completions with the fake engine
playing the model: a "playback" chat template names a family's markers (so
ringserve picks that format) and renders only the last user message, which
the fake engine echoes back as the answer. The answer must come back as the
golden message (tests/data/toolfmt_golden.json, llama-server's parse of the
same text), streamed deltas adding up to it, finish_reason "tool_calls"."""
from __future__ import annotations

import pytest

from frontends.testing import TestClient, sse_events

from test_toolfmt import GOLDEN, expected, strip_ids, assemble

MARKERS = {  # a family's detection markers, in a jinja comment
    "Hermes 2 Pro": ("Qwen-Qwen2.5-7B-Instruct.jinja", "<tool_call>"),
    "Mistral Nemo": ("mistralai-Mistral-Nemo-Instruct-2407.jinja", "[TOOL_CALLS]"),
    "GPT-OSS": ("openai-gpt-oss-120b.jinja", "<|channel|>"),
    "Qwen3-Coder": ("Qwen3-Coder.jinja", "<tool_call> <function= <parameter="),
    "Llama 3.x": ("meta-llama-Llama-3.1-8B-Instruct.jinja", "<|start_header_id|> ipython"),
}


def playback(markers: str) -> str:
    return ("{#- " + markers + " -#}"
            "{%- for m in messages %}{%- for tc in m.tool_calls or [] %}{{ tc.function.name }}{% endfor %}{% endfor %}"
            "{{- messages[-1].content -}}")


@pytest.fixture(scope="module", params=sorted(MARKERS))
def family(request):
    fam = request.param
    with TestClient("--chat-template", playback(MARKERS[fam][1])) as c:
        yield fam, c


def test_answers_parse_as_llama_server(family) -> None:
    fam, c = family
    name = MARKERS[fam][0]
    for i, text in enumerate(GOLDEN["templates"][name]["outputs"]):
        want = GOLDEN["templates"][name]["parsed"][i]
        if "error" in want or want.get("reasoning_content"):
            continue
        body = {"messages": [{"role": "user", "content": text}], "tools": GOLDEN["tools"], "parallel_tool_calls": True}
        r = c.simulate_post("/v1/chat/completions", json=body)
        assert r.status_code == 200, r.json
        ch = r.json["choices"][0]
        keep = fam == "Mistral Nemo"
        assert strip_ids(ch["message"], keep) == strip_ids(expected(name, i), keep), text
        assert ch["finish_reason"] == ("tool_calls" if want.get("tool_calls") else "stop")
        assert all(tc["id"] for tc in ch["message"].get("tool_calls", []))
        # streamed: the deltas add up to the same message
        r = c.simulate_post("/v1/chat/completions", json={**body, "stream": True})
        events = [e for e in sse_events(r.content) if e != "[DONE]"]
        deltas = [e["choices"][0]["delta"] for e in events if e.get("choices")]
        got = assemble(deltas)
        assert got["content"] == want.get("content", ""), text
        assert [(x["name"], x["arguments"]) for x in got["calls"]] == \
            [(x["function"]["name"], x["function"]["arguments"]) for x in want.get("tool_calls", [])]
        assert events[-1]["choices"][0]["finish_reason"] == ("tool_calls" if want.get("tool_calls") else "stop")
