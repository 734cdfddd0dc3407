"""Tool calls and enforced JSON schemas with the real default model (gemma-3
270M base): through the official openai client, streamed and not; tool
results in the history; 4 JSON-schema answers out of 4 valid beside 8
other streams; bad tools, schemas and grammars answered 400 while the
engine (same pid) and the other requests carry on.

Why the real model: the point is that the grammar holds even a tiny base
model to parseable calls and schema-valid JSON. The parsing and rendering
edge cases are in tests/test_tools_units.py.
"""
from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator

import jsonschema
import pytest
import requests

from frontends import testing as S

# sampled JSON answers checked against the schema beside 8 streams: one round of 4 at once (each answer takes
# the same grammar path; a second round only doubled the suite's time)
N_JSON = 4
FLAGS = ("-c", "4096", "-np", "12", "-t", "2", "-w", "2", "--threads-http", "32")
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "enum": ["Paris", "London", "Tokyo"]},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city", "unit"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The local time in a time zone",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 24}},
                   "required": ["zone"]}}}
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME)}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 20},
    "age": {"type": "integer"},
    "student": {"type": "boolean"},
    "colors": {"type": "array", "items": {"type": "string", "enum": ["red", "green", "blue"]}, "maxItems": 3},
    "pet": {"anyOf": [{"type": "null"}, {"type": "object", "properties": {
        "kind": {"type": "string", "enum": ["cat", "dog"]}, "legs": {"type": "integer"}}, "required": ["kind"]}]}},
    "required": ["name", "age", "student", "colors", "pet"], "additionalProperties": False}


@pytest.fixture(scope="module")
def srv() -> Iterator[S.Server]:
    s = S.Server(*FLAGS)
    yield s  # pytest runs the rest whatever the tests did
    assert s.finish() == (0, []), "the server did not stop cleanly"


@pytest.fixture(scope="module")
def client(srv: S.Server):
    import openai

    return openai.OpenAI(base_url=srv.url("/v1"), api_key="anything", max_retries=0, timeout=120)


def valid_call(name: str, arguments: str) -> dict:
    args = json.loads(arguments)
    jsonschema.validate(args, PARAMS[name])
    return args


def streamed_calls(chunks) -> tuple[dict[int, dict], list]:
    """The tool calls the deltas add up to (what the client's helpers do),
    checking OpenAI's streaming shape on the way."""
    calls: dict[int, dict] = {}
    finish = []
    for ch in chunks:
        if not ch.choices:
            continue
        c = ch.choices[0]
        if c.finish_reason:
            finish.append(c.finish_reason)
        for tc in c.delta.tool_calls or []:
            if tc.index not in calls:  # the first delta of a call names it
                assert tc.id and tc.id.startswith("call_") and tc.type == "function" and tc.function.name
                calls[tc.index] = {"id": tc.id, "name": tc.function.name, "arguments": ""}
            else:
                assert tc.id is None and not tc.function.name
            calls[tc.index]["arguments"] += tc.function.arguments or ""
    return calls, finish


def test_tool_call_through_the_openai_client(client, srv: S.Server) -> None:
    """tool_choice required: a call, whole and streamed (the same greedy
    answer), arguments valid against the tool's parameters."""
    r = client.chat.completions.create(model="m", messages=ASK, tools=[WEATHER, TIME], tool_choice="required",
                                       max_tokens=64, temperature=0)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls" and c.message.content is None and len(c.message.tool_calls) == 1
    tc = c.message.tool_calls[0]
    assert tc.type == "function" and tc.id.startswith("call_") and tc.function.name in PARAMS
    args = valid_call(tc.function.name, tc.function.arguments)
    chunks = list(client.chat.completions.create(model="m", messages=ASK, tools=[WEATHER, TIME],
                                                 tool_choice="required", max_tokens=64, temperature=0, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant" and len({ch.id for ch in chunks}) == 1
    calls, finish = streamed_calls(chunks)
    assert finish == ["tool_calls"] and list(calls) == [0]
    assert calls[0]["name"] == tc.function.name and valid_call(calls[0]["name"], calls[0]["arguments"]) == args
    assert sum(len(ch.choices[0].delta.tool_calls or []) for ch in chunks if ch.choices) > 2  # arguments in pieces
    assert all(not (ch.choices and ch.choices[0].delta.content) for ch in chunks)


def test_tool_result_in_history_round_trip(client) -> None:
    """The call as the client returns it, then the tool's result: accepted,
    rendered, and the model answers (text or another valid call)."""
    tools = [WEATHER]
    r = client.chat.completions.create(model="m", messages=ASK, tools=tools, tool_choice="required",
                                       max_tokens=64, temperature=0)
    msg = r.choices[0].message
    history = [*ASK, msg.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": "22 degrees, sunny"}]
    assert history[1]["role"] == "assistant" and "content" not in history[1]  # null content, as OpenAI sends it
    for stream in (False, True):
        kw = dict(model="m", messages=history, tools=tools, max_tokens=48, temperature=0)
        if not stream:
            c = client.chat.completions.create(**kw).choices[0]
            assert c.finish_reason in ("stop", "length", "tool_calls")
            if c.finish_reason == "tool_calls":
                for tc in c.message.tool_calls:
                    valid_call(tc.function.name, tc.function.arguments)
            assert c.message.tool_calls or c.message.content is not None
        else:
            chunks = list(client.chat.completions.create(**kw, stream=True))
            calls, finish = streamed_calls(chunks)
            text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
            assert len(finish) == 1 and (calls or isinstance(text, str))
            if finish == ["tool_calls"]:
                for c in calls.values():
                    valid_call(c["name"], c["arguments"])
    # without tools in the request, the history still renders
    c = client.chat.completions.create(model="m", messages=history, max_tokens=8, temperature=0).choices[0]
    assert c.message.tool_calls is None and c.message.content is not None


def test_parallel_and_named_tool_choice(client) -> None:
    r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Weather in Tokyo and the time there?"}],
                                       tools=[WEATHER, TIME], tool_choice="required", parallel_tool_calls=True,
                                       max_tokens=96, temperature=0)
    c = r.choices[0]
    # the model may go on adding calls until max_tokens (96: room for several whole calls): then the last one is cut
    assert c.finish_reason in ("tool_calls", "length") and c.message.tool_calls
    whole = c.message.tool_calls if c.finish_reason == "tool_calls" else c.message.tool_calls[:-1]
    assert whole, c.message.tool_calls
    for tc in whole:
        valid_call(tc.function.name, tc.function.arguments)
    assert len({tc.id for tc in c.message.tool_calls}) == len(c.message.tool_calls)
    r = client.chat.completions.create(model="m", messages=ASK, tools=[WEATHER, TIME],
                                       tool_choice={"type": "function", "function": {"name": "get_time"}},
                                       max_tokens=64, temperature=0.8, seed=5)
    tc = r.choices[0].message.tool_calls[0]
    assert tc.function.name == "get_time"
    valid_call("get_time", tc.function.arguments)


def test_auto_answers_or_calls(client) -> None:
    """tool_choice auto: either form parses (content, or valid calls)."""
    for seed in range(3):
        c = client.chat.completions.create(model="m", messages=ASK, tools=[WEATHER], max_tokens=48,
                                           temperature=1.0, seed=seed).choices[0]
        if c.message.tool_calls and c.finish_reason != "length":
            assert c.finish_reason == "tool_calls"
            valid_call(c.message.tool_calls[0].function.name, c.message.tool_calls[0].function.arguments)
        else:
            assert isinstance(c.message.content, str) and c.finish_reason in ("stop", "length")


def test_bad_tools_are_400_and_the_engine_carries_on(srv: S.Server) -> None:
    pid = srv.engine_pid
    bodies = [
        {"tools": "get_weather"},
        {"tools": [{"type": "code_interpreter"}]},
        {"tools": [{"type": "function", "function": {"name": ""}}]},
        {"tools": [WEATHER], "tool_choice": "always"},
        {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "get_time"}}},
        {"tool_choice": "required"},
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"n": {"type": "integer", "minimum": 1}}}}}]},
        {"tools": [WEATHER], "parallel_tool_calls": 1},
        {"messages": [*ASK, {"role": "assistant", "content": None, "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": "{not json"}}]}]},
        {"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "string", "format": "email"}}}},
        {"response_format": {"type": "json_object", "schema": {"type": "object", "minProperties": 2}}},
    ]
    for b in bodies:
        r = requests.post(srv.url("/v1/chat/completions"), json={"messages": ASK, "max_tokens": 4, **b}, timeout=30)
        assert r.status_code == 400, (b, r.text)
        assert set(r.json()["error"]) >= {"code", "message", "type"} and r.json()["error"]["code"] == 400
    r = requests.post(srv.url("/completion"), json={"prompt": "x", "json_schema": {"not": {}}}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    assert srv.engine_pid == pid


def test_json_schema_4_of_4_with_8_other_streams(srv: S.Server) -> None:
    """Sampled (temperature 1, a seed each), not greedy: 4 different
    answers at once, each valid JSON conforming to the schema, while 8
    streams run (one round of 4: the suite's time; the grammar path is the
    same for every answer)."""
    stop = threading.Event()
    done: list[bool] = []

    def background() -> None:
        while not stop.is_set():
            s = S.Stream(srv.url("/completion"), {"prompt": "Once upon a time", "n_predict": 16,
                                                  "ignore_eos": True, "temperature": 1.0}).run()
            done.append(s.complete and s.events[-1]["tokens_predicted"] == 16)

    def one(i: int) -> tuple[dict, str]:
        r = requests.post(srv.url("/v1/chat/completions"), timeout=180, json={
            "messages": [{"role": "user", "content": "Describe a person as JSON."}], "max_tokens": 200,
            "temperature": 1.0, "seed": i,
            "response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}})
        assert r.status_code == 200, r.text
        c = r.json()["choices"][0]
        return c, c["message"]["content"]

    threads = [threading.Thread(target=background, daemon=True) for _ in range(8)]
    for t in threads:
        t.start()
    t0 = time.monotonic()
    try:
        busy = S.wait_for(lambda: (n := S.busy_slots(srv.base)) >= 8 and n, 60, "8 busy slots")
        with ThreadPoolExecutor(4) as ex:
            results = list(ex.map(one, range(N_JSON)))
    finally:
        stop.set()
        for t in threads:
            t.join(120)
    ok = 0
    for c, text in results:
        assert c["finish_reason"] == "stop", text
        jsonschema.validate(json.loads(text), PERSON)
        ok += 1
    print(f"\nJSON schema: {ok}/{N_JSON} valid, {len(set(t for _, t in results))} distinct, beside 8 streams "
          f"({busy} slots busy at the start, {len(done)} background streams, all complete: {all(done)}), "
          f"{time.monotonic() - t0:.1f} s")
    assert ok == N_JSON and busy and done and all(done)
    assert len({t for _, t in results}) > N_JSON // 2


def test_bad_grammar_is_400_and_others_unaffected(srv: S.Server) -> None:
    """A grammar that does not parse, one with no token it can start with,
    and one whose only way on is the end-of-generation token ignore_eos bans:
    each a 400 for its request (llama.cpp would throw through ctypes and
    abort the engine on the last two); a stream beside them completes, the
    engine keeps its pid."""
    pid = srv.engine_pid
    bg = S.Stream(srv.url("/completion"), {"prompt": "Once upon a time", "n_predict": 64, "ignore_eos": True,
                                            "temperature": 0}).start()
    bg.first.wait(60)
    for body in ({"grammar": "root ::= foo"}, {"grammar": "root ::= [\\x00]"},
                 {"grammar": 'root ::= "yes"', "ignore_eos": True}, {"grammar": 'root ::= "yes"', "ignore_eos": True,
                                                                     "stream": True}):
        r = requests.post(srv.url("/completion"), json={"prompt": "Is it?", "n_predict": 8, **body}, timeout=60)
        if body.get("stream"):  # the error comes as the stream's last event
            assert r.status_code == 200 and '"error"' in r.text and "grammar" in r.text, r.text
        else:
            assert r.status_code == 400, (body, r.text)
            assert r.json()["error"]["type"] == "invalid_request_error" and "grammar" in r.json()["error"]["message"]
    bg.join(120)
    assert bg.complete and bg.events[-1]["tokens_predicted"] == 64
    r = requests.post(srv.url("/completion"), json={"prompt": "Is it?", "n_predict": 8,
                                                    "grammar": 'root ::= "yes" | "no"'}, timeout=60)
    assert r.status_code == 200 and r.json()["content"] in ("yes", "no")
    assert srv.engine_pid == pid
