"""Read-mostly endpoints: /health, /props, /models, /slots, /metrics."""
from __future__ import annotations

import os
import time

import falcon
import numpy as np

from ipc.chain import NAMES, PEEK, order_of
from ipc.layout import PARAMS, SLOT_GEN, SLOT_IDLE, chan_layout
from ipc.params import SLOT

from frontends.http.ctx import Ctx
from frontends.text.errors import ApiError, bad

from . import metrics
from .sleep import sleeping
from .slotfile import save_restore


def draining(ctx: Ctx) -> bool:
    """The launcher got SIGTERM: in-flight requests finish, balancers must
    look elsewhere (the listeners close as the workers stop)."""
    return ctx.arena is not None and bool(ctx.arena.get("draining"))


def saturated(ctx: Ctx, rows: np.ndarray | None = None) -> bool:
    """No slot is idle and at least ``queue_fail_depth`` requests wait for
    one (depth 0: as soon as no slot is idle, llama-server's fail_on_no_slot).
    Why a depth: when every instance is busy, failing at the first busy slot
    takes them all out of a readiness-probed pool; a short queue is often
    the better answer, and the operator knows which."""
    rows = ctx.arena.slots if rows is None else rows
    if np.any(rows["state"] == SLOT_IDLE):
        return False
    return ctx.arena.count("requests_deferred") >= ctx.cfg.queue_fail_depth


def check_available(ctx: Ctx, req: falcon.Request, rows: np.ndarray | None = None) -> None:
    """The balancer's question "can you take a request now?": 503 while
    draining, and with ``fail_on_no_slot`` when saturated."""
    if draining(ctx):
        raise ApiError(503, "Server is shutting down")
    if req.get_param("fail_on_no_slot") and saturated(ctx, rows):  # any value, as llama-server
        raise ApiError(503, "no slot available")


class Health:
    """GET /health: the gate already answered 503 while loading."""

    def __init__(self, ctx: Ctx):
        self.ctx = ctx

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        check_available(self.ctx, req)
        resp.media = {"status": "ok"}


def default_params(ctx: Ctx) -> dict:
    from frontends.text.params import plan

    pl = plan(ctx, {}, [[0]])
    return pl.settings


class Props:
    """GET /props (server-context.cpp get_res_props)."""

    def __init__(self, ctx: Ctx):
        self.ctx = ctx

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        ctx, v = self.ctx, self.ctx.vocab
        resp.media = {
            "default_generation_settings": {"params": default_params(ctx), "n_ctx": ctx.n_ctx_slot},
            "total_slots": ctx.n_slots,
            "model_alias": ctx.model,
            "model_ftype": v.ftype,
            "model_path": v.path,
            "modalities": {"vision": False, "video": False, "audio": False},
            "media_marker": "<__media__>",
            "endpoint_slots": ctx.cfg.slots,
            "endpoint_props": ctx.cfg.props,
            "endpoint_metrics": ctx.cfg.metrics,
            "ui": ctx.cfg.webui,
            "ui_settings": {},
            "chat_template": ctx.chat.source,
            "chat_template_caps": {},
            "bos_token": v.bos_text,
            "eos_token": v.eos_text,
            "build_info": "b0-ringserve",
            "is_sleeping": sleeping(ctx),  # --sleep-idle-seconds (frontends/api/sleep.py)
            "cors_proxy_enabled": ctx.cfg.ui_mcp_proxy,
            # ringserve's own: the engine's KV cache as -ctk/-ctv made it (llama-server logs it only)
            "kv_cache": {"type_k": ctx.cfg.cache_type_k, "type_v": ctx.cfg.cache_type_v,
                         "bytes": int(ctx.arena.get("kv_bytes")) if ctx.arena is not None else 0},
        }

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        """server-context.cpp post_props: with --props it changes nothing yet
        and says so with success; without, not_supported (501)."""
        if not self.ctx.cfg.props:
            raise ApiError(501, "This server does not support changing global properties. Start it with `--props`")
        resp.media = {"success": True}


class Models:
    """GET /models and /v1/models (ollama-style list plus OpenAI's data)."""

    def __init__(self, ctx: Ctx):
        self.ctx = ctx

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        ctx, v, name = self.ctx, self.ctx.vocab, self.ctx.model
        details = {"parent_model": "", "format": "gguf", "family": "", "families": [""],
                   "parameter_size": "", "quantization_level": ""}
        resp.media = {
            "models": [{"name": name, "model": name, "modified_at": "", "size": "", "digest": "", "type": "model",
                        "description": "", "tags": [""], "capabilities": ["completion"], "parameters": "",
                        "details": details}],
            "object": "list",
            "data": [{"id": name, "aliases": ctx.aliases, "tags": ctx.tags, "object": "model", "created": int(time.time()),
                      "owned_by": "llamacpp",  # llama-server's; smg takes it for a generic runtime (fleet.py)
                      "root": v.path, "max_model_len": ctx.n_ctx_slot,  # vLLM's fields: smg's model path and context
                      "meta": {"vocab_type": v.vocab_type, "n_vocab": v.n_vocab, "n_ctx": ctx.n_ctx_slot,
                               "n_ctx_train": v.n_ctx_train, "n_embd": v.n_embd, "n_params": v.n_params, "size": v.size,
                               "ftype": v.ftype}}],
        }


class Slots:
    """GET /slots and POST /slots/{id}?action=erase|save|restore; 501 with --no-slots."""

    def __init__(self, ctx: Ctx):
        self.ctx = ctx
        a = ctx.arena
        g = a.geom
        lay = chan_layout(g.max_prompt, g.ring_cap)
        # every channel's parameter area, to show a busy slot's request params
        self.params = np.ndarray((g.n_channels,), PARAMS, buffer=a.segs["ch"].buf, offset=lay["params"],
                                 strides=(g.chan_size(),))
        # and the start of every grammar area: a request's own sampler order rides there (ipc/chain.py)
        self.heads = np.ndarray((g.n_channels, PEEK), np.uint8, buffer=a.segs["ch"].buf,
                                offset=lay["grammar"], strides=(g.chan_size(), 1))
        self.defaults = np.zeros(1, PARAMS)[0]
        self.speculative = ctx.spec_types != ["none"] and not ctx.cfg.embedding
        for k, v in ctx.cfg.sampling().items():
            if k in PARAMS.names:
                self.defaults[k] = v

    def _enabled(self) -> None:
        if not self.ctx.cfg.slots:
            raise ApiError(501, "This server does not support slots endpoint. Start it with `--slots`")

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        self._enabled()
        ctx = self.ctx
        rows = ctx.arena.slots.copy()
        if req.get_param("fail_on_no_slot"):  # plain /slots stays a monitoring view, draining or not
            check_available(ctx, req, rows)
        resp.media = [self._slot(i, r) for i, r in enumerate(rows)]

    def _slot(self, i: int, r) -> dict:
        busy = int(r["state"]) != SLOT_IDLE
        # llama-server's can_speculate(): a drafter is configured (no embedding server runs one)
        out = {"id": i, "n_ctx": self.ctx.n_ctx_slot, "speculative": self.speculative, "is_processing": busy}
        if int(r["id_task"]) <= 0 and not busy:  # never used: llama-server's four fields
            return out
        ch = int(r["channel"])
        # a used idle slot keeps its last task's counts; its channel (and the
        # params in it) went to the next lessee, so show the server's defaults
        p = self.params[ch].copy() if busy and 0 <= ch < len(self.params) else self.defaults
        # an idle slot shows no budget: the finished task's must not leak into it (llama-server's rule)
        n_predict = int(r["n_predict"]) if busy else -1
        n_dec = int(r["n_decoded"]) if busy else 0
        out.update({
            "id_task": int(r["id_task"]),
            "n_prompt_tokens": int(r["n_prompt"]),
            "n_prompt_tokens_processed": max(int(r["n_prompt"]) - int(r["n_cache"]), 0),
            "n_prompt_tokens_cache": int(r["n_cache"]),
            "params": {**{row.name: round(float(p[row.name]), 6) if row.kind is float else p[row.name].item()
                          for row in SLOT}, "samplers": self._samplers(ch if busy else -1, int(p["n_grammar"]))},
            "next_token": [{"has_next_token": int(r["state"]) == SLOT_GEN, "has_new_line": False,
                            "n_remain": (n_predict - n_dec) if n_predict >= 0 else -1, "n_decoded": n_dec}],
        })
        return out

    def _samplers(self, ch: int, n: int) -> list[str]:
        """The sampler order a busy slot's request runs (its chain header, within
        the ``n`` bytes it wrote: an earlier request's header may lie past them),
        else the server's."""
        order = None
        if 0 <= ch < len(self.heads):  # a read racing the next lessee's write: best effort, as the params
            order = order_of(self.heads[ch][:max(0, n)].tobytes())
        return [NAMES[c] for c in (self.ctx.cfg.samplers if order is None else order)]

    def on_post(self, req: falcon.Request, resp: falcon.Response, id_slot: str) -> None:
        self._enabled()
        try:
            sid = int(id_slot)
        except ValueError:
            raise bad("Invalid slot ID") from None
        action = req.get_param("action") or ""
        if action in ("save", "restore"):
            return save_restore(self.ctx, req, resp, sid, action)
        if action != "erase":
            raise bad("Invalid action")
        ctx = self.ctx
        sid %= ctx.n_slots
        n = int(ctx.arena.slots[sid]["n_past"])
        ctx.port.erase_slot(sid)
        resp.media = {"id_slot": sid, "n_erased": n}


class Metrics:
    """GET /metrics (Prometheus text 0.0.4); 501 without --metrics."""

    def __init__(self, ctx: Ctx, load):
        self.ctx = ctx
        self.reg = (metrics.registry(ctx.arena, load, ctx.model, lambda: ctx.port.w if ctx.port is not None else None)
                    if ctx.arena is not None else None)
        self._start = 0

    def start_unix(self) -> int:
        """Process-Start-Time-Unix: when the server (the launcher, whose
        /proc start time the control block records) started, in Unix
        seconds: boot time + start ticks / CLK_TCK; this worker's start
        where /proc cannot tell."""
        if not self._start:
            try:
                ticks = int(self.ctx.arena.get("launcher_start"))
                with open("/proc/stat") as f:
                    btime = next(int(ln.split()[1]) for ln in f if ln.startswith("btime"))
                self._start = btime + ticks // os.sysconf("SC_CLK_TCK") if ticks else int(self.ctx.started)
            except (OSError, StopIteration, ValueError):
                self._start = int(self.ctx.started)
        return self._start

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        if not self.ctx.cfg.metrics or self.reg is None:
            raise ApiError(501, "This server does not support metrics endpoint. Start it with `--metrics`")
        resp.content_type = metrics.CONTENT_TYPE
        resp.set_header("Process-Start-Time-Unix", str(self.start_unix()))
        resp.data = metrics.render(self.reg)
