"""POST /v1/responses (and /responses): OpenAI's Responses API, text only.

The request becomes a chat: ``instructions`` a system message, ``input`` a
user message (a string) or the messages of an input item list (``content``
a string or ``input_text`` / ``output_text`` parts); then it takes the chat
completion path (chat template, the parameter table's validation, the same
Runner). ``max_output_tokens`` is an alias row of n_predict in
ipc/params.py. The answer and the stream follow OpenAI's shapes, which are
llama-server's (server-task.cpp to_json_oaicompat_resp*) plus the fields
OpenAI's SDK reads (output_index, content_index, sequence_number). A
``length`` stop is ``status: incomplete`` with ``incomplete_details``, as
OpenAI answers (llama-server says "completed").
"""
from __future__ import annotations

import time
from typing import Iterator

import falcon

from ipc.params import ECHO

from frontends.http.ctx import Ctx, client_socket, read_json
from frontends.http.gen import Job, Runner
from frontends.http.run import chat_ids, chat_plan, rand_id, run_one
from frontends.http.stream import event
from frontends.text.chat import text_of
from frontends.text.errors import bad
from frontends.text.fields import get_bool, get_str


def to_messages(body: dict) -> list[dict]:
    """llama-server's server_chat_convert_responses_to_chatcmpl, text only."""
    if "input" not in body:
        raise bad("'input' is required")
    if get_str(body, "previous_response_id"):
        raise bad("ringserve does not support 'previous_response_id'.")
    if body.get("tools"):
        raise bad("tools are not supported by /v1/responses on this server")
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
            kind = item.get("type", "message")
            role = item.get("role")
            if kind != "message" or role not in ("user", "system", "developer", "assistant"):
                raise bad(f"input[{i}]: only message items (user, system, developer, assistant) are supported")
            msgs.append({"role": "system" if role == "developer" else role,
                         "content": text_of(f"input[{i}]", item.get("content"))})
    else:
        raise bad("'input' must be a string or a non-empty array of input items")
    return msgs


class Responses:
    """POST /v1/responses and /responses."""

    def __init__(self, ctx: Ctx):
        self.ctx = ctx

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        ctx = self.ctx
        body = read_json(req, ctx.cfg.max_body)
        msgs = to_messages(body)
        instructions = body.get("instructions")
        body = {k: v for k, v in body.items() if k not in ("input", "instructions", "stream_options")}
        stream = get_bool(body, "stream", False)
        pl = chat_plan(ctx, body, msgs)
        runner = Runner(ctx, pl, client_socket(req)).start()
        head = {"id": rand_id("resp_"), "object": "response", "created_at": int(time.time()),
                "model": ctx.model, "instructions": instructions,
                "max_output_tokens": body.get("max_output_tokens"), **{k: pl.params[k] for k in ECHO},
                "parallel_tool_calls": False, "tool_choice": "auto", "tools": [],
                "text": {"format": {"type": "text"}}, "metadata": body.get("metadata") or {}, "error": None}
        j = run_one(resp, runner, stream, lambda: self.events(runner, head))
        if j is not None:
            resp.media = self.done(head, j, rand_id("msg_"))

    @staticmethod
    def message(mid: str, text: str, status: str) -> dict:
        part = {"type": "output_text", "annotations": [], "logprobs": [], "text": text}
        return {"type": "message", "id": mid, "status": status, "role": "assistant",
                "content": [part] if status == "completed" or text else []}

    def done(self, head: dict, j: Job, mid: str) -> dict:
        text = j.detok.text
        n_out, n_in = len(j.tokens), j.n_prompt
        incomplete = j.stop_type not in ("eos", "word")
        out = {**head, "status": "incomplete" if incomplete else "completed",
               "completed_at": int(time.time()),
               "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
               "output": [self.message(mid, text, "completed")],
               "usage": {"input_tokens": n_in, "input_tokens_details": {"cached_tokens": j.n_cached},
                         "output_tokens": n_out, "output_tokens_details": {"reasoning_tokens": 0},
                         "total_tokens": n_in + n_out}}
        return out

    def events(self, runner: Runner, head: dict) -> Iterator[bytes]:
        seq = iter(range(1 << 62))
        mid = rand_id("msg_")
        loc = {"item_id": mid, "output_index": 0, "content_index": 0}

        def ev(name: str, **data) -> bytes:
            return event(name, {"type": name, "sequence_number": next(seq), **data})

        start = {**head, "status": "in_progress", "output": [], "usage": None, "incomplete_details": None}
        yield ev("response.created", response=start)
        yield ev("response.in_progress", response=start)
        yield ev("response.output_item.added", output_index=0, item=self.message(mid, "", "in_progress"))
        yield ev("response.content_part.added", **loc,
                 part={"type": "output_text", "annotations": [], "logprobs": [], "text": ""})
        for st in runner.steps():
            j = st.job
            if st.final and j.error is not None:
                raise j.error
            if st.text:
                yield ev("response.output_text.delta", **loc, delta=st.text, logprobs=[])
            if not st.final:
                continue
            text = j.detok.text
            part = {"type": "output_text", "annotations": [], "logprobs": [], "text": text}
            yield ev("response.output_text.done", **loc, text=text, logprobs=[])
            yield ev("response.content_part.done", **loc, part=part)
            yield ev("response.output_item.done", output_index=0, item=self.message(mid, text, "completed"))
            final = self.done(head, j, mid)
            name = "response.completed" if final["status"] == "completed" else "response.incomplete"
            yield ev(name, response=final)


class InputTokens:
    """POST /v1/responses/input_tokens and /responses/input_tokens: the
    prompt's token count without generating (llama-server's handle_count_tokens)."""

    def __init__(self, ctx: Ctx):
        self.ctx = ctx

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        body = read_json(req, self.ctx.cfg.max_body)
        resp.media = {"input_tokens": len(chat_ids(self.ctx, to_messages(body))), "object": "response.input_tokens"}
