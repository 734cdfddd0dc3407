"""The conversation as llama-server puts it into a native template's jinja
context (common/chat.cpp common_chat_templates_apply_jinja and
common_chat_msg::to_json_oaicompat), so the template itself renders the
tools, the assistant's tool calls and the tool results:

* a message is ``{"role", "content"}`` (null content becomes ""), then
  ``reasoning_content``, ``name``, ``tool_call_id`` where set, then
  ``tool_calls`` as ``{"type": "function", "function": {"name",
  "arguments"}, "id"}`` (no id key when the client sent none);
* ``arguments`` stay the client's JSON string, or become the object where
  the template reads the arguments as an object (jinja caps'
  supports_object_arguments);
* ``developer`` is ``system`` for every template but gpt-oss's;
* ``tools`` are ``{"type": "function", "function": {"name", "description",
  "parameters"}}``, description "" when the client gave none.
"""
from __future__ import annotations

import functools
import json

from frontends.text.errors import ApiError, bad

_PROBE_ARGS = {"arg": "rs_probe_value"}


def _probe(tmpl, args) -> str:
    """jinja caps' tool-call probe (its ids are nine characters: Mistral's
    template refuses others)."""
    msgs = [{"role": "user", "content": "User message"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "call00001", "type": "function", "function": {"name": "rs_tool1", "arguments": args}}]},
            {"role": "tool", "content": "Tool response", "tool_call_id": "call00001"},
            {"role": "assistant", "content": "The tool response was 'tool response'"},
            {"role": "user", "content": "User message"}]
    try:
        return tmpl.render(msgs, False, {})
    except ApiError:
        return ""


@functools.lru_cache(maxsize=8)
def object_arguments(tmpl) -> bool:
    """Whether the template shows an argument read from an object."""
    return "rs_probe_value" in _probe(tmpl, _PROBE_ARGS)


@functools.lru_cache(maxsize=8)
def shows_calls(tmpl) -> bool:
    """Whether the template shows an assistant's tool call at all."""
    return "rs_tool1" in _probe(tmpl, _PROBE_ARGS) or "rs_tool1" in _probe(tmpl, json.dumps(_PROBE_ARGS))


def tools_json(tools: list[dict]) -> list[dict]:
    return [{"type": "function", "function": {"name": t["function"]["name"],
                                              "description": t["function"].get("description", ""),
                                              "parameters": t["function"]["parameters"]}} for t in tools]


def _args(v, where: str, obj: bool):
    if isinstance(v, dict):
        return v if obj else json.dumps(v, ensure_ascii=False)
    if not isinstance(v, str):
        raise bad(f"{where}: 'arguments' must be a JSON string")
    if not obj:
        return v
    try:
        return json.loads(v) if v.strip() else {}
    except ValueError:
        raise bad(f"{where}: 'arguments' is not valid JSON") from None


def messages(msgs: list[dict], tmpl, gpt_oss: bool) -> list[dict]:
    """Normalized OpenAI messages -> what the template's context gets."""
    obj = None
    out = []
    for i, m in enumerate(msgs):
        role = m["role"]
        if role == "developer" and not gpt_oss:
            role = "system"
        j: dict = {"role": role, "content": m.get("content") or ""}
        for k in ("reasoning_content", "name", "tool_call_id"):
            v = m.get(k)
            if v is not None and not isinstance(v, str):
                raise bad(f"messages[{i}]: '{k}' must be a string")
            if v:
                j[k] = v
        tcs = m.get("tool_calls") if role == "assistant" else None
        if tcs:
            if not isinstance(tcs, list):
                raise bad(f"messages[{i}]: 'tool_calls' must be an array")
            obj = object_arguments(tmpl) if obj is None else obj
            calls = []
            for k, tc in enumerate(tcs):
                where = f"messages[{i}].tool_calls[{k}]"
                if not isinstance(tc, dict) or not isinstance(tc.get("function"), dict) \
                        or not isinstance(tc["function"].get("name"), str):
                    raise bad(f"{where} must be {{\"type\": \"function\", \"function\": {{\"name\", \"arguments\"}}}}")
                c = {"type": "function", "function": {"name": tc["function"]["name"], "arguments": _args(
                    tc["function"].get("arguments", "{}"), where, obj)}}
                if tc.get("id"):
                    if not isinstance(tc["id"], str):
                        raise bad(f"{where}: 'id' must be a string")
                    c["id"] = tc["id"]
                calls.append(c)
            j["tool_calls"] = calls
        if hasattr(m, "continued"):  # text parts (chat.Parts): a continued prefill keeps llama-server's joining
            j = type(m)(j)
            j.continued = m.continued
        out.append(j)
    return out
