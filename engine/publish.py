"""What leaves the step loop: records, results, ends of requests, /slots rows.

The Engine (engine/loop.py) is a Publisher: these methods run on its
thread, between its steps' phases, and use the state it sets up (cfg,
arena, cnt, tab, slots, queue, out, kv, files). A record reaches its
reader through its channel's ring; a full ring pauses that slot only
(`publish` holds the record, `unpause` retries it every step, and
``stall_timeout`` ends it). The result area is filled before the LAST
record is pushed, and a slot's /slots row shows it free before its reader
can see the end.

Ends: every request the engine takes from a submission ring it ends exactly
once, with a LAST record (``end``, or the LAST record of its last token), or
``end_rid`` in the header when the ring is full; cancelled ones too, running
(``finish``) or still queued (``cancel``, Engine.assign). The end is the
engine's last write for that rid into its channel: a worker keeps a channel
released unfinished out of its free list until it sees that end (ipc/client.py
module doc), so nothing written here can land in a next request's areas.
Belt and braces, each write into areas a reader does not filter by rid (the
result area, the vector) is made only while the header still carries the
rid (EnginePort.holds / owner_ok).
"""
from __future__ import annotations

import collections
import time

from ipc.channel import Channel
from ipc.layout import (
    CNT, F_LAST, F_PROGRESS, SLOT_GEN, SLOT_IDLE, SLOT_PAUSED, STOP_CANCEL, STOP_ERROR, STOP_SHIFT, STOP_SHUTDOWN,
    STOP_STALL,
)

from .shift import settle
from .slots import Request, Slot


class Publisher:
    """The loop's output side (see module doc); Engine's base class."""

    # --------------------------------------------------------------- records
    def unsettle(self) -> None:
        """Records are about to be pushed whose accounting completes only at
        `settle`: ``settle_seq`` goes odd first. Memory order: this store
        precedes the ring pushes in program order and x86-64 keeps stores in
        order, so a reader that saw a LAST record and then reads the
        sequence sees it odd, or even again after `settle`
        (frontends/api/metrics.py `settled`)."""
        c, i = self.cnt, CNT["settle_seq"]
        if not int(c[i]) & 1:
            c[i] += 1

    def settle(self) -> None:
        """After each step (Engine.step): the cache gauges follow the
        releases of this step, then ``settle_seq`` is even again, so /metrics
        never shows a request's end without its accounting (llama-server's
        metrics task runs between its steps; ours are read by other
        processes at any time)."""
        c, i = self.cnt, CNT["settle_seq"]
        if int(c[i]) & 1:
            if self.kv is not None:
                self.kv.publish()
            c[i] += 1

    def publish(self) -> None:
        if self.out:
            self.unsettle()
        pushes = 0
        for s, rec in self.out:
            ch = self.arena.channel(s.req.channel)
            if rec[3] & F_LAST:  # /slots and /metrics show the slot's final row, free, before the reader sees the end
                self.show(s)
                self.tab[s.id]["state"] = SLOT_IDLE
            if ch.push(*rec):
                pushes += 1
                if rec[3] & F_LAST:
                    self.release(s)
                else:
                    self.show(s)
            elif rec[3] & F_PROGRESS:
                pass  # advisory: dropped rather than pausing a slot that is still prompting
            else:
                s.held = rec
                s.state = SLOT_PAUSED
                s.t_paused = time.perf_counter()
                self.cnt[CNT["ring_full_pauses_total"]] += 1
                self.show(s)
        self.out.clear()
        self.cnt[CNT["ring_pushes_total"]] += pushes

    def unpause(self) -> None:
        """Retry held records; a slot resumes once its reader made room (its
        ``space`` post, made only after it copied the freed slot's record
        and probability row: Channel.push may then rewrite both)."""
        now = time.perf_counter()
        for s in self.slots:
            if s.state != SLOT_PAUSED:
                continue
            rec = s.held
            self.unsettle()
            if self.arena.channel(s.req.channel).push(*rec):
                s.held = None
                if rec[3] & F_LAST:
                    self.release(s)
                else:
                    s.state = SLOT_GEN
                    self.show(s)
            elif now - s.t_paused > self.cfg.stall_timeout:
                self.cnt[CNT["stall_cancels_total"]] += 1
                s.held = None
                self.finish(s, STOP_STALL)

    # ------------------------------------------------------------ finishing
    def result(self, s: Slot, stop: int, code: int = 0, error: str = "") -> None:
        """Fill the result area (before the LAST record is published) and
        count the request, once."""
        if s.reported:
            return
        s.reported = True
        now = time.perf_counter()
        t_first = s.t_first or now
        n_prompt = len(s.req.prompt)
        # Only into its own channel (module doc): not owner_ok, which is false
        # for a stop string's cancel too, whose reader still reads the timings.
        if self.port.holds(s.req.channel, s.req.rid):
            self.arena.channel(s.req.channel).result[0] = (
                s.id, n_prompt, s.n_cache, n_prompt - s.n_cache, s.n_decoded, s.n_past,
                (t_first - s.t_start) * 1e3, (now - t_first) * 1e3, code, 0, s.n_discarded, error.encode()[:199],
                *(self.spec.totals(s) if self.spec is not None else (0, 0)))
        c, i = self.cnt, CNT
        c[i["prompt_tokens_total"]] += n_prompt - s.n_cache
        c[i["prompt_tokens_cached_total"]] += s.n_cache
        c[i["prompt_seconds_total"]] += t_first - s.t_start
        c[i["tokens_predicted_total"]] += s.n_decoded
        c[i["tokens_predicted_seconds_total"]] += now - t_first
        c[i["tokens_predicted_steps_total"]] += max(s.n_decoded - 1, 0)  # the rate's numerator (llama-server's steps)
        c[i["requests_total"]] += 1
        if stop == STOP_CANCEL:
            c[i["cancels_total"]] += 1

    def finish(self, s: Slot, stop: int, code: int = 0, error: str = "") -> None:
        """End a slot's request now: best-effort LAST record, then release."""
        self.out = [(o, rec) for o, rec in self.out if o is not s]
        self.result(s, stop, code, error)
        self.end(s.req, stop)
        if stop == STOP_CANCEL and self.kv is not None and self.abandoned(s.req):
            self.kv.abandon(s)  # its reader is gone: the answer no next turn can start with goes
        self.release(s)

    def abandoned(self, req) -> bool:
        """A cancelled request's reader gave it up (dropped the stream, or its
        lease is gone), rather than stopping it at a stop string (cancel 1,
        ipc/client.py Lease.cancel)."""
        h = self.arena.channel(req.channel).hdr[0]
        return int(h["rid"]) != req.rid or int(h["cancel"]) != 1

    def release(self, s: Slot) -> None:
        if s.sampler is not None:
            s.sampler.free()
        s.sampler, s.req, s.held, s.i_batch = None, None, None, -1
        if self.spec is not None:
            self.spec.end(s)
        settle(self.model, s)  # a shifted slot keeps only its exact prefix (engine/shift.py)
        if self.kv is not None:
            self.kv.release(s)  # prompt + generation: the slot's entry in the tree
        s.state = SLOT_IDLE
        s.t_used = time.perf_counter()
        self.show(s)

    def reject(self, req: Request, code: int, msg: str) -> None:
        """End a request that never ran with an error in its result area; a
        request nobody waits for any more (cancelled, its lease gone) ends as
        cancelled without a write (module doc)."""
        if not self.port.owner_ok(req.channel, req.rid):
            self.end(req, STOP_CANCEL)
            return
        ch: Channel = self.arena.channel(req.channel)
        r = ch.result
        r[0] = (-1, 0 if req.prompt is None else len(req.prompt), 0, 0, 0, 0, 0.0, 0.0, code, 0, 0, msg.encode()[:199], 0, 0)
        self.end(req, STOP_ERROR)

    def end(self, req: Request, stop: int) -> None:
        """Publish a LAST record without a token; if the ring is full, mark
        the header so the reader still learns the end once it drains. Either
        is also the worker's signal that the channel may be leased again
        (module doc), so it comes after every other write for the request:
        the push's post orders them (ipc/client.py WorkerPort._ended); the
        header's two stores come after them in program order (x86-64 keeps
        stores in order), ``end_rid`` last. The header is marked only while it
        carries the rid: a record is dropped by rid, the header is not."""
        self.unsettle()
        ch = self.arena.channel(req.channel)
        if not ch.push(req.rid, time.monotonic_ns(), -1, F_LAST | stop << STOP_SHIFT, 0.0, None) \
                and self.port.holds(req.channel, req.rid):
            ch.hdr["end_stop"] = stop
            ch.hdr["end_rid"] = req.rid

    def cancel(self, channel: int, rid: int, stop: int) -> None:
        """End request ``rid``, running or queued (its worker waits for the
        end before leasing the channel again: module doc). Not found: it has
        ended already (a cancel crossing its end); nothing to write."""
        for s in self.slots:
            if s.req is not None and s.req.channel == channel and s.req.rid == rid:
                self.finish(s, stop)
                return
        keep = collections.deque()
        for q in self.queue:
            if q.channel == channel and q.rid == rid:
                self.end(q, stop)
            else:
                keep.append(q)
        self.queue = keep

    def reclaim(self, w: int, channels: range) -> None:
        """A worker index is being reset: forget its requests (no records:
        nobody reads them, and the rings are about to be emptied)."""
        for s in self.slots:
            if s.req is not None and s.req.channel in channels:
                self.out = [(o, rec) for o, rec in self.out if o is not s]
                self.release(s)
        self.queue = collections.deque(q for q in self.queue if q.channel not in channels)
        self.files.drop(channels)

    def shutdown(self) -> None:
        """Tell every reader we are going (wakes them at once)."""
        for s in self.slots:
            if not s.idle:
                self.finish(s, STOP_SHUTDOWN, 503, "server is shutting down")
        for req in self.queue:
            self.reject(req, 503, "server is shutting down")
        self.queue.clear()

    def show(self, s: Slot) -> None:
        """Mirror a slot into the control block's slot table (for /slots)."""
        req = s.req
        self.tab[s.id] = (s.state, -1 if req is None else req.channel, 0 if req is None else req.rid,
                          s.n_prompt, s.n_cache, s.n_decoded, s.n_past, s.n_predict, s.id_task, (0, 0, 0))
