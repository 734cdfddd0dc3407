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
    with S.server.running("-c", "1024", "-np", "1", "-t", "1", "-w", "1") as s:
        yield s


@pytest.fixture(scope="module")
def lazy(srv):
    """/completion with a lazy grammar, straight into the engine: the workers
    read a request's own ``grammar`` as plain GBNF (frontends/text/params.py;
    only their tool-call formats send a lazy one), so this drives the
    server's engine through a worker index gunicorn leaves free, as a worker
    would: tokenized with BOS, greedy. Returns ``complete(prompt, grammar,
    n_predict) -> {"content", "stop_type"}``."""
    from engine.config import Config
    from engine.direct import generate
    from frontends.testing.client import vocab
    from ipc.client import WorkerPort

    arena = srv.arena()
    port = WorkerPort(arena, arena.geom.n_workers - 1)
    v = vocab(S.models.default())

    def complete(prompt: str, grammar: str, n_predict: int) -> dict:
        out = generate(port, v.tokenize(prompt), Config().sampling(temperature=0.0, n_predict=n_predict,
                                                                   cache_prompt=0), grammar=grammar.encode())
        assert out.stop != "error", out.result
        return {"content": v.detokenize(out.tokens, special=False), "stop_type": out.stop}

    yield complete
    arena.close()


def lazy_grammar() -> str:
    fmt = pick(ChatTemplate("{# <tool_call> #}{% for m in messages %}{% for tc in m.tool_calls or [] %}"
                            "{{ tc.function.name }}{% endfor %}{{ m.content }}{% endfor %}", "", ""))
    spec = tools.parse({"tools": [TIME]})
    g = G.build(fmt, spec)
    assert g.startswith(G.LAZY)
    return g


def test_free_text_then_the_grammar_from_the_trigger(srv, lazy) -> None:
    base = {"prompt": PROMPT, "n_predict": 48, "temperature": 0, "cache_prompt": False}
    code, free = S.post(srv.url("/completion"), {**base, "n_predict": 24})  # the call's start is all it checks
    assert code == 200 and free["content"].startswith('<tool_call>\n{"name": "get_weather"'), free  # what it would write
    held = lazy(PROMPT, lazy_grammar(), 48)
    text = held["content"]
    k = text.find("<tool_call>\n")
    assert k >= 0, text
    body = text[k + len("<tool_call>\n"):]
    call = json.loads(body[:body.rindex("}") + 1])
    assert call["name"] == "get_time" and call["arguments"]["zone"] in ("UTC", "CET"), text
    assert body.rstrip().endswith("</tool_call>") and held["stop_type"] == "eos", held


def test_a_trigger_that_never_comes_leaves_the_text_free(srv, lazy) -> None:
    base = {"prompt": "The capital of France is", "n_predict": 12, "temperature": 0, "cache_prompt": False}
    _, free = S.post(srv.url("/completion"), base)
    held = lazy(base["prompt"], lazy_grammar(), 12)
    assert held["content"] == free["content"] and "<tool_call>" not in free["content"]


def test_a_requests_own_lazy_header_is_a_comment(srv) -> None:
    """A request cannot send a lazy grammar (its trigger regexes would be
    compiled by llama.cpp, whose errors abort the engine): a grammar starting
    with the header line is that GBNF, the line a comment, applied from the
    first token (tests/test_faults_access.py: the requests that killed it)."""
    code, r = S.post(srv.url("/completion"), {"prompt": "x", "n_predict": 2, "grammar": '# lazy: {bad\nroot ::= "a"'})
    assert code == 200 and r["content"] == "a" and r["generation_settings"]["grammar_lazy"] is False, r


PLAYBACK = {  # a template naming each family's markers (detection) that shows tool calls
    "Hermes 2 Pro": "<tool_call>", "Mistral Nemo": "[TOOL_CALLS]", "DeepSeek R1": "tool▁calls▁begin <｜Assistant｜>",
    "Llama 3.x": "<|start_header_id|> ipython", "GPT-OSS": "<|channel|>", "Qwen3-Coder": "<tool_call> <function= <parameter=",
}


def playback(fam: str):
    fmt = pick(ChatTemplate("{# " + PLAYBACK[fam] + " #}{% for m in messages %}{% for tc in m.tool_calls or [] %}"
                            "{{ tc.function.name }}{% endfor %}{{ m.content }}{% endfor %}", "", ""))
    assert fmt is not None and fmt.name == fam
    return fmt


@pytest.mark.parametrize("fam", sorted(PLAYBACK))
def test_required_grammar_makes_a_call_the_format_parses(srv, fam: str) -> None:
    """tool_choice required: the engine accepts the format's grammar and the
    model's answer, held to it, parses to a get_time call."""
    fmt = playback(fam)
    spec = tools.parse({"tools": [TIME], "tool_choice": "required"})
    # the two formats whose "required" admits text before the call get a history that invites one;
    # gpt-oss's prompt ends in its generation prompt (the grammar starts after it)
    prompt = ("Tool calls made so far:\n" + HISTORY[fam] * 2 + ("<|start|>assistant" if fam == "GPT-OSS" else "")
              if fam in HISTORY else "Call a tool:\n")
    code, r = S.post(srv.url("/completion"), {"prompt": prompt, "n_predict": 96, "temperature": 0,
                                              "grammar": G.build(fmt, spec)})
    assert code == 200, r
    msg = parsed(fmt, spec, r["content"])
    assert [c["function"]["name"] for c in msg.get("tool_calls", [])] == ["get_time"], r["content"]
    zone_ok(fam, msg["tool_calls"][0]["function"]["arguments"], r["content"])


def parsed(fmt, spec, text: str) -> dict:
    """The answer as the request path parses it (the format told the request's tools)."""
    spec.fmt = fmt
    return tools.answerer(spec)().message(text)


def zone_ok(fam: str, arguments: str, text: str) -> None:
    """The call's zone: the schema's enum, except in Qwen3-Coder's XML, whose
    string parameters are free text up to ``</parameter>`` (llama-server's grammar)."""
    zone = json.loads(arguments)["zone"]
    assert zone in ("UTC", "CET") or fam == "Qwen3-Coder" and isinstance(zone, str), text


# a history of get_weather calls in the format: the model goes on with another; from the
# trigger on, the lazy grammar holds it to get_time (the calls llama-server's grammar allows)
HISTORY = {
    "GPT-OSS": '<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>'
               '{"city": "Paris"}<|call|>\n',
    "Qwen3-Coder": "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n"
                   "</tool_call>\n",
}


@pytest.mark.parametrize("fam", sorted(HISTORY))
def test_lazy_grammar_holds_the_call_from_the_trigger(srv, lazy, fam: str) -> None:
    fmt = playback(fam)
    base = {"prompt": "Tool calls made so far:\n" + HISTORY[fam] * 4, "n_predict": 64, "temperature": 0,
            "cache_prompt": False}
    code, free = S.post(srv.url("/completion"), {**base, "n_predict": 24})  # the call's name is all it checks
    assert code == 200 and "get_weather" in free["content"], free  # what it would write
    g = G.build(fmt, tools.parse({"tools": [TIME]}))
    assert g.startswith(G.LAZY), g
    held = lazy(base["prompt"], g, 64)
    msg = parsed(fmt, tools.parse({"tools": [TIME]}), held["content"])
    calls = msg.get("tool_calls") or []
    assert calls and calls[0]["function"]["name"] == "get_time", held["content"]
    zone_ok(fam, calls[0]["function"]["arguments"], held["content"])
