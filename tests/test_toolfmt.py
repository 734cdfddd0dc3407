"""Native tool-call formats without a model: detection from each vendored
llama.cpp template, and parsing, against goldens recorded from llama.cpp's
own chat code (scripts/record_toolfmt.py runs libllama-common.so, the code
llama-server parses with): the same text gives the same message
(content, reasoning_content, tool_calls), and the streamed deltas add up to
that message at every cut point."""
from __future__ import annotations

import json
import os

import pytest

from frontends.text import reasoning, tools, toolfmt
from frontends.text.chat import ChatTemplate
from frontends.text.reply import Reply
from frontends.text.toolparse import Answer

HERE = os.path.dirname(os.path.abspath(__file__))
GOLDEN = json.load(open(os.path.join(HERE, "data", "toolfmt_golden.json"), encoding="utf-8"))
TEMPLATES = os.path.expanduser("~/.cache/ringserve/llama.cpp-0.3.36/src/models/templates")

FAMILY = {  # template -> the format ringserve picks
    "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja": "Hermes 2 Pro",
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja": "Hermes 2 Pro",
    "Qwen-Qwen2.5-7B-Instruct.jinja": "Hermes 2 Pro",
    "Qwen-Qwen3-0.6B.jinja": "Hermes 2 Pro",
    "Qwen-QwQ-32B.jinja": "Hermes 2 Pro",
    "meta-llama-Llama-3.1-8B-Instruct.jinja": "Llama 3.x",
    "meta-llama-Llama-3.2-3B-Instruct.jinja": "Llama 3.x",
    "meta-llama-Llama-3.3-70B-Instruct.jinja": "Llama 3.x",
    "mistralai-Mistral-Nemo-Instruct-2407.jinja": "Mistral Nemo",
    "openai-gpt-oss-120b.jinja": "GPT-OSS",
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja": "DeepSeek R1",
    "llama-cpp-deepseek-r1.jinja": "DeepSeek R1",
    "Qwen3-Coder.jinja": "Qwen3-Coder",
}


def template(name: str) -> ChatTemplate:
    with open(os.path.join(TEMPLATES, name), encoding="utf-8") as f:
        return ChatTemplate(f.read(), "", "")


def factory(name: str):
    """The request path's answer factory for a one-user-turn request with the
    golden tools: the reasoning split (the template's markers, the generation
    prompt's opened part) before the format's parser, as Reply.of builds it."""
    tmpl = template(name)
    body = {"messages": [{"role": "user", "content": "Hey"}], "tools": GOLDEN["tools"], "parallel_tool_calls": True}
    spec, extra = tools.apply(body, tmpl)
    make = tools.answerer(spec)
    if spec.fmt is None:
        return spec, make
    closed, opened = tmpl.render(body["messages"], False, extra), tmpl.render(body["messages"], True, extra)
    think = reasoning.plan(tmpl, "auto", reasoning.generation_prompt(closed, opened))
    think = None if think.markers is None or spec.fmt.splits_thoughts else think
    return spec, lambda: Reply(think, make())


CASES = [(name, i) for name, t in GOLDEN["templates"].items() for i in range(len(t["outputs"]))
         if "error" not in t["parsed"][i]]


def expected(name: str, i: int) -> dict:
    m = dict(GOLDEN["templates"][name]["parsed"][i])
    m.setdefault("content", "")
    return m


def strip_ids(msg: dict, keep: bool) -> dict:
    out = dict(msg)
    if "tool_calls" in out:
        out["tool_calls"] = [{k: v for k, v in c.items() if keep or k != "id"} for c in out["tool_calls"]]
    return out


def test_every_vendored_template_of_a_family_is_detected() -> None:
    for name, fam in FAMILY.items():
        fmt = toolfmt.pick(template(name))
        assert fmt is not None and fmt.name == fam, name
    # a template without a tool syntax of its own keeps the generic JSON form
    for name in ("google-gemma-2-2b-it.jinja", "microsoft-Phi-3.5-mini-instruct.jinja"):
        assert toolfmt.pick(template(name)) is None, name
    spec, make = factory("microsoft-Phi-3.5-mini-instruct.jinja")
    assert spec.fmt is None and make is Answer


@pytest.mark.parametrize("name,i", CASES)
def test_parse_matches_llama_server(name: str, i: int) -> None:
    spec, make = factory(name)
    text = GOLDEN["templates"][name]["outputs"][i]
    got = make().message(text)
    keep_ids = name.startswith("mistralai")
    assert strip_ids(got, keep_ids) == strip_ids(expected(name, i), keep_ids), text


def assemble(deltas: list[dict]) -> dict:
    msg: dict = {"content": "", "reasoning_content": ""}
    calls: dict[int, dict] = {}
    for d in deltas:
        msg["content"] += d.get("content") or ""
        msg["reasoning_content"] += d.get("reasoning_content") or ""
        for tc in d.get("tool_calls", []):
            c = calls.setdefault(tc["index"], {"id": None, "name": "", "arguments": ""})
            c["id"] = tc.get("id") or c["id"]
            c["name"] += tc.get("function", {}).get("name") or ""
            c["arguments"] += tc.get("function", {}).get("arguments") or ""
    msg["calls"] = [calls[k] for k in sorted(calls)]
    return msg


@pytest.mark.parametrize("name,i", CASES)
def test_streamed_deltas_add_up_at_every_cut_point(name: str, i: int) -> None:
    _, make = factory(name)
    text = GOLDEN["templates"][name]["outputs"][i]
    whole = make().message(text)
    want = {"content": whole["content"] or "", "reasoning_content": whole.get("reasoning_content", ""),
            "calls": [{"id": c["id"], "name": c["function"]["name"], "arguments": c["function"]["arguments"]}
                      for c in whole.get("tool_calls", [])]}
    for step in (1, 2, 3, 7):  # one character at a time, then coarser cuts
        s, deltas = make(), []
        for k in range(0, len(text), step):
            deltas += s.feed(text[k:k + step])
        deltas += s.finish()
        got = assemble(deltas)
        for a, b in zip(got["calls"], want["calls"]):
            b["id"] = a["id"] if not name.startswith("mistralai") else b["id"]
        assert got == want, (step, text)


@pytest.mark.parametrize("name", sorted(n for n, t in GOLDEN["templates"].items() if t["grammar_lazy"]))
def test_auto_grammar_is_lazy_on_llama_servers_triggers(name: str) -> None:
    """tool_choice auto: a lazy grammar whose trigger patterns are llama-server's
    (a WORD trigger as common/sampling.cpp's regex_escape of it, a PATTERN verbatim)."""
    from frontends.text.toolfmt import grammar as G

    spec, _ = factory(name)
    g = G.build(spec.fmt, spec)
    assert g.startswith(G.LAZY), g[:200]
    got = json.loads(g.splitlines()[0][len(G.LAZY):])["patterns"]
    want = [G.regex_escape(t["value"]) if t["type"] == 1 else t["value"] for t in GOLDEN["templates"][name]["triggers"]]
    assert got == want


# llama-server's own rules for "text without <|end|>" and "text up to \n</parameter>\n"
# (its gpt-oss and Qwen3-Coder grammars, common/peg-parser.cpp's Aho-Corasick rules)
UNTIL_END = """until-6 ::= | [<] until-6-01 | [^<] until-6
until-6-01 ::= | [<] until-6-01 | [|] until-6-02 | [^<|] until-6
until-6-02 ::= | [<] until-6-01 | [e] until-6-03 | [^<e] until-6
until-6-03 ::= | [<] until-6-01 | [n] until-6-04 | [^<n] until-6
until-6-04 ::= | [<] until-6-01 | [d] until-6-05 | [^<d] until-6
until-6-05 ::= | [<] until-6-01 | [|] until-6-06 | [^<|] until-6
until-6-06 ::= | [<] until-6-01 | [^<>] until-6"""
UNTIL_PARAM_END = ["ac-8 ::= [\\n] ac-8-01 | [^\\n] ac-8", "ac-8-01 ::= [\\n] ac-8-01 | [<] ac-8-02 | [^\\n<] ac-8",
                   "ac-8-12 ::= [\\n] ac-8-01 | [>] ac-8-13 | [^\\n>] ac-8", "ac-8-13 ::= [\\n] | [^\\n] ac-8"]
UNTIL_CALL = ["until-168-01 ::= | [<] until-168-01 | [t] until-168-02 | [f] until-168-12 | [^<ft] until-168",
              "until-168-10 ::= | [<] until-168-01 | [^<>] until-168"]


def test_until_rules_are_llama_servers() -> None:
    from frontends.text.toolfmt.until import excluding, including

    assert "\n".join(excluding("until-6", ["<|end|>"])[1]) == UNTIL_END
    rules = including("ac-8", ["\n</parameter>\n"])[1]
    assert len(rules) == 14 and all(r in rules for r in UNTIL_PARAM_END), rules
    rules = excluding("until-168", ["<tool_call>", "<function=get_time>"])[1]
    assert all(r in rules for r in UNTIL_CALL), rules


def test_qwen3coder_grammar_types_and_orders_the_parameters() -> None:
    """A string parameter is free text up to </parameter> (an enum too, as
    llama-server's), another its schema's JSON; required ones in any order."""
    from frontends.text.toolfmt import grammar as G

    fn = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "s": {"type": "string", "enum": ["a"]}, "n": {"type": ["integer", "string"]}, "k": {"type": "integer"}},
        "required": ["s", "k"]}}}
    spec = tools.parse({"tools": [fn], "tool_choice": "required"})
    g = G.build(toolfmt.Qwen3Coder(""), spec)
    lines = g.splitlines()
    assert lines[0].startswith("root ::= ws until-call ws (tc-first)"), lines[0]
    assert 't0-arg0 ::= "<parameter=" "s" ">\\n" xml-arg-string' in lines
    assert 't0-arg1 ::= "<parameter=" "n" ">\\n" xml-arg-string' in lines
    assert 't0-arg2 ::= "<parameter=" "k" ">\\n" t0-a2-root "\\n</parameter>\\n"' in lines
    assert "t0-args-3 ::= t0-arg0 t0-args-2 | t0-arg2 t0-args-1" in lines
    assert 't0-call ::= "<function=" "f" ">\\n" t0-args-3 (t0-arg1)* "</function>\\n"' in lines


def test_undefined_joins_a_string_as_llama_cpps_jinja() -> None:
    """llama.cpp's runtime takes undefined + string as the string (firefunction
    v2 adds an undefined ``functions``; llama.cpp's test_template.py reads its date)."""
    import datetime

    assert ChatTemplate("{{ 'a' + nothing + 'b' }}{{ nothing ~ 'c' }}", "", "").render([], False) == "abc"
    with pytest.raises(Exception, match="chat template error"):
        ChatTemplate("{{ nothing + 1 }}", "", "").render([], False)
    out = template("fireworks-ai-llama-3-firefunction-v2.jinja").render([{"role": "user", "content": "Hi"}], True)
    assert datetime.date.today().strftime("%b %d %Y") in out


def test_jinja_as_llama_cpps() -> None:
    """Where jinja2 and llama.cpp's runtime part, the prompt is llama-server's
    (its /apply-template text, recorded through scripts/chat_oracle.cpp):
    ``{% generation %}`` blocks render their body (LFM2.5, Laguna), ``|safe``
    escapes nothing (functionary v3.1's tool list), and a template without a
    system role (Gemma 2) gets the system text before the first user turn."""
    g = ChatTemplate("{% generation %}A{{ 1 }}{% endgeneration %}B", "", "").render([], False)
    assert g == "A1B"
    assert ChatTemplate("""{{ "x"|safe + '"q" <b>' }}""", "", "").render([], False) == 'x"q" <b>'
    gemma2 = template("google-gemma-2-2b-it.jinja")
    assert not gemma2.supports_system and template("Qwen-Qwen3-0.6B.jinja").supports_system
    out = gemma2.render([{"role": "system", "content": "S"}, {"role": "user", "content": "Hi"}], True)
    assert out == "<start_of_turn>user\nS\nHi<end_of_turn>\n<start_of_turn>model\n"


def test_a_call_ends_qwen35s_thoughts() -> None:
    """Qwen 3.5 (the Qwen3-Coder XML family with <think>): a call may end the
    thoughts without </think>; llama-server's parse of this output."""
    _, make = factory("Qwen3.5-4B.jinja")
    text = "hm\n<tool_call>\n<function=python>\n<parameter=code>\nx\n</parameter>\n</function>\n</tool_call>"
    got = strip_ids(make().message(text), False)
    assert got == {"role": "assistant", "content": "", "reasoning_content": "hm\n", "tool_calls": [
        {"type": "function", "function": {"name": "python", "arguments": '{"code":"x"}'}}]}, got
