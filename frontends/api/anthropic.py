"""POST /v1/messages: Anthropic's Messages API, text, thinking and tools.

Converted as llama-server's server_chat_convert_anthropic_to_oai converts it
into a chat completion body, which then takes the chat completion path
(frontends/api/openai.py ``ChatCompletions.prepare``: template, tools,
reasoning, the parameter table; then the Runner and frontends/text/reply.py):

* ``system`` (a string or text blocks) -> a system message; each message's
  ``content`` a string or blocks: ``text`` parts, ``thinking`` ->
  ``reasoning_content``, ``tool_use`` -> the assistant's ``tool_calls``
  (``input`` as the JSON arguments), ``tool_result`` -> a ``tool`` message
  after it (its text blocks joined);
* ``tools`` ({name, description, input_schema}) -> function tools;
  ``tool_choice`` auto -> auto, any -> required, tool -> that one function
  (llama-server says required there), none -> none;
* ``thinking: {"type": "disabled"}`` -> enable_thinking false;
* ``max_tokens`` is required (Anthropic's rule; an alias row of n_predict),
  ``stop_sequences`` are stop strings, the sampling fields keep their names.

Answers and stream events are Anthropic's, field for field as llama-server's
to_json_anthropic*: content blocks thinking (``signature: ""``) -> text ->
tool_use; streamed as content_block_start/delta/stop with thinking_delta
(and a signature_delta before the thinking block closes), text_delta and
input_json_delta; ``stop_reason`` "tool_use" when the model called and
stopped by itself, "stop_sequence" on a stop string, as Anthropic's API says.

Errors carry both shapes: Anthropic's ``{"type": "error", "error": {"type",
"message"}}`` (what its SDK reads) with llama-server's ``code`` inside.
"""
from __future__ import annotations

import json
from typing import Iterator

import falcon

from frontends.http.ctx import Ctx, client_socket, read_json
from frontends.http.gen import Runner
from frontends.http.job import PING, Job
from frontends.http.run import rand_id, run_one
from frontends.http.stream import PING_SSE, event
from frontends.text.chat import text_of
from frontends.text.errors import ApiError, bad
from frontends.text.fields import get_bool, get_int
from frontends.text.params import Plan
from frontends.text.reply import Reply

from .openai import ChatCompletions

_PASS = ("system", "messages", "stop_sequences", "stop", "tools", "tool_choice", "thinking")


def _text(where: str, content) -> str:
    return text_of(where, content, ("text",), ("thinking",))


def _blocks(i: int, role: str, content: list) -> list[dict]:
    """One Anthropic message of content blocks -> its chat messages."""
    where = f"messages[{i}]"
    texts, calls, results, thought = [], [], [], ""
    for k, b in enumerate(content):
        kind = b.get("type") if isinstance(b, dict) else None
        if kind == "text":
            if not isinstance(b.get("text"), str):
                raise bad(f"{where}.content[{k}]: a text block needs a string 'text'")
            texts.append(b["text"])
        elif kind == "thinking":
            if not isinstance(b.get("thinking", ""), str):
                raise bad(f"{where}.content[{k}]: a thinking block needs a string 'thinking'")
            thought += b.get("thinking") or ""
        elif kind == "redacted_thinking":
            continue
        elif kind == "tool_use":
            if role != "assistant" or not isinstance(b.get("name"), str):
                raise bad(f"{where}.content[{k}]: a tool_use block belongs to an assistant message and needs a 'name'")
            args = b.get("input", {})
            if not isinstance(args, dict):
                raise bad(f"{where}.content[{k}]: 'input' must be an object")
            calls.append({"id": str(b.get("id") or ""), "type": "function",
                          "function": {"name": b["name"], "arguments": json.dumps(args, ensure_ascii=False)}})
        elif kind == "tool_result":
            c = b.get("content")
            text = "" if c is None else _text(f"{where}.content[{k}]", c)
            results.append({"role": "tool", "tool_call_id": str(b.get("tool_use_id") or ""), "content": text})
        else:
            raise bad(f"{where}: content block type {kind!r} is not supported by this server")
    out = []
    if texts or calls or thought:
        msg: dict = {"role": role, "content": "\n".join(texts)}
        if calls:
            msg["tool_calls"] = calls
        if thought:
            msg["reasoning_content"] = thought
        out.append(msg)
    return out + results


def to_messages(body: dict) -> list[dict]:
    msgs: list[dict] = []
    system = body.get("system")
    if system is not None:
        if not isinstance(system, (str, list)):
            raise bad("'system' must be a string or an array of text blocks")
        msgs.append({"role": "system", "content": _text("system", system)})
    m = body.get("messages")
    if not isinstance(m, list) or not m:
        raise bad("'messages' is required" if m is None else "'messages' must be a non-empty array")
    for i, msg in enumerate(m):
        if not isinstance(msg, dict) or msg.get("role") not in ("user", "assistant"):
            raise bad(f"messages[{i}]: 'role' must be 'user' or 'assistant'")
        if "content" not in msg:  # as /v1/chat/completions (chat.normalize): a 400, not an empty turn
            if msg["role"] == "assistant":
                continue
            raise bad(f"messages[{i}]: All non-assistant messages must contain 'content'")
        c = msg["content"]
        if isinstance(c, list):
            msgs += _blocks(i, msg["role"], c)
        else:
            msgs.append({"role": msg["role"], "content": _text(f"messages[{i}]", c)})
    return msgs


def _tools(body: dict) -> dict:
    """tools and tool_choice in the chat completion's shape."""
    out: dict = {}
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise bad("Field 'tools': expected an array")
        conv = []
        for i, t in enumerate(tools):
            if not isinstance(t, dict) or not isinstance(t.get("name"), str):
                raise bad(f"tools[{i}] must be an object with a 'name'")
            if t.get("type") not in (None, "custom"):
                raise bad(f"tools[{i}]: server tool type {t['type']!r} is not supported by this server")
            fn = {"name": t["name"], "parameters": t.get("input_schema") or {"type": "object", "properties": {}}}
            if t.get("description"):
                fn["description"] = t["description"]
            conv.append({"type": "function", "function": fn})
        out["tools"] = conv
    tc = body.get("tool_choice")
    if tc is not None:
        kind = tc.get("type") if isinstance(tc, dict) else None
        if kind == "auto":
            out["tool_choice"] = "auto"
        elif kind == "any":
            out["tool_choice"] = "required"
        elif kind == "none":
            out["tool_choice"] = "none"
        elif kind == "tool" and isinstance(tc.get("name"), str):
            out["tool_choice"] = {"type": "function", "function": {"name": tc["name"]}}
        else:
            raise bad("Field 'tool_choice': expected {\"type\": \"auto\" | \"any\" | \"none\"} or "
                      "{\"type\": \"tool\", \"name\": ...}")
        if isinstance(tc, dict) and tc.get("disable_parallel_tool_use") is False:
            out["parallel_tool_calls"] = True
    return out


def to_chat(body: dict) -> dict:
    """The whole request as a chat completion body (llama-server's conversion)."""
    conv = {k: v for k, v in body.items() if k not in _PASS}
    conv["messages"] = to_messages(body)
    conv.update(_tools(body))
    stops = body.get("stop_sequences")
    if stops is not None:
        if not isinstance(stops, list):
            raise bad("Field 'stop_sequences': expected an array of strings")
        conv["stop"] = stops
    th = body.get("thinking")
    if isinstance(th, dict) and th.get("type") == "disabled":
        kw = body.get("chat_template_kwargs") or {}
        if not isinstance(kw, dict):
            raise bad("Field 'chat_template_kwargs': expected an object")
        conv["chat_template_kwargs"] = {**kw, "enable_thinking": False}
    return conv


def stop_reason(j: Job, called: bool = False) -> str:
    if called and j.stop_type in ("eos", "word"):
        return "tool_use"
    return {"eos": "end_turn", "word": "stop_sequence"}.get(j.stop_type, "max_tokens")


def error_body(e: ApiError) -> dict:
    return {"type": "error", "error": {"type": e.type, "message": e.message, "code": e.code}}


def content_blocks(msg: dict) -> list[dict]:
    """An OpenAI assistant message as Anthropic content blocks."""
    out = []
    if msg.get("reasoning_content"):
        out.append({"type": "thinking", "thinking": msg["reasoning_content"], "signature": ""})
    if msg.get("content"):
        out.append({"type": "text", "text": msg["content"]})
    for tc in msg.get("tool_calls") or []:
        try:
            args = json.loads(tc["function"]["arguments"] or "{}")
        except ValueError:
            args = {}
        out.append({"type": "tool_use", "id": tc["id"], "name": tc["function"]["name"], "input": args})
    return out


class Messages:
    """POST /v1/messages."""

    def __init__(self, ctx: Ctx):
        self.ctx = ctx

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        try:
            self.answer(req, resp)
        except ApiError as e:
            resp.status = falcon.code_to_http_status(e.code)
            resp.media = error_body(e)

    def plan(self, body: dict) -> Plan:
        pl = ChatCompletions.prepare(self.ctx, to_chat(body))
        ChatCompletions.admit(self.ctx, {}, pl)
        return pl

    def answer(self, req: falcon.Request, resp: falcon.Response) -> None:
        ctx = self.ctx
        body = read_json(req, ctx.cfg.max_body)
        if body.get("max_tokens") is None:
            raise bad("max_tokens: Field required")
        get_int(body, "max_tokens", 0, 1)
        stream = get_bool(body, "stream", False)
        # a stream asks for the engine's progress records: the first carries the cached count, which
        # message_start's usage reports (llama-server's n_prompt_tokens_cache there)
        pl = self.plan({**body, "return_progress": True} if stream else body)
        runner = Runner(ctx, pl, client_socket(req)).start()
        mid = rand_id("msg_")
        j = run_one(resp, runner, pl.stream, lambda: self.events(pl, runner, mid))
        if j is None:
            return
        msg = Reply.of(pl).message(j.detok.text)
        resp.media = {"id": mid, "type": "message", "role": "assistant", "content": content_blocks(msg),
                      "model": ctx.model, "stop_reason": stop_reason(j, bool(msg.get("tool_calls"))),
                      "stop_sequence": j.detok.word, "usage": self.usage(j, len(j.tokens))}

    @staticmethod
    def usage(j: Job, n_out: int) -> dict:
        return {"cache_read_input_tokens": j.n_cached, "input_tokens": j.n_prompt - j.n_cached,
                "output_tokens": n_out}

    def events(self, pl: Plan, runner: Runner, mid: str) -> Iterator[bytes]:
        def ev(name: str, **data) -> bytes:
            return event(name, {"type": name, **data})

        j = runner.jobs[0]
        reply = Reply.of(pl)

        def start() -> bytes:  # after the first step: the cached count is known (the progress record)
            cache = max(j.p_cache, 0)
            return ev("message_start", message={
                "id": mid, "type": "message", "role": "assistant", "content": [], "model": self.ctx.model,
                "stop_reason": None, "stop_sequence": None,
                "usage": {"cache_read_input_tokens": cache, "input_tokens": len(j.prompt) - cache,
                          "output_tokens": 0}})

        sent = False
        cur: list = [None, -1]  # the open block's kind ("thinking", "text", or a call's index) and its index

        def close() -> Iterator[bytes]:
            if cur[0] == "thinking":  # Anthropic's SDK wants a signature before a thinking block ends
                yield ev("content_block_delta", index=cur[1], delta={"type": "signature_delta", "signature": ""})
            if cur[0] is not None:
                yield ev("content_block_stop", index=cur[1])
            cur[0] = None

        def blocks(deltas: list[dict]) -> Iterator[bytes]:
            for d in deltas:
                if "reasoning_content" in d or "content" in d:
                    kind, text = ("thinking", d["reasoning_content"]) if "reasoning_content" in d \
                        else ("text", d["content"])
                    if not text:
                        continue
                    if cur[0] != kind:
                        yield from close()
                        cur[:] = [kind, cur[1] + 1]
                        yield ev("content_block_start", index=cur[1], content_block={"type": kind, kind: ""})
                    delta = {"type": "thinking_delta", "thinking": text} if kind == "thinking" \
                        else {"type": "text_delta", "text": text}
                    yield ev("content_block_delta", index=cur[1], delta=delta)
                for tc in d.get("tool_calls", ()):
                    if "id" in tc:
                        yield from close()
                        cur[:] = [tc["index"], cur[1] + 1]
                        yield ev("content_block_start", index=cur[1], content_block={
                            "type": "tool_use", "id": tc["id"], "name": tc["function"]["name"], "input": {}})
                    args = tc["function"].get("arguments")
                    if args:
                        yield ev("content_block_delta", index=cur[1],
                                 delta={"type": "input_json_delta", "partial_json": args})

        try:
            for st in runner.steps():
                if st is PING:  # silence past sse_ping_interval (gen.Runner.steps)
                    yield PING_SSE
                    continue
                if st.final and j.error is not None:
                    raise j.error
                if st.progress is not None:  # the cached count, kept by the job for start(); nothing to send
                    continue
                if not sent:  # after the first step: an engine refusal is still a plain HTTP error
                    sent = True
                    yield start()
                yield from blocks(reply.feed(st.text) + (reply.finish() if st.final else []))
                if not st.final:
                    continue
                yield from close()
                yield ev("message_delta", delta={"stop_reason": stop_reason(j, bool(reply.calls)),
                                                 "stop_sequence": j.detok.word},
                         usage=self.usage(j, len(j.tokens)))
                yield ev("message_stop")
        except ApiError as e:
            if not sent:
                raise
            yield event("error", error_body(e))  # after the headers: Anthropic's error event


class CountTokens(Messages):
    """POST /v1/messages/count_tokens: {"input_tokens"} of a Messages request
    (its tools and thinking settings included: the same prompt it would run)."""

    def answer(self, req: falcon.Request, resp: falcon.Response) -> None:
        body = read_json(req, self.ctx.cfg.max_body)
        body.pop("stream", None)
        # counted, never admitted: a client asks this to learn whether a conversation needs compacting, so a
        # prompt past the context is an answer, not a 400 (llama-server's handle_count_tokens only tokenizes)
        resp.media = {"input_tokens": len(ChatCompletions.prepare(self.ctx, to_chat(body)).prompts[0])}
