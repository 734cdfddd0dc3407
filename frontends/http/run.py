"""One request run to its answer, shared by every API family: the context
check, the chat path (template, tokens, parameter plan), a non-streamed run
collected to its end, a one-job run streamed or collected, and response ids.
Invariant: whoever calls ``collect`` or ``run_one`` owns the runner's close
(run_one closes it itself when it does not stream)."""
from __future__ import annotations

import secrets
import string

import falcon

from frontends.text.chat import normalize
from frontends.text.errors import exceed_context
from frontends.text.fields import get_int
from frontends.text.params import Plan, plan

from .ctx import Ctx
from .gen import ClientGone, Runner
from .job import Job
from .stream import respond

_ALNUM = string.ascii_letters + string.digits
# a random byte to a letter or digit: 256 = 4 x 62 + 8, so 8 of the 62 (a-h) come a little more often
# (1.25x); 32 of them still carry ~190 bits, and an id needs only to be unique
_BYTE_TO_ALNUM = bytes((_ALNUM * 5)[:256], "ascii")


def rand_id(prefix: str) -> str:
    """llama-server's shape (a prefix and 32 letters or digits), from one
    read of the OS's random source: 1.2 us, where a ``secrets.choice`` per
    letter took 50 us (32 reads)."""
    return prefix + secrets.token_bytes(32).translate(_BYTE_TO_ALNUM).decode("ascii")


def n_cmpl(ctx: Ctx, body: dict) -> int:
    """Completions per prompt: llama-server's ``n_cmpl``, ``n`` its alias
    (OpenAI's), 1 to the slots (server-schema.cpp), on every completion path."""
    return get_int(body, ("n_cmpl", "n"), 1, 1, ctx.n_slots)


def check_context(ctx: Ctx, pl: Plan) -> None:
    """A prompt must leave room in its slot (server-context.cpp: n_prompt >= n_ctx -> 400)."""
    n_ctx = ctx.n_ctx_slot
    for ids in pl.prompts:
        if len(ids) >= n_ctx:
            raise exceed_context(len(ids), n_ctx)


def collect(runner: Runner) -> list[Job]:
    """Run every job to its end (non-streaming); raise the first job error."""
    try:
        for _ in runner.steps():
            pass
    except ClientGone:
        return []
    for j in runner.jobs:
        if j.error is not None:
            raise j.error
    return runner.jobs


def run_one(resp: falcon.Response, runner: Runner, stream: bool, events) -> Job | None:
    """Stream ``events()`` (None), or run the one job to its end and return
    it (its error raised; None if the client went away)."""
    if stream:
        respond(resp, events(), runner)
        return None
    try:
        jobs = collect(runner)  # raises the job's error
    finally:
        runner.close()
    return jobs[0] if jobs else None


def chat_ids(ctx: Ctx, messages: list[dict]) -> list[int]:
    """Converted messages through the chat template, tokenized as a chat is."""
    return ctx.vocab.tokenize(ctx.chat.render(normalize(messages), True, {}), True, True)


def chat_plan(ctx: Ctx, body: dict, messages: list[dict]) -> Plan:
    """The chat completion path for converted messages: template, tokens,
    the parameter table's validation and the context check."""
    pl = plan(ctx, body, [chat_ids(ctx, messages)])
    check_context(ctx, pl)
    return pl
