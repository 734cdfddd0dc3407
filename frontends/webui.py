"""The chat page at ``/`` (llama-server's web UI; ``--no-webui`` turns it off).

The page is three small static files shipped inside this package
(``frontends/webui/``, setup.cfg ``package_data``): nothing is built at
install time and nothing is fetched at run time. Each worker reads them once
when it builds its app and serves them from memory with an ETag
(``Cache-Control: no-cache``: a browser revalidates and gets a 304, so a new
ringserve version is picked up on the next load).

As in llama-server, the page's own paths need neither a ready engine nor an
API key (``PATHS``, used by auth.Gate): the page must load to show "loading"
or to ask for the key. Everything else it does goes through the API.

Safety: the page renders model output with DOM nodes and ``textContent``
only; the Content-Security-Policy below is a second wall (no inline script,
no foreign origin), not the first.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib import resources

import falcon

# URL path -> file in frontends/webui/
FILES = {"/": "index.html", "/index.html": "index.html", "/app.js": "app.js", "/md.js": "md.js",
         "/app.css": "app.css"}
PATHS = frozenset(FILES)
TYPES = {"html": "text/html; charset=utf-8", "js": "text/javascript; charset=utf-8", "css": "text/css; charset=utf-8"}
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


@dataclass(frozen=True)
class Asset:
    body: bytes
    ctype: str
    etag: str


def load() -> dict[str, Asset]:
    """Every served path's bytes, read from the installed package."""
    root = resources.files("frontends") / "webui"
    cache: dict[str, Asset] = {}
    out = {}
    for path, name in FILES.items():
        if name not in cache:
            body = (root / name).read_bytes()
            cache[name] = Asset(body, TYPES[name.rsplit(".", 1)[1]], '"' + hashlib.sha1(body).hexdigest()[:16] + '"')
        out[path] = cache[name]
    return out


def total_bytes() -> int:
    """The page and its assets, each file once (the issue's < 100 kB budget)."""
    root = resources.files("frontends") / "webui"
    return sum(len((root / n).read_bytes()) for n in set(FILES.values()))


class Static:
    """GET/HEAD of the page's files, from memory."""

    def __init__(self, assets: dict[str, Asset]):
        self.assets = assets

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        a = self.assets[req.path]
        resp.set_header("ETag", a.etag)
        resp.set_header("Cache-Control", "no-cache")
        resp.set_header("X-Content-Type-Options", "nosniff")
        resp.content_type = a.ctype
        if a.ctype.startswith("text/html"):
            resp.set_header("Content-Security-Policy", CSP)
            resp.set_header("Referrer-Policy", "no-referrer")
        inm = req.get_header("If-None-Match") or ""
        if a.etag in (t.strip().removeprefix("W/") for t in inm.split(",")):
            resp.status = falcon.HTTP_304
            return
        resp.data = a.body

    def on_head(self, req: falcon.Request, resp: falcon.Response) -> None:
        self.on_get(req, resp)
        resp.data = None
        resp.content_length = len(self.assets[req.path].body)


def add_routes(app: falcon.App) -> None:
    res = Static(load())
    for path in FILES:
        app.add_route(path, res)
