"""Slots on the prefix cache: which slot a request takes, which cached KV it
starts from, and what is kept when a slot is reused (issue 14).

The KV stays in llama.cpp's per-slot streams (engine/model.py): slot i is
sequence i and each decode attends over its own cells only, so the cache
costs running requests nothing. Each slot's content (``cache[:n]``, whose KV
sits in its stream) is an entry of the prefix tree (engine/prefix.py), and
so is each parking stream's content (``--cache-streams``: sequences past the
slots' that no decode touches) and each blob of the host-RAM tier
(engine/ramcache.py). For a request:

1. `pick`: the idle slot it runs on and the entry holding the longest
   usable cached prefix of its prompt (never its last token: its logits
   are needed), whichever slot or blob that is;
2. `attach`: the slot keeps its own content if that gives (nearly) as much
   (seq_rm cuts the rest); else the prefix is copied in, from another
   slot's stream (`seq_cp`: llama.cpp copies the whole stream buffer at the
   start of the next decode) or from RAM (`state_set`), and cut to length.
   Before a slot's content is cut or replaced, unless another entry already
   holds it, it is copied whole into a parking stream (`seq_cp`; the least
   recently used parked content then goes to RAM), or else saved to RAM
   (`state_get`);
3. `prompt_done` / `release`: the slot's entry grows to its prompt (queued
   requests sharing it can copy it while this one generates), then to
   prompt + generation.

Pending stream copies (lifetime rule): llama.cpp performs a `seq_cp` between
streams only at the next `llama_decode`, while `state_get` / `state_set`
touch the buffers at once. Until that decode (`stepped`), a slot that is the
destination of a pending copy has stale buffers (no `state_get` from it) and
one that is a source or destination must not be overwritten by `state_set`
(the later copy would read or clobber it). `seq_cp` itself is always safe:
llama.cpp performs pending copies in the order they were made.

Sliding-window models (gemma 3, n_swa 512): a prefix of length c is exact
only if its copy still holds the sliding-window cells of positions
[c - n_swa, c); llama-server's rule (`usable`, engine/lookup.py): the
sequence's lowest position (`llama_memory_seq_pos_min`, the SWA cache's) <=
max(0, c - n_swa).
A slot's stream keeps every cell unless llama.cpp's find_slot reuses one
outside the window (rare: the rule catches it). `state_get` leaves out the
cells outside the window of the sequence's last position, so a blob of n
tokens longer than n_swa serves exactly its own length n: a slot is cut
RAM_MARGIN tokens short before it is saved, so a next turn whose
re-tokenized history differs in its last tokens still matches it whole, and
sliding-window checkpoints (`state_get` of the window alone after cutting
the sequence there) are kept where other cached prompts branch off it. A
parking stream keeps every cell: any prefix of its content is usable.

What a cut slot keeps (step 2's parking and RAM saves, the checkpoints and
the density rule) is the keep policy, engine/keep.py; SlotCache is a Keeper.
"""
from __future__ import annotations

import time
from typing import Callable

import numpy as np

from ipc.layout import CNT, SLOT_PROMPT

from .keep import Keeper
from .hosttier import HostTier
from .kvevents import KvEvents
from .lookup import holds
from .prefix import Entry, common
from .shift import reuse_chunks
from .slots import Request, Slot, fresh, runs

MIN_SHARED = 64  # a prefix being computed worth waiting for (tokens)
# A peer's claimed prompt (the host tier) is waited for while evaluating it here would take longer:
# up to PEER_SLACK x its tokens at the learned per-token cost (never under max_wait); before that cost
# is learned (an instance's first prompts, when peers start together) up to PEER_COLD x max_wait. A
# fixed max_wait gave up just before a peer published on a slow CPU: two 1-thread instances, a
# 378-token system prompt (2.1-2.3 s there), the waiter evaluated it again (bench_fleet, 2026-12-07)
PEER_SLACK, PEER_COLD = 1.5, 4.0
MIN_GAIN = 4  # copy a prefix in only if it gives this many more tokens than the slot's own...
CELLS_PER_TOKEN = 512  # ...and, from another slot, one more per this many cells of the stream copied


class SlotCache(Keeper):
    """The prefix cache over every slot's stream, the parking streams and RAM
    (module doc); the engine loop calls it, on its thread only."""

    def __init__(self, model, slots: list[Slot], counters: np.ndarray, max_wait: float, ram_mib: int,
                 similarity: float, streams: int = 0, events: KvEvents | None = None,
                 patient: bool = False, host: HostTier | None = None,
                 per_tok: Callable[[], float] = lambda: 0.0) -> None:
        super().__init__(model, len(slots), ram_mib, streams)
        self.host = host  # the host tier (--cache-host, engine/hosttier.py): peers' prompt KV on this host
        self.per_tok = per_tok  # seconds a prompt token costs here, 0 until learned (StepBudget.per_tok)
        self.patient = patient  # defer past max_wait (see defer)
        self.events = events  # KV events (engine/kvevents.py): the tree tells it every entry that comes and goes
        self.tree.watch = events
        self.slots = slots
        self.cnt = counters
        # the *_total counters live in the arena and outlive this object (a
        # sleep frees the Engine, a crash restarts it): publish adds to what
        # they held when we were made, so /metrics never goes backwards
        self.base = counters.copy()
        self.max_wait = max_wait
        self.sps = similarity
        # a stream copy moves n_ctx_slot cells whatever the prefix: worth it
        # from about one evaluated token per CELLS_PER_TOKEN cells (scripts/bench_kv_copy.py)
        self.min_copy = max(MIN_GAIN, model.n_ctx_slot // CELLS_PER_TOKEN)
        self.hits = self.reused = self.copies = self.loads = 0
        self.t_copy = self.t_max = 0.0

    # ------------------------------------------------------------ choice
    def pick(self, req: Request) -> tuple[Slot, Entry | None, int] | None:
        """The idle slot ``req`` runs on, the entry to copy its prefix from
        (None: the slot's own content) and that prefix's length; None: wait.
        As llama-server: the requested ``id_slot``; else the idle slot whose
        own content gives the longest prefix if that is more than
        ``similarity`` of the prompt (so a shared system line alone does not
        pull every conversation onto one slot); else the least valuable idle
        slot (its content held elsewhere or empty, then the one that keeps
        busy sequence ids together: slots.runs, then least recently used),
        which gets the best prefix copied in. ``id_slot`` never bypasses the
        cache: the pinned slot attaches the same way."""
        idle = [s for s in self.slots if s.idle]
        if req.id_slot >= 0:
            s = self.slots[req.id_slot % len(self.slots)]
            if not s.idle:
                return None
            idle = [s]
        if not idle:
            return None
        if not req.params["cache_prompt"]:
            return fresh(self.slots, idle), None, 0
        best, src, own = self._best(req.prompt)
        if self.host is not None:
            best, src = self._from_host(req.prompt, best, src, max(own.values(), default=0))
        mine = max(idle, key=lambda x: (own.get(x.id, 0), x.t_used))
        k = own.get(mine.id, 0)
        if len(idle) == 1 or (k > 0 and k + self.min_copy > best and k > self.sps * len(req.prompt)):
            s = mine if len(idle) > 1 else idle[0]
        else:
            s = min(idle, key=lambda x: (not self._spare(x), runs(self.slots, x), x.t_used))
        k = own.get(s.id, 0)
        if src is None or src.slot == s.id or best < k + (self.min_copy if src.slot >= 0 else MIN_GAIN):
            return s, None, k
        if src.slot < 0 and s.id in self.src | self.dst:
            return s, None, k  # a pending stream copy still reads or writes this slot
        return s, src, best

    def _from_host(self, prompt: np.ndarray, best: int, src: Entry | None, own: int) -> tuple[int, Entry | None]:
        """The host tier's best entry instead of ``src`` where it gives MIN_GAIN
        more tokens than any copy here: a transient RAM-like entry, in no tree
        (``node`` None: what tells `_copy` it is the host tier's)."""
        if max(best, own) + MIN_GAIN > len(prompt) - 1:  # nothing a peer has could give more
            return best, src
        c, name, n, lo = self.host.best(prompt, len(prompt) - 1)
        if c < max(best, own) + MIN_GAIN:
            return best, src
        blob = self.host.load(name)
        if blob is None:
            return best, src
        return c, Entry(n, blob=blob, swa_lo=lo)

    # ---------------------------------------------------------- lifetime
    def attach(self, s: Slot, prompt: np.ndarray, src: Entry | None, k: int, reuse: int = 0,
               key: object = None) -> int:
        """A request starts on idle slot ``s`` (from `pick`): put the KV of
        prompt[:k] in its sequence and return k (0: evaluate everything).
        ``reuse`` > 0 (--cache-reuse, on a KV that can shift): when the slot
        keeps its own content, chunks of it past k that the prompt repeats
        are moved into place (engine/shift.py), unless saving the content
        left a stream copy pending (a parking stream must copy it unmoved)."""
        t0 = time.perf_counter()
        if src is None:
            self._save(s, k)
            if reuse > 0 and not self.pending(s.id):
                k = reuse_chunks(self.m, s, prompt, k, reuse)  # cuts what it did not move
            elif not self.m.seq_rm(s.id, k, -1):
                self.m.seq_clear(s.id)
                k = 0
        else:
            src.t_used = t0
            # the RAM bound never drops the entry about to be loaded; a slot about to get state_set is not parked
            self._save(s, 0, pin=src, park=src.slot >= 0)
            k = self._copy(s, src, k)
            s.cache[:k] = prompt[:k]
        if k:
            self.hits += 1
            self.reused += k
        self._set(s, k)
        if self.host is not None:  # peers wait for this prompt's entry rather than evaluate it too
            moved = self.host.move(key, s.id)  # the claim it made while queued (defer), if any
            if len(prompt) - k < MIN_SHARED:
                self.host.unclaim(s.id)  # it will not publish: nobody waits for it
            elif not moved:
                self.host.claim(s.id, prompt)
        dt = time.perf_counter() - t0
        self.t_copy += dt
        self.t_max = max(self.t_max, dt)
        return k

    def _copy(self, s: Slot, src: Entry, k: int) -> int:
        """Put the KV of ``src``'s first k tokens in ``s``'s (emptied)
        sequence; returns k, or 0 (sequence empty) if the copy does not hold
        exactly positions [0, k) with the sliding window before k.

        From another slot: `state_get` / `state_set` where the copy keeps
        every cell the prefix needs (no sliding window, a source within one
        window, or the prefix is the source's whole sequence): about 1 ms per
        500 tokens; else `seq_cp`, a whole-stream copy (~22 ms for 8192
        cells, scripts/bench_kv_copy.py) at the next decode."""
        m = self.m
        if src.slot >= 0:
            n = m.pos_max(src.slot) + 1
            # a state copy moves the source's n cells, a stream copy all n_ctx_slot
            whole = (not self.n_swa or n <= self.n_swa or k >= n) and 2 * n <= m.n_ctx_slot
            if whole and src.slot not in self.dst and not self.pending(s.id):
                ok = m.state_set(s.id, m.state_get(src.slot))
            else:
                m.seq_cp(src.slot, s.id)  # performed at the next decode (module doc)
                self.src.add(src.slot)
                self.dst.add(s.id)
                ok = True
        else:
            ok = m.state_set(s.id, src.blob)  # pick never chooses a slot a pending copy touches
            if ok and not self.window_ok(src.swa_lo, k):  # short of the blob's end: its checkpoint at k
                ck = next((b for p, b in src.ckpts if p == k), None)
                ok = ck is not None and m.state_set(s.id, ck, swa_only=True)
            if src.node is None:  # the host tier's (every RAM entry is in the tree)
                self.host.loads += ok
            else:
                self.loads += ok
        if not ok or not m.seq_rm(s.id, k, -1):
            k = 0
        elif not holds(m, self.n_swa, s.id, k):
            k = 0  # not exactly the prefix: evaluate it rather than guess
        if k == 0:
            m.seq_clear(s.id)
        elif src.slot >= 0:
            self.copies += 1
        elif k == src.n and not src.ckpts and not src.shared and src.node is not None:
            # the whole blob is in the slot now, and goes back to RAM (`_save`) before any of it is
            # lost: a move, as llama-server's host cache, so RAM holds only what no slot holds
            self.ram.drop(src, count=False)
        return k

    def _set(self, s: Slot, n: int) -> None:
        """The slot's entry now says cache[:n] (n = 0: none), never past its
        exact prefix: KV moved by a context shift or cache reuse is not
        offered (engine/shift.py)."""
        if s.n_exact >= 0:
            n = min(n, s.n_exact)
        if s.entry is not None:
            self.tree.remove(s.entry)
            s.entry = None
        if n > 0:
            s.entry = Entry(n, slot=s.id)
            s.entry.t_used = time.perf_counter()
            self.tree.insert(s.cache[:n], s.entry)

    def prompt_done(self, s: Slot) -> None:
        """``s`` evaluated its whole prompt: others may copy it now, and with
        the host tier so may the peers, if it evaluated MIN_SHARED tokens itself."""
        self._set(s, s.n_past)
        if self.host is not None:
            n = s.n_past
            # never KV that --cache-reuse moved into place (n_exact >= 0): only an exact prefix is offered
            if n - s.n_cache >= MIN_SHARED and s.n_exact < 0 and not self.pending(s.id):
                lo = self.m.pos_min(s.id)
                self.host.publish(s.cache[:n], self.m.state_get(s.id), max(lo, n - self.n_swa) if self.n_swa else lo)
            self.host.unclaim(s.id)  # after the entry is there: a peer waiting on the claim then finds it

    def abandon(self, s: Slot) -> None:
        """``s``'s request was cancelled (its client dropped the stream):
        its generation never reached anyone whole, so no next turn starts
        with it; the slot keeps its prompt only (a retry may ask it again),
        and neither it nor RAM keeps abandoned answers (issue 24: 2,000
        dropped unique streams grew the tree by 653 MB toward the bound).
        Nor is the prompt saved to RAM when the slot is reused (`_save`):
        a retry comes while the slot still holds it, or recomputes it.
        seq_rm only marks cells free: a pending stream copy from this slot
        still reads whole buffers at the next decode."""
        if self.host is not None:
            self.host.unclaim(s.id)
        n = len(s.req.prompt) if s.req is not None and s.req.prompt is not None else s.n_past
        if s.n_past > n and self.m.seq_rm(s.id, n, -1):
            s.n_past = n
        self.abandoned.add(s.id)

    def release(self, s: Slot) -> None:
        """``s``'s request ended: cache[:n_past] is its KV (every token added
        to a batch was decoded; a failed batch zeroes n_past)."""
        if self.host is not None:
            self.host.unclaim(s.id)
        self._set(s, s.n_past)

    def sync(self, s: Slot) -> None:
        """The loop changed ``s``'s KV outside the cache (erase, slot file
        restore, failed batch, a context shift): the entry follows n_past,
        and what the slot now holds is no abandoned answer (a restored file
        was dropped at the next save, not kept)."""
        self.abandoned.discard(s.id)
        self._set(s, s.n_past)

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
            r.n_match = self.tree.match(r.prompt[:len(r.prompt) - 1]) if r.params["cache_prompt"] else 0
            keyed.append(((1, -r.n_match, r.t_submit), r))
        keyed.sort(key=lambda x: x[0])
        return [r for _, r in keyed]

    def defer(self, r: Request) -> bool:
        """Hold ``r`` back this step: a running prompt is computing at least
        MIN_SHARED more tokens of its prefix than the cache has; ``r`` copies
        it once that prompt is done (prompt_done). Never past ``max_wait``,
        unless ``patient`` (admission by age, --admit fifo or srf: the prompt
        it waits for is older and goes first, so evaluating the same prefix
        beside it could not finish sooner; issue 24: a 1,700-token document's
        second question, giving up after 2 s, computed it again). A peer's
        claimed prompt is waited for up to ``peer_wait``."""
        if not r.params["cache_prompt"]:
            return False
        waited = time.perf_counter() - r.t_submit
        need = r.n_match + MIN_SHARED
        if self.patient or waited <= self.max_wait:
            for s in self.slots:
                if s.state == SLOT_PROMPT and s.req is not None and common(s.req.prompt, r.prompt) >= need:
                    return True
        # a peer's prompt (the host tier): never past peer_wait, its order is not ours; a prompt that
        # will evaluate MIN_SHARED tokens here claims them first, so that peers wait for it (hosttier.py)
        n = len(r.prompt) - r.n_match
        if self.host is not None and n >= MIN_SHARED and waited <= self.peer_wait(n):
            if self.host.behind((r.channel, r.rid), r.prompt, need):
                self.host.waits += 1
                return True
        return False

    def peer_wait(self, n: int) -> float:
        """Seconds a request that would evaluate ``n`` tokens waits for a
        peer's claim of them (PEER_SLACK, PEER_COLD): past that, evaluating
        them here would have been sooner."""
        t = self.per_tok()
        return max(self.max_wait, PEER_SLACK * n * t) if t > 0.0 else PEER_COLD * self.max_wait

    def settle(self) -> None:
        """After an intake (engine/loop.py): host-tier claims of queued requests
        that neither started nor wait for a peer go (hosttier.py HostTier.settle)."""
        if self.host is not None:
            self.host.settle()

    def publish(self) -> None:
        """Mirror the cache's figures into the /metrics counters."""
        c, ram, b = self.cnt, self.ram, self.base
        totals = {"cache_hits_total": self.hits, "cache_tokens_reused_total": self.reused,
                  "cache_parks_total": self.parks, "cache_evictions_total": self.dropped + ram.evictions,
                  "cache_tokens_evicted_total": self.dropped_tokens + ram.evicted_tokens,
                  "cache_copies_total": self.copies, "cache_ram_saves_total": self.saves,
                  "cache_ram_loads_total": self.loads, "cache_copy_seconds_total": self.t_copy}
        if self.host is not None:
            h = self.host
            totals.update(cache_host_loads_total=h.loads, cache_host_publishes_total=h.publishes,
                          cache_host_waits_total=h.waits)
        for k, v in totals.items():
            c[CNT[k]] = b[CNT[k]] + v
        c[CNT["cache_tokens_held"]] = (sum(s.entry.n for s in self.slots if s.entry is not None) + ram.tokens
                                       + sum(e.n for e, _, _ in self.parked.values()))
        c[CNT["cache_nodes"]] = self.tree.n_entries
        c[CNT["cache_copy_ms_max"]] = self.t_max * 1e3
        c[CNT["cache_ram_tokens"]] = ram.tokens
        c[CNT["cache_ram_bytes"]] = ram.nbytes
        c[CNT["cache_ram_entries"]] = len(ram.entries)
        if self.events is not None:  # once per step: this step's changes to the index, netted, in one message
            self.events.flush()

    def close(self) -> None:
        """Shutdown: the events' last message (AllBlocksCleared) and their socket."""
        if self.events is not None:
            self.tree.watch = None
            self.events.close()
            self.events = None
        if self.host is not None:
            self.host.close()
            self.host = None
