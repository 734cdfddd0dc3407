"""Tool calling for /v1/chat/completions in llama-server's generic JSON form.

What llama-server (common/chat.cpp, ``common_chat_params_init_generic``)
does for a chat template without a tool-call syntax of its own: a system
note describes the tools and asks for JSON; a grammar built from a schema
forces the answer to be one of

    {"tool_call": {"name": ..., "arguments": {...}}}      (parallel_tool_calls false)
    {"tool_calls": [{"name": ..., "arguments": {...}}]}   (parallel_tool_calls true)
    {"response": "..."}                                   (unless tool_choice is required)

and the answer is parsed back into OpenAI's ``tool_calls``
(frontends/text/toolparse.py). Because the
grammar holds the model to that form, even the tiny default model answers
with parseable calls whose arguments validate against each tool's
``parameters`` (frontends/text/schemas.py refuses parameters it cannot enforce).

Differences from llama-server, chosen here: call ids are made by the server
(``call_`` + 24 characters, as OpenAI's), not written by the model (a 270M
model writes poor ids and it costs tokens); ``tool_choice`` may name a
function (OpenAI's object form), which narrows the grammar to that tool.

The history is rendered through the model's own template with ``tools`` in
the jinja context (as llama-server and HF transformers pass it). What the
template cannot show is polyfilled as minja does: the tool list goes into
the system note, an assistant message's ``tool_calls`` become the JSON the
model is asked to write, a ``tool`` message becomes a user turn holding
``{"tool_response": ...}``. Which of these a template shows is probed once
per template (``caps``) by rendering marker names and looking for them.
"""
from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass

from ipc.params import BY_NAME

from .errors import ApiError, bad
from .fields import get_bool
from .schemas import enforceable
from . import toolfmt
from .toolfmt import grammar as _g, history as _h  # noqa: F401 -- toolfmt.grammar, toolfmt.history

NOTE = ("Respond in JSON format, either with `tool_call` (a request to call tools) or with `response` "
        "reply to the user's request")
INTRO = "You can call any of the following tools to satisfy the user's requests: "
NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
CHOICES = ("none", "auto", "required")
@dataclass
class ToolSpec:
    """One request's validated tool settings (None from ``parse`` when the
    model may not call tools)."""

    tools: list[dict]  # OpenAI tool objects shown to the model (those it may call)
    required: bool  # tool_choice required or a named function: no "response" branch
    parallel: bool  # parallel_tool_calls: the {"tool_calls": [...]} form
    response: dict | None = None  # response_format's schema for the "response" branch
    fmt: object = None  # the template's native format (frontends/text/toolfmt), None: the generic form


# ------------------------------------------------------------------ request
def _tool(i: int, t) -> dict:
    where = f"tools[{i}]"
    if not isinstance(t, dict):
        raise bad(f"{where} must be an object")
    if t.get("type", "function") != "function":
        raise bad(f"{where}: unsupported tool type {t.get('type')!r} (only 'function')")
    f = t.get("function")
    if not isinstance(f, dict):
        raise bad(f"{where}: 'function' must be an object")
    name = f.get("name")
    if not isinstance(name, str) or not NAME.match(name):
        raise bad(f"{where}.function.name must be 1 to 64 letters, digits, '_', '.' or '-'")
    desc = f.get("description")
    if desc is not None and not isinstance(desc, str):
        raise bad(f"{where}.function.description must be a string")
    params = f.get("parameters")
    if params is None:
        params = {"type": "object", "properties": {}}
    if not isinstance(params, dict):
        raise bad(f"{where}.function.parameters must be an object")
    try:
        enforceable(params)
    except ApiError as e:
        raise bad(f"{where}.function.parameters: {e.message}") from None
    fn = {"name": name, **({"description": desc} if desc else {}), "parameters": params}
    return {"type": "function", "function": fn}


def parse(body: dict) -> ToolSpec | None:
    """Validate ``tools``, ``tool_choice`` and ``parallel_tool_calls`` (400s
    in llama-server's shape); None when no tool may be called."""
    raw, choice = body.get("tools"), body.get("tool_choice")
    par = get_bool(body, "parallel_tool_calls", BY_NAME["parallel_tool_calls"].default)
    if raw is not None and not isinstance(raw, list):
        raise bad("Field 'tools': expected an array")
    tools = [_tool(i, t) for i, t in enumerate(raw or [])]
    names = [t["function"]["name"] for t in tools]
    if len(set(names)) != len(names):
        raise bad("tools: function names must be unique")
    if choice is None:
        choice = "auto"
    if isinstance(choice, str):
        if choice not in CHOICES:
            raise bad(f"Field 'tool_choice': must be one of {', '.join(CHOICES)} or a function, got {choice!r}")
        if choice == "required" and not tools:
            raise bad("tool_choice 'required' needs 'tools'")
        if choice == "none" or not tools:
            return None
        return ToolSpec(tools, choice == "required", par)
    if not isinstance(choice, dict) or choice.get("type", "function") != "function" \
            or not isinstance(choice.get("function"), dict):
        raise bad("Field 'tool_choice': expected a string or {\"type\": \"function\", \"function\": {\"name\": ...}}")
    name = choice["function"].get("name")
    if name not in names:
        raise bad(f"tool_choice names a function not in 'tools': {name!r}")
    return ToolSpec([tools[names.index(name)]], True, par)


def take_response_format(body: dict, spec: ToolSpec) -> None:
    """With tools, response_format shapes the "response" branch instead of
    the whole answer (consumed from ``body``)."""
    rf = body.pop("response_format", None)
    if rf is None or not isinstance(rf, dict) or rf.get("type", "text") == "text":
        if rf is not None and not isinstance(rf, dict):
            raise bad("Field 'response_format': expected an object")
        return
    if rf["type"] == "json_object":
        spec.response = rf.get("schema") if rf.get("schema") is not None else {"type": "object"}
    elif rf["type"] == "json_schema":
        js = rf.get("json_schema")
        spec.response = js.get("schema") if isinstance(js, dict) else None
        if spec.response is None:
            raise bad("response_format json_schema needs 'json_schema.schema'")
    else:
        raise bad(f"response_format type must be one of text, json_object, json_schema; got {rf['type']!r}")
    spec.response = enforceable(spec.response)


def apply(body: dict, tmpl, jinja: bool = True) -> tuple[ToolSpec | None, dict]:
    """The chat endpoint's one hook: validate the tool fields, set the
    tools' grammar in ``body`` (response_format then shapes its "response"
    branch), and rewrite ``body["messages"]`` into what the template can
    render (normalized, tool calls and results polyfilled, the system note
    added). Returns the spec (None: no tool calls) and the jinja context
    additions (``tools``) for the render. ``jinja`` False (--no-jinja):
    tools and a tool_choice other than "auto" are refused as llama-server's
    oaicompat_chat_params_parse refuses them there (a runtime_error: 500)."""
    if not jinja:
        tools, choice = body.get("tools"), body.get("tool_choice", "auto")
        if isinstance(tools, list) and tools:
            raise ApiError(500, "tools param requires --jinja flag")
        if isinstance(choice, str) and choice != "auto":
            raise ApiError(500, "tool_choice param requires --jinja flag")
    from .chat import normalize

    spec = parse(body)
    fmt = toolfmt.pick(tmpl) if hasattr(tmpl, "tmpl") else None  # a built-in (C++) template has no tool syntax
    if fmt is not None:  # the template's own syntax: it renders the history, the model writes freely
        if spec is not None:
            if body.get("grammar") or body.get("json_schema") is not None:
                raise bad("Cannot use custom grammar constraints with tools.")
            spec.fmt = fmt
            body["grammar"] = toolfmt.grammar.build(fmt, spec)
        if body.get("messages") is None:
            return spec, {}
        msgs = toolfmt.history.messages(normalize(body["messages"]), tmpl, isinstance(fmt, toolfmt.GptOss))
        body["messages"] = msgs
        return spec, ({"tools": toolfmt.history.tools_json(spec.tools)} if spec is not None else {})
    if spec is not None:
        take_response_format(body, spec)
        if body.get("grammar") or body.get("json_schema") is not None:
            raise bad("'tools' cannot be combined with 'grammar' or 'json_schema'")
        body["grammar"] = grammar(spec)
    if body.get("messages") is None:
        return spec, {}
    body["messages"], extra = prepare(normalize(body["messages"]), spec, tmpl)
    return spec, extra


# ------------------------------------------------------------------ grammar
def _hoist(i: int, params: dict, defs: dict) -> dict:
    """A tool's parameters with its ``#/`` references re-rooted: inside the
    combined schema they point to ``#/$defs/t<i>`` (its own copy)."""
    key = f"t{i}"

    def fix(n):
        if isinstance(n, dict):
            return {k: (f"#/$defs/{key}/" + v[2:] if k == "$ref" and isinstance(v, str) and v.startswith("#/")
                        else fix(v)) for k, v in n.items()}
        if isinstance(n, list):
            return [fix(x) for x in n]
        return n

    if "$ref" not in json.dumps(params):
        return params
    defs[key] = fix(params)
    return {"$ref": f"#/$defs/{key}"}


def schema(spec: ToolSpec) -> dict:
    """The JSON schema the answer must match (llama-server's generic one,
    without model-written ids)."""
    defs: dict = {}
    calls = []
    for i, t in enumerate(spec.tools):
        f = t["function"]
        args = _hoist(i, enforceable(f["parameters"]), defs)
        calls.append({"type": "object", "properties": {"name": {"const": f["name"]}, "arguments": args},
                      "required": ["name", "arguments"]})
    one = calls[0] if len(calls) == 1 else {"anyOf": calls}
    if spec.parallel:
        call = {"type": "object", "properties": {"tool_calls": {"type": "array", "items": one, "minItems": 1}},
                "required": ["tool_calls"]}
    else:
        call = {"type": "object", "properties": {"tool_call": one}, "required": ["tool_call"]}
    out = call
    if not spec.required:
        resp = {"type": "object", "properties": {"response": spec.response or {"type": "string"}},
                "required": ["response"]}
        out = {"anyOf": [call, resp]}
    return {**out, "$defs": defs} if defs else out


def grammar(spec: ToolSpec) -> str:
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    try:
        return json_schema_to_gbnf(json.dumps(schema(spec)))
    except Exception as e:  # noqa: BLE001 -- the converter raises assorted types
        raise bad(f"failed to convert the tools to a grammar: {e}") from None


# ------------------------------------------------------------------ prompt
@dataclass(frozen=True)
class Caps:
    """What a chat template shows by itself (minja's capability probes)."""

    tools: bool
    tool_calls: bool
    tool_role: bool


_PROBE_TOOL = {"type": "function", "function": {"name": "rs_probe_tool", "description": "probe",
                                                 "parameters": {"type": "object", "properties": {}}}}


@functools.lru_cache(maxsize=8)
def caps(tmpl) -> Caps:
    def shows(marker: str, msgs: list[dict], extra: dict | None = None) -> bool:
        try:
            return marker in tmpl.render(msgs, False, extra or {})
        except ApiError:
            return False

    user = {"role": "user", "content": "hi"}
    call = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "rs_probe_call", "arguments": {"a": 1}}}]}
    return Caps(tools=shows("rs_probe_tool", [user], {"tools": [_PROBE_TOOL]}),
                tool_calls=shows("rs_probe_call", [user, call]),
                tool_role=shows("rs_probe_result", [user, call, {"role": "tool", "tool_call_id": "call_1",
                                                                  "content": "rs_probe_result"}]))


def _args(v, where: str):
    """History arguments (OpenAI sends a JSON string) as a JSON value."""
    if isinstance(v, str):
        try:
            return json.loads(v) if v.strip() else {}
        except ValueError:
            raise bad(f"{where}: 'arguments' is not valid JSON") from None
    if isinstance(v, dict):
        return v
    raise bad(f"{where}: 'arguments' must be a JSON string")


def _calls(i: int, m: dict) -> list[dict]:
    tcs = m.get("tool_calls")
    if not isinstance(tcs, list):
        raise bad(f"messages[{i}]: 'tool_calls' must be an array")
    out = []
    for k, tc in enumerate(tcs):
        where = f"messages[{i}].tool_calls[{k}]"
        if not isinstance(tc, dict) or tc.get("type", "function") != "function" \
                or not isinstance(tc.get("function"), dict) or not isinstance(tc["function"].get("name"), str):
            raise bad(f"{where} must be {{\"type\": \"function\", \"function\": {{\"name\", \"arguments\"}}}}")
        tid = tc.get("id")
        if tid is not None and not isinstance(tid, str):
            raise bad(f"{where}: 'id' must be a string")
        out.append({"id": tid or "", "name": tc["function"]["name"],
                    "arguments": _args(tc["function"].get("arguments", "{}"), where)})
    return out


def prepare(msgs: list[dict], spec: ToolSpec | None, tmpl) -> tuple[list[dict], dict]:
    """Normalized messages -> (messages for the template, jinja context
    additions). Validates tool calls and results in the history."""
    cap: Caps | None = None
    out: list[dict] = []
    names: dict[str, str] = {}  # tool_call_id -> function name, for tool results
    for i, m in enumerate(msgs):
        role = m["role"]
        calls = _calls(i, m) if role == "assistant" and m.get("tool_calls") is not None else []
        if calls:
            cap = cap or caps(tmpl)
            names.update((c["id"], c["name"]) for c in calls if c["id"])
            if cap.tool_calls:
                out.append({**m, "tool_calls": [{"id": c["id"], "type": "function", "function": {
                    "name": c["name"], "arguments": c["arguments"]}} for c in calls]})
                continue
            body: dict = ({"tool_call": {"name": calls[0]["name"], "arguments": calls[0]["arguments"]}}
                          if len(calls) == 1 else
                          {"tool_calls": [{"name": c["name"], "arguments": c["arguments"]} for c in calls]})
            if m["content"]:
                body["content"] = m["content"]
            out.append({"role": "assistant", "content": json.dumps(body, ensure_ascii=False)})
        elif role == "tool":
            cap = cap or caps(tmpl)
            tid = m.get("tool_call_id")
            if tid is not None and not isinstance(tid, str):
                raise bad(f"messages[{i}]: 'tool_call_id' must be a string")
            if cap.tool_role:
                out.append(m)
                continue
            res = {"tool": m.get("name") or names.get(tid or "", ""), "content": m["content"]}
            if tid:
                res["tool_call_id"] = tid
            text = json.dumps({"tool_response": res}, ensure_ascii=False)
            if out and out[-1].get("_tool_results"):  # parallel results: one user turn
                out[-1]["content"] += "\n" + text
            else:
                out.append({"role": "user", "content": text, "_tool_results": True})
        else:
            out.append({k: v for k, v in m.items() if k != "tool_calls"} if "tool_calls" in m else m)
    for m in out:
        m.pop("_tool_results", None)
    extra: dict = {}
    if spec is not None:
        cap = cap or caps(tmpl)
        extra["tools"] = spec.tools
        note = ("" if cap.tools else INTRO + json.dumps(spec.tools, indent=2, ensure_ascii=False) + "\n\n") + NOTE
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": out[0]["content"] + "\n\n" + note}
        else:
            out.insert(0, {"role": "system", "content": note})
    return out, extra


def answerer(spec: ToolSpec):
    """The request's answer parser factory: the generic form's Answer, or
    the native format's Stream (it reads the answer after the reasoning
    split, frontends/text/reply.py)."""
    import copy

    from .toolparse import Answer

    fmt = spec.fmt
    if fmt is None:
        return Answer
    fmt = copy.copy(fmt)
    if hasattr(fmt, "set_tools"):  # a format that reads the request's tools (their names, their types)
        fmt.set_tools(spec.tools)
    return lambda: toolfmt.Stream(fmt)
