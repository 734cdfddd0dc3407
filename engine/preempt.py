"""The streams' step gives way to a cache hit that arrives during it.

Why: a later question (a document's next question, a chat's next turn) is a
short remainder after a cached prefix, decoded alone before the step's
other rows (engine/batch.py express). Its client sends it when the answer
before it ends, which is at a step's end, so it lands a few milliseconds
into the next step and waited for all of it (a step of three streams is
~30-40 ms here; docs/ARCHITECTURE.md, "A pure decode step gives way").

How: while a step that carries only generating rows runs (no prompt chunk,
no drafts: one ubatch per run of consecutive slot ids), llama.cpp's abort
callback (ggml-cpu.c: thread 0, after every graph node) looks for new
submissions. Where there are some it takes them (EnginePort.peek: the ring
records only; the next intake handles them in their order) and reads each
new request's prompt from its channel; it aborts the step when one of them
would be expressed, judged as ``express`` will judge it (its remainder after
the longest cached prefix <= ``express_tokens`` and <= that prefix), an idle
slot can take it, and less than 0.8 of the time the last pure step of as
many rows took has run: the streams lose what ran (and wait for the
question's decode, as they would have at the next step), the question gains
what was left. The step after an aborted one is never aborted: under a train
of questions the streams still move every other step. Cost while armed: one
Python call per graph node (~400 for Gemma 3 270M), +0.44 ms on a 31 ms
three-row step (1.4%, scripts/step_cost.py's way, A B interleaved). On a
GPU build the callback runs only for the CPU backend's nodes: the device's
graph is never aborted, and the step simply completes.

Lifetime and state: llama.cpp drops the aborted ubatch's positions from
the KV and keeps the ubatches before it (llama-context.cpp decode); the
engine then drops every generating row's token of this step (``undo``), so
each slot is back at its state before ``build`` and the next step feeds the
same token again. Nothing was sampled, so no sampler moved. The callback
runs on the engine's own thread (ggml's thread 0 is the caller of
llama_decode, which ctypes called with the GIL released), and touches no
llama.cpp state, no slot and no channel but to read it: a request read here
is only parsed; the intake still loads and validates it (Engine.load).
"""
from __future__ import annotations

import time

import llama_cpp as L

from ipc.channel import BadRequest
from ipc.layout import CNT, SUB_SUBMIT

from .budget import quick
from .vocab import hush

RECENT_S = 10.0  # armed only this long after an express decode: where none happens the callback costs nothing


class Preempt:
    """The abort callback of one engine's pure decode steps (module doc)."""

    def __init__(self, engine) -> None:
        self.e = engine
        self.cb = L.ggml_abort_callback(self._check)  # kept: llama.cpp holds only the pointer
        self.t0 = self.limit = 0.0
        self.hit = False
        self.n = 0
        self.gave = False  # the last armed step was aborted
        self.x_seen, self.t_express = 0.0, -RECENT_S  # the express decodes counted, when last one was
        self.cost: dict[int, float] = {}  # rows -> seconds of the last pure decode step with that many

    def arm(self) -> bool:
        """Before a step's llama_decode: watch it if it is a pure decode step
        (``build`` admitted no prompt and no draft), a slot is idle to take a
        newcomer, an express decode ran in the last RECENT_S (where cache hits
        come back; elsewhere, unique prompts, nothing is ever aborted and the
        callback would only cost), the budget knows what such a step costs, and the step before
        did not give way (else a train of questions, each arriving during the
        step redone after the one before, would stop the streams for as long
        as it lasts), and no context was shifted for it (an aborted K-shift
        graph left some layers rotated twice). True: armed, ``disarm`` after
        the decode."""
        e = self.e
        if self.gave:  # the step after one that gave way runs whole: the streams move at least every other step
            self.gave = False
            return False
        now = time.perf_counter()
        x = e.cnt[CNT["express_total"]]
        if x != self.x_seen:
            self.x_seen, self.t_express = x, now
        if now - self.t_express > RECENT_S:  # no cache hit expressed lately (unique prompts): not worth a call a node
            return False
        if e.n_prompt or e.n_spec or not e.budget.d_gen or not any(s.idle for s in e.slots):
            return False
        if e.n_shift:  # a context shift's K-shift runs in this decode: llama.cpp 0.3.36 keeps its pending
            return False  # shifts when that graph is aborted and rotates the done layers again next decode
        self.n = e.n_gen
        self.limit, self.hit = 0.8 * self.cost.get(self.n, e.budget.d_gen), False
        self.t0 = now
        L.llama_set_abort_callback(e.model.ctx, self.cb, None)
        return True

    def disarm(self, ret: int) -> None:
        if ret == 0:  # what a pure step of n rows costs now (the last one's time: the limit follows the machine)
            self.cost[self.n] = time.perf_counter() - self.t0
        hush(False)
        L.llama_set_abort_callback(self.e.model.ctx, L.ggml_abort_callback(), None)

    def _check(self, _data) -> bool:
        """After each graph node of an armed step: abort it? (module doc).
        Must not raise: ctypes would print the error and return 0."""
        if self.hit:
            return True
        e = self.e
        # installed only between arm and disarm: called only during an armed step
        if time.perf_counter() - self.t0 > self.limit or not e.port.pending():
            return False
        try:
            for kind, channel, rid, _arg in e.port.peek():
                if kind == SUB_SUBMIT and self._express(channel):
                    self.hit = True
                    hush(True)  # llama_decode logs the abort as errors
        except Exception:  # a bad record is the intake's to reject
            return False
        return self.hit

    def _express(self, channel: int) -> bool:
        """Would the request in ``channel`` be expressed at the next step?"""
        e = self.e
        try:
            prompt, params, _g, _b = e.arena.channel(channel).read_request(e.model.n_vocab)
        except BadRequest:
            return False
        pin = int(params["id_slot"])
        if pin >= 0 and not e.slots[pin % len(e.slots)].idle:
            return False
        m = e.kv.tree.match(prompt) if params["cache_prompt"] else 0
        return quick(len(prompt) - m, m, e.cfg.express_tokens)

    def undo(self) -> None:
        """After an aborted step: every generating row goes back one position
        (its KV too: earlier ubatches of the step stay in it), to be fed
        again by the next step's ``build``."""
        e = self.e
        for s in e.slots:
            if s.i_batch >= 0:
                s.n_past -= 1
                e.model.seq_rm(s.id, s.n_past, -1)
                s.i_batch = -1
        e.cnt[CNT["steps_preempted_total"]] += 1
        self.gave = True
