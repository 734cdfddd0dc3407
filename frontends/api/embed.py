"""Embeddings and rerank: /embedding(s), /v1/embeddings, /rerank (+ aliases).

llama-server's behaviour (server-context.cpp handle_embeddings_impl,
post_rerank): without --embedding these endpoints answer 501 and with it
the completion endpoints do (routes in app.py); ``input`` (OpenAI) or
``content`` (native; it makes even /v1/embeddings answer the native shape)
is a string, token ids, ids mixed with strings, or an array of those;
``embd_normalize`` and ``encoding_format`` (float | base64) as llama-server.
/v1/embeddings with pooling none is a 400 (not OAI compatible); per-token
vectors (pooling none on /embedding) are not served here: 501.

Each input is its own engine request (engine/embed.py): leased, submitted
and read in waves of at most n_slots, the vector read from the channel's
vector area once its LAST record arrived. Rerank (pooling rank) builds each
(query, document) prompt as llama-server's format_prompt_rerank and scores
it by the first float of its vector.
"""
from __future__ import annotations

import base64
import math

import falcon
import numpy as np

from engine.setting import POOLING
from ipc.client import EngineUnavailable, NoChannel
from ipc.layout import STOP_EOS, STOP_ERROR
from ipc.params import BY_NAME

from frontends.http.ctx import Ctx, client_socket, read_json
from frontends.http.gen import POLL, refused, ClientGone, peer_gone
from frontends.text.errors import ApiError, bad, unavailable
from frontends.text.params import prompts, value

MAX_INPUTS = 2048  # inputs per request (OpenAI's limit)


def pooling(ctx: Ctx) -> str:
    """The pooling the engine runs: --pooling, rank under --reranking, else
    the GGUF's ``<arch>.pooling_type`` (none when it has none), as llama.cpp
    resolves LLAMA_POOLING_TYPE_UNSPECIFIED."""
    if ctx.cfg.pooling_type:
        return ctx.cfg.pooling_type
    v = ctx.vocab.meta(f"{ctx.vocab.arch}.pooling_type")
    try:
        return POOLING[int(v)] if v else "none"
    except (ValueError, IndexError):
        return "none"


def normalize(v: np.ndarray, norm: int) -> np.ndarray:
    """llama.cpp's common_embd_normalize, in float64 as it sums."""
    x = v.astype(np.float64)
    if norm < 0:
        s = 1.0
    elif norm == 0:
        s = float(np.max(np.abs(x))) / 32760.0 if len(x) else 0.0
    elif norm == 2:
        s = math.sqrt(float(np.dot(x, x)))
    else:
        s = float(np.sum(np.abs(x) ** norm)) ** (1.0 / norm)
    return (x * (1.0 / s if s > 0 else 0.0)).astype(np.float32)


def vectors(ctx: Ctx, req: falcon.Request, inputs: list[list[int]]) -> list[tuple[np.ndarray, int]]:
    """(vector, prompt tokens) of each input, in order; ClientGone once the
    client went away (every lease released, unfinished ones cancelled)."""
    port = ctx.port
    if port is None:
        raise unavailable("no engine port in this worker")
    for ids in inputs:
        if len(ids) >= ctx.n_ctx_slot:
            from frontends.text.errors import exceed_context

            raise exceed_context(len(ids), ctx.n_ctx_slot)
    params = ctx.cfg.sampling(cache_prompt=0)
    sock = client_socket(req)
    out: list = [None] * len(inputs)
    wave = max(1, ctx.n_slots)
    for w0 in range(0, len(inputs), wave):
        leases = []
        try:
            for i in range(w0, min(w0 + wave, len(inputs))):
                lease = port.lease()
                leases.append((i, lease))
                lease.submit(inputs[i], params)
            for i, lease in leases:
                out[i] = _read(lease, sock)
        except (EngineUnavailable, NoChannel) as e:
            raise refused(e) from None
        finally:
            for _, lease in leases:
                lease.close()  # cancels an unfinished one
    return out


def _read(lease, sock) -> tuple[np.ndarray, int]:
    while True:
        tok = lease.read(POLL)
        if tok is None:
            if peer_gone(sock):
                raise ClientGone()
            if not lease.engine_ok():
                raise unavailable("engine unavailable")
            continue
        if not tok.last:
            continue
        r = lease.channel.result[0]
        if tok.stop == STOP_EOS:
            n = int(r["n_embd"])
            return lease.channel.vector[:n].copy(), int(r["n_prompt"])
        if tok.stop == STOP_ERROR:
            code = int(r["error_code"]) or 500
            raise ApiError(code if 400 <= code < 600 else 500, r["error"].decode("utf-8", "replace") or "engine error")
        raise unavailable("request ended by the engine")


def _prompt_entries(ctx: Ctx, p) -> list[list[int]]:
    """tokenize_input_prompts' shapes: one input, or an array of inputs
    (strings, token-id arrays, mixed arrays), each with BOS as the model adds it."""
    many = isinstance(p, list) and p and not any(isinstance(e, int) and not isinstance(e, bool) for e in p)
    if many and len(p) > MAX_INPUTS:
        raise bad(f"at most {MAX_INPUTS} inputs per request")
    try:
        return [prompts(ctx.vocab, [x])[0] for x in (p if many else [p])]
    except ApiError as e:
        if e.message == "The prompt is empty":
            raise bad("Input content cannot be empty") from None
        raise


class Embeddings:
    """POST /embedding, /embeddings (native) and /v1/embeddings (``oai``)."""

    def __init__(self, ctx: Ctx, oai: bool):
        self.ctx, self.oai = ctx, oai

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        ctx = self.ctx
        if not ctx.cfg.embeddings:
            raise ApiError(501, "This server does not support embeddings. Start it with `--embeddings`")
        pool = pooling(ctx)
        if self.oai and pool == "none":
            raise bad("Pooling type 'none' is not OAI compatible. Please use a different pooling type")
        body = read_json(req, ctx.cfg.max_body)
        oai = self.oai
        if body.get("input") is not None:
            p = body["input"]
        elif "content" in body:
            oai, p = False, body["content"]  # "content" is not OAI compatible
        else:
            raise bad('"input" or "content" must be provided')
        fmt = body.get("encoding_format", "float")
        if fmt not in ("float", "base64"):
            raise bad("The format to return the embeddings in. Can be either float or base64")
        norm = value(ctx, body, BY_NAME["embd_normalize"])
        if isinstance(p, list) and not p:
            raise bad('"input" must not be empty')
        inputs = _prompt_entries(ctx, p)
        if pool == "none":
            raise ApiError(501, "per-token embeddings (pooling none) are not supported by this server: start it "
                                "with --pooling mean, cls or last")
        try:
            res = vectors(ctx, req, inputs)
        except ClientGone:
            return
        vecs = [normalize(v, norm) for v, _ in res]
        if not oai:
            resp.media = [{"index": i, "embedding": [v.tolist()]} for i, v in enumerate(vecs)]
            return
        n = sum(k for _, k in res)
        data = []
        for i, v in enumerate(vecs):
            if fmt == "base64":
                data.append({"embedding": base64.b64encode(v.astype("<f4").tobytes()).decode(), "index": i,
                             "object": "embedding", "encoding_format": "base64"})
            else:
                data.append({"embedding": v.tolist(), "index": i, "object": "embedding"})
        model = body.get("model") if isinstance(body.get("model"), str) else ctx.model
        resp.media = {"model": model, "object": "list", "usage": {"prompt_tokens": n, "total_tokens": n},
                      "data": data}


class Rerank:
    """POST /rerank, /reranking, /v1/rerank, /v1/reranking (Jina shape; TEI with ``texts``)."""

    def __init__(self, ctx: Ctx):
        self.ctx = ctx

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        ctx = self.ctx
        if not ctx.cfg.embeddings or pooling(ctx) != "rank":
            raise ApiError(501, "This server does not support reranking. Start it with `--reranking`")
        body = read_json(req, ctx.cfg.max_body)
        tei = "texts" in body
        query = body.get("query")
        if query is None:
            raise bad('"query" must be provided')
        if not isinstance(query, str):
            raise bad('"query" must be a string')
        docs = body.get("documents", body.get("texts"))
        if not isinstance(docs, list) or not docs or not all(isinstance(d, str) for d in docs):
            raise bad('"documents" must be a non-empty string array')
        if len(docs) > MAX_INPUTS:
            raise bad(f"at most {MAX_INPUTS} documents per request")
        top_n = value(ctx, body, BY_NAME["top_n"])
        return_text = tei and body.get("return_text") is True
        try:
            res = vectors(ctx, req, [self.prompt(query, d) for d in docs])
        except ClientGone:
            return
        key = "score" if tei else "relevance_score"
        items = [{"index": i, key: float(v[0]) if len(v) else -1e6} for i, (v, _) in enumerate(res)]
        if return_text:
            for it in items:
                it["text"] = docs[it["index"]]
        items.sort(key=lambda it: -it[key])
        items = items[:top_n]
        if tei:
            resp.media = items
            return
        n = sum(k for _, k in res)
        model = body.get("model") if isinstance(body.get("model"), str) else ctx.model
        resp.media = {"model": model, "object": "list", "usage": {"prompt_tokens": n, "total_tokens": n},
                      "results": items}

    def prompt(self, query: str, doc: str) -> list[int]:
        """format_prompt_rerank: the GGUF's "rerank" template, else
        [BOS] query [EOS] [SEP] doc [EOS] as the vocabulary adds them."""
        v = self.ctx.vocab
        tmpl = v.meta("tokenizer.chat_template.rerank")
        if tmpl:
            return v.tokenize(tmpl.replace("{query}", query).replace("{document}", doc), False, True)
        core = v.core
        import llama_cpp as L

        eos = v.eos if v.eos >= 0 else L.llama_vocab_sep(core.vocab)
        out = [v.bos] if v.add_bos else []
        out += v.tokenize(query, False, False)
        if core.add_eos:
            out.append(eos)
        if L.llama_vocab_get_add_sep(core.vocab):
            out.append(L.llama_vocab_sep(core.vocab))
        out += v.tokenize(doc, False, False)
        if core.add_eos:
            out.append(eos)
        return out


class NoCompletions:
    """The generation routes of a server started with --embedding."""

    def __init__(self, ctx: Ctx):
        self.ctx = ctx

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        raise ApiError(501, "This server does not support completions. Start it without `--embeddings`")
