"""vLLM's render endpoints: a request's prompt token ids, without generating.

llm-d's precise prefix routing (its ``token-producer`` plugin, backend
vllm) posts the client's body verbatim, and scores pods by the token ids
these return against the blocks their KV events announced
(engine/kvevents.py), so the ids must be exactly the ones the engine would
get. Both endpoints therefore run the generating endpoint's own
preparation (frontends/api/openai.py ``prepare``: every field validated,
the same 400s, the chat template with tools) and its checks (``n``, the
slot's context), and stop before the engine:

* ``POST /v1/completions/render`` -> ``[{"token_ids": [...]}, ...]``, one
  per prompt (a string, an array of strings, token ids echoed);
* ``POST /v1/chat/completions/render`` -> ``{"token_ids": [...]}``.
"""
from __future__ import annotations

import falcon

from frontends.http.ctx import Ctx, read_json

from .openai import ChatCompletions, Completions


class Render:
    """POST /v1/completions/render (``chat`` False) or /v1/chat/completions/render."""

    def __init__(self, ctx: Ctx, chat: bool):
        self.ctx, self.chat = ctx, chat

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        ctx = self.ctx
        body = read_json(req, ctx.cfg.max_body)
        api = ChatCompletions if self.chat else Completions
        pl = api.prepare(ctx, body)
        api.admit(ctx, body, pl)
        resp.media = {"token_ids": pl.prompts[0]} if self.chat else [{"token_ids": ids} for ids in pl.prompts]
