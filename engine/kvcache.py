"""Slots on the prefix cache: attach, publish, release, room and queue order.

The glue between the step loop (engine/loop.py) and the tree
(engine/prefix.py) when the KV is one unified pool (cfg.prefix_cache).

Sequence ids: slot i is sequence i; its SWA twin (engine.model.Batch) is
i + parallel; the keeper is 2 * parallel; holders of cached prefixes are
2 * parallel + 1 .. n_seq_max - 1.

Lifetime of a slot's KV: `attach` (start of a request) tags the slot's
sequences with the longest cached prefix of its prompt and pins that node;
`prompt_done` (its prompt evaluated) puts the prompt in the tree, so
requests queued behind a shared prefix can attach while this one still
generates; `release` (the request ended) puts prompt + generation in the
tree and clears the slot's sequences: an idle slot holds nothing, every
cached token is in the tree. Pool accounting: cells used = ``tree.held`` +
each busy slot's cells past its pinned path (``own``); `ensure` evicts
least recently used leaves before a decode would not fit.
"""
from __future__ import annotations

import time
import numpy as np

from ipc.layout import CNT, SLOT_PROMPT

from .prefix import PrefixCache, common
from .slots import Request, Slot

MIN_SHARED = 64  # a prefix being computed worth waiting for (tokens)
MARGIN = 16  # free cells kept beyond the accounted ones


class SlotCache:
    def __init__(self, model, parallel: int, counters: np.ndarray, max_wait: float, cap: int = 0) -> None:
        self.m = model
        self.twin = model.twin
        self.pool = model.n_ctx
        keeper = 2 * parallel
        self.tree = PrefixCache(model, range(keeper + 1, model.n_seq_max), keeper if self.twin else -1)
        self.cnt = counters
        self.max_wait = max_wait
        self.cap = cap if cap > 0 else self.pool  # cells the tree may hold (--cache-tokens)

    def seqs(self, s: Slot) -> tuple[int, ...]:
        return (s.id, s.id + self.twin) if self.twin else (s.id,)

    def clear_slot(self, s: Slot) -> None:
        for q in self.seqs(s):
            self.m.seq_rm(q, 0, -1)
        PrefixCache.unpin(s.node)
        s.node, s.n_attached, s.n_past = None, 0, 0

    # ---------------------------------------------------------- lifetime
    def attach(self, s: Slot, prompt: np.ndarray, reuse: bool) -> int:
        """A request starts on idle slot ``s``: the cached prefix it reuses
        (never its last token: its logits are needed)."""
        self.clear_slot(s)
        s.n_left = 0
        if not reuse or s.fresh:
            s.fresh = False
            return 0
        m, node = self.tree.attach(prompt[:len(prompt) - 1], self.seqs(s))
        s.node, s.n_attached = node, m
        s.cache[:m] = prompt[:m]
        return m

    def prompt_done(self, s: Slot) -> None:
        """``s`` evaluated its whole prompt: cache it now, pinned by ``s``."""
        self._insert(s, s.n_past)

    def release(self, s: Slot) -> None:
        """``s``'s request ended: its prompt and generation go to the tree
        (the KV of cache[:n_past] is complete: every token added to a batch
        was decoded, a failed batch zeroes n_past), then the slot empties."""
        s.n_left = s.n_past
        if s.n_past > 0:
            self._insert(s, s.n_past)
            s.last_leaf = s.node if s.n_attached == s.n_past else None
        self.clear_slot(s)

    def _insert(self, s: Slot, n: int) -> None:
        """Cache s.cache[:n]; the slot then pins it, and its sequences are
        re-tagged onto the tree's cells (cells it computed that the tree
        already had from another request are freed now, so that every cell
        of the slot below n_attached is a tree cell: the room accounting
        relies on it)."""
        node = self.tree.insert(s.cache[:n], s.id)
        if node is None or node.end != n:
            return
        node.ref += 1
        PrefixCache.unpin(s.node)
        s.node, s.n_attached = node, n
        h = self.tree.holder_of(node)
        for q in self.seqs(s):
            self.m.seq_rm(q, 0, n)
            self.m.seq_cp(h, q, 0, n)

    def erase(self, s: Slot) -> None:
        """/slots erase, llama-server's meaning: the slot forgets its cache.
        The leaf its last request ended on is dropped (if nobody uses it and
        nothing grew from it) and its next request evaluates everything."""
        leaf = s.last_leaf
        if leaf is not None and leaf.ref == 0 and leaf.holder >= 0 and leaf.parent is not None:
            self.tree.drop(leaf)
        s.last_leaf, s.n_left, s.fresh = None, 0, True

    # -------------------------------------------------------------- room
    def used(self, slots: list[Slot]) -> int:
        return self.tree.held + sum(s.n_past - s.n_attached for s in slots if not s.idle)

    def ensure(self, slots: list[Slot]) -> None:
        """Before a decode: make the pool hold the batch just built (the
        slots' n_past already count its tokens), evicting LRU unpinned
        leaves; MARGIN cells to spare."""
        room = self.pool - self.used(slots)
        if room < MARGIN:
            self.tree.evict_until(room, MARGIN)
        while self.tree.held > self.cap and self.tree.evict_one():
            pass  # every cached cell widens each decode's attention: keep at most cap

    def publish(self) -> None:
        """Mirror the tree's figures into the /metrics counters."""
        c, t = self.cnt, self.tree
        c[CNT["cache_hits_total"]] = t.hits
        c[CNT["cache_tokens_reused_total"]] = t.reused
        c[CNT["cache_tokens_held"]] = t.held
        c[CNT["cache_nodes"]] = len(t.leaves)
        c[CNT["cache_evictions_total"]] = t.evictions
        c[CNT["cache_tokens_evicted_total"]] = t.evicted_tokens

    # -------------------------------------------------------- scheduling
    def order(self, reqs: list[Request]) -> list[Request]:
        """Waiting requests in the order they should get slots: anyone
        waiting past ``max_wait`` seconds first, in arrival order (nobody
        starves); then longest cached prefix first (SGLang's
        longest-prefix-first), ties in arrival order."""
        now = time.perf_counter()
        keyed = []
        for r in reqs:
            if now - r.t_submit > self.max_wait:
                keyed.append(((0, 0, r.t_submit), r))
                continue
            r.n_match = self.tree.match(r.prompt[:len(r.prompt) - 1])[0] if r.params["cache_prompt"] else 0
            keyed.append(((1, -r.n_match, r.t_submit), r))
        keyed.sort(key=lambda x: x[0])
        return [r for _, r in keyed]

    def defer(self, r: Request, slots: list[Slot]) -> bool:
        """Hold ``r`` back this step: a running prompt is computing at least
        MIN_SHARED more tokens of its prefix than the tree has; it is cached
        when that prompt is done (prompt_done) and ``r`` then attaches it.
        Never past ``max_wait``."""
        if not r.params["cache_prompt"] or time.perf_counter() - r.t_submit > self.max_wait:
            return False
        need = r.n_match + MIN_SHARED
        for s in slots:
            if s.state == SLOT_PROMPT and s.req is not None and common(s.req.prompt, r.prompt) >= need:
                return True
        return False
