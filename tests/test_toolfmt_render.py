"""Rendering parity: for each vendored llama.cpp template of a native
tool-call family, a conversation with tools, parallel tool calls and their
results renders byte for byte as llama-server ``--jinja`` renders it
(``/apply-template`` side by side: the real llama-server binary started once
per template with ``--chat-template-file``, and ringserve's app with the
same flag over the fake engine, both on SmolLM2-135M: a rendering reads the
model only for its BOS and EOS text, and SmolLM2's 49k-token vocabulary
loads ~4x faster than the default model's 262k, 13 servers at once).
Skipped without the llama-server binary (scripts/build_llama_server.sh)
or SmolLM2 (the test extra).

The llama-servers all start at once when the module begins (each test then
waits for its own): their start-ups overlap instead of adding up, and a
rendering does not depend on the process next door. ``--no-warmup`` skips
the start-up decode, which /apply-template never uses."""
from __future__ import annotations

import os

import pytest

from frontends import testing
from frontends.testing import Proc, TestClient, free_port
from frontends.testing.models import smollm2

from test_toolfmt import FAMILY, TEMPLATES

BIN = os.path.expanduser("~/.cache/ringserve/llama.cpp-0.3.36/build/bin/llama-server")
MODEL = smollm2()
pytestmark = pytest.mark.skipif(not os.access(BIN, os.X_OK) or MODEL is None,
                                reason="needs the llama-server binary and SmolLM2 (test extra)")

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "description": "The city"}}, "required": ["city"]}}}
PYTHON = {"type": "function", "function": {"name": "python", "parameters": {
    "type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}}}
CONVERSATION = {
    "tools": [WEATHER, PYTHON],
    "messages": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Weather in Paris? And run print(1)."},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call00001", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
            {"id": "call00002", "type": "function", "function": {"name": "python", "arguments": '{"code": "print(1)"}'}}]},
        {"role": "tool", "tool_call_id": "call00001", "content": "22 C, sunny"},
        {"role": "tool", "tool_call_id": "call00002", "content": "1"},
        {"role": "assistant", "content": "It is 22 C and sunny in Paris; the code printed 1."},
        {"role": "user", "content": "Thanks! Again for Rome?"},
    ],
}


def conversation(name: str) -> dict:
    """Llama 3.x's templates refuse parallel calls ("This model only supports single tool-calls at once!"),
    in llama-server too: one call and its result there."""
    if "Llama-3" not in name or "Hermes" in name:
        return CONVERSATION
    msgs = [dict(m) for m in CONVERSATION["messages"]]
    msgs[2]["tool_calls"] = msgs[2]["tool_calls"][:1]
    del msgs[4]
    return {**CONVERSATION, "messages": msgs}


def llama_server(path: str) -> Proc:
    """Started, not waited for (``wait_ready`` before use)."""
    port = free_port()
    cmd = [BIN, "-m", MODEL, "--jinja", "--chat-template-file", path, "--host", "127.0.0.1",
           "--port", str(port), "-t", "1", "-c", "512", "-np", "1", "-b", "64", "-ub", "64", "--no-webui",
           "--no-warmup"]
    return Proc(cmd, port, name="llama-server", ready_timeout=120.0, wait=False)


@pytest.fixture(scope="module")
def servers():
    """One llama-server per template, all starting at once; every one stopped at the end."""
    procs = {name: llama_server(os.path.join(TEMPLATES, name)) for name in sorted(FAMILY)}
    try:
        yield procs
    finally:
        for p in procs.values():
            p.stop()
            p.cleanup()


@pytest.mark.parametrize("name", sorted(FAMILY))
def test_conversation_renders_as_llama_server(servers, name: str) -> None:
    path, body = os.path.join(TEMPLATES, name), conversation(name)
    with servers[name].wait_ready() as ls:
        code, want = testing.post(ls.url("/apply-template"), body)
    assert code == 200, want
    with TestClient("-m", MODEL, "--chat-template-file", path) as c:
        got = c.simulate_post("/apply-template", json=body)
    assert got.status_code == 200, got.json
    a, b = got.json["prompt"], want["prompt"]
    k = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    assert a == b, f"first difference at {k}: ringserve {a[max(0, k - 60):k + 80]!r} llama-server {b[max(0, k - 60):k + 80]!r}"
