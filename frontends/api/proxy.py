"""GET/POST /cors-proxy: llama-server's CORS proxy for the web UI's MCP
clients (server.cpp, server-cors-proxy.h; EXPERIMENTAL there too).

Off by default: every call answers 403 ``feature_disabled``, as
llama-server's ``res_403``. With ``--ui-mcp-proxy`` the request goes to
``?url=`` (http or https, no password in it) with only the headers the
caller named ``X-Llama-Server-Proxy-Header-<name>`` (prefix removed; never
its own Authorization, cookies or API key) and, for POST, its body;
redirects are followed; the answer comes back with its status, content type
and headers, less the hop-by-hop ones and the target's CORS headers (ours
are added by cors.py), streamed as it arrives. A bad URL answers 500
``server_error`` with the reason, as llama-server's exception wrapper does.

The API-key gate applies (the path is not public). Anyone holding a key may
make the server fetch any URL it can reach: llama-server's warning stands,
enable it only where that is wanted.
"""
from __future__ import annotations

import urllib.error
import urllib.request
from urllib.parse import urlsplit

import falcon

from frontends.text.errors import ApiError

PREFIX = "x-llama-server-proxy-header-"
NOT_FORWARDED = frozenset({"accept-encoding", "transfer-encoding", "content-length", "host"})
STRIPPED = frozenset({"server", "transfer-encoding", "content-length", "keep-alive", "connection", "date"})
TIMEOUT_S = 600.0  # llama-server's read and write timeouts
CHUNK = 64 * 1024


class _NoErrors(urllib.request.HTTPErrorProcessor):
    """Every status is an answer to pass on, not an exception."""

    def http_response(self, request, response):
        return response

    https_response = http_response


_OPENER = urllib.request.build_opener(_NoErrors)


def target(url: str) -> str:
    """The URL to fetch, checked as server-cors-proxy.h checks it."""
    try:
        u = urlsplit(url)
        host = u.hostname
    except ValueError as e:
        raise ApiError(500, f"invalid target URL: {e}") from None
    if not host:
        raise ApiError(500, "invalid target URL: missing host")
    if u.password:
        raise ApiError(500, "authentication in target URL is not supported")
    if u.scheme not in ("http", "https"):
        raise ApiError(500, f"unsupported URL scheme in target URL: {u.scheme}")
    return url if u.path else u._replace(path="/").geturl()


def forwarded(headers: dict[str, str]) -> dict[str, str]:
    """The caller's explicit proxy headers, their prefix removed."""
    out = {}
    for k, v in headers.items():
        low = k.lower()
        if low.startswith(PREFIX) and len(low) > len(PREFIX):
            name = k[len(PREFIX):].title()  # WSGI upper-cased it; HTTP names are case-insensitive
            if name.lower() not in NOT_FORWARDED:
                out[name] = v
    return out


class CorsProxy:
    def __init__(self, ctx):
        self.on = bool(getattr(ctx.cfg, "ui_mcp_proxy", False))

    def _proxy(self, req: falcon.Request, resp: falcon.Response, method: str) -> None:
        if not self.on:
            resp.status = 403
            resp.media = {"error": {"message": "this feature is disabled", "type": "feature_disabled"}}
            return
        url = target(req.get_param("url") or "")
        body = req.bounded_stream.read() if method == "POST" else None
        r = urllib.request.Request(url, data=body, method=method, headers=forwarded(req.headers))
        try:
            up = _OPENER.open(r, timeout=TIMEOUT_S)
        except (urllib.error.URLError, OSError, ValueError) as e:
            raise ApiError(500, f"proxy request to {url} failed: {getattr(e, 'reason', e)}") from None
        resp.status = up.status
        for k, v in up.headers.items():
            low = k.lower()
            if low == "content-type":
                resp.content_type = v
            elif low not in STRIPPED and not low.startswith("access-control-"):
                resp.append_header(k, v)
        if up.status in (204, 304):
            up.close()
            return

        def chunks():
            try:
                while True:
                    b = up.read1(CHUNK)
                    if not b:
                        return
                    yield b
            finally:
                up.close()

        resp.stream = chunks()

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        self._proxy(req, resp, "GET")

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        self._proxy(req, resp, "POST")
