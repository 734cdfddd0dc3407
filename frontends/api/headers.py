"""Response header names spelled as llama-server spells them.

Falcon lowercases every header name it is given (``Response.set_header``)
and gunicorn writes the names it gets, so ringserve answered
``access-control-allow-origin`` where llama-server (cpp-httplib writes what
server-http.cpp / server-context.cpp pass it) answers
``Access-Control-Allow-Origin``. HTTP names are case-insensitive, but
clients that copy the headers into a plain dict (``dict(response.headers)``,
as llama.cpp's own tools/server/tests do) then look them up by llama-server's
spelling and miss. ``Response`` is the app's response type: it writes each
name in its canonical spelling: each dash-separated word capitalised, as
httplib and llama-server write every header they send
(``Content-Type``, ``Process-Start-Time-Unix``, ``X-Accel-Buffering``),
with the few exceptions in ``SPECIAL`` (``ETag``).

Cost: one dict lookup per header per response (a name's spelling is
computed once, then cached): about 1 us per response of ~6 headers against
a request path of several hundred us (docs/PERFORMANCE.md, "Header
spelling").
"""
from __future__ import annotations

import falcon

SPECIAL = {"etag": "ETag", "www-authenticate": "WWW-Authenticate", "content-md5": "Content-MD5"}
_SPELLING: dict[str, str] = dict(SPECIAL)


def spelled(name: str) -> str:
    """A lowercased header name in llama-server's spelling."""
    s = _SPELLING.get(name)
    if s is None:
        s = "-".join(w.capitalize() for w in name.split("-"))
        if len(_SPELLING) < 512:  # names come from our code; the bound only guards a bug
            _SPELLING[name] = s
    return s


class Response(falcon.Response):
    """falcon.Response whose header names go out in llama-server's spelling."""

    def _wsgi_headers(self, media_type: str | None = None) -> list[tuple[str, str]]:
        get = _SPELLING.get
        return [(get(k) or spelled(k), v) for k, v in super()._wsgi_headers(media_type)]
