"""A worker process's side of the arena: its channels and submission ring.

Threads of one worker share a ``WorkerPort``. Leasing and submitting are
serialised by a thread lock inside this process only (no lock is shared
between processes): the submission ring stays single-producer because only
the thread holding ``_sub_lock`` pushes, and a channel has one reader because
only the thread holding its lease reads it.

Channel lifetime (who may write a channel's areas, and until when):

* A lease's request, once submitted, is the engine's until the engine *ends*
  it: its LAST record for the rid, or, the ring full, ``end_rid`` = rid in
  the header (engine/publish.py ``end``). Up to its end the engine may write
  the channel's result area, and under --embedding the vector over the
  prompt area, neither of which a reader filters by rid. Its end is the
  engine's last write for that rid into the channel's areas.
* A lease that read its LAST record (``done``), or never reached the
  engine's ring (``sent`` false), releases its channel to the free list at
  once: the engine has nothing of it left to write.
* A lease released unfinished (cancelled: a hang-up, an error) keeps its
  channel out of the free list, the header's rid still its own, until the
  engine's end of that rid is seen (``WorkerPort._ended``): only then may a
  next request write its prompt there. Every request the engine takes, it
  ends, cancelled ones too, queued or running (engine/publish.py ``cancel``,
  engine/loop.py ``assign``, engine/slotfile.py ``run``), so the wait is one
  engine step. Without this, the channel went straight back (LIFO) to the
  next request and a cancelled --embedding request's vector, written as its
  decode ended, overwrote the next request's prompt.
* A registration (a new engine) resets every free channel of the index
  (those awaiting an end are marked free), and the engine that held those
  requests is gone: channels awaiting an end are free again. A channel still
  leased by this process is left to its lease, whose epoch is the dead
  engine's: it sends nothing to the new one, and on release resets its ring
  and frees its channel at once (``release``, ``send``'s epoch check).
"""
from __future__ import annotations

import os
import threading
import time

from . import shm
from .arena import Arena
from .channel import Channel, Token
from .layout import CH_FREE, CH_LEASED, F_LAST, STOP_SHIFT, SUB_CANCEL, SUB_ERASE, SUB_SUBMIT

# A lease that finds every free channel awaiting the engine's end of a
# cancelled request waits for one (the engine ends it at its next step; a step
# on a starved machine lasts seconds), polling every END_POLL s, up to END_WAIT.
END_WAIT = 5.0
END_POLL = 0.001


class EngineUnavailable(RuntimeError):
    """The engine is loading, restarting, dead, or not answering."""


class NoChannel(RuntimeError):
    """Every channel of this worker is leased (more requests than threads)."""


class Lease:
    """One request's exclusive hold on a channel. Use as a context manager:
    leaving it releases the channel (cancelling the request if unfinished)."""

    __slots__ = ("port", "channel", "rid", "done", "epoch", "sent")

    def __init__(self, port: "WorkerPort", channel: Channel, rid: int, epoch: int):
        self.port, self.channel, self.rid, self.epoch = port, channel, rid, epoch
        self.done = False  # the LAST record was read
        self.sent = False  # a submission of this rid is in the engine's ring: the engine owes it an end

    def submit(self, prompt, params: dict, grammar: bytes = b"", bias=()) -> None:
        self.channel.write_request(prompt, params, grammar, bias)
        self.post(SUB_SUBMIT)

    def post(self, kind: int, arg: int = 0) -> None:
        """Send this lease's request (SUB_SUBMIT, SUB_SAVE, SUB_RESTORE): from
        here on the engine owns it until its end (module doc)."""
        self.port.send(kind, self.channel.index, self.rid, arg, epoch=self.epoch)
        self.sent = True

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
        if self.epoch != self.port.arena.get("epoch"):
            return  # the engine that took it is gone; the one running now never saw it
        try:
            self.port.send(SUB_CANCEL, self.channel.index, self.rid, timeout=0.2)
        except EngineUnavailable:
            pass  # the flag alone stops it; a dead engine has nothing to stop

    def close(self) -> None:
        if self.channel is None:
            return
        if not self.done and self.sent:
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
        # Channels that no request of the engine's can still write (module doc).
        # Order is a cache nicety only (LIFO: the last used is warm); no
        # guarantee rests on it.
        self._free = list(reversed(arena.channels_of(w)))
        # channel -> rid: released unfinished, awaiting the engine's end of rid
        self._unended: dict[int, int] = {}
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
        with self._sub_lock:  # our submission ring's producer side is still while the engine resets it
            self._register(timeout)

    def _register(self, timeout: float) -> None:
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
                # The engine reset every free channel of ours (those awaiting an
                # end are marked free) and holds no request of ours (a new
                # engine: the one that held them is gone), so none awaits an
                # end any more. Under _lock (lease) or before
                # any lease exists.
                self._free[:0] = list(self._unended)
                self._unended.clear()
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

    def lease(self, wait: float = END_WAIT) -> Lease:
        """A free channel for one request; registers first if the engine is new.

        A channel released unfinished comes back only once the engine ended
        its request (module doc); if every free channel awaits that, wait for
        one up to ``wait`` s (NoChannel then, as when all are leased)."""
        a = self.arena
        deadline = None
        while True:
            with self._lock:
                self._registered()
                if self._unended:
                    self._reap()
                if self._free:
                    i = self._free.pop()
                    self._leased += 1
                    rid = max(time.monotonic_ns(), self._last_rid + 1)
                    self._last_rid = rid
                    epoch = self.epoch  # under _lock: the engine this lease's request is for
                    break
                if not self._unended:
                    raise NoChannel(f"all {a.geom.n_chan} channels of worker {self.w} are leased")
            now = time.monotonic()
            if deadline is None:
                deadline = now + wait
            if now >= deadline:
                raise NoChannel(f"all {a.geom.n_chan} channels of worker {self.w} are leased or await "
                                f"the engine's end of a cancelled request")
            time.sleep(END_POLL)
        ch = a.channel(i)
        ch.discard()
        h = ch.hdr
        h["worker"] = self.w
        h["owner_pid"] = os.getpid()
        h["generation"] = self.generation
        h["cancel"] = 0
        h["rid"] = rid
        h["state"] = CH_LEASED
        return Lease(self, ch, rid, epoch)

    def release(self, lease: Lease) -> None:
        ch = lease.channel
        stale = self.arena.get("epoch") != lease.epoch
        if stale or lease.done or not lease.sent or self._ended(ch, lease.rid):
            if stale:
                # Lifetime: the engine that took this request is gone and owes it no end; its successor
                # never writes here (the channel stayed leased through our registration,
                # server.EnginePort._reset). The dead one may have left a record half pushed, so the ring
                # is reset, not drained; its one reader is this lease, and it is not free until below.
                ch.ring.reset()
            else:
                ch.discard()  # nothing queued survives into the next lease
            ch.hdr["state"] = CH_FREE
            ch.hdr["rid"] = 0
            with self._lock:
                self._free.append(ch.index)
                self._leased -= 1
            return
        # Unfinished: the engine may still write this channel's areas for the
        # rid (a vector, a result) until it ends it, so no request gets it
        # before that (module doc). The header keeps the rid (and the cancel
        # flag): the engine's check before each such write (EnginePort.holds /
        # owner_ok) stays true for it, and for nothing else, until its end.
        ch.hdr["state"] = CH_FREE  # not leased to a request (/metrics' channels_leased)
        with self._lock:
            self._unended[ch.index] = lease.rid
            self._leased -= 1

    @staticmethod
    def _ended(ch: Channel, rid: int) -> bool:
        """Has the engine ended request ``rid`` on ``ch``? Drains the ring
        (its lease is gone: nobody else reads it) looking for rid's LAST record.

        Memory order: the engine writes the channel's areas for rid, then
        pushes its LAST record, whose post our successful trywait (Ring.pop)
        acquires: its writes are complete before we hand the channel on and
        a next request writes there. Without room in the ring the engine
        writes ``end_rid`` after those areas instead, a plain store read here
        as Lease.read reads it: ordered by x86-64's in-order stores (TSO), the
        same assumption as that end-without-room path."""
        end = False
        while (rec := ch.ring.pop(0)) is not None:
            if rec[1] == rid and rec[4] & F_LAST:
                end = True
        return end or int(ch.hdr[0]["end_rid"]) == rid

    def _reap(self) -> None:
        """Under ``_lock``: channels whose cancelled request the engine has
        ended go to the far end of the free list (the last to be leased
        again, which costs nothing and is no part of the guarantee)."""
        for i, rid in list(self._unended.items()):
            ch = self.arena.channel(i)
            if self._ended(ch, rid):
                del self._unended[i]
                ch.hdr["rid"] = 0
                self._free.insert(0, i)

    @property
    def unended(self) -> int:
        """Channels released unfinished whose end the engine has not published yet."""
        return len(self._unended)

    @property
    def leased(self) -> int:
        return self._leased

    # ------------------------------------------------------------- submission
    def send(self, kind: int, channel: int, rid: int = 0, arg: int = 0, timeout: float = 2.0,
             epoch: int | None = None) -> None:
        """Push one submission record and ring the doorbell.

        A worker may wait (the engine never does): if the ring is full the
        engine is inside a long step; wait for space up to ``timeout``.
        ``epoch`` (a lease's request): refused if we registered with another
        engine since that lease was taken; checked under ``_sub_lock``, which
        a registration holds through its handshake, so a request of a dead
        engine's lease never reaches its successor (whose registration left
        that channel unreset: server.EnginePort._reset).
        """
        ring = self.arena.sub_ring(self.w)
        deadline = time.monotonic() + timeout
        with self._sub_lock:
            if epoch is not None and epoch != self.epoch:
                raise EngineUnavailable("engine restarted")
            while not ring.push(rid, channel, kind, 0, arg):
                if time.monotonic() > deadline:
                    raise EngineUnavailable("submission ring full")
                time.sleep(0.0005)
        self.arena.doorbell.release()

    def erase_slot(self, slot: int) -> None:
        """SUB_ERASE, sent as a lease's records are: registered first (the
        engine reads no ring of an index that has not registered with it,
        and a registration empties the ring, so an erase from a worker that
        had not leased since the engine started was lost, answered 200). A
        registration by another thread of ours cannot reset the ring under
        the push: it holds ``_sub_lock`` through its handshake (register)."""
        with self._lock:
            self._registered()
        self.send(SUB_ERASE, 0, 0, slot)
