"""The engine's side of the arena: intake of submissions, worker lifecycle.

Single-threaded by design (it runs inside the engine's step loop), so it is
the only consumer of every submission ring and the only producer of every
channel ring.
"""
from __future__ import annotations

import os
import time
from typing import Callable

from . import shm
from .arena import Arena
from .layout import CH_FREE, ST_READY

RECHECK_S = 0.1  # how often worker pids are checked for death


class EnginePort:
    """Registration, reclaim and submission intake for the engine."""

    def __init__(self, arena: Arena, on_reclaim: Callable[[int, range], None]):
        """``on_reclaim(w, channels)`` must drop every engine reference to those
        channels (cancel their slots) before their rings are reset."""
        self.arena, self.on_reclaim = arena, on_reclaim
        n = arena.geom.n_workers
        self.epoch = arena.start_engine_epoch(os.getpid())
        # Registrations made with an earlier engine are stale: every worker
        # re-registers before we touch its rings (its free channels' only, _reset).
        self.acked = [int(arena.workers[w]["req_seq"]) for w in range(n)]
        self.live = [False] * n  # registered with this epoch
        self.pid = [0] * n
        self.gen = [0] * n
        self._next_check = 0.0
        self.rings = [arena.sub_ring(w) for w in range(n)]
        self.doorbell = arena.doorbell
        self.reclaims = 0
        self.t_work = time.monotonic()  # when a submission last came (engine/sleep.py)
        self.early: list[tuple[int, tuple[int, int, int, int]]] = []  # (worker, record) taken by peek()

    def pending(self) -> bool:
        """Is a submission waiting in some ring? One sem_getvalue a worker;
        a hint (the record is taken with the acquire in ``peek``)."""
        return any(r.items.value > 0 for r in self.rings)

    def waiting(self) -> bool:
        """Has a registered worker queued a submission, or is a worker
        registering? What the next ``poll`` would take: engine/sleep.py
        does not doze over it (the idle wait may have taken the doorbell's
        ring for it)."""
        wt = self.arena.workers
        return any((self.live[w] and self.rings[w].items.value > 0) or int(wt[w]["req_seq"]) != self.acked[w]
                   for w in range(len(self.rings)))

    def peek(self) -> list[tuple[int, int, int, int]]:
        """Take the submissions queued now from the rings of workers that
        are registered and not registering again, with nothing else of
        ``poll`` (no registration, reset or death check: those reclaim
        channels, which must not happen during a decode). What it returns is
        also kept for the next ``poll``, which returns it first: the
        per-worker FIFO order holds. Called from the abort callback, during a
        step (engine/preempt.py)."""
        wt = self.arena.workers
        new = [(w, r) for w in range(len(self.rings))
               if self.live[w] and int(wt[w]["req_seq"]) == self.acked[w] for r in self._take(w)]
        self.early += new
        return [r for _, r in new]

    def _take(self, w: int) -> list[tuple[int, int, int, int]]:
        """Every record in worker w's submission ring now, as (kind, channel, rid, arg)."""
        out = []
        while True:
            # pop, not take/free: a SUB slot holds nothing outside its record (ipc/ring.py)
            rec = self.rings[w].pop(0)  # ACQUIRE: pairs with the worker's post
            if rec is None:
                return out
            _seq, rid, channel, kind, _pad, arg = rec
            out.append((kind, channel, rid, arg))

    def ready(self) -> None:
        self.arena.set("ready_pid", os.getpid())  # before READY (x86 stores in order): never cleared
        self.arena.set("state", ST_READY)

    def poll(self) -> list[tuple[int, int, int, int]]:
        """Registrations, deaths, then every submission queued now, as
        (kind, channel, rid, arg) in per-worker FIFO order."""
        a = self.arena
        wt = a.workers
        for w in range(len(self.acked)):
            seq = int(wt[w]["req_seq"])
            if seq != self.acked[w]:
                self._reset(w, keep_pid=int(wt[w]["pid"]))
                self.early = [e for e in self.early if e[0] != w]  # its old registration's, reclaimed now
                self.pid[w], self.gen[w] = int(wt[w]["pid"]), int(wt[w]["generation"])
                self.live[w] = True
                self.acked[w] = seq
                wt[w]["epoch"] = self.epoch
                wt[w]["ack_seq"] = seq
                a.ack(w).release()  # RELEASE: the resets above are visible to the worker
        now = time.monotonic()
        if now >= self._next_check:
            self._next_check = now + RECHECK_S
            for w in range(len(self.live)):
                if self.live[w] and not shm.alive(self.pid[w]):
                    self._reset(w)
                    self.live[w] = False
                    self.early = [e for e in self.early if e[0] != w]
        out = [r for _, r in self.early]  # taken during the last step (peek): first, in their order
        self.early = []
        for w in range(len(self.rings)):
            if self.live[w]:
                out += self._take(w)
        if out:  # the idle clock of --sleep-idle-seconds (engine/sleep.py): any submission is work
            self.t_work = now
        return out

    def _reset(self, w: int, keep_pid: int = 0) -> None:
        """Reclaim index w: the engine lets go of its channels, then empties
        their rings and its submission ring (no reader of w is active on
        them: the worker is dead, or it is registering). ``keep_pid`` (a
        registration): a channel still leased by that process is its lease
        from an engine that died, whose reader may still touch it (a thread held
        in a write to a client that stopped reading); it is left alone, this
        engine never writes to it (it was never submitted here), and the
        worker resets its ring itself when that lease ends (WorkerPort.release)."""
        chans = self.arena.channels_of(w)
        self.on_reclaim(w, chans)
        for i in chans:
            ch = self.arena.channel(i)
            h = ch.hdr[0]
            if keep_pid and int(h["state"]) != CH_FREE and int(h["owner_pid"]) == keep_pid:
                continue  # the registering process's own lease of a dead engine (a replaced one's: reset)
            ch.ring.reset()
            # A dead worker never released its leases: mark them free so
            # /metrics' channels_leased and monitoring agree with the engine.
            ch.hdr["state"] = CH_FREE
            ch.hdr["rid"] = 0
        self.rings[w].reset()
        self.reclaims += 1

    def owner_ok(self, channel: int, rid: int) -> bool:
        """Is this request still wanted? False if its lease changed, it was
        cancelled, or its worker is gone (the engine then ends it as
        cancelled). The engine checks it before writing a request's vector;
        see ``holds`` for why the answer cannot turn stale before the write."""
        ch = self.arena.channel(channel)
        h = ch.hdr[0]
        return int(h["rid"]) == rid and not h["cancel"] and self.live[channel // self.arena.geom.n_chan]

    def holds(self, channel: int, rid: int) -> bool:
        """May the engine write request ``rid``'s areas of this channel (its
        result; under --embedding its vector, over the prompt area)? True
        while the header carries rid: its lease, or, released unfinished,
        the worker keeping the channel aside until rid's end
        (ipc/client.py module doc). Race-free, not just a narrower window:
        the worker changes the header's rid only after it has seen this
        engine end rid (its LAST record or ``end_rid``, pushed after every
        such write) or after a registration's reset (which drops the
        request first, on this thread), so a check made before the end
        holds until the engine itself ends the request."""
        return int(self.arena.channel(channel).hdr[0]["rid"]) == rid

    def wait(self, timeout: float) -> bool:
        """Sleep on the doorbell (idle only); drains extra rings so the next
        idle wait really sleeps."""
        got = shm.wait(self.doorbell, timeout)
        if got:
            shm.drain(self.doorbell)
        return got
