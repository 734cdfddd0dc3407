"""Server-sent events written by hand (Falcon's SSE helpers are ASGI-only).

Framing is llama-server's: ``data: <json>\\n\\n`` per event, OpenAI endpoints
end with ``data: [DONE]\\n\\n``, an error after the headers went out is one
``data: {"error": ...}`` event and the end of the body; a stream silent past
its ``sse_ping_interval`` after its first event gets ``PING_SSE`` comments,
as llama-server's (every SSE parser skips them). ``SSEBody`` is the
WSGI body: gunicorn calls its ``close()`` in a ``finally`` (also when the
client vanished mid-write), and that releases every lease of the request.
"""
from __future__ import annotations

import itertools
import logging
import socket
from typing import Iterator

import falcon
import orjson

from frontends.text.errors import ApiError

from .gen import ClientGone, Runner

log = logging.getLogger("ringserve")

DONE = b"data: [DONE]\n\n"
PING_SSE = b":\n\n"  # llama-server's keep-alive: an SSE comment, for a gen.PING step
# Send buffer of a streaming response (the kernel doubles it). Linux would
# autotune it up to tcp_wmem's 4 MiB, so a client that never reads would
# have its whole answer generated into kernel memory. On TCP the runner
# stops reading its rings first (gen.HOLD_UNSENT, 2 KiB unsent); this bound
# is what stops it where unsent bytes cannot be read (a unix socket): the
# worker's write blocks after ~16 KiB, its reader stops, the ring fills and
# the engine pauses that one slot (then cancels it after stall_timeout).
# 16 KiB in flight is far more than a token stream needs at any round-trip time.
STREAM_SNDBUF = 8192


def dumps(obj) -> bytes:
    """JSON bytes of a response (orjson; also the app's media handler). A
    str holding a lone surrogate, which JSON text may escape (a model's
    own "\\ud800" in a tool call's JSON, decoded by the parsers) and UTF-8
    cannot carry, goes out as U+FFFD, as invalid UTF-8 does in generated
    text; orjson refused it, a 500."""
    try:
        return orjson.dumps(obj)
    except TypeError:  # anything else unserializable raises again below
        return orjson.dumps(_mend(obj))


def _mend(o):
    if isinstance(o, str):
        return o.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    if isinstance(o, dict):
        return {_mend(k): _mend(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_mend(v) for v in o]
    return o


def sse(obj) -> bytes:
    return b"data: " + dumps(obj) + b"\n\n"


def event(name: str, data: dict) -> bytes:
    """One named SSE event (llama-server's format_oai_resp_sse / format_anthropic_sse)."""
    return b"event: " + name.encode() + b"\ndata: " + dumps(data) + b"\n\n"


class SSEBody:
    """An iterable body that always releases its runner on close."""

    def __init__(self, events: Iterator[bytes], runner: Runner):
        self._it = self._guard(events)
        self.runner = runner

    def _guard(self, events: Iterator[bytes]) -> Iterator[bytes]:
        try:
            yield from events
            return
        except ClientGone:
            return
        except ApiError as e:
            err = e.body()
        except Exception as e:  # a bug: headers are out, so tell the client in-band
            log.exception("error while streaming")
            err = ApiError(500, f"internal error: {type(e).__name__}").body()
        # Lifetime: the leases go before the error's write. A client that stopped reading holds that
        # write up to --timeout seconds, and a worker holding a lease cannot register with a restarted
        # engine (ipc/client.py): after an engine crash it answered 503 for as long as that client stayed.
        self.runner.close()
        yield sse(err)

    def __iter__(self):
        return self

    def __next__(self) -> bytes:
        return next(self._it)

    def close(self) -> None:
        try:
            self._it.close()
        finally:
            self.runner.close()


def respond(resp: falcon.Response, events: Iterator[bytes], runner: Runner) -> None:
    """Send status and headers with the first event, as llama-server does:
    an error before any event (the engine refused the request) is still a
    plain JSON error with its HTTP status."""
    try:
        first = next(events)
    except StopIteration:
        first = b""
    except ClientGone:
        runner.close()
        resp.data = b""
        return
    except BaseException:
        runner.close()
        raise
    runner.streaming()  # the first event goes out now: silence after it is pinged (gen.Runner.steps)
    events = itertools.chain((first,), events)
    if runner.sock is not None:
        try:
            runner.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, STREAM_SNDBUF)
        except OSError:
            pass
    resp.content_type = "text/event-stream"
    resp.set_header("Cache-Control", "no-cache")
    resp.set_header("X-Accel-Buffering", "no")
    resp.stream = SSEBody(events, runner)
