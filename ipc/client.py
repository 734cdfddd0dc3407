"""A worker process's side of the arena: its channels and submission ring.

Threads of one worker share a ``WorkerPort``. Leasing and submitting are
serialised by a thread lock inside this process only (no lock is shared
between processes): the submission ring stays single-producer because only
the thread holding ``_sub_lock`` pushes, and a channel has one reader because
only the thread holding its lease reads it.
"""
from __future__ import annotations

import os
import threading
import time

from . import shm
from .arena import Arena
from .channel import Channel, Token
from .layout import CH_FREE, CH_LEASED, F_LAST, STOP_SHIFT, SUB_CANCEL, SUB_ERASE, SUB_SUBMIT


class EngineUnavailable(RuntimeError):
    """The engine is loading, restarting, dead, or not answering."""


class NoChannel(RuntimeError):
    """Every channel of this worker is leased (more requests than threads)."""


class Lease:
    """One request's exclusive hold on a channel. Use as a context manager:
    leaving it releases the channel (cancelling the request if unfinished)."""

    __slots__ = ("port", "channel", "rid", "done", "epoch")

    def __init__(self, port: "WorkerPort", channel: Channel, rid: int, epoch: int):
        self.port, self.channel, self.rid, self.epoch = port, channel, rid, epoch
        self.done = False  # the LAST record was read

    def submit(self, prompt, params: dict, grammar: bytes = b"", bias=()) -> None:
        self.channel.write_request(prompt, params, grammar, bias)
        self.port.send(SUB_SUBMIT, self.channel.index, self.rid)

    def read(self, timeout: float | None) -> Token | None:
        """The next record, or None on timeout.

        If the engine ended the request while the ring was full (a stalled
        reader cancelled, a shutdown), it could not publish the LAST record;
        it marks the header instead, and once the ring is drained this
        returns a LAST token with that stop reason.
        """
        tok = self.channel.read(self.rid, timeout)
        if tok is None:
            h = self.channel.hdr[0]
            if int(h["end_rid"]) == self.rid and len(self.channel.ring) == 0:
                tok = Token(-1, F_LAST | int(h["end_stop"]) << STOP_SHIFT, 0, 0.0, None)
        if tok is not None and tok.last:
            self.done = True
        return tok

    def engine_ok(self) -> bool:
        """False once the engine that took this request died or was replaced."""
        a = self.port.arena
        return a.get("epoch") == self.epoch and a.engine_alive()

    def cancel(self, whole: bool = False) -> None:
        """Stop the request. ``whole``: its reader stops it having all it
        wants (a stop string matched: 1); else the reader abandons it (2: the
        engine keeps no answer of it for a next turn, engine/kvcache.py abandon)."""
        self.channel.hdr["cancel"] = 1 if whole else 2  # polled by the engine each step
        try:
            self.port.send(SUB_CANCEL, self.channel.index, self.rid, timeout=0.2)
        except EngineUnavailable:
            pass  # the flag alone stops it; a dead engine has nothing to stop

    def close(self) -> None:
        if self.channel is None:
            return
        if not self.done:
            self.cancel()
        self.port.release(self)
        self.channel = None

    def __enter__(self) -> "Lease":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class WorkerPort:
    """Worker index ``w``'s channels and submission ring in one process."""

    def __init__(self, arena: Arena, w: int):
        if not 0 <= w < arena.geom.n_workers:
            raise ValueError(f"worker index {w} out of range 0..{arena.geom.n_workers - 1}")
        self.arena, self.w = arena, w
        self._lock = threading.Lock()  # free list, registration
        self._sub_lock = threading.Lock()  # the single producer of the submission ring
        self._free = list(reversed(arena.channels_of(w)))
        self._leased = 0
        self._last_rid = 0
        self.epoch = 0  # engine epoch we are registered with
        self.generation = 0

    # ----------------------------------------------------------- registration
    def register(self, timeout: float = 30.0) -> None:
        """Ask the engine to reset this index for us and wait for its ack.

        The engine acks between steps, and a step on a starved machine can
        last seconds; a dead engine ends the wait at once (engine_alive), so
        the long timeout only ever waits for a live, busy engine.

        The engine resets the rings of our free channels, which no reader of
        ours touches; a channel still leased (a lease from an engine that
        died, its thread held in a write to a client that stopped reading)
        is left to that lease, which resets it when it ends (``release``).
        The ack semaphore's wait is the fence after which the engine's resets
        (ring counters, semaphores) are visible here.
        """
        a = self.arena
        row = a.workers[self.w : self.w + 1]
        shm.drain(a.ack(self.w))
        self.generation = time.monotonic_ns()
        row["pid"] = os.getpid()
        row["generation"] = self.generation
        seq = int(row["req_seq"][0]) + 1
        row["req_seq"] = seq  # the engine acts on this field changing
        a.doorbell.release()
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not a.engine_alive():
                raise EngineUnavailable("engine did not acknowledge worker registration")
            if shm.wait(a.ack(self.w), min(left, 0.1)) and int(row["ack_seq"][0]) == seq:
                self.epoch = int(row["epoch"][0])
                return

    # ----------------------------------------------------------------- leases
    def _registered(self) -> None:
        """Under ``_lock``: registered with the engine now running, registering
        first if it is new. Leases of the dead engine may still be held: their
        channels are not in the free list and the new engine leaves them be
        (register). Before, a worker waited for them all to end, and one
        client that stopped reading kept it answering 503 after a restart."""
        a = self.arena
        if not a.ready():
            raise EngineUnavailable("engine not ready")
        if self.epoch != a.get("epoch"):
            self.register()

    def lease(self) -> Lease:
        """A free channel for one request; registers first if the engine is new."""
        a = self.arena
        with self._lock:
            self._registered()
            if not self._free:
                raise NoChannel(f"all {a.geom.n_chan} channels of worker {self.w} are leased")
            i = self._free.pop()
            self._leased += 1
            rid = max(time.monotonic_ns(), self._last_rid + 1)
            self._last_rid = rid
        ch = a.channel(i)
        ch.discard()
        h = ch.hdr
        h["worker"] = self.w
        h["owner_pid"] = os.getpid()
        h["generation"] = self.generation
        h["cancel"] = 0
        h["rid"] = rid
        h["state"] = CH_LEASED
        return Lease(self, ch, rid, self.epoch)

    def release(self, lease: Lease) -> None:
        ch = lease.channel
        if self.arena.get("epoch") != lease.epoch:
            # Lifetime: the engine that took this request is gone and its successor never writes here
            # (the channel stayed leased through our registration, server.EnginePort._reset); the dead
            # one may have left a record half pushed, so the ring is reset, not drained. Nobody else
            # touches it: its one reader is this lease, and the channel is not free until below.
            ch.ring.reset()
        else:
            ch.discard()  # nothing queued survives into the next lease
        ch.hdr["state"] = CH_FREE
        ch.hdr["rid"] = 0
        with self._lock:
            self._free.append(ch.index)
            self._leased -= 1

    @property
    def leased(self) -> int:
        return self._leased

    # ------------------------------------------------------------- submission
    def send(self, kind: int, channel: int, rid: int = 0, arg: int = 0, timeout: float = 2.0) -> None:
        """Push one submission record and ring the doorbell.

        A worker may wait (the engine never does): if the ring is full the
        engine is inside a long step; wait for space up to ``timeout``.
        """
        ring = self.arena.sub_ring(self.w)
        deadline = time.monotonic() + timeout
        with self._sub_lock:
            while not ring.push(rid, channel, kind, 0, arg):
                if time.monotonic() > deadline:
                    raise EngineUnavailable("submission ring full")
                time.sleep(0.0005)
        self.arena.doorbell.release()

    def erase_slot(self, slot: int) -> None:
        """SUB_ERASE, sent as a lease's records are: registered first (the
        engine reads no ring of an index that has not registered with it,
        and a registration empties the ring, so an erase from a worker that
        had not leased since the engine started was lost, answered 200), and
        counted as leased while it is pushed, so that no other thread of
        ours registers (resets this ring) meanwhile."""
        with self._lock:
            self._registered()
            self._leased += 1
        try:
            self.send(SUB_ERASE, 0, 0, slot)
        finally:
            with self._lock:
                self._leased -= 1
