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

    def add(self, e: Entry, tokens, pin: Entry | None = None) -> bool:
        """Keep ``e`` (a blob of ``tokens``): least recently used entries go
        first if the bound needs room; so does any entry whose tokens ``e``
        extends (a conversation's earlier turn: its next turn matches ``e``;
        with a sliding window that gives up branching exactly at the older
        end). ``pin`` is never dropped here (a load from it is under way).
        False: ``e`` does not fit (nothing of it is kept)."""
        assert e.blob is not None and e.slot < 0
        # the pin counts against the bound only where it is one of this tier's entries (a host-tier blob
        # being loaded is not); and the check comes before any drop: a refused ``e`` keeps what it extends
        held = pin is not None and pin.blob is not None and any(x is pin for x in self.entries)
        if not self.fits(e.nbytes + (pin.nbytes if held else 0)):
            return False
        for c, old in self.tree.shared(tokens):
            if old.slot < 0 and c >= old.n and old is not pin:
                self.drop(old, count=False)
        while self.limit >= 0 and self.nbytes + e.nbytes > self.limit:
            self.drop(min((x for x in self.entries if x is not pin), key=lambda x: x.t_used))
        self.tree.insert(tokens, e)
        self.entries.append(e)
        self.nbytes += e.nbytes
        self.tokens += e.n
        return True

    def drop(self, e: Entry, count: bool = True) -> None:
        self.tree.remove(e)
        self.entries.remove(e)
        self.nbytes -= e.nbytes
        self.tokens -= e.n
        e.blob, e.ckpts = None, []
        if count:
            self.evictions += 1
            self.evicted_tokens += e.n
