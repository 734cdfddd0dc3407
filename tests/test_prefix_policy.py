"""The slot cache's choices, on the fake of llama.cpp's streams
(tests/_prefix_fake.py): what a slot's content keeps when the slot moves
on, and in what order waiting requests meet the cache (issue 24).

What holds: a document's turn start gets a sliding-window checkpoint, also
where a cached prefix reached past it, but a conversation continuing its
cached history gets none; a content whose own part is too small for the
KV its blob would take stays out of RAM, and such a tail is dropped before
its slot is read (no `state_get` to throw away); an abandoned stream keeps
its prompt in the slot and puts nothing in RAM; the queue takes the
longest cached prefix first, except past cache_wait, and a request waits
for the running prompt computing its prefix, until cache_wait (unless
admission is by age). Every `run` also checks that the reused KV is the
request's own tokens. A request that reuses nothing goes where it keeps
the busy sequence ids together (one ubatch pass for them), not only to
the least recently used slot.
"""
from __future__ import annotations

import numpy as np

from engine.kvcache import SlotCache
from engine.slots import Slot, pick, runs
from ipc.layout import SLOT_GEN, SLOT_PROMPT

from _prefix_fake import FakeStreams, make, req, run


def test_queue_order_longest_cached_first_and_bounded_wait() -> None:
    kv, slots, cache = make(n_slots=2)
    run(kv, cache, [req(list(range(100, 180)), 1)])
    short, long_ = req(list(range(100, 110)) + [1, 2], 2), req(list(range(100, 170)) + [3], 3)
    assert cache.order([short, long_]) == [long_, short]
    short.t_submit -= 10  # waited past cache_wait: first, whatever it shares
    assert cache.order([short, long_]) == [short, long_]


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


def _prompted(kv, cache, a: list[int]):
    """Slot 0 has evaluated prompt ``a`` (60 tokens) for request 1: its slot."""
    s, src, k = cache.pick(req(a, 1))
    cache.attach(s, a, src, k)
    kv.decode([(0, 0, np.asarray(a, np.int32))])
    cache.stepped()
    s.cache[:60] = a
    s.req, s.n_past = req(a, 1), 60
    cache.prompt_done(s)
    return s


def test_an_abandoned_stream_keeps_its_prompt_in_the_slot_and_nothing_in_ram() -> None:
    kv, slots, cache = make(n_slots=1)
    a = list(range(100, 160))
    s = _prompted(kv, cache, a)
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


def test_what_replaces_an_abandoned_stream_in_its_slot_is_kept() -> None:
    """The abandoned mark is the slot's answer's: a content put there since
    (a slot file restored, an erase) goes to RAM at the next save as any
    other (it was dropped)."""
    kv, slots, cache = make(n_slots=1)
    s = _prompted(kv, cache, list(range(100, 160)))
    cache.abandon(s)
    s.req = None
    cache.release(s)
    b = list(range(500, 580))  # what a slot file restore puts there (engine/slotfile.py), then syncs
    kv.seq_clear(0)
    kv.decode([(0, 0, np.asarray(b, np.int32))])
    s.cache[:80], s.n_past = b, 80
    cache.sync(s)
    run(kv, cache, [req(list(range(900, 950)), 2)])  # another prompt takes the slot: b is saved
    assert cache.saves == 1 and len(cache.ram.entries) == 1


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


def _counted(n_slots: int):
    """A cache whose density rules are on (cell_bytes measured on the fake's
    blobs) and whose reads (`state_get`) are recorded."""
    kv, slots, cache = make(n_slots=n_slots)
    kv.meta[0], kv.data[0] = {p: True for p in range(200)}, {p: 7 for p in range(200)}
    cache.cell_bytes = (kv.state_get(0).nbytes - (kv.seq_rm(0, 100), kv.state_get(0).nbytes)[1]) / 100
    kv.seq_clear(0)
    reads = []
    get = kv.state_get
    kv.state_get = lambda s, swa_only=False: (reads.append(s), get(s, swa_only))[1]
    return kv, cache, reads


def test_a_tail_too_small_to_keep_is_dropped_before_it_is_read() -> None:
    """Issue 24: a document's second question on the slot that holds the
    first one's prompt and answer keeps the document and cuts the tail (a
    few tokens past it): that tail never pays for a blob, and the slot's
    whole sequence is not read (`state_get`, 12 MiB for 1,500 tokens, in the
    engine loop) only to be dropped; a tail worth a blob still is read."""
    from engine.keep import RAM_CELLS

    kv, cache, reads = _counted(n_slots=1)
    doc = list(range(100, 400))
    assert run(kv, cache, [req(doc + [1, 2, 3, 4, 5, 6], 1)]) == [0]  # the slot: doc, question 1, its 5 tokens
    assert run(kv, cache, [req(doc + [7, 8], 2)]) == [300]  # 11 tokens cut: past MIN_SAVE
    assert reads == [] and cache.dropped == 1 and cache.saves == 0
    long = doc + list(range(500, 500 + 300 // RAM_CELLS + 10))  # its own part is worth its blob
    run(kv, cache, [req(long, 3)])
    assert run(kv, cache, [req(doc + [5], 4)]) == [300]
    assert reads and cache.saves == 1  # read and kept


def test_a_tail_past_what_another_slot_serves_is_dropped_before_it_is_read() -> None:
    """Issue 24: a slot holding a document's question and answer, whose
    document another slot serves, takes an unrelated prompt: what only it
    holds is the tail, too small for its blob, so the blob is never read
    (its size is llama.cpp's count) and nothing goes to RAM; a tail worth
    its blob is read and kept."""
    from engine.keep import RAM_CELLS

    kv, cache, reads = _counted(n_slots=2)
    doc = list(range(100, 400))
    run(kv, cache, [req(doc + [1], 1, id_slot=0)], gen=0)  # slot 0: the document
    reads.clear()
    assert run(kv, cache, [req(doc + [2, 3, 4, 5, 6, 7, 8, 9, 10, 11], 2, id_slot=1)]) == [300]  # copied in
    reads.clear()
    run(kv, cache, [req(list(range(900, 960)), 3, id_slot=1)], gen=0)  # slot 1 takes another prompt
    assert reads == [] and cache.saves == 0 and cache.dropped == 1
    assert cache._held_len(np.asarray(doc, np.int32), None) == 300  # the document: still slot 0's
    long = doc + list(range(500, 500 + 300 // RAM_CELLS + 10))  # its own part is worth its blob
    assert run(kv, cache, [req(long, 4, id_slot=1)]) == [300]
    reads.clear()
    saves = cache.saves
    run(kv, cache, [req(list(range(960, 1020)), 5, id_slot=1)], gen=0)
    assert reads and cache.saves == saves + 1  # read and kept


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


def test_a_request_that_reuses_nothing_keeps_busy_ids_together() -> None:
    """Slots 1 and 3 generate; slot 0 was used least recently, slot 2 most
    recently: LRU alone would open a third run at 0, ``runs`` joins the two
    at 2 (cache on, cache_prompt off, and the cache-less pick alike); with
    nothing busy, LRU still decides."""
    for cp in (1, 0):
        kv, slots, cache = make(n_slots=5)
        for s, t in zip(slots, (1.0, 2.0, 9.0, 3.0, 4.0)):
            s.t_used = t
        assert cache.pick(req([7, 8, 9], 1, cache_prompt=cp))[0].id == 0
        slots[1].state = slots[3].state = SLOT_GEN
        assert [runs(slots, slots[i]) for i in (0, 2, 4)] == [0, -1, 0]
        assert cache.pick(req([7, 8, 9], 2, cache_prompt=cp))[0].id == 2
        slots[2].state = SLOT_PROMPT
        assert cache.pick(req([7, 8, 9], 3, cache_prompt=cp))[0].id == 0  # both ends extend a run: LRU
    assert pick(slots, req([7, 8, 9], 4)).id == 0
    slots[0].state = SLOT_GEN
    assert pick(slots, req([7, 8, 9], 5)).id == 4
