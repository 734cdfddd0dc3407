"""The chat page at ``/`` (llama-server's web UI; ``--no-webui`` turns it off).

The page's sources are three small static files shipped inside this package
(``frontends/api/webui/``: index.html, app.css, md.js, app.js; setup.cfg
``package_data``): nothing is built at install time and nothing is fetched
at run time. Each worker reads them once when it builds its app and inlines
the stylesheet and scripts into index.html, so a browser loads the page in
one response (three more round trips cost a cold load 20-50 ms here). It is
served from memory with an ETag and ``Cache-Control: no-cache``: a browser
revalidates, gets a 304, and picks up a new ringserve version on its next
load.

As in llama-server, the page's paths need neither a ready engine nor an API
key (``PATHS``, used by auth.Gate): the page must load to show "loading" or
to ask for the key. Everything else it does goes through the API.

Safety: the page renders model output with DOM nodes and ``textContent``
only. The Content-Security-Policy is a second wall, not the first: scripts
and styles run only if their SHA-256 is listed (the inlined ones), nothing
from another origin, no eval.
"""
from __future__ import annotations

import base64
import hashlib
import re
from dataclasses import dataclass
from importlib import resources

import falcon

PATHS = frozenset({"/", "/index.html"})
SOURCES = ("index.html", "app.css", "md.js", "app.js")
_TAG = re.compile(r'<link rel="stylesheet" href="([\w.]+)">|<script src="([\w.]+)"></script>')


@dataclass(frozen=True)
class Page:
    body: bytes
    etag: str
    csp: str


def _sha(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


def build_page() -> Page:
    """index.html with its stylesheet and scripts inlined, and the CSP that
    admits exactly those."""
    root = resources.files("frontends.api") / "webui"
    scripts, styles = [], []

    def inline(m: re.Match) -> str:
        css, js = m.group(1), m.group(2)
        text = (root / (css or js)).read_text(encoding="utf-8")
        # an inlined file must not be able to end its own element early
        assert "</script" not in text.lower() and "</style" not in text.lower() and "<!--" not in text, css or js
        (styles if css else scripts).append(_sha(text))
        return f"<style>{text}</style>" if css else f"<script>{text}</script>"

    html = _TAG.sub(inline, (root / "index.html").read_text(encoding="utf-8"))
    csp = (f"default-src 'none'; script-src {' '.join(scripts)}; style-src {' '.join(styles)}; img-src data:; "
           "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
    body = html.encode()
    return Page(body, '"' + hashlib.sha1(body).hexdigest()[:16] + '"', csp)


class Static:
    """GET/HEAD of the page, from memory."""

    def __init__(self, page: Page):
        self.page = page

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        p = self.page
        resp.set_header("ETag", p.etag)
        resp.set_header("Cache-Control", "no-cache")
        resp.set_header("X-Content-Type-Options", "nosniff")
        resp.set_header("Content-Security-Policy", p.csp)
        resp.set_header("Referrer-Policy", "no-referrer")
        resp.content_type = "text/html; charset=utf-8"
        inm = req.get_header("If-None-Match") or ""
        if p.etag in (t.strip().removeprefix("W/") for t in inm.split(",")):
            resp.status = falcon.HTTP_304
            return
        resp.data = p.body

    def on_head(self, req: falcon.Request, resp: falcon.Response) -> None:
        self.on_get(req, resp)
        resp.data = None
        resp.content_length = len(self.page.body)


def add_routes(app: falcon.App) -> None:
    res = Static(build_page())
    for path in PATHS:
        app.add_route(path, res)
