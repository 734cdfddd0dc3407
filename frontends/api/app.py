"""The worker's WSGI application.

``build(cfg, arena, w)`` assembles the Falcon app of one worker process:
the vocabulary (vocab-only load), the chat template, the worker's port on the
arena (index ``w``) and every route. gunicorn loads it after fork, through
``frontends.app:app``: that attribute is computed on first access from the
environment the master set up (RINGSERVE_CONFIG, RINGSERVE_ARENA,
RINGSERVE_WORKER; see hooks.py), so importing this module has no side effect.
"""
from __future__ import annotations

import logging
import os

import falcon
import orjson
from falcon import media

from engine import memtrace
from engine.config import Config
from ipc.arena import Arena
from ipc.client import WorkerPort

from frontends.http.ctx import Ctx
from frontends.http.stream import dumps
from frontends.text import errors
from frontends.text.chat import ChatTemplate
from frontends.text.tokenizer import Vocab

from . import webui
from .anthropic import CountTokens, Messages
from .auth import Gate
from .cors import Cors
from .embed import Embeddings, NoCompletions, Rerank
from .fleet import Info, Loads, model_info, server_info
from .headers import Response
from .infill import Infill
from .load import LoadReader
from .misc import Health, Metrics, Models, Props, Slots
from .native import Completion, Detokenize, Tokenize
from .openai import ApplyTemplate, ChatCompletions, Completions, InputTokens
from .openapi import OpenAPI
from .proxy import CorsProxy
from .render import Render
from .sleep import Wake
from .timeout import SocketTimeout
from .responses import InputTokens as ResponseTokens, Responses

log = logging.getLogger("ringserve")


def routes(app: falcon.App, ctx: Ctx) -> None:
    health, models, cmpl, chat = Health(ctx), Models(ctx), Completion(ctx), ChatCompletions(ctx)
    load, server, model = LoadReader(ctx), Info(ctx, server_info), Info(ctx, model_info)  # one load snapshot for /v1/loads and /metrics
    table = {
        "/health": health, "/v1/health": health,
        "/props": Props(ctx),
        "/models": models, "/v1/models": models,
        "/completion": cmpl, "/completions": cmpl,
        "/v1/completions": Completions(ctx),
        "/chat/completions": chat, "/v1/chat/completions": chat,
        "/chat/completions/input_tokens": InputTokens(ctx), "/v1/chat/completions/input_tokens": InputTokens(ctx),
        "/tokenize": Tokenize(ctx), "/detokenize": Detokenize(ctx), "/apply-template": ApplyTemplate(ctx),
        "/metrics": Metrics(ctx, load),
        # what gateways read (fleet.py): smg's load poll and metadata, SGLang's names
        "/v1/loads": Loads(ctx, load),
        "/server_info": server, "/get_server_info": server, "/model_info": model, "/get_model_info": model,
        "/infill": Infill(ctx),
        "/v1/responses": Responses(ctx), "/responses": Responses(ctx),
        "/v1/messages": Messages(ctx), "/v1/messages/count_tokens": CountTokens(ctx),
        "/v1/responses/input_tokens": ResponseTokens(ctx), "/responses/input_tokens": ResponseTokens(ctx),
        "/openapi.json": OpenAPI(),
        "/cors-proxy": CorsProxy(ctx),  # 403 without --ui-mcp-proxy, as llama-server's
        # vLLM's render endpoints (llm-d's precise prefix routing): the prompt's token ids, nothing generated
        "/v1/completions/render": Render(ctx, False), "/v1/chat/completions/render": Render(ctx, True),
    }
    embd, rerank = Embeddings(ctx, False), Rerank(ctx)
    table.update({"/embedding": embd, "/embeddings": embd, "/v1/embeddings": Embeddings(ctx, True),
                  "/rerank": rerank, "/reranking": rerank, "/v1/rerank": rerank, "/v1/reranking": rerank})
    if ctx.cfg.embeddings:  # llama-server's --embedding serves vectors only
        no = NoCompletions(ctx)
        for path in ("/completion", "/completions", "/v1/completions", "/chat/completions", "/v1/chat/completions",
                     "/infill", "/v1/responses", "/responses", "/v1/messages"):
            table[path] = no
    for path, res in table.items():
        app.add_route(path, head_as_get(res))
    if ctx.cfg.webui:
        webui.add_routes(app)
    if ctx.arena is not None:
        slots = head_as_get(Slots(ctx))
        app.add_route("/slots", slots)
        app.add_route("/slots/{id_slot}", slots)


def head_as_get(res):
    """``res`` answering HEAD as its GET without the body (Falcon drops it and
    keeps the length), as llama-server's httplib serves HEAD by its GET
    handlers: ``curl -I /health`` and ``wget --spider`` health checks."""
    if hasattr(res, "on_get") and not hasattr(res, "on_head"):
        res.on_head = res.on_get
    return res


def build(cfg: Config, arena: Arena | None, w: int, vocab: Vocab | None = None) -> falcon.App:
    """One worker's app. ``arena`` None (tests of pure request handling)
    makes every generation answer 503."""
    vocab = vocab or Vocab(cfg.model_path())
    chat = ChatTemplate.pick(cfg.chat_template, vocab.chat_template, vocab.bos_text, vocab.eos_text, vocab.arch,
                             vocab.add_bos)
    port = WorkerPort(arena, w) if arena is not None and 0 <= w < arena.geom.n_workers else None
    ctx = Ctx(cfg=cfg, vocab=vocab, chat=chat, arena=arena, port=port, w=w)
    app = falcon.App(middleware=[SocketTimeout(cfg), Cors(cfg), Gate(ctx), Wake(ctx)], response_type=Response)  # llama-server's header spelling
    json = media.JSONHandler(dumps=dumps, loads=orjson.loads)
    app.req_options.media_handlers[falcon.MEDIA_JSON] = json
    app.resp_options.media_handlers[falcon.MEDIA_JSON] = json
    app.req_options.strip_url_path_trailing_slash = True
    errors.install(app)
    routes(app, ctx)
    return app


def build_from_env(vocab: Vocab | None = None) -> falcon.App:
    """The app of a gunicorn worker forked by our hooks; ``vocab`` is the
    one the launcher loaded before it forked the master (frontends/process/master.py), else the worker
    loads its own (plain gunicorn)."""
    memtrace.install("worker")  # after gunicorn's worker set its signal handlers
    cfg = Config.from_env()
    inst = os.environ.get("RINGSERVE_ARENA") or cfg.arena
    w = int(os.environ.get("RINGSERVE_WORKER", "-1"))
    arena = Arena.attach(inst)
    if w < 0:
        log.error("worker %d has no arena worker index: it will answer 503", os.getpid())
    return build(cfg, arena, w, vocab)


def __getattr__(name: str):
    # `gunicorn frontends.app:app` looks the attribute up once per worker
    if name == "app":
        return build_from_env()
    raise AttributeError(name)
