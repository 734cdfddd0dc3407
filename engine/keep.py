"""What the prefix cache keeps when a slot's content is cut or replaced:
a parking stream, a host-RAM blob with its sliding-window checkpoints, or
nothing (the keep policy of engine/kvcache.py's step 2).

Why its own module: choosing slots and copying prefixes in (SlotCache,
engine/kvcache.py) and deciding what a cut would lose and whether keeping
it pays (this) are two jobs; SlotCache is a Keeper and calls ``_save``
before every cut. The rule every decision here follows: a content is kept
only where no other entry holds it, it is at least MIN_SAVE tokens, and a
RAM blob spares at least one token's evaluation per RAM_CELLS KV cells'
bytes it takes (``_cheap``; docs/ARCHITECTURE.md, "What RAM keeps, and
what it costs").

Lifetime (engine/kvcache.py's module doc): ``_park`` makes a stream copy
(`seq_cp`) that llama.cpp performs only at the next decode, so it records
its source in ``src`` and its destination in ``dst`` until `stepped`; a
sequence in ``dst`` has stale buffers, so nothing here `state_get`s it.
Runs on the engine loop's thread only.
"""
from __future__ import annotations

import time

import numpy as np

from .lookup import Lookup
from .prefix import Entry
from .ramcache import RamCache
from .slots import Slot

MIN_SAVE = 8  # keep a slot's content only if this many of its tokens would be lost and no other copy has them
RAM_MARGIN = 4  # sliding-window models: tokens a slot is cut short by before it is saved
MAX_CKPTS = 2  # sliding-window checkpoints kept with one RAM entry (~7.9 MB each for gemma 3 270M)
RAM_CELLS = 12  # a RAM blob must spare at least one token's evaluation per this many KV cells' bytes it takes


class Keeper(Lookup):
    """The keep policy (module doc) and the state it owns: the RAM tier,
    the parking streams, the pending stream copies (``pending``,
    ``stepped``) and the drop counters."""

    def __init__(self, model, n_slots: int, ram_mib: int, streams: int) -> None:
        super().__init__(model)
        self.ram = RamCache(self.tree, ram_mib)
        self.src: set[int] = set()  # slots read by a pending stream copy (until the next decode)
        self.dst: set[int] = set()  # slots written by one
        self.free = list(range(n_slots + streams - 1, n_slots - 1, -1))  # parking streams (sequence ids) not in use
        # parking sequence -> (entry, its tokens, where its request branched off a cached prefix)
        self.parked: dict[int, tuple[Entry, np.ndarray, tuple[int, ...]]] = {}
        self.saves = self.parks = self.dropped = self.dropped_tokens = 0
        self.abandoned: set[int] = set()  # slots whose content's request was cancelled (SlotCache.abandon)
        # bytes of one token's KV cell (all layers; 0: unknown, the density rule is off)
        self.cell_bytes = getattr(model, "kv_bytes", 0) / max(getattr(model, "n_ctx", 0), 1)

    def pending(self, slot: int) -> bool:
        """A stream copy made since the last decode reads or writes ``slot``."""
        return slot in self.src or slot in self.dst

    def stepped(self) -> None:
        """A decode ran: llama.cpp performed every pending stream copy."""
        self.src.clear()
        self.dst.clear()

    def _save(self, s: Slot, keep: int, pin: Entry | None = None, park: bool = True) -> None:
        """``s``'s content is about to be cut to ``keep`` tokens: keep what
        would be lost, unless it is short or another entry holds it: whole
        in a parking stream (``park``: the slot is not overwritten by
        `state_set` this step), else in RAM. ``pin``: a RAM entry the bound
        must not drop now."""
        e = s.entry
        gone = s.id in self.abandoned
        self.abandoned.discard(s.id)  # a new request starts on the slot
        if e is None or e.n <= keep:
            return
        if gone:
            self._lost(e.n, keep)
            return
        held = self._held_len(s.cache[:e.n], e)
        if held >= e.n:
            return
        if e.n - max(keep, held) < MIN_SAVE:  # what only this copy holds: too little to keep
            self._lost(e.n, keep)
            return
        # where its last request branched off a cached prefix, and where its prompt's last turn starts
        marks = (s.n_cache, self._turn_start(s.cache[:e.n], s.n_prompt, s.n_cache))
        if park and s.id not in self.dst and self._park(s.id, s.cache[:e.n], pin, marks):
            return
        self._to_ram(s.id, s.cache[:e.n], e, keep, pin, marks)

    def _park(self, seq: int, tokens: np.ndarray, pin: Entry | None, marks: tuple[int, ...]) -> bool:
        """Copy sequence ``seq`` whole into a free parking stream, or into
        the least recently used one after its content went to RAM (never
        ``pin``'s: a copy from it is under way); False: no parking stream
        (or every one is pinned or written by a pending copy)."""
        if self.free:
            h = self.free.pop()
        else:
            old = [q for q in self.parked if q not in self.dst and self.parked[q][0] is not pin]
            if not old:
                return False
            h = min(old, key=lambda q: self.parked[q][0].t_used)
            e, toks, was = self.parked.pop(h)
            self._to_ram(h, toks, e, 0, pin, was)
            self.tree.remove(e)
        self.m.seq_cp(seq, h)  # resets h's cells; buffers copied at the next decode (module doc)
        self.src.add(seq)
        self.dst.add(h)
        pe = Entry(len(tokens), slot=h)
        pe.t_used = time.perf_counter()
        self.parked[h] = (pe, np.array(tokens, np.int32), marks)
        self.tree.insert(tokens, pe)
        self.parks += 1
        return True

    def _to_ram(self, seq: int, tokens: np.ndarray, e: Entry, keep: int, pin: Entry | None,
                marks: tuple[int, ...] = ()) -> None:
        """Save sequence ``seq`` (holding ``tokens``, entry ``e``) to RAM
        before it is cut to ``keep``: a blob cut RAM_MARGIN short (sliding
        windows), with sliding-window checkpoints where other cached prompts
        branch off it, at ``keep`` and at ``marks``; else count it as
        dropped."""
        n = len(tokens)
        lo = self.m.pos_min(seq)
        cut = n - RAM_MARGIN if self.n_swa and n > self.n_swa else n
        if not self.window_ok(lo, cut):
            cut = n  # the window is not there below the end (restored from a blob or a file): the end only
        if (not self.ram.on or seq in self.dst
                or not self.window_ok(lo, cut) or (cut < n and not self.m.seq_rm(seq, cut, -1))):
            self._lost(n, keep)
            return
        # where a checkpoint could spare tokens (below): the sliding window as it was where another cached
        # prompt branches off the content, and at the cut about to be made (keep), as (p, the tokens past
        # the longest prefix another entry serves); none where another copy serves all of it already
        ok = []
        if self.n_swa and cut > self.n_swa:
            at = {keep, *marks, *self.tree.splits(tokens[:cut])}
            ok = [(p, p - h) for p in at if keep <= p < cut and 0 < p and self.window_ok(lo, p)
                  for h in (self._held_len(tokens[:p], e),) if h < p]
        if self._worthless(seq, tokens, e, keep, cut, ok):
            self._lost(n, keep)
            return
        blob = self.m.state_get(seq)
        ckpts = []
        end = cut  # where the blob ends
        if ok:
            # the blob alone serves only its own length (module doc); the sequence is cut down step by
            # step, never below keep
            size = 0  # a window's bytes, once one was read (they are all about the same)
            for p, spare in sorted(ok, reverse=True):
                if len(ckpts) >= MAX_CKPTS:
                    break
                if size and self._cheap(spare, size):
                    continue  # known too cheap before reading its window
                if not self.m.seq_rm(seq, p, -1):
                    break
                ck = self.m.state_get(seq, swa_only=True)
                size = ck.nbytes
                if not ckpts and self._cheap(end - p, size):
                    # the tail past the longest checkpoint (a question and its answer past a document) is
                    # worth less than that window: the blob ends there instead, exact without one; and again
                    # down to a point a few tokens below (the document's turn start, 2-4 tokens before where
                    # two questions with the same first words part): one blob serves both, no checkpoint
                    blob, end = self.m.state_get(seq), p
                    continue
                if self._cheap(spare, size):
                    # e.g. the 3 tokens every document starts with, or a turn start 3 tokens past the end of
                    # a document's blob: 7.9 MB to spare 3 tokens' evaluation
                    continue
                ckpts.append((p, ck))
        r = Entry(end, blob=blob, swa_lo=max(lo, end - self.n_swa) if self.n_swa else lo, ckpts=ckpts)
        r.shared = end < cut  # cut at a branch point: every later question loads it (a copy, not a move)
        if self._cheap(end - max(keep, self._held_len(tokens[:end], e)), r.nbytes):
            # too big for what only it holds: a question's tail past a document that another entry
            # serves (a 10.5 MB blob for ~30 tokens; issue 24) costs more RAM than its recomputation
            # is worth; a conversation's turn past a short shared system prompt is kept (~7 MB for ~46)
            self._lost(n, keep)
            return
        r.t_used = time.perf_counter()
        if self.ram.add(r, tokens[:end], pin):
            self.saves += 1
        else:
            self._lost(n, keep)

    def _worthless(self, seq: int, tokens: np.ndarray, e: Entry, keep: int, cut: int, ok: list) -> bool:
        """No outcome of the reads in `_to_ram` would pass its density rules,
        told before the `state_get`, which reads the whole sequence in the
        engine loop (12 MiB, 4-60 ms for 1,500 tokens of gemma 3 270M, the high
        end on pages new to this VM). Two rules, either drops the content:

        - a bound: cut cells' bytes (cell_bytes: one cell over all layers)
          against the cut - keep tokens past what the slot keeps: no end and
          no checkpoint spares more. Past n_swa tokens llama.cpp leaves the
          masked sliding-window cells out of a blob, so a blob is smaller than
          this (1,000 tokens of gemma 3 270M: 10.7 MB, not 18.4), and a tail
          up to ~1.7x longer than the exact rule would keep goes here;
        - exact, from the bytes llama.cpp counts without copying: every
          checkpoint candidate's spare against a window's bytes (each
          candidate at or past n_swa holds a full window, as the cut does),
          and the blob at cut against its own. It spares a question's tail
          past a document that another slot serves, read (two `state_get`s,
          ~7 ms) only to be dropped in 116 of 124 saves of bench_cache's
          prefix workload."""
        if self.cell_bytes <= 0:
            return False
        if getattr(self.m, "swa_full", True) and self._cheap(cut - keep, cut * self.cell_bytes):
            return True
        if any(p < self.n_swa for p, _ in ok):
            return False
        if ok:
            w = self.m.state_size(seq, swa_only=True)
            if not all(self._cheap(spare, w) for _, spare in ok):
                return False
        return self._cheap(cut - max(keep, self._held_len(tokens[:cut], e)), self.m.state_size(seq))

    def _cheap(self, n: int, nbytes: int) -> bool:
        """n tokens' evaluation is worth less than nbytes of RAM (one token per
        RAM_CELLS cells' bytes); never where the cell size is unknown."""
        return self.cell_bytes > 0 and n * RAM_CELLS * self.cell_bytes < nbytes

    def _lost(self, n: int, keep: int) -> None:
        """A content of n tokens is cut to ``keep`` with nothing saved."""
        self.dropped += 1
        self.dropped_tokens += n - keep
