"""The lazy grammar with the real engine (default model): free text until
the trigger appears in the generated text, the grammar from there on --
what a native tool-call format's "auto" sends (frontends/text/toolfmt/
grammar.py, read by engine/sampling/chain.py). The model, shown calls to
get_weather, starts writing one; once it wrote ``<tool_call>\\n`` the grammar
allows only a get_time call, and the answer ends with it."""
from __future__ import annotations

import json

import pytest

from frontends import testing as S
from frontends.text import tools
from frontends.text.toolfmt import grammar as G, pick
from frontends.text.chat import ChatTemplate

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
PROMPT = "Tool calls made so far:\n" + CALL * 4
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}}, "required": ["zone"]}}}


@pytest.fixture(scope="module")
def srv():
    with S.server.running("-c", "1024", "-np", "1", "-t", "2", "-w", "1") as s:
        yield s


def lazy_grammar() -> str:
    fmt = pick(ChatTemplate("{# <tool_call> #}{% for m in messages %}{% for tc in m.tool_calls or [] %}"
                            "{{ tc.function.name }}{% endfor %}{{ m.content }}{% endfor %}", "", ""))
    spec = tools.parse({"tools": [TIME]})
    g = G.build(fmt, spec)
    assert g.startswith(G.LAZY)
    return g


def test_free_text_then_the_grammar_from_the_trigger(srv) -> None:
    base = {"prompt": PROMPT, "n_predict": 48, "temperature": 0, "cache_prompt": False}
    code, free = S.post(srv.url("/completion"), base)
    assert code == 200 and free["content"].startswith('<tool_call>\n{"name": "get_weather"'), free  # what it would write
    code, held = S.post(srv.url("/completion"), {**base, "grammar": lazy_grammar()})
    assert code == 200, held
    text = held["content"]
    k = text.find("<tool_call>\n")
    assert k >= 0, text
    body = text[k + len("<tool_call>\n"):]
    call = json.loads(body[:body.rindex("}") + 1])
    assert call["name"] == "get_time" and call["arguments"]["zone"] in ("UTC", "CET"), text
    assert body.rstrip().endswith("</tool_call>") and held["stop_type"] == "eos", held


def test_a_trigger_that_never_comes_leaves_the_text_free(srv) -> None:
    base = {"prompt": "The capital of France is", "n_predict": 12, "temperature": 0, "cache_prompt": False}
    _, free = S.post(srv.url("/completion"), base)
    _, lazy = S.post(srv.url("/completion"), {**base, "grammar": lazy_grammar()})
    assert lazy["content"] == free["content"] and "<tool_call>" not in free["content"]


def test_a_bad_lazy_header_is_400(srv) -> None:
    code, r = S.post(srv.url("/completion"), {"prompt": "x", "n_predict": 2, "grammar": '# lazy: {bad\nroot ::= "a"'})
    assert code == 400 and "grammar" in r["error"]["message"], r


PLAYBACK = {  # a template naming each family's markers (detection) that shows tool calls
    "Hermes 2 Pro": "<tool_call>", "Mistral Nemo": "[TOOL_CALLS]", "DeepSeek R1": "tool▁calls▁begin <｜Assistant｜>",
    "Llama 3.x": "<|start_header_id|> ipython",
}


@pytest.mark.parametrize("fam", sorted(PLAYBACK))
def test_required_grammar_makes_a_call_the_format_parses(srv, fam: str) -> None:
    """tool_choice required: the engine accepts the format's grammar and the
    model's answer, held to it, parses to a get_time call."""
    fmt = pick(ChatTemplate("{# " + PLAYBACK[fam] + " #}{% for m in messages %}{% for tc in m.tool_calls or [] %}"
                            "{{ tc.function.name }}{% endfor %}{{ m.content }}{% endfor %}", "", ""))
    assert fmt is not None and fmt.name == fam
    spec = tools.parse({"tools": [TIME], "tool_choice": "required"})
    code, r = S.post(srv.url("/completion"), {"prompt": "Call a tool:\n", "n_predict": 96, "temperature": 0,
                                              "grammar": G.build(fmt, spec)})
    assert code == 200, r
    msg = fmt.stream().message(r["content"])
    assert [c["function"]["name"] for c in msg.get("tool_calls", [])] == ["get_time"], r["content"]
    assert json.loads(msg["tool_calls"][0]["function"]["arguments"])["zone"] in ("UTC", "CET")
