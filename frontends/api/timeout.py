"""llama-server's read/write timeout (``-to``/``--timeout``, default 600 s)
on every connection.

Why: gunicorn's gthread worker hands a request's socket to its thread in
blocking mode with no timeout, so a client that stops reading (a paused
process, a partition without a FIN) left that thread in ``sendall`` for as
long as it stayed, and with it whatever the response still held (a stream's
leases: a worker holding a lease cannot register with a restarted engine).
llama-server's httplib bounds each socket read and write by ``-to``; here
the socket gets the same bound when the request starts, so a write that
makes no progress for that long raises, gunicorn closes the connection and
the body's ``close()`` releases everything. gunicorn resets the socket to
blocking for the next request on a kept-alive connection (gthread's
``setblocking(True)``), so each request sets it again.
"""
from __future__ import annotations

import falcon

from frontends.http.ctx import client_socket


class SocketTimeout:
    """Falcon middleware: the request's socket reads and writes time out after ``cfg.timeout`` s."""

    def __init__(self, cfg) -> None:
        self.t = float(cfg.timeout) if cfg.timeout > 0 else None

    def process_request(self, req: falcon.Request, resp: falcon.Response) -> None:
        sock = client_socket(req)
        if sock is not None and self.t is not None:
            try:
                sock.settimeout(self.t)
            except OSError:
                pass
