"""The prefix tree (engine/prefix.py) on a cell-level fake of llama.cpp's
unified KV: no model. Every check reads back which cells a sequence holds
and which token each cell was computed for, so a wrong seq_cp range, a
holder lending cells of another path or an eviction of a pinned prefix fails."""
from __future__ import annotations

import numpy as np
import pytest

from engine.prefix import PrefixCache

KEEPER = 9
HOLDERS = range(10, 16)


class FakeKV:
    """Cells: [pos, token, tags]; seq_cp/seq_rm as llama_kv_cache in one stream."""

    def __init__(self) -> None:
        self.cells: list[list] = []

    def decode(self, seq: int, tokens, pos0: int = 0) -> None:
        for i, t in enumerate(tokens):
            self.cells.append([pos0 + i, int(t), {seq}])

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        p1 = p1 if p1 >= 0 else 1 << 30
        for c in self.cells:
            if src in c[2] and max(p0, 0) <= c[0] < p1:
                c[2].add(dst)

    def seq_rm(self, seq: int, p0: int = -1, p1: int = -1) -> bool:
        p1 = p1 if p1 >= 0 else 1 << 30
        for c in self.cells:
            if max(p0, 0) <= c[0] < p1:
                c[2].discard(seq)
        self.cells = [c for c in self.cells if c[2]]
        return True

    def seq(self, s: int) -> list[int]:
        """Tokens of sequence s by position; asserts one cell per position 0..n-1."""
        cs = sorted((c[0], c[1]) for c in self.cells if s in c[2])
        assert [p for p, _ in cs] == list(range(len(cs))), f"seq {s} positions {cs}"
        return [t for _, t in cs]


def run(kv: FakeKV, tree: PrefixCache, slot: int, prompt: list[int], gen: list[int]) -> int:
    """One request on `slot`: attach, compute the rest, cache it; the prefix reused."""
    p = np.array(prompt + gen, np.int32)
    m, node = tree.attach(np.array(prompt[:-1], np.int32), (slot,))
    assert kv.seq(slot) == prompt[:m]  # KV of exactly the shared tokens
    kv.decode(slot, p[m:], m)
    tree.insert(p, slot)
    PrefixCache.unpin(node)
    kv.seq_rm(slot)
    return m


def test_longest_match_split_and_exact_cells() -> None:
    kv, t = FakeKV(), None
    t = PrefixCache(kv, HOLDERS, KEEPER)
    sysp = list(range(100, 140))
    assert run(kv, t, 0, sysp + [1, 2, 3], [7, 8]) == 0
    assert run(kv, t, 1, sysp + [1, 2, 3, 7, 8, 4], [5]) == 45  # next turn: whole history
    assert run(kv, t, 0, sysp + [9, 9], [6]) == 40  # another conversation: the system prompt
    assert run(kv, t, 2, sysp[:20] + [55], []) == 20  # mid-edge
    # every cell is held once, and every cached cell carries the keeper
    assert t.held == len(kv.cells) == 40 + 7 + 3 + 1
    assert all(KEEPER in c[2] for c in kv.cells)
    # each leaf's holder holds exactly its path
    for h, leaf in t.leaves.items():
        path, n = [], leaf
        while n is not t.root:
            path = list(n.tokens) + path
            n = n.parent
        assert kv.seq(h) == path
    assert t.match(np.array(sysp + [1, 2, 3, 7, 8, 4, 5, 0], np.int32))[0] == 47
    assert t.match(np.array([100, 101, 5], np.int32))[0] == 2
    assert t.match(np.array([5], np.int32))[0] == 0


def test_lru_eviction_never_takes_a_pinned_prefix() -> None:
    kv = FakeKV()
    t = PrefixCache(kv, HOLDERS, KEEPER)
    convs = [[200 + i] * 10 for i in range(4)]
    for i, c in enumerate(convs):
        run(kv, t, 0, c, [1])
    pinned_len, pinned = t.attach(np.array(convs[0] + [1, 3], np.int32), (1,))  # conv 0: oldest, now in use
    assert pinned_len == 11
    run(kv, t, 2, convs[2] + [1, 4], [])  # conv 2 touched: most recent
    assert t.evict_one()  # LRU unpinned: conv 1
    assert t.match(np.array(convs[1], np.int32))[0] == 0
    assert t.match(np.array(convs[0] + [1], np.int32))[0] == 11
    while t.evict_one():
        pass
    # only the pinned path is left, and its cells are intact for the slot holding them
    assert t.held == 11 and kv.seq(1) == convs[0] + [1]
    assert {c[1] for c in kv.cells} == set(convs[0] + [1])
    PrefixCache.unpin(pinned)
    assert t.evict_one() and t.held == 0 and t.evicted_tokens > 0
    kv.seq_rm(1)
    assert kv.cells == [] and sorted(t.free) == list(HOLDERS)


def test_out_of_holders_evicts_lru_and_keeper_survives_sibling_eviction() -> None:
    kv = FakeKV()
    t = PrefixCache(kv, range(10, 12), KEEPER)  # two holders only
    run(kv, t, 0, [1, 2, 3, 4], [])
    run(kv, t, 0, [1, 2, 5, 6], [])  # sibling at the same positions
    run(kv, t, 0, [1, 2, 3, 4, 9], [])  # grows a leaf: no new holder
    assert len(t.leaves) == 2
    run(kv, t, 0, [8, 8, 8], [])  # a third path: LRU ([1 2 5 6]) goes
    assert t.match(np.array([1, 2, 5, 6], np.int32))[0] == 2
    # the evicted sibling shared positions 2..3 with [3 4]: the keeper still tags those
    assert all(KEEPER in c[2] for c in kv.cells)
    assert t.held == len(kv.cells) == 5 + 3


@pytest.mark.parametrize("seed", range(3))
def test_random_workload_never_cross_talks(seed: int) -> None:
    rng = np.random.default_rng(seed)
    kv = FakeKV()
    t = PrefixCache(kv, HOLDERS, KEEPER)
    hist = [[int(x) for x in rng.integers(0, 4, 3)] for _ in range(8)]
    for step in range(60):
        i = int(rng.integers(0, 8))
        hist[i] = hist[i] + [int(x) for x in rng.integers(0, 4, 3)]
        run(kv, t, int(rng.integers(0, 4)), hist[i], [int(rng.integers(0, 4))])
        if rng.random() < 0.3:
            t.evict_one()
        assert t.held == len(kv.cells)


class FakeModel(FakeKV):
    twin, n_ctx, n_seq_max = 0, 64, 12


def test_queue_order_longest_cached_first_defer_and_bounded_wait() -> None:
    import time

    from engine.kvcache import MIN_SHARED, SlotCache
    from engine.slots import Request, Slot
    from ipc.layout import N_COUNTERS, SLOT_PROMPT

    m = FakeModel()
    kv = SlotCache(m, 2, np.zeros(N_COUNTERS), max_wait=1.0)
    cached = list(range(1, 21))
    m.decode(0, cached)
    kv.tree.insert(np.array(cached, np.int32), 0)
    m.seq_rm(0)

    def req(toks: list[int], age: float = 0.0) -> Request:
        r = Request(0, len(toks), t_submit=time.perf_counter() - age, prompt=np.array(toks, np.int32))
        r.params = {"cache_prompt": 1}
        return r

    cold, short, long_ = req([50, 51, 52]), req(cached[:5] + [9]), req(cached + [9, 9])
    assert kv.order([cold, short, long_]) == [long_, short, cold]
    old = req([60, 61], age=5.0)  # waited past max_wait: first whatever it shares
    assert kv.order([cold, long_, old])[0] is old
    # a running prompt computing a long prefix that `r` shares: r waits for it (not past max_wait)
    s = Slot(0, 512)
    shared = list(range(100, 100 + MIN_SHARED + 10))
    s.req, s.state = req(shared + [1]), SLOT_PROMPT
    r = req(shared + [2])
    kv.order([r])
    assert kv.defer(r, [s]) and not kv.defer(cold, [s])
    assert not kv.defer(req(shared + [2], age=5.0), [s])
    # room: a busy slot's own cells count; eviction of unpinned leaves makes room
    s.n_past, s.n_attached = 60, 0
    kv.ensure([s])
    assert kv.tree.held == 0 and kv.tree.evictions == 1


def test_cache_tokens_bound() -> None:
    from engine.kvcache import SlotCache
    from ipc.layout import N_COUNTERS

    m = FakeModel()
    kv = SlotCache(m, 2, np.zeros(N_COUNTERS), max_wait=1.0, cap=10)
    for base in (1, 20, 40):
        toks = list(range(base, base + 6))
        m.decode(0, toks)
        kv.tree.insert(np.array(toks, np.int32), 0)
        m.seq_rm(0)
    kv.ensure([])
    assert kv.tree.held == 6 and kv.tree.match(np.array(range(40, 46), np.int32))[0] == 6  # LRU kept
