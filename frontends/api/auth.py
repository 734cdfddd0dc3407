"""Request gates, in llama-server's order: engine state, then API key.

While the engine is not ready every path but the OpenAPI description and the
chat page's files answers 503 "Loading model" (server-http.cpp
middleware_server_state). With keys configured, every path but /health,
/v1/health and the chat page's files (the OpenAPI description too) needs
``Authorization: Bearer K`` or ``X-Api-Key: K``; OPTIONS is exempt (browsers send preflights
without credentials). Keys are compared with hmac.compare_digest against
every configured key, so timing reveals neither which key nor how much of it
matched.
"""
from __future__ import annotations

import hmac

import falcon

from frontends.text.errors import ApiError

from .webui import PATHS as PAGE

PUBLIC = frozenset({"/health", "/v1/health"})
ALWAYS = frozenset({"/openapi.json"})


def key_ok(given: str, keys: list[bytes]) -> bool:
    g = given.encode("utf-8", "surrogateescape")
    ok = False
    for k in keys:
        ok |= hmac.compare_digest(g, k)
    return ok


class Gate:
    """Falcon middleware: readiness, then authentication."""

    def __init__(self, ctx):
        self.ctx = ctx
        self.keys = [k.encode() for k in ctx.cfg.api_keys if k]
        page = PAGE if ctx.cfg.webui else frozenset()
        self.always = ALWAYS | page  # served before the engine is ready
        self.public = PUBLIC | page  # served without a key

    def process_request(self, req: falcon.Request, resp: falcon.Response) -> None:
        if req.method == "OPTIONS":
            return
        if req.path not in self.always and not self.ctx.ready():
            raise self.ctx.not_ready()
        if not self.keys or req.path in self.public:
            return
        given = req.get_header("Authorization") or req.get_header("X-Api-Key") or ""
        if given.startswith("Bearer "):
            given = given[7:]
        if not key_ok(given, self.keys):
            raise ApiError(401, "Invalid API Key")
