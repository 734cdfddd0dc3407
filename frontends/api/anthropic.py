"""POST /v1/messages: Anthropic's Messages API, text only.

Converted as llama-server's server_chat_convert_anthropic_to_oai converts it
(``system`` a string or text blocks -> a system message; each message's
``content`` a string or text blocks), then the chat completion path
(http/run.py chat_plan: template, parameter table, Runner). ``max_tokens``
is required (Anthropic's rule; an alias row of n_predict in ipc/params.py),
``stop_sequences`` are stop strings, the sampling fields keep their names
(the table's rows). Answers and stream events are Anthropic's (message_start,
content_block_start/delta/stop, message_delta with stop_reason and usage,
message_stop), field for field as llama-server's to_json_anthropic*; a stop
string ends with ``stop_reason: "stop_sequence"`` as Anthropic's API says.

Errors carry both shapes: Anthropic's ``{"type": "error", "error": {"type",
"message"}}`` (what its SDK reads) with llama-server's ``code`` inside.
"""
from __future__ import annotations

from typing import Iterator

import falcon

from frontends.http.ctx import Ctx, client_socket, read_json
from frontends.http.gen import Job, Runner
from frontends.http.run import chat_ids, chat_plan, rand_id, run_one
from frontends.http.stream import event
from frontends.text.chat import text_of
from frontends.text.errors import ApiError, bad
from frontends.text.fields import get_bool, get_int


def _text(where: str, content) -> str:
    return text_of(where, content, ("text",), ("thinking",))


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
        msgs.append({"role": msg["role"], "content": _text(f"messages[{i}]", msg.get("content", ""))})
    return msgs


def stop_reason(j: Job) -> str:
    return {"eos": "end_turn", "word": "stop_sequence"}.get(j.stop_type, "max_tokens")


def error_body(e: ApiError) -> dict:
    return {"type": "error", "error": {"type": e.type, "message": e.message, "code": e.code}}


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

    def answer(self, req: falcon.Request, resp: falcon.Response) -> None:
        ctx = self.ctx
        body = read_json(req, ctx.cfg.max_body)
        if body.get("max_tokens") is None:
            raise bad("max_tokens: Field required")
        get_int(body, "max_tokens", 0, 1)
        if body.get("tools"):
            raise bad("tools are not supported by /v1/messages on this server")
        msgs = to_messages(body)
        stops = body.get("stop_sequences")
        conv = {k: v for k, v in body.items() if k not in ("system", "messages", "stop_sequences", "stop")}
        if stops is not None:
            if not isinstance(stops, list):
                raise bad("Field 'stop_sequences': expected an array of strings")
            conv["stop"] = stops
        get_bool(body, "stream", False)
        pl = chat_plan(ctx, conv, msgs)
        runner = Runner(ctx, pl, client_socket(req)).start()
        mid = rand_id("msg_")
        j = run_one(resp, runner, pl.stream, lambda: self.events(runner, mid))
        if j is None:
            return
        text = j.detok.text
        resp.media = {"id": mid, "type": "message", "role": "assistant",
                      "content": [{"type": "text", "text": text}] if text else [],
                      "model": ctx.model, "stop_reason": stop_reason(j), "stop_sequence": j.detok.word,
                      "usage": self.usage(j, len(j.tokens))}

    @staticmethod
    def usage(j: Job, n_out: int) -> dict:
        return {"cache_read_input_tokens": j.n_cached, "input_tokens": j.n_prompt - j.n_cached,
                "output_tokens": n_out}

    def events(self, runner: Runner, mid: str) -> Iterator[bytes]:
        def ev(name: str, **data) -> bytes:
            return event(name, {"type": name, **data})

        j = runner.jobs[0]
        start = ev("message_start", message={
            "id": mid, "type": "message", "role": "assistant", "content": [], "model": self.ctx.model,
            "stop_reason": None, "stop_sequence": None,
            "usage": {"cache_read_input_tokens": 0, "input_tokens": len(j.prompt), "output_tokens": 0}})
        sent = started = False
        try:
            for st in runner.steps():
                if st.final and j.error is not None:
                    raise j.error
                if not sent:  # after the first step: an engine refusal is still a plain HTTP error
                    sent = True
                    yield start
                if st.text:
                    if not started:
                        started = True
                        yield ev("content_block_start", index=0, content_block={"type": "text", "text": ""})
                    yield ev("content_block_delta", index=0, delta={"type": "text_delta", "text": st.text})
                if not st.final:
                    continue
                if started:
                    yield ev("content_block_stop", index=0)
                yield ev("message_delta", delta={"stop_reason": stop_reason(j), "stop_sequence": j.detok.word},
                         usage=self.usage(j, len(j.tokens)))
                yield ev("message_stop")
        except ApiError as e:
            if not sent:
                raise
            yield event("error", error_body(e))  # after the headers: Anthropic's error event


class CountTokens(Messages):
    """POST /v1/messages/count_tokens: {"input_tokens"} of a Messages request."""

    def answer(self, req: falcon.Request, resp: falcon.Response) -> None:
        body = read_json(req, self.ctx.cfg.max_body)
        resp.media = {"input_tokens": len(chat_ids(self.ctx, to_messages(body)))}
