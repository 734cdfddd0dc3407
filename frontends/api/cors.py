"""CORS, as llama-server answers it (server-http.cpp pre-routing handler).

Every response gets ``Access-Control-Allow-Origin``:

* ``--cors-origins *`` (the default) with ``--cors-credentials`` (the
  default): the request's ``Origin`` is echoed back, whatever it is, so any
  page may call the server with credentials (no Origin: an empty value,
  as llama-server sends it);
* ``--cors-origins localhost``: the Origin is echoed only when its host is
  localhost, 127.0.0.1 or ::1 (any port, any scheme); otherwise no header;
* anything else: the configured value, verbatim.

An OPTIONS request to any path (routed or not) is a preflight: 200 with an
empty ``text/html`` body and the Allow-Credentials/-Methods/-Headers
headers, before the readiness and API-key gates (browsers send preflights
without credentials). This middleware is installed first, so its headers are
on every answer, the gates' 401 and 503 included.
"""
from __future__ import annotations

from urllib.parse import urlsplit

import falcon

LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})


def origin_is_localhost(origin: str) -> bool:
    try:
        return urlsplit(origin).hostname in LOCAL_HOSTS
    except ValueError:
        return False


class Cors:
    """Falcon middleware: the Allow-Origin header and the preflight answer."""

    def __init__(self, cfg):
        self.origins, self.creds = cfg.cors_origins, cfg.cors_credentials
        self.preflight = {"Access-Control-Allow-Credentials": "true" if cfg.cors_credentials else "false",
                          "Access-Control-Allow-Methods": cfg.cors_methods,
                          "Access-Control-Allow-Headers": cfg.cors_headers}

    def allow_origin(self, origin: str) -> str | None:
        """The Access-Control-Allow-Origin value for a request's Origin (None: no header)."""
        if self.creds and self.origins == "*":
            return origin
        if self.origins == "localhost":
            return origin if origin and origin_is_localhost(origin) else None
        return self.origins

    def process_request(self, req: falcon.Request, resp: falcon.Response) -> None:
        if req.method == "OPTIONS":
            resp.set_headers(self.preflight)
            resp.content_type = "text/html"
            resp.data = b""
            resp.complete = True  # no gate, no responder: a blank 200

    def process_response(self, req: falcon.Request, resp: falcon.Response, resource, req_succeeded: bool) -> None:
        allow = self.allow_origin(req.get_header("Origin") or "")
        if allow is not None:
            resp.set_header("Access-Control-Allow-Origin", allow)
