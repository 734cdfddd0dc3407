"""The prefix tree and the slot cache on a fake of llama.cpp's per-slot streams.

The fake keeps, per stream, which positions a sequence holds (cell
metadata, changed at once) and which token each position's KV was computed
from (buffer data). As in llama.cpp, a cross-stream `seq_cp` copies the
metadata at once and the buffer only at the next decode, `state_get` /
`state_set` touch buffers at once and `state_get` leaves out sliding-window
cells outside the window. The property checked after every decode: each
slot's KV at positions [0, k) was computed from exactly the request's prompt
tokens (no cross-talk), with the sliding-window cells before k present.
"""
from __future__ import annotations

import pickle
import random

import numpy as np
import pytest

from engine.kvcache import SlotCache
from engine.prefix import Entry, PrefixTree
from engine.slots import Request, Slot
from ipc.layout import CNT, SLOT_GEN, SLOT_IDLE, SLOT_PROMPT


class FakeStreams:
    n_ctx_slot = 4096

    """Per-slot streams: meta[s] = {pos: in_swa} (what llama.cpp's cells say:
    the full-attention cache holds every position, the sliding-window cache
    those with in_swa), data[s] = {pos: token} (what the buffers hold)."""

    def __init__(self, n: int, n_swa: int = 0) -> None:
        self.n_swa = n_swa
        self.meta = [dict() for _ in range(n)]
        self.data = [dict() for _ in range(n)]
        self.pending: list[tuple[int, int]] = []

    def pos_min(self, s: int) -> int:  # as llama_kv_cache_iswa's: the sliding-window cache's
        w = [p for p, in_swa in self.meta[s].items() if in_swa]
        return min(w) if w else -1

    def pos_max(self, s: int) -> int:
        return max(self.meta[s]) if self.meta[s] else -1

    def seq_rm(self, s: int, p0: int = -1, p1: int = -1) -> bool:
        p0 = 0 if p0 < 0 else p0
        p1 = 1 << 30 if p1 < 0 else p1
        self.meta[s] = {p: t for p, t in self.meta[s].items() if not p0 <= p < p1}
        return True

    def seq_clear(self, s: int) -> None:
        self.meta[s] = {}

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        assert p0 < 0 and p1 < 0, "llama.cpp asserts on partial cross-stream copies"
        self.meta[dst] = dict(self.meta[src])
        self.pending.append((src, dst))

    def state_get(self, s: int, swa_only: bool = False) -> np.ndarray:
        top = max(self.meta[s])
        keep = {p: (self.data[s][p], sw and not (self.n_swa and top - p >= self.n_swa)) for p, sw in self.meta[s].items()}
        if swa_only:  # LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY: the sliding-window cache alone
            keep = {p: v for p, v in keep.items() if v[1]}
        return np.frombuffer(pickle.dumps((swa_only, keep)), np.uint8).copy()

    def state_set(self, s: int, blob: np.ndarray, swa_only: bool = False) -> bool:
        partial, keep = pickle.loads(blob.tobytes())
        assert partial == swa_only
        if swa_only:  # the sliding-window cache replaced, the full-attention one kept
            self.meta[s] = {p: p in keep for p in self.meta[s]}
        else:
            self.meta[s] = {p: sw for p, (_, sw) in keep.items()}
        self.data[s].update({p: t for p, (t, _) in keep.items()})
        return True

    def decode(self, writes: list[tuple[int, int, np.ndarray]]) -> None:
        for src, dst in self.pending:  # in order, before the batch is computed
            self.data[dst] = dict(self.data[src])
        self.pending.clear()
        for s, p0, toks in writes:
            for i, t in enumerate(toks):
                self.meta[s][p0 + i] = True
                self.data[s][p0 + i] = int(t)


def make(n_slots: int = 3, n_swa: int = 0, ram: int = 64, sps: float = 0.1, streams: int = 0):
    kv = FakeStreams(n_slots + streams, n_swa)
    slots = [Slot(i, 4096) for i in range(n_slots)]
    cache = SlotCache(kv, slots, np.zeros(64), 2.0, ram, sps, streams)
    return kv, slots, cache


def req(prompt, rid: int = 0, id_slot: int = -1, cache_prompt: int = 1) -> Request:
    return Request(0, rid, prompt=np.asarray(prompt, np.int32), params={"cache_prompt": cache_prompt},
                   id_slot=id_slot)


def run(kv: FakeStreams, cache: SlotCache, reqs: list[Request], gen: int = 5, check_swa: bool = True) -> list[int]:
    """Start every request that gets a slot, decode their prompts in one
    step, check each slot's KV, generate ``gen`` tokens, release. Returns the
    prefixes attached."""
    started = []
    for r in reqs:
        got = cache.pick(r)
        if got is None:  # its slot is taken this step
            continue
        s, src, k = got
        k = cache.attach(s, r.prompt, src, k)
        s.req, s.state, s.n_past, s.n_prompt, s.n_cache = r, SLOT_PROMPT, k, len(r.prompt), k  # busy: pick skips it
        started.append((s, r, k))
    kv.decode([(s.id, k, r.prompt[k:]) for s, r, k in started])
    cache.stepped()
    for s, r, k in started:
        held = kv.meta[s.id]
        for p in range(k):  # the reused KV was computed from this prompt's own tokens
            assert kv.data[s.id].get(p) == r.prompt[p], (s.id, p)
        if check_swa and kv.n_swa:
            assert all(held.get(p) for p in range(max(0, k - kv.n_swa), k))
        s.cache[:len(r.prompt)] = r.prompt
        s.n_past = len(r.prompt)
        cache.prompt_done(s)
        s.state = SLOT_GEN
    for s, r, k in started:
        out = np.random.default_rng(r.rid).integers(1000, 2000, gen).astype(np.int32)
        kv.decode([(s.id, s.n_past, out)])
        s.cache[s.n_past:s.n_past + gen] = out
        s.n_past += gen
        s.state, s.req = SLOT_IDLE, None
        cache.release(s)
    return [k for _, _, k in started]


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


def test_queue_order_longest_cached_first_and_bounded_wait() -> None:
    kv, slots, cache = make(n_slots=2)
    run(kv, cache, [req(list(range(100, 180)), 1)])
    short, long_ = req(list(range(100, 110)) + [1, 2], 2), req(list(range(100, 170)) + [3], 3)
    assert cache.order([short, long_]) == [long_, short]
    short.t_submit -= 10  # waited past cache_wait: first, whatever it shares
    assert cache.order([short, long_]) == [short, long_]


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


class Lines(FakeStreams):
    """Token 10 is a line break (for the turn-start checkpoint)."""

    def token_to_piece(self, t: int, special: bool = False) -> bytes:
        return b"\n" if t == 10 else b"w"


def test_a_documents_turn_start_gets_a_checkpoint_when_its_slot_moves_on() -> None:
    """Issue 24: the first question about a document longer than the
    window goes to RAM with the window at its prompt's last turn start, so
    the second one reuses the document without anyone having branched off
    it before; a continuing conversation's content gets none."""
    kv = Lines(1, 16)
    slots = [Slot(0, 4096)]
    cache = SlotCache(kv, slots, np.zeros(64), 2.0, 64, 0.1)
    doc = list(range(100, 140))
    cue = [10, 300]  # "\nAssistant:": a line start too close to the end to be a turn
    q1 = doc + [10] + list(range(200, 212)) + cue
    run(kv, cache, [req(q1, 1)])
    run(kv, cache, [req(list(range(500, 560)), 2)])  # q1's content goes to RAM
    (e,) = cache.ram.entries
    assert [p for p, _ in e.ckpts] == [len(doc) + 1]
    q2 = doc + [10] + list(range(400, 412)) + cue
    assert run(kv, cache, [req(q2, 3)]) == [len(doc) + 1]  # blob + checkpoint: the document, exactly
    chat = q2 + list(np.random.default_rng(3).integers(1000, 2000, 5)) + [10] + list(range(600, 612)) + cue
    assert run(kv, cache, [req(chat, 4)]) == [len(q2) + 5]  # its own slot: the next turn
    run(kv, cache, [req(list(range(700, 760)), 5)])
    # continued from its cached history: no checkpoint at its turn start (only where it branched off the cache)
    assert [p for p, _ in cache.ram.entries[-1].ckpts] == [len(q2) + 5]


def test_the_turn_start_is_marked_where_the_cached_prefix_reached_past_it() -> None:
    """Issue 24's prefix workload: a question that began with the same words
    as a cached sibling reused the document and those words (1,005 tokens
    of a 1,001-token document); its content's blob then ended where the two
    questions part, with no checkpoint at the document's end, and a question
    sharing only the document recomputed all of it. The turn start is now a
    mark there too; not for a conversation's next turn, which continued its
    cached history (the blob serves it whole)."""
    kv = Lines(1, 16)
    cache = SlotCache(kv, [Slot(0, 4096)], np.zeros(64), 2.0, 64, 0.1)
    doc = list(range(100, 140))
    toks = np.asarray(doc + [10, 200, 201, 202] + list(range(230, 242)) + [10, 300], np.int32)
    n = len(toks)
    assert cache._turn_start(toks, n, 0) == len(doc) + 1  # a new document: as before
    assert cache._turn_start(toks, n, len(doc) + 4) == len(doc) + 1  # reused past it: now marked
    assert cache._turn_start(toks, n, len(doc) + 1) == 0  # continued from it: a next turn, no mark
    assert cache._turn_start(toks, n, len(doc) - 5) == 0  # continued within a window before it: as before


def test_an_abandoned_stream_keeps_its_prompt_in_the_slot_and_nothing_in_ram() -> None:
    kv, slots, cache = make(n_slots=1)
    a = list(range(100, 160))
    got = cache.pick(req(a, 1))
    s, src, k = got
    cache.attach(s, a, src, k)
    kv.decode([(0, 0, np.asarray(a, np.int32))])
    cache.stepped()
    s.cache[:60] = a
    s.req, s.n_past = req(a, 1), 60
    cache.prompt_done(s)
    kv.decode([(0, 60, np.arange(1000, 1020, dtype=np.int32))])
    s.cache[60:80] = np.arange(1000, 1020)
    s.n_past = 80
    cache.abandon(s)  # the client dropped it mid-answer
    assert s.n_past == 60 and kv.pos_max(0) == 59
    s.req = None
    cache.release(s)
    assert s.entry.n == 60
    assert run(kv, cache, [req(a[:50] + [5] * 5, 2)]) == [50]  # a retry still finds the prompt in the slot
    assert not cache.ram.entries and cache.saves == 0  # the abandoned content never went to RAM


def test_a_blob_too_big_for_what_only_it_holds_stays_out_of_ram() -> None:
    """Issue 24: a content whose own part is small beside the KV its blob
    would take (a question's tail past a document another entry serves) is
    not saved to RAM; one whose own part is worth it (RAM_CELLS cells' bytes
    per token at most) is."""
    from engine.keep import RAM_CELLS

    kv, slots, cache = make(n_slots=2)
    for s in range(2):
        kv.meta[s], kv.data[s] = {p: True for p in range(200)}, {p: 7 for p in range(200)}
    cache.cell_bytes = (kv.state_get(0).nbytes - (kv.seq_rm(1, 100), kv.state_get(1).nbytes)[1]) / 100
    for s in range(2):
        kv.seq_clear(s)
    shared = list(range(100, 200))
    run(kv, cache, [req(shared + [5], 1, id_slot=0)], gen=0)  # slot 0 holds the shared part
    big = 100 // RAM_CELLS + 6  # own tokens: enough for its blob
    run(kv, cache, [req(shared + list(range(300, 300 + big)), 2, id_slot=1)], gen=0)
    run(kv, cache, [req(list(range(900, 960)), 3, id_slot=1)], gen=0)  # slot 1's content: to RAM
    a = np.asarray(shared + list(range(300, 300 + big)), np.int32)
    assert cache._held_len(a, None) == len(a)  # kept whole
    small = 100 // RAM_CELLS - 2  # too few for a blob of all its cells
    b = np.asarray(shared + list(range(400, 400 + small)), np.int32)
    run(kv, cache, [req(b, 4, id_slot=1)], gen=0)
    run(kv, cache, [req(list(range(960, 1020)), 5, id_slot=1)], gen=0)
    assert cache._held_len(b, None) == len(shared)  # only the shared part, from slot 0


def test_a_tail_too_small_to_keep_is_dropped_before_it_is_read() -> None:
    """Issue 24: a document's second question on the slot that holds the
    first one's prompt and answer keeps the document and cuts the tail (a
    few tokens past it): that tail never pays for a blob, and the slot's
    whole sequence is not read (`state_get`, 12 MiB for 1,500 tokens, in the
    engine loop) only to be dropped; a tail worth a blob still is read."""
    from engine.keep import RAM_CELLS

    kv, slots, cache = make(n_slots=1)
    kv.meta[0], kv.data[0] = {p: True for p in range(200)}, {p: 7 for p in range(200)}
    cache.cell_bytes = (kv.state_get(0).nbytes - (kv.seq_rm(0, 100), kv.state_get(0).nbytes)[1]) / 100
    kv.seq_clear(0)
    reads = []
    get = kv.state_get
    kv.state_get = lambda s, swa_only=False: (reads.append(s), get(s, swa_only))[1]
    doc = list(range(100, 400))
    assert run(kv, cache, [req(doc + [1, 2, 3, 4, 5, 6], 1)]) == [0]  # the slot: doc, question 1, its 5 tokens
    assert run(kv, cache, [req(doc + [7, 8], 2)]) == [300]  # 11 tokens cut: past MIN_SAVE
    assert reads == [] and cache.dropped == 1 and cache.saves == 0
    long = doc + list(range(500, 500 + 300 // RAM_CELLS + 10))  # its own part is worth its blob
    run(kv, cache, [req(long, 3)])
    assert run(kv, cache, [req(doc + [5], 4)]) == [300]
    assert reads and cache.saves == 1  # read and kept


def test_a_request_waits_for_the_prompt_computing_its_prefix() -> None:
    """defer: a request whose prefix a running prompt is computing waits for
    it; past cache_wait it gives up, unless admission is by age (patient:
    the prompt it waits for goes first anyway; issue 24)."""
    for patient in (False, True):
        kv, slots, cache = make(n_slots=2)
        cache.patient = patient
        doc = list(range(100, 300))
        s = slots[0]
        s.req, s.state = req(doc + [1, 2], 1), SLOT_PROMPT  # evaluating the document
        r = req(doc + [3, 4], 2)
        cache.order([r])
        assert cache.defer(r)
        r.t_submit -= 10  # waited past cache_wait
        assert cache.defer(r) is patient
