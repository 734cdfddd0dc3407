"""A result channel: one in-flight request's areas in shared memory.

Layout (ipc.layout.chan_layout): header line, sampling parameters, result
area, prompt ids, grammar, logit biases, the token ring and its probability
rows. Each channel has its own ``items`` semaphore, so a token wakes exactly
the one thread that reads this channel, and its own ``space`` semaphore, the
producer's fence for reusing a slot.

Ownership: the worker that leased the channel writes the header, params and
request areas, then submits; the engine writes only the result area, the ring
and probability rows. A record belongs to the lease whose ``rid`` it carries:
a reader drops every record with another rid, so a token the engine publishes
for a released lease can never reach the next lessee.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import posix_ipc

from .layout import (
    BIAS,
    CHAN_HDR,
    F_LAST,
    MAX_BIAS,
    MAX_GRAMMAR,
    MAX_PROBS,
    PARAMS,
    PROB,
    RESULT,
    STOP_SHIFT,
    TOKEN,
    chan_layout,
)
from .params import FLOATS
from .ring import Ring


@dataclass(slots=True)
class Token:
    """One record as a reader sees it."""

    token: int
    flags: int
    t_ns: int
    logprob: float
    probs: np.ndarray | None  # (n, PROB) copy, only when the request asked

    @property
    def last(self) -> bool:
        return bool(self.flags & F_LAST)

    @property
    def stop(self) -> int:
        return self.flags >> STOP_SHIFT


class BadRequest(ValueError):
    """The request area holds something the engine must not act on."""


class Channel:
    """Views over one channel; the same class serves engine and worker."""

    def __init__(self, buf: memoryview, off: int, index: int, max_prompt: int, ring_cap: int,
                 items: posix_ipc.Semaphore, space: posix_ipc.Semaphore, init: bool = False):
        lay = chan_layout(max_prompt, ring_cap)
        self.index, self.max_prompt, self.ring_cap = index, max_prompt, ring_cap
        b = lambda name, end: buf[off + lay[name] : off + lay[end]]  # noqa: E731
        self.hdr = np.frombuffer(b("hdr", "params"), CHAN_HDR, 1)
        self.params = np.frombuffer(b("params", "result"), PARAMS, 1)
        self.result = np.frombuffer(buf, RESULT, 1, off + lay["result"])
        self.prompt = np.frombuffer(b("prompt", "grammar"), np.int32)[:max_prompt]
        # --embedding: the same area carries the pooled vector back (ipc/layout.py chan_layout)
        self.vector = np.frombuffer(b("prompt", "grammar"), np.float32)[:max_prompt]
        self.grammar = np.frombuffer(b("grammar", "bias"), np.uint8)
        self.bias = np.frombuffer(buf, BIAS, MAX_BIAS, off + lay["bias"])
        self.probs = np.frombuffer(buf, PROB, ring_cap * MAX_PROBS, off + lay["probs"]).reshape(ring_cap, MAX_PROBS)
        self.ring = Ring(buf, off + lay["ring"], ring_cap, TOKEN, items, space, init=init)

    # ---------------------------------------------------------------- worker
    def write_request(self, prompt, params: dict, grammar: bytes = b"", bias=()) -> None:
        """Fill the request areas. The SUB_SUBMIT post that follows orders
        these plain stores before the engine reads them."""
        n = len(prompt)
        if n > self.max_prompt:
            raise BadRequest(f"prompt of {n} tokens exceeds the channel's {self.max_prompt}")
        if len(grammar) > MAX_GRAMMAR:
            raise BadRequest(f"grammar of {len(grammar)} bytes exceeds {MAX_GRAMMAR}")
        if len(bias) > MAX_BIAS:
            raise BadRequest(f"{len(bias)} logit biases exceed {MAX_BIAS}")
        self.prompt[:n] = prompt
        p = np.zeros(1, PARAMS)
        for k, v in params.items():
            p[k] = v
        p["n_prompt"] = n
        p["n_grammar"] = len(grammar)
        p["n_bias"] = len(bias)
        self.params[:] = p
        if grammar:
            self.grammar[: len(grammar)] = np.frombuffer(grammar, np.uint8)
        for i, (tid, b) in enumerate(bias):
            self.bias[i] = (tid, b)
        self.result[:] = np.zeros(1, RESULT)

    def read(self, rid: int, timeout: float | None) -> Token | None:
        """The next record of lease ``rid``; None on timeout.

        Records of other rids (left by an earlier lease) are dropped here:
        the by-construction guarantee that results never reach a sibling.
        One deadline covers the whole call: stale records arriving one by one
        must not restart the caller's timeout.

        Memory order: the record's slot is ours from ``take`` until the
        ``space`` post (``free``); the probability row of that slot is copied
        in between, so the producer, which must acquire that ``space`` unit
        before it can write the slot again, never overwrites a row still to
        be read (ipc/ring.py, docs/ARCHITECTURE.md "Memory ordering").
        """
        ring = self.ring
        deadline = None if not timeout else time.monotonic() + timeout
        while True:
            rec = ring.take(timeout)
            if rec is None:
                return None
            seq, r, t_ns, token, flags, n_probs, logprob = rec
            if r != rid:  # a stale record of an earlier lease: drop, keep waiting
                ring.space.release()  # ring.free(): nothing of the slot is read
                if deadline is not None:
                    timeout = max(deadline - time.monotonic(), 0)
                continue
            try:  # the row is copied BEFORE the slot goes back
                probs = self.probs[seq % self.ring_cap, : min(n_probs, MAX_PROBS)].copy() if n_probs else None
            finally:
                # ring.free(), inlined (one Python frame less per token): the
                # RELEASE that orders the record's and the row's loads before
                # the producer's next reserve of this slot
                ring.space.release()
            return Token(token, flags, t_ns, logprob, probs)

    def discard(self) -> int:
        """Drop every record queued now (on release); returns how many.
        ``pop`` is enough here: nothing of a dropped slot is read."""
        n = 0
        while self.ring.pop(0) is not None:
            n += 1
        return n

    # ---------------------------------------------------------------- engine
    def read_request(self, n_vocab: int) -> tuple[np.ndarray, dict, bytes, np.ndarray]:
        """Copy and validate the request areas.

        Every length and index read from shared memory is checked: a worker
        bug or a hostile writer gets a BadRequest, never an engine crash.
        """
        p = self.params[0].copy()
        n = int(p["n_prompt"])
        if not 0 < n <= self.max_prompt:
            raise BadRequest(f"prompt length {n} out of range 1..{self.max_prompt}")
        prompt = self.prompt[:n].copy()
        if prompt.min() < 0 or prompt.max() >= n_vocab:
            raise BadRequest("prompt token id out of vocabulary")
        ng, nb = int(p["n_grammar"]), int(p["n_bias"])
        if ng > MAX_GRAMMAR or nb > MAX_BIAS:
            raise BadRequest("grammar or logit-bias length out of range")
        bias = self.bias[:nb].copy()
        if nb and (bias["id"].min() < 0 or bias["id"].max() >= n_vocab):
            raise BadRequest("logit-bias token id out of vocabulary")
        params = {k: p[k].item() for k in PARAMS.names if not k.startswith("_")}
        for k in FLOATS:  # every float row of ipc/params.py
            if not np.isfinite(params[k]):
                raise BadRequest(f"{k} is not finite")
        if not 0 <= params["n_probs"] <= MAX_PROBS:
            raise BadRequest(f"n_probs out of range 0..{MAX_PROBS}")
        return prompt, params, self.grammar[:ng].tobytes(), bias

    def push(self, rid: int, t_ns: int, token: int, flags: int, logprob: float = 0.0,
             probs: tuple[np.ndarray, np.ndarray] | None = None) -> bool:
        """Publish one token record; False if the ring is full (never blocks).

        Probability rows are written into the slot the record will occupy
        after ``reserve`` and before the record is published, so the same
        ``items`` post orders both for the reader. ``reserve``'s acquire of a
        ``space`` unit is what makes writing the row safe: the reader posts
        that unit only after it copied the slot's previous row (``read``).
        """
        ring = self.ring
        h = ring.reserve()
        if h is None:
            return False
        n = 0
        if probs is not None:
            try:
                ids, lps = probs
                n = len(ids)
                if n > MAX_PROBS:
                    raise ValueError(f"{n} probabilities exceed {MAX_PROBS}")
                row = self.probs[h % self.ring_cap]
                row["id"][:n] = ids
                row["logprob"][:n] = lps
            except BaseException:
                ring.unreserve()  # nothing published: the slot goes back
                raise
        ring.commit(h, rid, t_ns, token, flags, n, logprob)
        return True

    def release(self) -> None:
        self.ring.release()
