"""Reasoning and tools on every chat API, against the fake engine playing
the model: its chat template (ECHO) shows an assistant message with reasoning
between ``<think>`` markers (so the markers are detected as llama-server
detects them) and otherwise renders only the last message's content, which the fake engine
echoes -- so the test writes the model's answer. The OpenAI and Anthropic
clients run in-process over WSGI. SmolLM2 runs in tests/test_smollm2.py."""
from __future__ import annotations

import json

import anthropic
import httpx
import openai
import pytest

from frontends.testing import TestClient
from frontends.text import reasoning
from frontends.text.chat import ChatTemplate
from frontends.text.reply import Reply
from frontends.text.toolparse import Answer

ECHO = ("{%- for m in messages -%}"
        "{%- if m.role == 'assistant' -%}{%- if m.reasoning_content -%}<think>{{ m.reasoning_content }}</think>"
        "{{ m.content }}{%- endif -%}"
        "{%- elif loop.last -%}{{ m.content }}{%- endif -%}"
        "{%- endfor -%}")
WEATHER = {"name": "get_weather", "description": "the weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
CALL = '{"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}}'
EOS = {"n_predict": -1}  # the fake engine: one pass over the prompt, then EOS (the model stops by itself)


@pytest.fixture(scope="module")
def srv():
    with TestClient("--chat-template", ECHO, token_s=0.0005) as c:
        yield c


def wsgi(srv) -> httpx.Client:
    return httpx.Client(transport=httpx.WSGITransport(app=srv.app))


def claude(srv) -> anthropic.Anthropic:
    import httpx2  # the anthropic SDK's own httpx fork

    http = httpx2.Client(transport=httpx2.WSGITransport(app=srv.app))
    return anthropic.Anthropic(base_url="http://testserver", api_key="none", http_client=http, max_retries=0)


def gpt(srv) -> openai.OpenAI:
    return openai.OpenAI(base_url="http://testserver/v1", api_key="none", http_client=wsgi(srv), max_retries=0)


# ------------------------------------------------------------------ the splitter
TEXTS = ["<think>pondering</think>The answer", "<think>\nA\n</think>\n\nB", "<think>cut short", "no thoughts",
         "<thi", "<think>a</thi", "<think></think>", "</think>late", " <think>x</think>y"]


@pytest.mark.parametrize("mk", [reasoning.Markers("<think>", "</think>"),
                                reasoning.Markers("<think>", "</think>", True, True)])
@pytest.mark.parametrize("prefix", ["", "<think>\n"])
def test_splitter_every_cut_point(mk, prefix):
    """Streamed at any cut, the pieces add up to the whole split, and no
    piece ever holds part of a marker."""
    think = reasoning.Think(mk, "auto", prefix)
    for text in TEXTS:
        whole = reasoning.split(think, text)
        for cut in range(len(text) + 1):
            sp = reasoning.Splitter(think)
            pieces = sp.feed(text[:cut]) + sp.feed(text[cut:]) + sp.finish()
            r = "".join(t for k, t in pieces if k == "reasoning")
            c = "".join(t for k, t in pieces if k == "content")
            assert (r, c) == whole, (text, cut)
        chars = reasoning.Splitter(think)
        pieces = [p for ch in text for p in chars.feed(ch)]  # before the end: a marker is never shown
        if whole[0] or prefix:
            assert not any(k == "reasoning" and "</" in t for k, t in pieces), (text, pieces)


def test_split_as_llama_server():
    """The splits measured on llama-server (SmolLM2 under the DeepSeek R1 and
    Qwen 3 templates, the output forced by a grammar)."""
    qwen = reasoning.Think(reasoning.Markers("<think>", "</think>", True, True), "auto")
    r1 = reasoning.Think(reasoning.Markers("<think>", "</think>"), "auto", "<think>\n")
    assert reasoning.split(r1, "I think.</think>\n\nHello") == ("\nI think.", "\n\nHello")
    assert reasoning.split(r1, "I think a") == ("\nI think a", "")
    assert reasoning.split(r1, "<think>\nA\n</think>\n\nB") == ("\n<think>\nA\n", "\n\nB")
    assert reasoning.split(qwen, "<think>\nA\n</think>\n\nB") == ("A\n", "B")
    assert reasoning.split(qwen, "I think.</think>\n\nHello") == ("", "I think.</think>\n\nHello")
    none = reasoning.Think(r1.markers, "none", "<think>\n")
    assert reasoning.split(none, "I think.</think>\n\nHello") == ("", "<think>\nI think.</think>\n\nHello")


TEMPLATES = "/root/.cache/ringserve/llama.cpp-0.3.36/src/models/templates/"

# llama-server's own parse of these outputs (common_chat_parse through scripts/chat_oracle.cpp, reasoning
# format auto): whitespace before <think> skipped, whitespace-only thoughts dropped, the template's own
# whitespace after </think> skipped (GLM writes one newline there, Qwen 3 two), and with no thoughts the
# answer's leading whitespace skipped; DeepSeek R1's generation prompt opens <think>\n
ORACLE = {
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B": [
        ('<think>\n\n</think>Hi', ('\n<think>\n\n', 'Hi')), ('\n\n</think>Hi', ('', 'Hi')),
        (' <think>x</think>y', ('\n <think>x', 'y')), ('<think> </think>', ('\n<think> ', '')),
        ('</think>Hi', ('', 'Hi')), ('<think>\nA\n</think>\n\nB', ('\n<think>\nA\n', '\n\nB')),
        ('A</think>B', ('\nA', 'B')), ('\n\nHi', ('\n\n\nHi', ''))],
    "Qwen-Qwen3-0.6B": [
        ('<think>\n\n</think>Hi', ('', 'Hi')), ('\n\n</think>Hi', ('', '</think>Hi')), (' <think>x</think>y', ('x', 'y')),
        ('<think> </think>', ('', '')), ('</think>Hi', ('', '</think>Hi')), ('<think>\nA\n</think>\n\nB', ('A\n', 'B')),
        ('A</think>B', ('', 'A</think>B')), ('\n\nHi', ('', 'Hi'))],
    "GLM-4.6": [
        ('<think>\n\n</think>Hi', ('', 'Hi')), ('\n\n</think>Hi', ('', '</think>Hi')), (' <think>x</think>y', ('x', 'y')),
        ('<think> </think>', ('', '')), ('</think>Hi', ('', '</think>Hi')),
        ('<think>\nA\n</think>\n\nB', ('\nA\n', '\nB')), ('A</think>B', ('', 'A</think>B')), ('\n\nHi', ('', 'Hi'))],
    # a call ends Qwen 3.5's thoughts without </think> (qwen3-coder.cpp's thinking_end_tags)
    "Qwen3.5-4B": [
        ('hm\n<tool_call>\n<function=python>\n<parameter=code>\nx\n</parameter>\n</function>\n</tool_call>',
         ('hm\n', '<tool_call>\n<function=python>\n<parameter=code>\nx\n</parameter>\n</function>\n</tool_call>')),
        ('hm\n</think>\n\nok', ('hm\n', 'ok')), ('hm <tool_call> x', ('hm ', '<tool_call> x'))],
}


@pytest.mark.parametrize("name", sorted(ORACLE))
def test_split_of_templates_as_llama_servers_parser(name):
    import os

    path = TEMPLATES + name + ".jinja"
    if not os.path.exists(path):
        pytest.skip("llama.cpp's templates are not here")
    tmpl = ChatTemplate(open(path).read(), "", "")
    user = [{"role": "user", "content": "Hey"}]
    think = reasoning.plan(tmpl, "auto", reasoning.generation_prompt(tmpl.render(user, False), tmpl.render(user, True)))
    for text, want in ORACLE[name]:
        assert reasoning.split(think, text) == want, text
        for cut in range(len(text) + 1):  # streamed at any cut: the same
            sp = reasoning.Splitter(think)
            pieces = sp.feed(text[:cut]) + sp.feed(text[cut:]) + sp.finish()
            assert ("".join(t for k, t in pieces if k == "reasoning"), "".join(t for k, t in pieces if k == "content")) \
                == want, (text, cut)


@pytest.mark.parametrize("name, mk", [
    ("Qwen-Qwen3-0.6B", reasoning.Markers("<think>", "</think>", True, True, "\n", "\n\n")),
    ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", reasoning.Markers("<think>", "</think>")),
    ("CohereForAI-c4ai-command-r7b-12-2024-tool_use", reasoning.Markers("<|START_THINKING|>", "<|END_THINKING|>")),
    ("meta-llama-Llama-3.3-70B-Instruct", None),
    # found as llama-server finds them (the generation prompt with thinking off against on; its patches)
    ("HuggingFaceTB-SmolLM3-3B", reasoning.Markers("<think>", "</think>")),
    ("deepseek-ai-DeepSeek-V3.1", reasoning.Markers("<think>", "</think>")),
    ("ibm-granite-granite-3.3-2B-Instruct", reasoning.Markers("<think>", "</think>")),
    ("mistralai-Ministral-3-14B-Reasoning-2512", reasoning.Markers("[THINK]", "[/THINK]")),
    ("Kimi-K2-Instruct", reasoning.Markers("<think>", "</think>")),
    ("GLM-4.6", reasoning.Markers("<think>", "</think>", False, True, "", "\n")),
])
def test_markers_of_templates(name, mk):
    import os

    path = TEMPLATES + name + ".jinja"
    if not os.path.exists(path):
        pytest.skip("llama.cpp's templates are not here")
    assert reasoning.markers(ChatTemplate(open(path).read(), "<s>", "</s>")) == mk


def test_thoughts_never_reach_tool_parsing():
    think = reasoning.Think(reasoning.Markers("<think>", "</think>"), "auto")
    text = '<think>maybe {"tool_call": {"name": "rm", "arguments": {}}}</think>' + CALL
    msg = Reply(think, Answer()).message(text)
    assert [c["function"]["name"] for c in msg["tool_calls"]] == ["get_weather"]
    assert msg["reasoning_content"].startswith("maybe") and msg["content"] is None


# ------------------------------------------------------------------ chat completions
def test_chat_reasoning_content(srv):
    c = gpt(srv)
    r = c.chat.completions.create(model="m", messages=[{"role": "user", "content": "<think>hmm</think>Hi there"}])
    m = r.choices[0].message
    assert m.content == "Hi there" and m.model_extra["reasoning_content"] == "hmm"
    chunks = list(c.chat.completions.create(model="m", stream=True, messages=[
        {"role": "user", "content": "<think>hmm, let me see</think>Hi there"}]))
    deltas = [ch.choices[0].delta for ch in chunks if ch.choices]
    assert "".join(d.model_extra.get("reasoning_content") or "" for d in deltas) == "hmm, let me see"
    assert "".join(d.content or "" for d in deltas) == "Hi there"
    r = srv.simulate_post("/v1/chat/completions", json={"reasoning_format": "none", "messages": [
        {"role": "user", "content": "<think>hmm</think>Hi"}]}).json
    assert r["choices"][0]["message"] == {"role": "assistant", "content": "<think>hmm</think>Hi"}
    r = srv.simulate_post("/v1/chat/completions", json={"reasoning_format": "sideways", "messages": [
        {"role": "user", "content": "x"}]})
    assert r.status_code == 400 and "reasoning_format" in r.json["error"]["message"]
    r = srv.simulate_post("/v1/chat/completions", json={"chat_template_kwargs": {"enable_thinking": "yes"},
                                                        "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 400 and "enable_thinking" in r.json["error"]["message"]


def test_deepseek_legacy_streams_as_deepseek(srv):
    """The vendored llama-server sets reasoning_in_content for a streamed
    deepseek-legacy request and no parser reads it: the deltas carry the
    thoughts as reasoning_content and the content without them, as deepseek's."""
    from frontends.testing import sse_events

    for fmt in ("deepseek", "deepseek-legacy"):
        r = srv.simulate_post("/v1/chat/completions", json={"stream": True, "reasoning_format": fmt, "messages": [
            {"role": "user", "content": "<think>hmm, let me see</think>Hi there"}]})
        deltas = [e["choices"][0]["delta"] for e in sse_events(r.content) if e != "[DONE]" and e.get("choices")]
        assert "".join(d.get("reasoning_content") or "" for d in deltas) == "hmm, let me see", fmt
        assert "".join(d.get("content") or "" for d in deltas) == "Hi there", fmt


def test_stop_string_inside_the_thoughts(srv):
    """A stop string applies to the whole output, thoughts included, as in llama-server."""
    r = srv.simulate_post("/v1/chat/completions", json={"stop": ["STOP"], "messages": [
        {"role": "user", "content": "<think>a STOP b</think>c"}]}).json
    assert r["choices"][0]["message"]["reasoning_content"] == "a " and r["choices"][0]["message"]["content"] == ""


def test_server_wide_reasoning_format_none():
    with TestClient("--chat-template", ECHO, "--reasoning-format", "none") as c:
        r = c.simulate_post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "<think>x</think>y"}]})
        assert r.json["choices"][0]["message"]["content"] == "<think>x</think>y"
        assert c.simulate_get("/props").status_code == 200


# ------------------------------------------------------------------ /v1/messages
def test_messages_tool_round_trip(srv):
    c = claude(srv)
    ask = [{"role": "user", "content": CALL}]
    m = c.messages.create(model="m", max_tokens=200, tools=[WEATHER], messages=ask, extra_body=EOS)
    assert m.stop_reason == "tool_use"
    use = [b for b in m.content if b.type == "tool_use"]
    assert len(use) == 1 and use[0].name == "get_weather" and use[0].input == {"city": "Paris"}
    assert use[0].id.startswith("call_")
    again = ask + [{"role": "assistant", "content": m.content},
                   {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use[0].id,
                                                 "content": [{"type": "text", "text": "Sunny, 21 C"}]}]}]
    m2 = c.messages.create(model="m", max_tokens=200, tools=[WEATHER], messages=again, extra_body=EOS)
    assert m2.stop_reason == "end_turn" and m2.content[0].type == "text" and m2.content[0].text == "Sunny, 21 C"
    for choice in ({"type": "any"}, {"type": "tool", "name": "get_weather"}):
        m3 = c.messages.create(model="m", max_tokens=200, tools=[WEATHER], tool_choice=choice, messages=ask,
                               extra_body=EOS)
        assert m3.stop_reason == "tool_use"
    none = c.messages.create(model="m", max_tokens=200, tools=[WEATHER], tool_choice={"type": "none"},
                             messages=ask, extra_body=EOS)
    assert none.stop_reason == "end_turn" and none.content[0].text == CALL  # no tools: the text as it is


def test_messages_tool_stream(srv):
    c = claude(srv)
    with c.messages.stream(model="m", max_tokens=200, tools=[WEATHER], extra_body=EOS,
                           messages=[{"role": "user", "content": "<think>need the weather</think>" + CALL}]) as s:
        events = list(s)
        final = s.get_final_message()
    kinds = [e.type for e in events]
    assert "input_json" in kinds and "thinking" in kinds
    assert [b.type for b in final.content] == ["thinking", "tool_use"]
    assert final.content[0].thinking == "need the weather" and final.content[1].input == {"city": "Paris"}
    assert final.stop_reason == "tool_use"
    r = srv.simulate_post("/v1/messages", json={"max_tokens": 5, "tools": [{"type": "web_search_20250305",
                                                                            "name": "web_search"}],
                                                "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 400 and r.json["type"] == "error"


def test_messages_thinking_blocks(srv):
    c = claude(srv)
    m = c.messages.create(model="m", max_tokens=200, extra_body=EOS,
                          messages=[{"role": "user", "content": "<think>a thought</think>An answer"}])
    assert [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in m.content] == [
        ("thinking", "a thought"), ("text", "An answer")]
    with c.messages.stream(model="m", max_tokens=200, extra_body=EOS,
                           messages=[{"role": "user", "content": "<think>a thought</think>An answer"}]) as s:
        final = s.get_final_message()
    assert final.content[0].thinking == "a thought" and final.content[1].text == "An answer"
    # a thinking block in the history reaches the template as reasoning_content
    n = srv.simulate_post("/v1/messages/count_tokens", json={"messages": [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "T", "signature": ""},
                                          {"type": "text", "text": "A"}]}]}).json
    assert n["input_tokens"] > 0


# ------------------------------------------------------------------ /v1/responses
FN = {"type": "function", "name": "get_weather", "description": "the weather in a city",
      "parameters": WEATHER["input_schema"]}


def test_responses_function_call_round_trip(srv):
    c = gpt(srv)
    r = c.responses.create(model="m", input=CALL, tools=[FN], extra_body=EOS)
    calls = [o for o in r.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather" and json.loads(calls[0].arguments) == {"city": "Paris"}
    assert r.status == "completed"
    inp = [{"role": "user", "content": CALL}, *[o.model_dump() for o in r.output],
           {"type": "function_call_output", "call_id": calls[0].call_id, "output": "Rain, 12 C"}]
    r2 = c.responses.create(model="m", input=inp, tools=[FN], extra_body=EOS)
    assert r2.output_text == "Rain, 12 C" and not [o for o in r2.output if o.type == "function_call"]


def test_responses_stream_reasoning_and_call(srv):
    c = gpt(srv)
    with c.responses.stream(model="m", input="<think>weather?</think>" + CALL, tools=[FN], extra_body=EOS) as s:
        events = list(s)
        final = s.get_final_response()
    kinds = [e.type for e in events]
    assert "response.reasoning_text.delta" in kinds and "response.function_call_arguments.delta" in kinds
    assert "response.function_call_arguments.done" in kinds
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert json.loads(args) == {"city": "Paris"}
    assert [o.type for o in final.output] == ["reasoning", "function_call"]
    assert final.output[0].content[0].text == "weather?"
    seq = [e.sequence_number for e in events]
    assert seq == list(range(len(seq)))


def test_responses_counts_the_reasoning_tokens(srv):
    """usage.output_tokens_details.reasoning_tokens: the tokens up to the one
    that starts the answer (the echoed thoughts and their end marker); all of
    them for thoughts cut short; 0 without thoughts. Streamed or not, the same."""
    from frontends.testing.client import vocab

    v = vocab(srv.cfg.model)
    c = gpt(srv)
    text = "<think>weather? let me think it over</think>The answer: rain"
    ids = v.tokenize(text, False, True)

    def shown(k: int) -> str:
        return b"".join(v.piece(t) for t in ids[:k]).decode("utf-8", "ignore")

    want = next(k for k in range(1, len(ids) + 1) if "</think>T" in shown(k)) - 1  # the token with "T" starts it
    r = c.responses.create(model="m", input=text, extra_body=EOS)
    assert r.output_text == "The answer: rain"
    assert 0 < want < r.usage.output_tokens and r.usage.output_tokens_details.reasoning_tokens == want, r.usage
    with c.responses.stream(model="m", input=text, extra_body=EOS) as s:
        list(s)
        assert s.get_final_response().usage.output_tokens_details.reasoning_tokens == want
    r = c.responses.create(model="m", input="<think>cut short", extra_body=EOS)
    assert r.usage.output_tokens_details.reasoning_tokens == r.usage.output_tokens > 0
    r = c.responses.create(model="m", input="no thoughts", extra_body=EOS)
    assert r.usage.output_tokens_details.reasoning_tokens == 0


def test_responses_thoughts_only_streamed_and_whole_alike(srv):
    """An answer of thoughts alone (its text stopped inside them): a reasoning
    item and no message, streamed or not, as llama-server adds a message only
    for content; the whole answer added an empty one beside the thoughts."""
    c = gpt(srv)
    eb = {"n_predict": -1, "stop": ["STOP"]}
    r = c.responses.create(model="m", input="<think>x STOP</think>y", extra_body=eb)
    with c.responses.stream(model="m", input="<think>x STOP</think>y", extra_body=eb) as s:
        list(s)
        f = s.get_final_response()
    assert [o.type for o in r.output] == [o.type for o in f.output] == ["reasoning"], (r.output, f.output)
