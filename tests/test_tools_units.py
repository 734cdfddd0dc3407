"""Tool calling and enforced JSON schemas without a model: request
validation (400s in llama-server's shape), the schema checker's verdicts,
the generic answer's parser (streamed deltas add up to the whole message)
and the prompt rendering through a template without and with tool syntax.
The real model's side is tests/test_tools_real.py."""
from __future__ import annotations

import json

import pytest
from llama_cpp.llama_grammar import json_schema_to_gbnf

from frontends.text import tools
from frontends.text.toolparse import Answer
from frontends.text.chat import ChatTemplate
from frontends.text.errors import ApiError
from frontends.text.schemas import enforceable
from frontends.testing import TestClient, sse_events

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}

# What json_schema_to_gbnf would drop silently (the grammar would not enforce it): 400.
UNENFORCEABLE = [
    {"type": "integer", "minimum": 0},
    {"type": "number", "exclusiveMaximum": 1},
    {"type": "number", "multipleOf": 2},
    {"not": {"type": "string"}},
    {"if": {"type": "string"}, "then": {"maxLength": 2}},
    {"type": "object", "patternProperties": {"^a": {}}},
    {"type": "object", "propertyNames": {"maxLength": 3}},
    {"type": "object", "dependentSchemas": {"a": {}}},
    {"type": "object", "dependentRequired": {"a": ["b"]}},
    {"type": "object", "minProperties": 1},
    {"type": "object", "unevaluatedProperties": False},
    {"type": "object", "properties": {"a": {}}, "required": ["b"]},
    {"type": "object", "required": ["a"]},
    {"type": "array", "items": {}, "uniqueItems": True},
    {"type": "array", "items": {}, "contains": {"type": "string"}},
    {"type": "array", "prefixItems": [{}], "items": {"type": "string"}},
    {"type": "string", "format": "email"},
    {"type": "string", "pattern": "abc"},  # unanchored: JSON Schema searches, the converter would match whole
    {"type": "string", "pattern": "^(?!x).*$"},
    {"type": "string", "pattern": "^a+$", "maxLength": 3},
    {"type": "string", "format": "date", "minLength": 3},
    {"oneOf": [{"type": "integer"}, {"type": "number"}]},
    {"oneOf": [{"enum": [1, 2]}, {"const": 2}]},
    {"anyOf": [{"type": "string"}], "minLength": 3},
    {"$ref": "#/$defs/A", "maxLength": 3, "$defs": {"A": {"type": "string"}}},
    {"$ref": "https://example.com/schema.json"},
    {"$ref": "#/$defs/missing"},
    {"type": "strin"},
    {"enum": ["a", 1], "type": "string"},
    {"maxLength": 3},
    [1],
]
ENFORCEABLE = [
    {},
    True,
    {"type": "object", "properties": {"a": {"type": "string", "maxLength": 4}, "b": {"type": "integer"}},
     "required": ["a"]},
    {"type": ["string", "null"], "maxLength": 5},
    {"oneOf": [{"type": "string"}, {"type": "integer"}]},
    {"$ref": "#/$defs/A", "$defs": {"A": {"type": "object", "properties": {"x": {"type": "boolean"}}}}},
    {"allOf": [{"$ref": "#/definitions/B"}], "definitions": {"B": {"type": "string"}}},
    {"type": "array", "minItems": 1},
    {"type": "array", "items": {"type": "integer"}, "maxItems": 3, "description": "annotations are fine"},
    {"type": "string", "format": "date-time"},
    {"type": "string", "pattern": "^[a-z]{2,4}$"},
    {"enum": ["a", 1, None]},
    {"type": "object", "additionalProperties": {"type": "integer"}},
]


@pytest.mark.parametrize("schema", UNENFORCEABLE, ids=lambda s: json.dumps(s)[:60])
def test_unenforceable_schema_is_400(schema) -> None:
    with pytest.raises(ApiError) as e:
        enforceable(schema)
    assert e.value.code == 400 and e.value.type == "invalid_request_error"


@pytest.mark.parametrize("schema", ENFORCEABLE, ids=lambda s: json.dumps(s)[:60])
def test_enforceable_schema_converts(schema) -> None:
    assert "root ::=" in json_schema_to_gbnf(json.dumps(enforceable(schema)))


def test_type_list_with_constraints_becomes_anyof() -> None:
    """The converter drops maxLength beside a type list; the rewrite keeps it."""
    s = enforceable({"type": ["string", "null"], "maxLength": 2})
    assert s == {"anyOf": [{"maxLength": 2, "type": "string"}, {"type": "null"}]}
    g = json_schema_to_gbnf(json.dumps(s))
    assert "char char?" in g.replace("(", "").replace(")", "") or "{0,2}" in g or "char? char?" in g


# ------------------------------------------------------------------ request
@pytest.mark.parametrize("body", [
    {"tools": {}},
    {"tools": [3]},
    {"tools": [{"type": "retrieval"}]},
    {"tools": [{"type": "function", "function": {"name": "has space"}}]},
    {"tools": [{"type": "function", "function": {}}]},
    {"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]},
    {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "integer", "minimum": 1}}}]},
    {"tools": [WEATHER, WEATHER]},
    {"tools": [WEATHER], "tool_choice": "sometimes"},
    {"tools": [WEATHER], "tool_choice": 3},
    {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
    {"tool_choice": "required"},
    {"tools": [WEATHER], "parallel_tool_calls": "yes"},
], ids=lambda b: json.dumps(b)[:70])
def test_bad_tools_are_400(body) -> None:
    with pytest.raises(ApiError) as e:
        tools.parse(body)
    assert e.value.code == 400


def test_tool_choice_forms() -> None:
    assert tools.parse({}) is None and tools.parse({"tools": []}) is None
    assert tools.parse({"tools": [WEATHER], "tool_choice": "none"}) is None
    auto = tools.parse({"tools": [WEATHER, TIME]})
    assert not auto.required and not auto.parallel and len(auto.tools) == 2
    one = tools.parse({"tools": [WEATHER, TIME], "tool_choice": {"type": "function", "function": {"name": "get_time"}},
                       "parallel_tool_calls": True})
    assert one.required and one.parallel and [t["function"]["name"] for t in one.tools] == ["get_time"]


def test_schema_forms() -> None:
    """llama-server's generic schema: tool_call / tool_calls, response unless required."""
    s = tools.schema(tools.parse({"tools": [WEATHER]}))
    assert [set(a["properties"]) for a in s["anyOf"]] == [{"tool_call"}, {"response"}]
    s = tools.schema(tools.parse({"tools": [WEATHER, TIME], "tool_choice": "required", "parallel_tool_calls": True}))
    assert set(s["properties"]) == {"tool_calls"} and len(s["properties"]["tool_calls"]["items"]["anyOf"]) == 2
    # a tool's local references survive being nested (re-rooted under $defs)
    ref = {"type": "function", "function": {"name": "r", "parameters": {
        "type": "object", "properties": {"a": {"$ref": "#/$defs/A"}}, "$defs": {"A": {"type": "integer"}}}}}
    g = tools.grammar(tools.parse({"tools": [ref], "tool_choice": "required"}))
    assert "integer" in g


# ------------------------------------------------------------------ answer
CALLS = ('{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Pa\\u00e9ris \\"x\\"", "n": 12}}, '
         '{"name": "get_time", "arguments": {}}]}')


def assemble(deltas: list[dict]) -> tuple[str, dict[int, dict]]:
    """What the openai client does with streamed deltas."""
    content, calls = "", {}
    for d in deltas:
        content += d.get("content") or ""
        for tc in d.get("tool_calls", []):
            c = calls.setdefault(tc["index"], {"id": None, "name": "", "arguments": ""})
            c["id"] = tc.get("id") or c["id"]
            c["name"] += tc.get("function", {}).get("name") or ""
            c["arguments"] += tc.get("function", {}).get("arguments") or ""
    return content, calls


@pytest.mark.parametrize("text", [CALLS, '{"tool_call": {"name": "f", "arguments": {"a": [1, {"b": "}"}]}}}',
                                  '{"response": "Hello \\ud83d\\ude00 \\\\ there"}', '{ "response" : {"a": 1} }',
                                  '{"tool_call": {"name": "x", "arguments": {"a": 1', '{"respo', "",
                                  # a lone high surrogate: the scanner skipped 12 characters for its pair
                                  '{"response": "x\\ud800y"}', '{"tool_call": {"name": "f\\ud800", "arguments": {}}}'])
def test_streamed_deltas_add_up_to_the_message(text: str) -> None:
    whole = Answer().message(text)
    a, deltas = Answer(), []
    for ch in text:  # one character at a time: every cut point
        deltas += a.feed(ch)
    deltas += a.finish()
    content, calls = assemble(deltas)
    assert content == (whole["content"] or "")
    got = [{"name": c["name"], "arguments": c["arguments"]} for _, c in sorted(calls.items())]
    assert got == [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
                   for c in whole.get("tool_calls", [])]
    assert all(c["id"].startswith("call_") for c in calls.values())


ECHO = ("{%- for m in messages -%}{%- if loop.last -%}{{ m.content }}{%- endif -%}{%- endfor -%}")


@pytest.mark.parametrize("stream", [False, True])
def test_a_lone_surrogate_in_the_models_json_is_a_replacement_character(stream: bool) -> None:
    """A model may write "\\ud800" alone in its JSON: the decoded text holds
    a lone surrogate, which UTF-8 cannot carry; it goes out as U+FFFD (a 500
    from the JSON encoder before, and the rest of the answer lost)."""
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]
    with TestClient("--chat-template", ECHO) as c:
        body = {"messages": [{"role": "user", "content": '{"response": "x\\ud800y"}'}], "n_predict": -1,
                "tools": tools, "stream": stream}
        r = c.simulate_post("/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        if stream:
            ev = [e for e in sse_events(r.content) if e != "[DONE]"]
            assert not any("error" in e for e in ev), ev
            text = "".join(e["choices"][0]["delta"].get("content") or "" for e in ev if e["choices"])
        else:
            text = r.json["choices"][0]["message"]["content"]
        assert text == "x\ufffdy", text


def test_message_shapes() -> None:
    m = Answer().message(CALLS)
    assert m["content"] is None and [c["function"]["name"] for c in m["tool_calls"]] == ["get_weather", "get_time"]
    assert json.loads(m["tool_calls"][0]["function"]["arguments"]) == {"city": 'Paéris "x"', "n": 12}
    assert len({c["id"] for c in m["tool_calls"]}) == 2
    assert Answer().message('{"response": "hi"}') == {"role": "assistant", "content": "hi"}
    assert Answer().message('{"respo') == {"role": "assistant", "content": '{"respo'}  # cut: raw text


# ------------------------------------------------------------------ prompt
GEMMA = ChatTemplate.pick("", "", "<bos>", "<eos>", "gemma3")  # the default model's: its GGUF has none
NATIVE = ChatTemplate(  # a template with its own tool syntax (Hermes-like)
    "{% if tools %}<tools>{{ tools | tojson }}</tools>\n{% endif %}"
    "{% for m in messages %}<{{ m.role }}>{{ m.content }}"
    "{% for tc in m.tool_calls or [] %}<tool_call>{{ tc.function | tojson }}</tool_call>{% endfor %}"
    "{% if m.role == 'tool' %}[{{ m.tool_call_id }}]{% endif %}\n{% endfor %}", "<bos>", "<eos>")
HISTORY = [
    {"role": "user", "content": "Weather in Paris and the time?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
        {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "22 C"},
    {"role": "tool", "tool_call_id": "call_2", "content": "noon"},
]


def render(tmpl: ChatTemplate, body: dict) -> str:
    from frontends.text.chat import normalize

    msgs, extra = tools.prepare(normalize(body["messages"]), tools.parse(body), tmpl)
    return tmpl.render(msgs, True, extra)


def test_polyfilled_history_on_a_template_without_tool_syntax() -> None:
    assert tools.caps(GEMMA) == tools.Caps(False, False, False)
    text = render(GEMMA, {"messages": HISTORY, "tools": [WEATHER, TIME]})
    assert tools.NOTE in text and tools.INTRO in text and '"get_weather"' in text  # the tools, in the system note
    # roles still alternate (Gemma's template raises otherwise): both results are one user turn
    assert text.count("<start_of_turn>user") == 2 and text.count("<start_of_turn>model") == 2
    assert '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}' in text
    assert '{"tool_response": {"tool": "get_weather", "content": "22 C", "tool_call_id": "call_1"}}' in text
    # history alone (no tools in this request): rendered, no note
    assert tools.NOTE not in render(GEMMA, {"messages": HISTORY})


def test_native_template_gets_tools_in_its_context() -> None:
    assert tools.caps(NATIVE) == tools.Caps(True, True, True)
    text = render(NATIVE, {"messages": HISTORY, "tools": [WEATHER]})
    assert text.startswith("<tools>[{") and tools.INTRO not in text and tools.NOTE in text
    assert '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>' in text
    assert "<tool>22 C[call_1]" in text


@pytest.mark.parametrize("msgs", [
    [{"role": "assistant", "content": None, "tool_calls": {}}],
    [{"role": "assistant", "content": None, "tool_calls": [{"type": "function", "function": {"name": "f",
                                                                                               "arguments": "{x"}}]}],
    [{"role": "assistant", "content": None, "tool_calls": [{"type": "function"}]}],
    [{"role": "tool", "tool_call_id": 5, "content": "x"}],
])
def test_bad_history_is_400(msgs) -> None:
    with pytest.raises(ApiError) as e:
        render(GEMMA, {"messages": [{"role": "user", "content": "hi"}, *msgs]})
    assert e.value.code == 400


# ------------------------------------------------------------------ HTTP (fake engine)
@pytest.fixture(scope="module")
def srv():
    with TestClient("-a", "fake-model") as c:
        yield c


def test_http_400s_in_llama_server_shape(srv) -> None:
    base = {"messages": [{"role": "user", "content": "hi"}]}
    for extra in ({"tools": [{"type": "retrieval"}]}, {"tools": [WEATHER], "tool_choice": "sometimes"},
                  {"tools": [WEATHER], "grammar": "root ::= \"a\""},
                  {"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "integer",
                                                                                         "maximum": 3}}}},
                  {"tools": [WEATHER], "response_format": {"type": "json_object", "schema": {"not": {}}}}):
        r = srv.simulate_post("/v1/chat/completions", json={**base, **extra})
        assert r.status_code == 400, (extra, r.text)
        err = r.json["error"]
        assert err["code"] == 400 and err["type"] == "invalid_request_error" and err["message"], extra
    r = srv.simulate_post("/completion", json={"prompt": "x", "json_schema": {"type": "string", "format": "email"}})
    assert r.status_code == 400 and "format" in r.json["error"]["message"]
    # and the next request is served
    r = srv.simulate_post("/v1/chat/completions", json={**base, "tools": [WEATHER], "max_tokens": 2})
    assert r.status_code == 200 and r.json["choices"][0]["message"]["role"] == "assistant"
    assert "tool_calls" not in r.json["choices"][0]["message"]  # the fake engine echoes: no JSON answer
    # /apply-template shows the prompt a tool request gets
    r = srv.simulate_post("/apply-template", json={"messages": HISTORY, "tools": [WEATHER, TIME]})
    assert r.status_code == 200 and tools.NOTE in r.json["prompt"] and '"tool_response"' in r.json["prompt"]


def test_openapi_describes_tool_requests() -> None:
    """A tool request and a structured-output request validate against the
    chat schema /openapi.json publishes (a wrong tool_choice does not)."""
    import jsonschema

    from frontends.api.openapi import spec

    chat = spec()["paths"]["/v1/chat/completions"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    msgs = [{**m, "content": m["content"] or ""} for m in HISTORY]  # OpenAPI 3.0's nullable is not JSON Schema
    body = {"messages": msgs, "tools": [WEATHER, TIME], "tool_choice": {"type": "function", "function": {
        "name": "get_time"}}, "parallel_tool_calls": True,
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}}
    jsonschema.validate(body, chat)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**body, "tool_choice": "sometimes"}, chat)
