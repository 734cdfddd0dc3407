"""POST /v1/responses (and /responses): OpenAI's Responses API, text,
reasoning and function tools.

The request becomes a chat completion body as llama-server's
server_chat_convert_responses_to_chatcmpl makes it: ``instructions`` a
system message, ``input`` a user message (a string) or the messages of an
item list (``message`` items with a string or ``input_text`` /
``output_text`` parts; ``function_call`` -> the assistant's ``tool_calls``,
merged into the assistant message before it; ``function_call_output`` -> a
``tool`` message; ``reasoning`` -> the assistant's ``reasoning_content``);
function ``tools`` ({type, name, description, parameters}) -> chat tools,
``tool_choice`` alike; ``reasoning.effort`` -> reasoning_effort. Then it
takes the chat completion path (frontends/api/openai.py
``ChatCompletions.prepare``, the Runner, frontends/text/reply.py).
``max_output_tokens`` is an alias row of n_predict in ipc/params.py.

The answer's ``output`` holds, as llama-server's to_json_oaicompat_resp*:
a ``reasoning`` item (``reasoning_text`` content), the ``message`` (when
there is text, or nothing else), one ``function_call`` item per call
(``call_id`` the chat path's call id, ``id`` "fc_..."); streamed as
response.output_item.added/done around each, with
response.reasoning_text.delta/done, response.output_text.delta/done and
response.function_call_arguments.delta/done, plus the fields OpenAI's SDK
reads (output_index, content_index, sequence_number). A ``length`` stop is
``status: incomplete`` with ``incomplete_details``, as OpenAI answers
(llama-server says "completed").
"""
from __future__ import annotations

import time
from typing import Iterator

import falcon

from ipc.params import ECHO

from frontends.http.ctx import Ctx, client_socket, read_json
from frontends.http.gen import Runner
from frontends.http.job import PING, Job
from frontends.http.run import rand_id, run_one
from frontends.http.stream import PING_SSE, event
from frontends.text.chat import text_of
from frontends.text.errors import bad
from frontends.text.fields import get_bool, get_str
from frontends.text.params import Plan
from frontends.text.reply import Reply, thought_tokens

from .openai import ChatCompletions

_DROP = ("input", "instructions", "stream_options", "tools", "tool_choice", "reasoning", "max_output_tokens")


def _item(i: int, item: dict, msgs: list[dict]) -> None:
    """One input item appended to the chat messages ``msgs``."""
    kind = item.get("type", "message")
    prev = msgs[-1] if msgs and msgs[-1]["role"] == "assistant" else None
    if kind == "message":
        role = item.get("role")
        if role not in ("user", "system", "developer", "assistant"):
            raise bad(f"input[{i}]: a message's role must be user, system, developer or assistant")
        msgs.append({"role": "system" if role == "developer" else role,
                     "content": text_of(f"input[{i}]", item.get("content"))})
    elif kind == "function_call":
        if not all(isinstance(item.get(k), str) for k in ("call_id", "name", "arguments")):
            raise bad(f"input[{i}]: a function_call needs string 'call_id', 'name' and 'arguments'")
        call = {"id": item["call_id"], "type": "function",
                "function": {"name": item["name"], "arguments": item["arguments"]}}
        if prev is not None:  # merged into the assistant message before it, as llama-server does
            prev.setdefault("tool_calls", []).append(call)
        else:
            msgs.append({"role": "assistant", "content": "", "tool_calls": [call]})
    elif kind == "function_call_output":
        out = item.get("output")
        if not isinstance(item.get("call_id"), str) or not isinstance(out, (str, list)):
            raise bad(f"input[{i}]: a function_call_output needs a string 'call_id' and an 'output'")
        msgs.append({"role": "tool", "tool_call_id": item["call_id"],
                     "content": out if isinstance(out, str) else text_of(f"input[{i}].output", out)})
    elif kind == "reasoning":
        parts = item.get("content")
        # llama-server's checks (server_chat_convert_responses_to_chatcmpl): a non-empty array of text parts
        if not isinstance(parts, list) or not parts:
            raise bad(f"input[{i}]: a reasoning item's 'content' must be a non-empty array")
        if not all(isinstance(p, dict) and isinstance(p.get("text"), str) for p in parts):
            raise bad(f"input[{i}]: a reasoning item's content parts need a string 'text'")
        text = "".join(p["text"] for p in parts)
        if prev is not None:
            prev["reasoning_content"] = text
        else:
            msgs.append({"role": "assistant", "content": "", "reasoning_content": text})
    else:
        raise bad(f"input[{i}]: item type {kind!r} is not supported by this server")


def to_messages(body: dict) -> list[dict]:
    """llama-server's server_chat_convert_responses_to_chatcmpl, text only."""
    if "input" not in body:
        raise bad("'input' is required")
    if get_str(body, "previous_response_id"):
        raise bad("ringserve does not support 'previous_response_id'.")
    msgs: list[dict] = []
    if body.get("instructions") is not None:
        msgs.append({"role": "system", "content": get_str(body, "instructions")})
    inp = body["input"]
    if isinstance(inp, str):
        msgs.append({"role": "user", "content": inp})
    elif isinstance(inp, list) and inp:
        for i, item in enumerate(inp):
            if not isinstance(item, dict):
                raise bad(f"input[{i}] must be an object")
            _item(i, item, msgs)
    else:
        raise bad("'input' must be a string or a non-empty array of input items")
    return msgs


def to_chat(body: dict) -> dict:
    conv = {k: v for k, v in body.items() if k not in _DROP}
    conv["messages"] = to_messages(body)
    if body.get("max_output_tokens") is not None:
        conv["max_output_tokens"] = body["max_output_tokens"]
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise bad("'tools' must be an array of objects")
        conv["tools"] = []
        for i, t in enumerate(tools):
            if not isinstance(t, dict) or t.get("type") != "function":
                raise bad(f"tools[{i}]: only function tools are supported by this server")
            fn = {k: t[k] for k in ("name", "description", "parameters") if t.get(k) is not None}
            conv["tools"].append({"type": "function", "function": fn})
    tc = body.get("tool_choice")
    if isinstance(tc, dict) and tc.get("type") == "function":
        conv["tool_choice"] = {"type": "function", "function": {"name": tc.get("name")}}
    elif tc is not None:
        conv["tool_choice"] = tc
    r = body.get("reasoning")
    if isinstance(r, dict) and r.get("effort") is not None:
        conv["reasoning_effort"] = r["effort"]
    return conv


def _call_item(c: dict, status: str) -> dict:
    return {"id": "fc_" + c["id"].removeprefix("call_"), "type": "function_call", "status": status,
            "arguments": c["arguments"], "call_id": c["id"], "name": c["name"]}


def _reasoning_item(rid: str, text: str, status: str) -> dict:
    return {"id": rid, "type": "reasoning", "summary": [], "status": status,
            "content": [{"type": "reasoning_text", "text": text}], "encrypted_content": ""}


class Responses:
    """POST /v1/responses and /responses."""

    def __init__(self, ctx: Ctx):
        self.ctx = ctx

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        ctx = self.ctx
        body = read_json(req, ctx.cfg.max_body)
        stream = get_bool(body, "stream", False)
        pl = ChatCompletions.prepare(ctx, to_chat(body))
        ChatCompletions.admit(ctx, {}, pl)
        runner = Runner(ctx, pl, client_socket(req)).start()
        tools = body.get("tools") or []
        head = {"id": rand_id("resp_"), "object": "response", "created_at": int(time.time()),
                "model": ctx.model, "instructions": body.get("instructions"),
                # the value as read (a float truncated, as llama-server's n_predict), not the raw field
                "max_output_tokens": pl.params["n_predict"] if body.get("max_output_tokens") is not None else None,
                **{k: pl.params[k] for k in ECHO},
                "parallel_tool_calls": bool(body.get("parallel_tool_calls", False)),
                "tool_choice": body.get("tool_choice") or "auto", "tools": tools,
                "text": {"format": {"type": "text"}}, "metadata": body.get("metadata") or {}, "error": None}
        j = run_one(resp, runner, stream, lambda: self.events(pl, runner, head))
        if j is not None:
            reply = Reply.of(pl)
            reply.message(j.detok.text)
            resp.media = self.done(head, j, self.output(reply, rand_id("rs_"), rand_id("msg_")),
                                   self.thoughts(pl, j, reply))

    @staticmethod
    def message(mid: str, text: str, status: str) -> dict:
        part = {"type": "output_text", "annotations": [], "logprobs": [], "text": text}
        return {"type": "message", "id": mid, "status": status, "role": "assistant",
                "content": [part] if status == "completed" or text else []}

    def output(self, reply: Reply, rid: str, mid: str) -> list[dict]:
        out = [_reasoning_item(rid, reply.reasoning, "completed")] if reply.reasoning else []
        content = reply.content
        if content or not (reply.calls or reply.reasoning):  # as the stream: no empty message beside thoughts
            out.append(self.message(mid, content, "completed"))
        return out + [_call_item(c, "completed") for c in reply.calls]

    def thoughts(self, pl: Plan, j: Job, reply: Reply) -> int:
        """The answer's reasoning tokens (0 without thoughts)."""
        if not reply.reasoning:
            return 0
        return thought_tokens(lambda: Reply.of(pl), [self.ctx.vocab.piece(t) for t in j.tokens])

    def done(self, head: dict, j: Job, output: list[dict], n_thought: int) -> dict:
        n_out, n_in = len(j.tokens), j.n_prompt
        incomplete = j.stop_type not in ("eos", "word")
        return {**head, "status": "incomplete" if incomplete else "completed",
                "completed_at": int(time.time()),
                "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
                "output": output,
                "usage": {"input_tokens": n_in, "input_tokens_details": {"cached_tokens": j.n_cached},
                          "output_tokens": n_out, "output_tokens_details": {"reasoning_tokens": n_thought},
                          "total_tokens": n_in + n_out}}

    def events(self, pl: Plan, runner: Runner, head: dict) -> Iterator[bytes]:
        seq = iter(range(1 << 62))
        reply = Reply.of(pl)
        rid, mid = rand_id("rs_"), rand_id("msg_")
        items: list[dict] = []  # output items done
        cur: list = [None]  # the open item's kind: "reasoning", "message" or a call's index

        def ev(kind: str, **data) -> bytes:
            return event(kind, {"type": kind, "sequence_number": next(seq), **data})

        def at() -> dict:
            return {"output_index": len(items)}

        def open_(kind) -> Iterator[bytes]:
            yield from close()
            cur[0] = kind
            if kind == "reasoning":
                yield ev("response.output_item.added", **at(), item={**_reasoning_item(rid, "", "in_progress")})
            elif kind == "message":
                yield ev("response.output_item.added", **at(), item=self.message(mid, "", "in_progress"))
                yield ev("response.content_part.added", item_id=mid, **at(), content_index=0,
                         part={"type": "output_text", "annotations": [], "logprobs": [], "text": ""})
            else:
                yield ev("response.output_item.added", **at(), item=_call_item(reply.calls[kind], "in_progress"))

        def close() -> Iterator[bytes]:
            kind = cur[0]
            if kind is None:
                return
            if kind == "reasoning":
                yield ev("response.reasoning_text.done", item_id=rid, **at(), content_index=0, text=reply.reasoning)
                item = _reasoning_item(rid, reply.reasoning, "completed")
            elif kind == "message":
                text = reply.content
                part = {"type": "output_text", "annotations": [], "logprobs": [], "text": text}
                yield ev("response.output_text.done", item_id=mid, **at(), content_index=0, text=text, logprobs=[])
                yield ev("response.content_part.done", item_id=mid, **at(), content_index=0, part=part)
                item = self.message(mid, text, "completed")
            else:
                item = _call_item(reply.calls[kind], "completed")
                yield ev("response.function_call_arguments.done", item_id=item["id"], **at(),
                         arguments=item["arguments"], name=item["name"])
            yield ev("response.output_item.done", **at(), item=item)
            items.append(item)
            cur[0] = None

        def deltas(ds: list[dict]) -> Iterator[bytes]:
            for d in ds:
                if d.get("reasoning_content"):
                    if cur[0] != "reasoning":
                        yield from open_("reasoning")
                    yield ev("response.reasoning_text.delta", item_id=rid, **at(), content_index=0,
                             delta=d["reasoning_content"])
                if d.get("content"):
                    if cur[0] != "message":
                        yield from open_("message")
                    yield ev("response.output_text.delta", item_id=mid, **at(), content_index=0,
                             delta=d["content"], logprobs=[])
                for tc in d.get("tool_calls", ()):
                    if "id" in tc:
                        yield from open_(tc["index"])
                    args = tc["function"].get("arguments")
                    if args:
                        yield ev("response.function_call_arguments.delta", item_id=_call_item(
                            reply.calls[tc["index"]], "")["id"], **at(), delta=args)

        start = {**head, "status": "in_progress", "output": [], "usage": None, "incomplete_details": None}
        begun = False
        for st in runner.steps():
            if st is PING:  # silence past sse_ping_interval (gen.Runner.steps)
                yield PING_SSE
                continue
            j = st.job
            if st.final and j.error is not None:  # refused before any event: a plain HTTP error (stream.respond)
                raise j.error
            if not begun:  # the opening events with the first step, not before: an engine's refusal stays a 4xx
                begun = True
                yield ev("response.created", response=start)
                yield ev("response.in_progress", response=start)
                if pl.think is None and not pl.tools:
                    yield from open_("message")  # a plain answer: the message item opens at once
            yield from deltas(reply.feed(st.text) + (reply.finish() if st.final else []))
            if not st.final:
                continue
            if not items and cur[0] is None:
                yield from open_("message")  # nothing was said: an empty message, as a whole answer has
            yield from close()
            final = self.done(head, j, items, self.thoughts(pl, j, reply))
            name = "response.completed" if final["status"] == "completed" else "response.incomplete"
            yield ev(name, response=final)


class InputTokens:
    """POST /v1/responses/input_tokens and /responses/input_tokens: the
    prompt's token count without generating (llama-server's
    handle_count_tokens), tools included."""

    def __init__(self, ctx: Ctx):
        self.ctx = ctx

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        body = read_json(req, self.ctx.cfg.max_body)
        body.pop("stream", None)
        pl = ChatCompletions.prepare(self.ctx, to_chat(body))
        resp.media = {"input_tokens": len(pl.prompts[0]), "object": "response.input_tokens"}
