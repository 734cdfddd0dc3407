"""What gateways read: GET /v1/loads, /server_info, /model_info.

smg (the Shepherd Model Gateway) registers an HTTP worker from /health,
/v1/models (whose ``owned_by: "llamacpp"`` makes it a ``generic`` runtime),
/server_info and /model_info (SGLang's names, also under /get_*), and then
balances on /v1/loads: for a generic worker that is its only source of load,
since it never reads ``llamacpp:*`` metrics. The shapes are smg's
(crates/protocols/src/worker.rs ``WorkerLoadResponse``, and the
``ServerInfo`` / ``ModelInfo`` structs its metadata step reads; every field
optional, unknown ones ignored), with only values that are true of this
server: no SGLang field is filled with a guess. /version is deliberately not
served (smg would take the worker for vLLM).

Behind the API key like /metrics (a gateway sends its --api-key on its
probes and polls); /health stays public. /v1/loads is served whether or not
--metrics is on: a gateway depends on it.
"""
from __future__ import annotations

import datetime

import falcon

from frontends.http.ctx import Ctx

from .load import LoadReader


class Loads:
    """GET /v1/loads (any query string: smg asks ``?include=core,disagg,
    queues,memory``; every section it can parse is in the one rank)."""

    def __init__(self, ctx: Ctx, load: LoadReader):
        self.ctx, self.load = ctx, load

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        ld = self.load.read()
        usage = ld.token_usage
        resp.media = {
            "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds"),
            "dp_rank_count": 1,
            "loads": [{
                "dp_rank": 0,
                "num_running_reqs": ld.running,
                "num_waiting_reqs": ld.waiting,
                # the engine does not know a queued prompt's cached share before it takes a slot:
                # 0 = not measured (smg then estimates from num_waiting_reqs)
                "num_waiting_uncached_tokens": 0,
                "num_total_reqs": ld.running + ld.waiting,
                "num_used_tokens": ld.used_tokens,
                "max_total_num_tokens": ld.total_tokens,
                "token_usage": usage,
                "gen_throughput": ld.gen_throughput,
                "cache_hit_rate": ld.cache_hit_rate,
                "utilization": usage,
                "max_running_requests": ld.max_running,
            }],
        }


def server_info(ctx: Ctx) -> dict:
    """SGLang's /server_info fields that have a true value here. The model
    id smg resolves is ``served_model_name`` (= /v1/models' id)."""
    cfg = ctx.cfg
    return {
        "served_model_name": ctx.model,
        "model_path": ctx.vocab.path,
        "context_length": ctx.n_ctx_slot,  # a request's limit: one slot's context
        "max_total_tokens": ctx.n_slots * ctx.n_ctx_slot,
        "max_running_requests": ctx.n_slots,
        "is_embedding": bool(cfg.embeddings),
        "tp_size": 1, "dp_size": 1, "pp_size": 1,
    }


def model_info(ctx: Ctx) -> dict:
    """SGLang's /model_info fields that have a true value here. No
    ``tokenizer_path`` (the vocabulary is inside the GGUF, which no HF
    tokenizer loader reads) and no ``architectures`` (HF class names a GGUF
    does not record); ``model_type`` is the GGUF's general.architecture."""
    cfg = ctx.cfg
    return {
        "model_path": ctx.vocab.path,
        "is_generation": not cfg.embeddings,
        "model_type": ctx.vocab.arch,
        "has_image_understanding": False,
        "has_audio_understanding": False,
    }


class Info:
    """GET of a fixed description: /server_info and /get_server_info
    (``server_info``), /model_info and /get_model_info (``model_info``)."""

    def __init__(self, ctx: Ctx, describe):
        self.ctx, self.describe = ctx, describe

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.media = self.describe(self.ctx)
