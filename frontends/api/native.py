"""llama-server's native endpoints: /completion(s), /tokenize, /detokenize."""
from __future__ import annotations

from typing import Iterator

import falcon

from frontends.http.ctx import Ctx, client_socket, read_json
from frontends.http.gen import Runner
from frontends.http.job import PING, Job
from frontends.http.run import check_context, collect, n_cmpl
from frontends.http.stream import PING_SSE, respond, sse
from frontends.text.errors import bad
from frontends.text.fields import get_bool
from frontends.text.params import Plan, plan, probs_alias, prompts


def final(ctx: Ctx, pl: Plan, job: Job, stream: bool, fields: list[str] | None = None) -> dict:
    """llama-server's final /completion object (server-task.cpp to_json_non_oaicompat),
    only ``fields`` of it when the request names some (response_fields)."""
    text = job.detok.text
    out = {
        "index": job.index,
        "content": "" if stream else text,
        "tokens": job.tokens if (pl.return_tokens and not stream) else [],
        "id_slot": int(job.result.get("id_slot", -1)),
        "stop": True,
        "model": ctx.model,
        "tokens_predicted": len(job.tokens),
        "tokens_evaluated": job.n_prompt,
        "generation_settings": pl.settings,
        "prompt": ctx.vocab.detokenize(job.prompt),
        "has_new_line": "\n" in text,
        "truncated": job.truncated,
        "stop_type": job.stop_type,
        "stopping_word": job.word,
        "tokens_cached": int(job.result.get("n_ctx_used", 0)),
        "timings": job.timings(),
    }
    if not stream and job.probs:
        out["completion_probabilities"] = job.whole_probs(ctx.vocab)
    return picked(out, fields) if fields else out


def response_fields(body: dict) -> list[str]:
    """The request's ``response_fields`` (llama.vim asks for a few keys of the
    final object); anything but a list of strings is ignored, as
    llama-server's json_value falls back to its default."""
    v = body.get("response_fields")
    if isinstance(v, list) and all(isinstance(x, str) for x in v):
        return v
    return []


def picked(obj: dict, paths: list[str]) -> dict:
    """llama-server's json_get_nested_values: each "a/b" path that exists,
    under its whole path as the key."""
    out = {}
    for path in paths:
        cur, ok = obj, True
        for k in path.split("/"):
            if isinstance(cur, dict) and k in cur:
                cur = cur[k]
            else:
                ok = False
                break
        if ok:
            out[path] = cur
    return out


def partial(job: Job, text: str, token: int | None, probs: dict | None, pl: Plan | None = None,
            progress: dict | None = None) -> dict:
    """A streamed /completion event; a prompt_progress one has llama-server's
    empty content and token 0 (its default token output)."""
    out = {
        "index": job.index,
        "content": text,
        "tokens": [0] if progress is not None else [token] if token is not None and token >= 0 else [],
        "stop": False,
        "id_slot": -1,
        "tokens_predicted": len(job.tokens),
        "tokens_evaluated": len(job.prompt),
    }
    if pl is not None and pl.per_token:
        out["timings"] = job.live_timings()
    if progress is not None:
        out["prompt_progress"] = progress
    if probs is not None:
        out["completion_probabilities"] = [probs]
    return out


def native_events(ctx: Ctx, pl: Plan, runner: Runner, fields: list[str] | None = None) -> Iterator[bytes]:
    for st in runner.steps():
        if st is PING:  # silence past sse_ping_interval (gen.Runner.steps)
            yield PING_SSE
            continue
        j = st.job
        if st.progress is not None:
            if pl.progress:
                yield sse(partial(j, "", None, None, pl, st.progress))
            continue
        if not st.final:
            yield sse(partial(j, st.text, st.token, st.probs, pl))
            continue
        if j.error is not None:
            raise j.error
        if st.text:  # text held back for a stop string that never completed
            yield sse(partial(j, st.text, None, None, pl))
        yield sse(final(ctx, pl, j, True, fields))


class Completion:
    """POST /completion and /completions."""

    def __init__(self, ctx: Ctx):
        self.ctx = ctx

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        ctx = self.ctx
        body = read_json(req, ctx.cfg.max_body)
        self.complete(req, resp, body, prompts(ctx.vocab, body.get("prompt")))

    def complete(self, req: falcon.Request, resp: falcon.Response, body: dict, ids: list[list[int]]) -> None:
        """Run validated prompt ids with the body's sampling fields (also /infill's)."""
        ctx = self.ctx
        probs_alias(body)
        pl = plan(ctx, body, ids)
        copies = n_cmpl(ctx, body)
        check_context(ctx, pl)
        runner = Runner(ctx, pl, client_socket(req)).start(copies=copies)
        fields = response_fields(body)
        if pl.stream:
            respond(resp, native_events(ctx, pl, runner, fields), runner)
            return
        try:
            jobs = collect(runner)
        finally:
            runner.close()
        res = [final(ctx, pl, j, False, fields) for j in jobs]
        resp.media = res[0] if len(res) == 1 else res


class Tokenize:
    """POST /tokenize {content, add_special=false, parse_special=true, with_pieces=false}."""

    def __init__(self, ctx: Ctx):
        self.ctx = ctx

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        vocab = self.ctx.vocab
        body = read_json(req, self.ctx.cfg.max_body)
        content = body.get("content")
        if content is None:
            content = ""
        if not isinstance(content, str):
            raise bad("Field 'content': expected a string")
        ids = vocab.tokenize(content, get_bool(body, "add_special", False), get_bool(body, "parse_special", True))
        if not get_bool(body, "with_pieces", False):
            resp.media = {"tokens": ids}
            return
        out = []
        for t in ids:
            b = vocab.piece(t, True)
            try:
                piece = b.decode("utf-8")
            except UnicodeDecodeError:
                piece = list(b)  # not valid UTF-8 on its own: the bytes
            out.append({"id": t, "piece": piece})
        resp.media = {"tokens": out}


class Detokenize:
    """POST /detokenize {tokens} -> {content}."""

    def __init__(self, ctx: Ctx):
        self.ctx = ctx

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        vocab = self.ctx.vocab
        body = read_json(req, self.ctx.cfg.max_body)
        toks = body.get("tokens")
        if toks is None:
            toks = []
        if not isinstance(toks, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in toks):
            raise bad("Field 'tokens': expected an array of token ids")
        for t in toks:
            if not vocab.valid(t):
                raise bad(f"token id {t} out of range 0..{vocab.n_vocab - 1}")
        resp.media = {"content": vocab.detokenize(toks)}
