"""The host-RAM tier of the prefix cache (``--cache-ram MiB``, issue 14).

Holds KV that left the slots: `llama_state_seq_get_data` blobs
(engine/model.py `state_get`), each an ``Entry`` of the prefix tree
(engine/prefix.py) with ``slot`` -1. Bounded by bytes: adding past the
bound drops least recently used entries first (nothing in RAM is pinned:
a restore copies the blob into a slot, so dropping a blob never affects a
running request). limit 0: the tier is off; < 0: no bound.

Lifetime: a blob is a numpy buffer referenced only from its entry; dropping
the entry frees it (malloc returns buffers this large to the OS at once),
so the process's RSS follows ``nbytes``.
"""
from __future__ import annotations

from .prefix import Entry, PrefixTree


class RamCache:
    def __init__(self, tree: PrefixTree, mib: int) -> None:
        self.tree = tree
        self.limit = -1 if mib < 0 else mib << 20
        self.entries: list[Entry] = []
        self.nbytes = 0
        self.tokens = 0
        self.evictions = self.evicted_tokens = 0

    @property
    def on(self) -> bool:
        return self.limit != 0

    def fits(self, nbytes: int) -> bool:
        return self.limit < 0 or nbytes <= self.limit

    def add(self, e: Entry, tokens) -> None:
        """Keep ``e`` (a blob of ``tokens``): older entries go first if the
        bound needs room; so does any entry whose tokens ``e`` extends."""
        assert e.blob is not None and e.slot < 0
        for c, old in self.tree.shared(tokens):
            if old.slot < 0 and c >= old.n and old.swa_lo == 0 and e.swa_lo == 0:
                self.drop(old, count=False)  # fully inside the new one: redundant
        while self.entries and self.limit >= 0 and self.nbytes + e.nbytes > self.limit:
            self.drop(min(self.entries, key=lambda x: x.t_used))
        self.tree.insert(tokens, e)
        self.entries.append(e)
        self.nbytes += e.nbytes
        self.tokens += e.n

    def drop(self, e: Entry, count: bool = True) -> None:
        self.tree.remove(e)
        self.entries.remove(e)
        self.nbytes -= e.nbytes
        self.tokens -= e.n
        e.blob = None
        if count:
            self.evictions += 1
            self.evicted_tokens += e.n
