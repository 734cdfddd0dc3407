"""The prefix tree and the slot cache on a fake of llama.cpp's per-slot streams
(tests/_prefix_fake.py): every way a prompt's prefix is reused (its slot's
own KV, a cross-slot `seq_cp`, a RAM blob with its sliding-window
checkpoints, a parking stream) hands the slot KV computed from that
prompt's tokens.

The fake behaves as llama.cpp does where it matters: a cross-stream
`seq_cp` copies the metadata at once and the buffer only at the next
decode, and `state_get` leaves out sliding-window cells outside the window.
The property checked after every decode (in `run`): each slot's KV at
positions [0, k) was computed from exactly the request's prompt tokens (no
cross-talk), with the sliding-window cells before k present. Also here: the
RAM bound never evicts the entry being loaded, and the ``*_total``
counters outlive the cache object. What the cache chooses to keep, and in
which order requests meet it, is tests/test_prefix_policy.py's.
"""
from __future__ import annotations

import random

import numpy as np
import pytest

from engine.kvcache import SlotCache
from engine.prefix import Entry, PrefixTree
from engine.slots import Slot
from ipc.layout import CNT

from _prefix_fake import FakeStreams, make, req, run


def test_tree_shared_lengths_and_remove() -> None:
    t = PrefixTree()
    a, b = Entry(6, slot=0), Entry(4, slot=1)
    t.insert(np.array([1, 2, 3, 4, 5, 6]), a)
    t.insert(np.array([1, 2, 9, 9]), b)
    assert t.match(np.array([1, 2, 3, 4, 7])) == 4
    got = {e.slot: c for c, e in t.shared(np.array([1, 2, 3, 4, 7]))}
    assert got == {0: 4, 1: 2}
    assert t.splits(np.array([1, 2, 3, 4, 5, 6, 7])) == [2, 6] and t.splits(np.array([1, 2, 9])) == [2]
    t.remove(a)
    assert t.match(np.array([1, 2, 3])) == 2 and t.nodes() == 1  # the split at 2 merged away
    t.remove(b)
    assert t.nodes() == 0 and t.n_entries == 0


def test_cross_slot_copy_ram_restore_and_pins() -> None:
    kv, slots, cache = make(n_slots=2)
    sys_ = list(range(100, 140))
    a = sys_ + list(range(200, 230))
    assert run(kv, cache, [req(a, 1, id_slot=0)]) == [0]
    b = sys_ + list(range(300, 330))
    assert run(kv, cache, [req(b, 2, id_slot=1)]) == [40]  # slot 0's system prompt, copied from its stream
    assert cache.copies == 1
    c = sys_ + list(range(400, 430))
    assert run(kv, cache, [req(c, 3, id_slot=0)]) == [40]  # slot 0's own system prompt; the rest goes to RAM
    assert cache.saves == 1 and len(cache.ram.entries) == 1
    a2 = a + list(np.random.default_rng(1).integers(1000, 2000, 5)) + [7, 8, 9]
    assert run(kv, cache, [req(a2, 4, id_slot=1)]) == [len(a) + 5]  # back from RAM, prompt and answer
    assert cache.loads == 1
    no = run(kv, cache, [req(a2, 5, cache_prompt=0)])
    assert no == [0]


def test_swa_blob_serves_its_own_length_and_its_checkpoints() -> None:
    kv, slots, cache = make(n_slots=1, n_swa=16)
    a = list(range(100, 160))
    run(kv, cache, [req(a, 1)], gen=4)
    b = list(range(500, 560))
    run(kv, cache, [req(b, 2)])  # a's 64 tokens go to RAM, cut RAM_MARGIN short
    (e,) = cache.ram.entries
    assert e.n == 64 - 4 and e.swa_lo == e.n - 16 and not e.ckpts
    b2 = b[:30] + [9] * 10
    assert run(kv, cache, [req(b2, 3)]) == [30]  # its slot's own 30; b goes to RAM with the window at 30
    assert [p for p, _ in cache.ram.entries[-1].ckpts] == [30]
    out_a = np.random.default_rng(1).integers(1000, 2000, 4)
    assert run(kv, cache, [req(a + list(out_a) + [1, 2], 4)]) == [e.n]  # a's blob, whole
    assert run(kv, cache, [req(a[:40] + [5] * 10, 5)]) == [0]  # restored from that blob, the slot lacks the window before 40
    b3 = b[:30] + [8] * 10
    assert run(kv, cache, [req(b3, 6)]) == [30]  # from RAM: a blob and its checkpoint at 30
    assert cache.loads == 2


def test_parking_stream_keeps_every_prefix_of_a_long_content() -> None:
    kv, slots, cache = make(n_slots=1, n_swa=16, streams=1)
    doc = list(range(100, 160))
    run(kv, cache, [req(doc + [1, 2, 3], 1)])
    run(kv, cache, [req(list(range(500, 560)), 2)])  # the first content goes whole to the parking stream
    assert cache.parks == 1 and not cache.ram.entries
    assert run(kv, cache, [req(doc + list(range(800, 820)), 3)]) == [60]  # any prefix of it: the window is there
    assert cache.parks == 1 and len(cache.ram.entries) == 1  # the parked source is pinned: the slot's went to RAM
    run(kv, cache, [req(list(range(700, 760)), 4)])  # parks this one, the older parked content goes to RAM
    assert cache.parks == 2 and len(cache.ram.entries) == 2


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("n_swa,streams", [(0, 0), (8, 0), (8, 2)])
def test_random_workload_never_cross_talks(seed: int, n_swa: int, streams: int) -> None:
    """Families of prompts sharing prefixes, several requests started in the
    same step (pending copies interleave), tight RAM bound, parking streams
    or none: every attached prefix is the request's own tokens (checked in
    `run`)."""
    rng = random.Random(seed)
    kv, slots, cache = make(n_slots=4, n_swa=n_swa, ram=1, streams=streams)
    cache.ram.limit = 2500  # bytes: a few of the fake's blobs, so the bound evicts all the time
    fams = [[rng.randrange(50) for _ in range(rng.randrange(5, 40))] for _ in range(5)]
    hist = {}
    rid = 0
    for _ in range(40):
        batch = []
        for _ in range(rng.randrange(1, 5)):
            rid += 1
            f = rng.randrange(len(fams))
            base = hist.get(f, fams[f]) if rng.random() < 0.7 else fams[f][:rng.randrange(1, len(fams[f]) + 1)]
            p = list(base) + [rng.randrange(50) for _ in range(rng.randrange(1, 12))]
            hist[f] = p
            batch.append(req(p, rid, id_slot=rng.choice([-1, -1, -1, rng.randrange(4)])))
        run(kv, cache, batch)
    assert cache.hits > 0 and cache.copies + cache.loads > 0 and cache.ram.evictions > 0
    cache.publish()
    assert cache.cnt[CNT["cache_ram_bytes"]] == cache.ram.nbytes <= 2500


def test_totals_outlive_the_cache_object() -> None:
    """A sleep frees the Engine and its SlotCache, a crash restarts them: the
    arena's ``*_total`` counters go on from where they were (as llamacpp:*)."""
    kv, slots, cache = make(n_slots=2)
    p = list(range(100, 140))
    run(kv, cache, [req(p, 1)])
    run(kv, cache, [req(p + [7, 8], 2)])
    cache.publish()
    hits = cache.cnt[CNT["cache_hits_total"]]
    assert hits >= 1
    kv2, slots2 = FakeStreams(2, 0), [Slot(i, 4096) for i in range(2)]
    again = SlotCache(kv2, slots2, cache.cnt, 2.0, 64, 0.1)  # the next Engine, the same arena
    again.publish()
    assert again.cnt[CNT["cache_hits_total"]] == hits
    run(kv2, again, [req(p, 3)])
    run(kv2, again, [req(p + [9], 4)])
    again.publish()
    assert again.cnt[CNT["cache_hits_total"]] == hits + again.hits > hits


def test_the_entry_being_loaded_survives_the_ram_bound() -> None:
    """The slot's old content is saved before the new prompt's prefix is
    loaded: with room for one blob, that save must not evict the blob about
    to be loaded (it would leave nothing to load: the engine would die)."""
    kv, slots, cache = make(n_slots=1)
    a = list(range(100, 160))
    run(kv, cache, [req(a, 1)], gen=4)
    run(kv, cache, [req(list(range(500, 560)), 2)], gen=4)  # a's content goes to RAM
    (e,) = cache.ram.entries
    cache.ram.limit = 2 * e.nbytes - 16  # room for one blob of this size, not two
    assert run(kv, cache, [req(a + [1, 2, 3], 3)]) == [60]  # b's save does not fit: b is dropped, not a
    assert cache.loads == 1 and cache.dropped >= 1


def test_ram_add_refused_keeps_what_it_extends_and_a_pin_outside_ram_is_not_counted() -> None:
    """RamCache.add checks the bound before it drops anything: a blob too big
    for the tier leaves the older turn it extends in place (it dropped it,
    uncounted, then refused the new one: both lost). And a pin counts against
    the bound only when it is one of the tier's entries: a host-tier blob
    being loaded (kvcache._from_host, in no tier) refused a save that fit an
    empty tier."""
    from engine.ramcache import RamCache

    def blob(n: int, size: int) -> Entry:
        return Entry(n, blob=np.zeros(size, np.uint8))

    ram = RamCache(PrefixTree(), 1)  # 1 MiB
    old = blob(20, 400_000)
    assert ram.add(old, np.arange(20, dtype=np.int32))
    assert not ram.add(blob(30, 1_200_000), np.arange(30, dtype=np.int32))  # past the bound: refused
    assert ram.entries == [old] and ram.nbytes == 400_000
    fresh = RamCache(PrefixTree(), 1)
    host = blob(10, 600_000)  # not in this tier
    assert fresh.add(blob(20, 500_000), np.arange(20, dtype=np.int32), pin=host)
    assert fresh.nbytes == 500_000
    inram = blob(5, 700_000)  # a pin that is in the tier counts
    assert fresh.add(inram, np.arange(100, 105, dtype=np.int32)) and fresh.entries == [inram]
    assert not fresh.add(blob(30, 400_000), np.arange(200, 230, dtype=np.int32), pin=inram)
