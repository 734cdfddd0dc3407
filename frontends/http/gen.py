"""Driving one HTTP request's generations over its leases.

A ``Runner`` owns every lease of one request (one per prompt, or ``n`` for
OpenAI's ``n``), submits, and turns token records into ``Step``s: the text a
client may see now, the token, its probabilities, and at the end a final step
per choice. While it waits it polls the client's socket (MSG_PEEK) and the
engine's liveness every ``POLL`` seconds, so a vanished client is cancelled
within about two polls and a dead engine ends the request within one second.
Where the socket can be watched (hangup.py, one epoll thread per worker),
the hangup cancels the leases at once and the runner sleeps on its ring
between records (``WATCHED_POLL``) instead of waking every POLL.
Once a stream's first event is out, a silence past its ping interval yields
``PING`` (llama-server's SSE comment: idle-timing clients, as undici, keep it).
Invariant: ``close()`` releases every lease, cancelling any unfinished one;
``_lock`` orders it with the watcher's cancel, so a hangup never cancels a
channel already released (and perhaps leased to another request).
"""
from __future__ import annotations

import fcntl
import math
import select
import socket
import struct
import threading
import time
from typing import Iterator

from ipc.channel import BadRequest
from ipc.client import EngineUnavailable, NoChannel
from ipc.layout import F_PROGRESS

from frontends.text.errors import ApiError, unavailable

from . import hangup
from .job import PING, Job, Step, lp_json, utf8_prefix

POLL = 0.03  # read timeout and disconnect/engine check period (cancel < 100 ms)
# read timeout of a request whose socket the hangup watcher covers (hangup.py): only the
# engine's liveness and the stop-string grace are checked on a timeout; a hangup wakes it
WATCHED_POLL = 0.25
WORD_GRACE = 1.0  # after a stop-string cancel, how long to wait for the engine's last record
SIOCOUTQNSD = 0x894B  # linux/sockios.h: bytes queued in a TCP socket and not yet sent
# Back-pressure: once this much of a stream waits unsent in the kernel (the
# peer's receive window is shut: it does not read), the runner stops draining
# its rings. They fill within ring_cap tokens and the engine pauses the slots,
# so a client that never reads costs the batch about a ring of tokens rather
# than the send buffer's worth too (~150 small SSE events). A reading client,
# however far away, has an open window and nearly nothing unsent.
HOLD_UNSENT = 2048


def refused(e: EngineUnavailable | NoChannel) -> ApiError:
    """The answer when a request cannot start. No free channel (every
    channel of this worker is leased: its threads' requests hold them, one
    per prompt and copy) is capacity, not failure: 429, which a gateway
    retries on another instance without counting it against this one (smg
    counts 503 toward its circuit breaker, 429 not). llama-server has no
    such case: its task queue is unbounded, and its only capacity answer,
    /health's fail_on_no_slot 503, stays (misc.check_available). An engine
    that is not ready, restarting or not taking submissions is 503."""
    if isinstance(e, NoChannel):
        return ApiError(429, str(e), "unavailable_error")
    return unavailable(str(e) or "engine unavailable")


class ClientGone(Exception):
    """The client closed its connection; every lease was cancelled."""


def peer_gone(sock: socket.socket | None) -> bool:
    """True if the peer closed: readable and a peeked recv returns b"".

    Pending bytes (a pipelined request) mean it is still there; only EOF or
    a reset counts. Never consumes data.
    """
    if sock is None:
        return False
    try:
        r, _, _ = select.select([sock], [], [], 0)
        if not r:
            return False
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except (BlockingIOError, InterruptedError, ValueError):
        return False  # ValueError: a TLS socket cannot peek; we cannot tell
    except OSError:
        return True


def unsent(sock: socket.socket | None) -> int:
    """Bytes the kernel holds for the peer without having sent them (0 when
    it cannot tell: no socket, a unix socket, TLS under another server)."""
    if sock is None:
        return 0
    try:
        return struct.unpack("i", fcntl.ioctl(sock.fileno(), SIOCOUTQNSD, b"\0\0\0\0"))[0]
    except (OSError, ValueError):
        return 0


class Runner:
    """All leases of one request; iterate ``steps()``; always ``close()``."""

    def __init__(self, ctx, plan, sock: socket.socket | None = None):
        self.ctx, self.plan, self.sock = ctx, plan, sock
        self.t_max = plan.options.get("t_max_predict_ms", -1)  # ms; > 0: a newline past it ends a job (_token)
        self.n_indent = plan.options.get("n_indent", 0)  # > 0: a less indented line ends a job (_indent)
        self.write_s = float(ctx.cfg.timeout) if ctx.cfg.timeout > 0 else 0.0  # -to: a hold past it is a hang-up
        iv = plan.options.get("sse_ping_interval", -1)  # s; llama-server pings only for > 0
        self.ping_s = float(iv) if iv > 0 else 0.0
        self.ping = 0.0  # the live interval: ping_s once streaming() (the headers are out); 0 never pings
        self.jobs: list[Job] = []
        self._lock = threading.Lock()  # close() against the watcher's cancel (module doc)
        self.closed = self.gone = False
        self.watched = None  # hangup.watch's handle once start() submitted

    def start(self, copies: int = 1) -> "Runner":
        """One job per prompt and copy, submitted in waves (``_more``); 503 if
        the engine, 429 if no channel is free for the first (``refused``;
        nothing stays leased then)."""
        port, pl = self.ctx.port, self.plan
        if port is None:
            raise unavailable("no engine port in this worker")
        self.jobs = [Job(i, prompt, None, pl.stops) for i, prompt in
                     enumerate(p for p in pl.prompts for _ in range(copies))]
        try:
            self._more()
        except BaseException:
            self.close()
            raise
        self.watched = hangup.watch(self.sock, self._hung_up)
        return self

    def _more(self) -> list[Job]:
        """Lease and submit the next jobs while fewer than the engine's slots
        are in flight (it runs no more at once), and return them. Why waves:
        a worker has one channel per HTTP thread, and a request of 40
        prompts (a batch-evaluation client) leased one each and got 429 on
        an idle server, for ever; llama-server takes any number. A job's
        channel goes back as soon as its last record is read (``steps``).
        No channel free with nothing of ours in flight is the 429."""
        port, pl = self.ctx.port, self.plan
        flying = sum(j.lease is not None and not j.done for j in self.jobs)
        out = []
        for j in self.jobs:
            if flying >= max(1, self.ctx.n_slots):
                break
            if j.lease is not None or j.done:
                continue
            try:
                # with jobs of ours in flight, no wait for a channel: ours come back as they finish
                j.lease = port.lease(wait=0.0) if flying else port.lease()
            except NoChannel as e:
                if flying:
                    break  # ours come back as they finish
                raise refused(e) from None
            except EngineUnavailable as e:
                raise refused(e) from None
            try:
                j.lease.submit(j.prompt, pl.params, pl.chain + pl.grammar, pl.bias)
            except BadRequest as e:  # the channel refused what validation let through
                raise ApiError(400, str(e)) from None
            except EngineUnavailable as e:
                raise refused(e) from None
            flying += 1
            out.append(j)
        return out

    def _done(self, j: Job, active: list[Job]) -> None:
        """``j`` has its result (``finish`` read it): its channel goes back and
        the next wave's jobs join ``active``."""
        with self._lock:
            if j.lease is not None:
                j.lease.close()
                j.lease = None
        if not self.closed and not self.gone:  # nothing more for a client that hung up
            active += self._more()

    def close(self) -> None:
        hangup.unwatch(self.watched)
        with self._lock:
            self.closed = True
            for j in self.jobs:
                if j.lease is not None:
                    j.lease.close()  # cancels unless the last record was read
                    j.lease = None

    def _hung_up(self) -> None:
        """The watcher thread: the client is gone; stop the engine now (the
        reader wakes on the cancel's last record, or within WATCHED_POLL)."""
        with self._lock:
            if self.closed:
                return
            self.gone = True
            self.cancel()

    def streaming(self) -> None:
        """The first event and headers are out (stream.respond): silence is pinged from now on, not
        before (llama-server awaits a stream's first result unpinged: a long prompt, bar return_progress)."""
        self.ping = self.ping_s

    def cancel(self) -> None:
        for j in self.jobs:
            if j.lease is not None and not j.done:
                j.lease.cancel()

    # ------------------------------------------------------------------ loop
    def steps(self) -> Iterator[Step]:
        """Each record as a Step; PING past ``ping`` s of silence, timed once a poll (a read times out
        within WATCHED_POLL, 0.25 s, of a >= 1 s interval; llama-server's wait polls each 1 s), so the
        token path pays one local store (``heard``)."""
        active = [j for j in self.jobs if j.lease is not None and not j.done]
        next_check, rr, held = 0.0, 0, False
        heard, quiet = True, 0.0  # a record since the last poll; the poll that first found silence
        stuck = 0.0  # when unsent bytes last started to hold the stream (0: they do not)
        while active:
            now = time.monotonic()
            if now >= next_check:
                next_check = now + POLL
                self._check(active, now)
                for j in [j for j in active if j.deadline and now > j.deadline]:
                    active.remove(j)
                    st = Step(j, j.finish(-1), -1, None, True)
                    self._done(j, active)
                    yield st
                if not active:
                    break
                # once a poll, not once a token: the ioctl per loop was a tenth of a worker's CPU
                held = unsent(self.sock) > HOLD_UNSENT
                # llama-server's write timeout (-to) for a client that stopped reading: the kernel's
                # send buffer never fills here (the runner holds at HOLD_UNSENT), so the socket's own
                # timeout (frontends/api/timeout.py) cannot fire; held that long, the client is gone
                stuck = (stuck or now) if held else 0.0
                if held and self.write_s and now - stuck > self.write_s:
                    self.cancel()
                    raise ClientGone()
                # unsent bytes are no silence (and a ping would only queue behind them)
                if heard or held or not self.ping:
                    heard, quiet = False, now
                elif now - quiet > self.ping:  # llama-server: elapsed > interval, then the clock restarts
                    quiet = now
                    yield PING
            if held:  # the client is not reading: leave the rings be
                time.sleep(POLL)
                continue
            job, tok = self._next(active, rr)
            rr += 1
            if self.gone:
                raise ClientGone()
            if tok is None:
                continue
            heard = True
            if tok.flags & F_PROGRESS:
                yield Step(job, "", -1, None, False, job.progress(tok.token, tok.logprob))
                continue
            if tok.token >= 0 and job.detok.word is None and not job.limited:
                yield self._token(job, tok)
            if tok.last:
                active.remove(job)
                st = Step(job, job.finish(tok.stop), -1, None, True)
                self._done(job, active)
                yield st

    def _next(self, active: list[Job], rr: int):
        if len(active) == 1:
            return active[0], active[0].lease.read(WATCHED_POLL if self.watched else POLL)
        n = len(active)
        for k in range(n):
            j = active[(rr + k) % n]
            tok = j.lease.read(0)
            if tok is not None:
                return j, tok
        j = active[rr % n]
        return j, j.lease.read(0.005)

    def _check(self, active: list[Job], now: float) -> None:
        if self.gone or (not self.watched and peer_gone(self.sock)):
            self.cancel()
            raise ClientGone()
        for j in active:
            if not j.lease.engine_ok():
                raise unavailable("engine unavailable")

    def _token(self, job: Job, tok) -> Step:
        vocab = self.ctx.vocab
        job.tokens.append(tok.token)
        job.t_first_ns = job.t_first_ns or tok.t_ns
        job.t_last_ns = tok.t_ns
        piece = vocab.piece(tok.token)
        text = job.detok.feed(piece)
        probs = None
        if self.plan.n_probs:
            probs = self._probs(tok, piece)
            job.probs.append(probs)
        t_max = self.t_max
        if job.detok.word is None and t_max > 0 and "\n" in text and (tok.t_ns - job.t_first_ns) / 1e6 > t_max:
            job.limited = True  # llama-server: past t_max_predict_ms since the first token, a newline ends it
        if self.n_indent > 0 and job.detok.word is None and not job.limited:
            self._indent(job, text)
        if job.detok.word is not None or job.limited:  # stop the engine, wait for its result
            job.lease.cancel(whole=True)
            job.deadline = time.monotonic() + WORD_GRACE
        return Step(job, text, tok.token, probs, False)

    def _indent(self, job: Job, text: str) -> None:
        """llama-server's n_indent (server-context.cpp process_token): once
        the answer holds a newline, each token checks the line after the
        newline found so far; a line with text that starts less indented
        than n_indent ends the answer there, its text cut from the first
        non-blank character (a stream has sent it already, as there). The
        newline is found one token late, as there. Only the text from that
        line's start is kept (``tail``): the work per token is the line's,
        not the answer's."""
        seen = job.nl >= 0
        job.tail += text
        t = job.tail
        if seen:
            if job.nl > 0:
                pos = 0
                while pos < len(t) and t[pos] in " \t":
                    pos += 1
                if pos < len(t) and pos < self.n_indent:
                    job.limited = True
                    job.detok.parts[:] = ["".join(job.detok.parts)[:job.n_before + pos]]
                    job.detok.pending = ""  # a stop string's held start belongs to the cut line
                    return
            k = t.find("\n")
            if k >= 0:
                job.nl, job.n_before, job.tail = 1, job.n_before + k + 1, t[k + 1:]
        if "\n" in text and not seen:
            job.nl = 0

    def _probs(self, tok, piece: bytes) -> dict:
        """One completion_probabilities entry (llama-server's shape)."""
        vocab, post = self.ctx.vocab, self.plan.post_probs
        key, tkey = ("prob", "top_probs") if post else ("logprob", "top_logprobs")
        val = (lambda lp: math.exp(lp) if math.isfinite(lp) else 0.0) if post else lp_json
        top = []
        if tok.probs is not None:
            for tid, lp in zip(tok.probs["id"].tolist(), tok.probs["logprob"].tolist()):
                b = vocab.piece(tid, True)
                top.append({"id": tid, "token": utf8_prefix(b), "bytes": list(b), key: val(lp)})
        return {"id": tok.token, "token": utf8_prefix(piece), "bytes": list(piece), key: val(tok.logprob), tkey: top}
