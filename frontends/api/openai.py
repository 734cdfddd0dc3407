"""OpenAI-compatible endpoints: /v1/completions and /v1/chat/completions.

Shapes follow llama-server's to_json_oaicompat* (server-task.cpp): ``id`` is
constant across a stream, ``finish_reason`` is "stop" for EOS or a stop
string and "length" otherwise, ``usage`` carries
``prompt_tokens_details.cached_tokens``, streams end with ``data: [DONE]``.
"""
from __future__ import annotations

import time
from typing import Iterator

import falcon

from ipc.budget import UNLIMITED, pack as budget_header
from ipc.layout import LAZY_GRAMMAR
from ipc.params import MAX_PROBS

from frontends.http.ctx import Ctx, client_socket, read_json
from frontends.http.gen import Runner
from frontends.http.job import PING, Job
from frontends.http.run import check_context, collect, n_cmpl, rand_id
from frontends.http.stream import DONE, PING_SSE, respond, sse
from frontends.text import tools as toolcalls
from frontends.text.chat import chat_prompt, normalize
from frontends.text.errors import bad
from frontends.text.fields import get_num
from frontends.text.params import Plan, json_grammar, plan, probs_alias, prompts
from frontends.text import reasoning
from frontends.text.reply import Reply

from .native import final


def new_id() -> str:
    return rand_id("chatcmpl-")


def finish_reason(job: Job) -> str:
    return "stop" if job.stop_type in ("eos", "word") else "length"


def tool_finish(job: Job, called: bool) -> str:
    """"tool_calls" when the model called and stopped by itself."""
    fr = finish_reason(job)
    return "tool_calls" if called and fr == "stop" else fr


def usage(jobs: list[Job]) -> dict:
    # n > 1 shares one prompt: count it once, as OpenAI does
    seen, p, c, cached = set(), 0, 0, 0
    for j in jobs:
        c += len(j.tokens)
        key = tuple(j.prompt)
        if key not in seen:
            seen.add(key)
            p += j.n_prompt
            cached += j.n_cached
    return {"completion_tokens": c, "prompt_tokens": p, "total_tokens": c + p,
            "prompt_tokens_details": {"cached_tokens": cached}}


def live(pl: Plan, j: Job) -> dict:
    """timings_per_token: the figures so far on a streamed event."""
    return {"timings": j.live_timings()} if pl.per_token else {}


def _logprobs(pl: Plan, probs: list[dict]) -> dict:
    """OpenAI's logprobs.content, top lists cut to what was asked."""
    key = "top_probs" if pl.post_probs else "top_logprobs"
    k = pl.top_logprobs
    return {"content": [{**p, key: p[key][:k]} for p in probs]}


class _Base:
    object_name = ""

    def __init__(self, ctx: Ctx):
        self.ctx = ctx

    def head(self, rid: str, created: int) -> dict:
        return {"created": created, "model": self.ctx.model, "system_fingerprint": "b0-ringserve",
                "object": self.object_name, "id": rid}

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        body = read_json(req, self.ctx.cfg.max_body)
        self.run(req, resp, body, self.prepare(self.ctx, body))

    @staticmethod
    def admit(ctx: Ctx, body: dict, pl: Plan) -> int:
        """The checks before anything is submitted (also the render endpoints',
        frontends/api/render.py): ``n`` (``n_cmpl``) copies within the slots, every prompt
        within a slot's context. Returns ``n``."""
        n = n_cmpl(ctx, body)
        check_context(ctx, pl)
        return n

    def run(self, req, resp, body: dict, pl: Plan) -> None:
        n = self.admit(self.ctx, body, pl)
        runner = Runner(self.ctx, pl, client_socket(req)).start(copies=n)
        rid, created = new_id(), int(time.time())
        if pl.stream:
            respond(resp, self.events(pl, runner, rid, created), runner)
            return
        try:
            jobs = collect(runner)
        finally:
            runner.close()
        out = {"choices": [self.choice(pl, j) for j in jobs], **self.head(rid, created), "usage": usage(jobs)}
        if jobs:
            out.update(self.debug(pl, jobs[0], False))
            out["timings"] = jobs[0].timings()
        resp.media = out

    def debug(self, pl: Plan, j: Job, stream: bool) -> dict:
        """``__verbose``: the native final result, under --verbose or a
        request's ``verbose`` (llama-server's to_json_non_oaicompat)."""
        return {"__verbose": final(self.ctx, pl, j, stream)} if pl.options.get("verbose") else {}


class Completions(_Base):
    """POST /v1/completions (llama-server parses it with the native schema)."""

    object_name = "text_completion"

    @staticmethod
    def prepare(ctx: Ctx, body: dict) -> Plan:
        """The body validated into its plan: prompts tokenized (also
        /v1/completions/render's, frontends/api/render.py)."""
        probs_alias(body)
        pl = plan(ctx, body, prompts(ctx.vocab, body.get("prompt")))
        pl.top_logprobs = pl.n_probs
        return pl

    def choice(self, pl: Plan, j: Job) -> dict:
        return {"text": j.detok.text, "index": j.index,
                "logprobs": _logprobs(pl, j.whole_probs(self.ctx.vocab)) if j.probs else None,
                "finish_reason": finish_reason(j)}

    def events(self, pl: Plan, runner: Runner, rid: str, created: int) -> Iterator[bytes]:
        head = self.head(rid, created)
        for st in runner.steps():
            if st is PING:  # silence past sse_ping_interval (gen.Runner.steps)
                yield PING_SSE
                continue
            j = st.job
            if st.progress is not None:
                if pl.progress:
                    yield sse({"choices": [{"text": "", "index": j.index, "logprobs": None, "finish_reason": None}],
                               **head, **live(pl, j), "prompt_progress": st.progress})
                continue
            if st.final:
                if j.error is not None:
                    raise j.error
                yield sse({"choices": [{"text": st.text, "index": j.index, "logprobs": None,
                                        "finish_reason": finish_reason(j)}],
                           **head, "usage": usage([j]), **self.debug(pl, j, True), "timings": j.timings()})
            elif st.text or st.probs:
                lp = _logprobs(pl, [st.probs]) if st.probs else None
                yield sse({"choices": [{"text": st.text, "index": j.index, "logprobs": lp,
                                        "finish_reason": None}], **head, **live(pl, j)})
        yield DONE


class ChatCompletions(_Base):
    """POST /v1/chat/completions (and /chat/completions)."""

    object_name = "chat.completion"

    @classmethod
    def prepare(cls, ctx: Ctx, body: dict) -> Plan:
        """The body validated into its plan: tools, the chat template,
        response_format, logprobs, the prompt tokenized (also
        /v1/chat/completions/render's, frontends/api/render.py)."""
        if body.get("messages") is None:
            raise bad("'messages' is required")
        spec, extra = toolcalls.apply(body, ctx.chat, ctx.cfg.jinja)  # tools: grammar, messages polyfilled
        text = render_chat(ctx, body, extra)
        think = chat_think(ctx, body, extra)
        if spec is None:
            cls._format(body)
        # server-common.cpp oaicompat_chat_params_parse: json_value(body, "logprobs", false) (a non-boolean
        # is false, and then reaches the native schema, whose n_probs reads it as its alias), and
        # n_probs = json_value(body, "top_logprobs", 20): no limit, a wrong type is 20
        lp, top = body.get("logprobs"), 0
        if lp is True:
            t = body.get("top_logprobs")
            top = get_num(body, "top_logprobs", 20) if isinstance(t, (int, float)) else 20
            body["n_probs"] = max(top, 1)  # the sampled token's logprob needs at least one entry
            top = max(0, min(top, MAX_PROBS))
        elif body.get("top_logprobs") is not None:
            raise bad("top_logprobs requires logprobs to be set to true")
        elif lp is not None and lp is not False:
            probs_alias(body)
        ids = [ctx.vocab.tokenize(text, True, True)]
        pl = plan(ctx, body, ids)
        pl.top_logprobs = top
        if spec is not None:
            pl.tools, pl.settings["chat_format"] = True, spec.fmt.name if spec.fmt is not None else "Generic"
            pl.answer = toolcalls.answerer(spec)
        pl.think = think
        if think is not None:
            pl.settings["reasoning_format"] = think.fmt
            # llama-server sets reasoning_in_content for a streamed deepseek-legacy request and reads it
            # nowhere: its deltas split the thoughts as deepseek's do (so do ours); only the setting shows it
            pl.settings["reasoning_in_content"] = pl.stream and think.fmt == "deepseek-legacy"
            budget(ctx, body, pl)
        return pl

    @staticmethod
    def _format(body: dict) -> None:
        """response_format -> json_schema as llama-server's oaicompat_chat_params_parse: json_object's
        own schema, else the request's, else any object; json_schema's json_schema.schema (over the
        request's; absent: any object); not an object or no string type: no format (json_value)."""
        rf = body.get("response_format")
        if not isinstance(rf, dict):
            return
        kind = rf.get("type") if isinstance(rf.get("type"), str) else ""
        if kind in ("", "text"):
            return
        if kind == "json_object":
            if "schema" in rf:
                body["json_schema"] = rf["schema"] if isinstance(rf["schema"], dict) else {}
            elif not body.get("json_schema"):  # any JSON object
                if body.get("grammar"):
                    raise bad("Either \"json_schema\" or \"grammar\" can be specified, but not both")
                body["grammar"] = json_grammar()
                return
        elif kind == "json_schema":
            js = rf.get("json_schema")
            schema = js.get("schema") if isinstance(js, dict) else None
            body["json_schema"] = schema if isinstance(schema, dict) else {}
        else:
            raise bad(f"response_format type must be one of text, json_object, json_schema; got {kind!r}")
        if body["json_schema"] == {}:  # llama-server: an absent or empty schema means any object
            body["json_schema"] = {"type": "object"}

    def choice(self, pl: Plan, j: Job) -> dict:
        out = {"finish_reason": finish_reason(j), "index": j.index,
               "message": {"role": "assistant", "content": j.detok.text}}
        if pl.tools or pl.think is not None:
            out["message"] = msg = Reply.of(pl).message(j.detok.text)
            out["finish_reason"] = tool_finish(j, bool(msg.get("tool_calls")))
        if j.probs:
            out["logprobs"] = _logprobs(pl, j.whole_probs(self.ctx.vocab))
        return out

    def events(self, pl: Plan, runner: Runner, rid: str, created: int) -> Iterator[bytes]:
        head = {**self.head(rid, created), "object": "chat.completion.chunk"}
        started: set[int] = set()
        answers: dict[int, Reply] = {}  # per choice, with tools or reasoning

        def chunk(j: Job, delta: dict, finish=None, lp=None, extra: dict | None = None) -> bytes:
            ch = {"finish_reason": finish, "index": j.index, "delta": delta}
            if lp is not None:
                ch["logprobs"] = lp
            return sse({"choices": [ch], **head, **(extra or {})})

        role = {"role": "assistant", "content": None}
        for st in runner.steps():
            if st is PING:  # silence past sse_ping_interval (gen.Runner.steps)
                yield PING_SSE
                continue
            j = st.job
            if st.progress is not None:  # llama-server repeats the role delta with each progress object
                if pl.progress:
                    yield chunk(j, role, extra={**live(pl, j), "prompt_progress": st.progress})
                continue
            if st.final and j.error is not None:  # before the role delta: a request the engine refused
                raise j.error  # before any event is a plain HTTP error (stream.respond), as llama-server's
            if j.index not in started:  # OpenAI's first delta carries the role
                started.add(j.index)
                yield chunk(j, role)
            if pl.tools or pl.think is not None:  # reasoning and tool-call deltas, parsed as the text grows
                ans = answers.setdefault(j.index, Reply.of(pl))
                deltas = ans.feed(st.text) + (ans.finish() if st.final else [])
                lp = _logprobs(pl, [st.probs]) if st.probs else None
                for k, d in enumerate(deltas):
                    yield chunk(j, d, None, lp if k == 0 else None, live(pl, j))
                if lp is not None and not deltas:
                    yield chunk(j, {}, None, lp, live(pl, j))
                if not st.final:
                    continue
                fin = tool_finish(j, bool(ans.calls))
            else:
                if not st.final:
                    if st.text or st.probs:
                        lp = _logprobs(pl, [st.probs]) if st.probs else None
                        yield chunk(j, {"content": st.text} if st.text else {}, None, lp, live(pl, j))
                    continue
                if st.text:
                    yield chunk(j, {"content": st.text})
                fin = finish_reason(j)
            last = {"choices": [{"finish_reason": fin, "index": j.index, "delta": {}}], **head,
                    **self.debug(pl, j, True)}
            if not pl.include_usage:
                last["timings"] = j.timings()
            yield sse(last)
        if pl.include_usage:
            jobs = runner.jobs
            yield sse({"choices": [], **head, "usage": usage(jobs),
                       **({"timings": jobs[0].timings()} if jobs else {})})
        yield DONE


def chat_kwargs(ctx: Ctx, body: dict) -> dict:
    """The template's further variables: ``enable_thinking`` (llama-server
    always defines it: true unless --reasoning off or the template has no
    thinking; --reasoning on forces it), then the request's
    chat_template_kwargs; ``reasoning_effort: "none"`` turns thinking off."""
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise bad("Field 'chat_template_kwargs': expected an object")
    mode = ctx.cfg.reasoning
    on = mode == "on" or (mode == "auto" and reasoning.markers(ctx.chat) is not None)
    out = {"enable_thinking": on, **kwargs}
    reasoning.enable_thinking(out)
    if body.get("reasoning_effort") == "none":
        out["enable_thinking"] = False
    elif isinstance(body.get("reasoning_effort"), str) and body["reasoning_effort"]:
        out["reasoning_effort"] = body["reasoning_effort"]
    return out


def budget(ctx: Ctx, body: dict, pl: Plan) -> None:
    """The thinking budget (reasoning_budget_tokens, thinking_budget_tokens,
    else --reasoning-budget): the engine forces ``reasoning_budget_message``
    + the end marker once it is spent (ipc/budget.py, engine/sampling/budget.py),
    as llama-server's reasoning-budget sampler. A request with a plain
    grammar keeps none: a forced token the grammar refuses would abort
    llama.cpp. A lazy grammar (a native tool-call format) gets one, unlimited
    if no budget was asked: the engine holds the grammar off while the model
    thinks (llama.cpp's common_sampler does the same)."""
    n = pl.options.get("reasoning_budget_tokens", -1)
    think = pl.think
    lazy = pl.grammar.startswith(LAZY_GRAMMAR)
    if (n < 0 and not lazy) or (pl.grammar and not lazy) or think is None or not think.markers.start:
        return
    msg = body.get("reasoning_budget_message", ctx.cfg.reasoning_budget_message)
    if not isinstance(msg, str):
        raise bad("Field 'reasoning_budget_message': expected a string")
    mk, tok = think.markers, ctx.vocab.tokenize
    end = tok(mk.end, False, True)
    forced = tok(msg + mk.end_lead + mk.end, False, True)  # as measured on llama-server (Qwen 3.5's "\n</think>")
    pl.grammar = budget_header(n if n >= 0 else UNLIMITED, tok(mk.start, False, True), end, forced,
                               tok(think.gen, False, True) if think.gen else []) + pl.grammar
    if n >= 0:
        pl.settings["reasoning_budget_tokens"] = n


def render_chat(ctx: Ctx, body: dict, extra: dict | None = None) -> str:
    """A chat request's prompt text: messages validated, then the template
    with chat_kwargs (plus ``extra``), add_generation_prompt,
    continue_final_message and the assistant prefill (chat.chat_prompt)."""
    if body.get("messages") is None:
        raise bad("'messages' is required")
    msgs = normalize(body["messages"])
    return chat_prompt(ctx.chat, msgs, body, ctx.cfg.prefill_assistant, {**chat_kwargs(ctx, body), **(extra or {})})


def chat_think(ctx: Ctx, body: dict, extra: dict | None = None) -> reasoning.Think | None:
    """How the request's answer is split (None: the template has no thinking
    markers): the format, and the generation prompt's opened thinking."""
    if reasoning.markers(ctx.chat) is None:
        reasoning.get_format(body, ctx.cfg.reasoning_format)  # still validated
        return None
    fmt = reasoning.get_format(body, ctx.cfg.reasoning_format)
    msgs = normalize(body["messages"])
    if msgs and msgs[-1].get("role") == "assistant" and ctx.cfg.prefill_assistant:
        msgs = msgs[:-1]  # a continued message: the prompt before it (common_chat_template_generation_prompt)
    kw = {**chat_kwargs(ctx, body), **(extra or {})}
    gen = reasoning.generation_prompt(ctx.chat.render(msgs, False, kw), ctx.chat.render(msgs, True, kw))
    return reasoning.plan(ctx.chat, fmt, gen)


class ApplyTemplate:
    """POST /apply-template {messages, ...} -> {"prompt"}: the chat template
    alone, as llama-server offers it (no generation)."""

    def __init__(self, ctx: Ctx):
        self.ctx = ctx

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        body = read_json(req, self.ctx.cfg.max_body)
        resp.media = {"prompt": render_chat(self.ctx, body, _tool_extra(self.ctx, body))}


class InputTokens:
    """POST /chat/completions/input_tokens and /v1/...: the number of tokens
    a chat request's prompt holds, without generating (llama-server's
    handle_count_tokens: the rendered prompt tokenized with BOS)."""

    def __init__(self, ctx: Ctx):
        self.ctx = ctx

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        body = read_json(req, self.ctx.cfg.max_body)
        n = len(self.ctx.vocab.tokenize(render_chat(self.ctx, body, _tool_extra(self.ctx, body)), True, True))
        resp.media = {"input_tokens": n, "object": "response.input_tokens"}


def _tool_extra(ctx: Ctx, body: dict) -> dict:
    """The template context a tool request's prompt gets (its messages polyfilled in place)."""
    if body.get("messages") is None:
        raise bad("'messages' is required")
    return toolcalls.apply(body, ctx.chat)[1]
