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

from frontends.text import tools, toolfmt
from frontends.text.chat import ChatTemplate
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
    """The request path's parser factory for a one-user-turn request with the golden tools."""
    tmpl = template(name)
    body = {"messages": [{"role": "user", "content": "Hey"}], "tools": GOLDEN["tools"], "parallel_tool_calls": True}
    spec, extra = tools.apply(body, tmpl)
    prompt = tmpl.render(body["messages"], True, extra)
    return spec, tools.answerer(spec, prompt, body)


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
