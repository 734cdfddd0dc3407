"""The SPSC ring: FIFO, empty/full behaviour, wrap-around, record integrity,
a model-based state machine, and a cross-process stress run.

Why this much: every token and every submission crosses a Ring, and the engine
relies on ``push`` never blocking. A lost, duplicated or reordered record
would surface as a corrupt stream in some other request much later.
"""
from __future__ import annotations

import struct
import time
from collections import deque
from typing import Callable

import numpy as np
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

import _procs
from ipc.arena import Arena
from ipc.layout import MAX_PROBS, PROB, SUB_ERASE, TOKEN
from ipc.ring import Ring

CAP = 5  # odd and small: wraps often, fills easily
GEOM = dict(n_workers=1, n_chan=1, ring_cap=8, sub_cap=CAP, max_prompt=16, n_slots=1)


def sub_fields(i: int) -> tuple:
    """Payload of SUB record i (rid, channel, kind, pad, arg)."""
    return (i, i & 0xFFFFFFFF, i % 3 + 1, 0, _procs.checksum(i))


def test_fifo_order(make_arena: Callable[..., Arena]) -> None:
    ring = make_arena(**GEOM).sub_ring(0)
    for i in range(CAP):
        assert ring.push(*sub_fields(i))
    assert len(ring) == CAP
    for i in range(CAP):
        assert ring.pop(0) == (i, *sub_fields(i))
    assert len(ring) == 0


def test_empty_pop_returns_none(make_arena: Callable[..., Arena]) -> None:
    ring = make_arena(**GEOM).sub_ring(0)
    t = time.monotonic()
    assert ring.pop(0) is None
    assert time.monotonic() - t < 0.01
    t = time.monotonic()
    assert ring.pop(0.1) is None
    assert 0.1 <= time.monotonic() - t < 0.2
    assert ring.head == ring.tail == 0


def test_full_push_fails_at_once(make_arena: Callable[..., Arena]) -> None:
    """The engine must never block on a slow reader: push on full returns False
    immediately and leaves the ring intact."""
    ring = make_arena(**GEOM).sub_ring(0)
    for i in range(CAP):
        assert ring.push(*sub_fields(i))
    for _ in range(100):
        t = time.perf_counter()
        assert ring.push(*sub_fields(99)) is False
        assert time.perf_counter() - t < 0.005
    assert ring.reserve() is None
    assert ring.space.value == 0 and ring.items.value == CAP and len(ring) == CAP
    assert ring.pop(0) == (0, *sub_fields(0))
    assert ring.push(*sub_fields(CAP))  # one slot freed, one push fits
    assert ring.push(*sub_fields(CAP + 1)) is False
    assert [ring.pop(0)[1] for _ in range(CAP)] == list(range(1, CAP + 1))


def test_wraparound_many_laps(make_arena: Callable[..., Arena]) -> None:
    """Positions keep increasing across thousands of laps; slot = position % cap."""
    ring = make_arena(**GEOM).sub_ring(0)
    rng = np.random.default_rng(1)
    sent = got = 0
    while got < 5000 * CAP:
        for _ in range(int(rng.integers(0, CAP + 2))):
            if ring.push(*sub_fields(sent)):
                sent += 1
        for _ in range(int(rng.integers(0, CAP + 2))):
            rec = ring.pop(0)
            if rec is None:
                break
            assert rec == (got, *sub_fields(got))
            got += 1
        assert len(ring) == sent - got and ring.items.value == sent - got and ring.space.value == CAP - (sent - got)
    assert ring.head == sent and ring.tail == got


def test_record_integrity_extremes(make_arena: Callable[..., Arena]) -> None:
    """Every field survives at its limits (signed and unsigned extremes)."""
    ring = make_arena(**GEOM).sub_ring(0)
    cases = [(2**64 - 1, 2**32 - 1, 2**16 - 1, 2**16 - 1, -(2**63)), (0, 0, 0, 0, 2**63 - 1), (1, 2, 3, 4, -1)]
    for c in cases:
        assert ring.push(*c)
    for k, c in enumerate(cases):
        assert ring.pop(0) == (k, *c)


def test_unpackable_record_gives_its_slot_back(make_arena: Callable[..., Arena]) -> None:
    """A record that cannot be packed (a field out of range, e.g. a slot id
    from an HTTP path) raises, and the slot it had reserved is returned: a bad
    call must not shrink the ring for good."""
    ring = make_arena(**GEOM).sub_ring(0)
    for _ in range(2 * CAP):
        try:
            ring.push(0, 0, SUB_ERASE, 0, 2**64)  # arg is i64
        except struct.error:
            pass
        else:
            raise AssertionError("an out-of-range field was packed")
    assert ring.items.value == 0 and ring.space.value == CAP and ring.head == 0
    for i in range(CAP):
        assert ring.push(*sub_fields(i))
    assert [ring.pop(0)[0] for _ in range(CAP)] == list(range(CAP))


def test_bad_probs_give_the_slot_back(make_arena: Callable[..., Arena]) -> None:
    a = make_arena(n_workers=1, n_chan=1, ring_cap=4, sub_cap=4, max_prompt=16, n_slots=1)
    ch = a.channel(0)
    too_many = (np.arange(MAX_PROBS + 5, dtype=np.int32), np.zeros(MAX_PROBS + 5, np.float32))
    for _ in range(8):
        try:
            ch.push(1, 0, 5, 0, 0.0, too_many)
        except ValueError:
            pass
        else:
            raise AssertionError("more than MAX_PROBS probabilities were accepted")
    assert ch.ring.space.value == 4 and ch.ring.items.value == 0
    assert ch.push(1, 0, 5, 0) and ch.read(1, 0).token == 5


def test_token_records_and_probs_rows(make_arena: Callable[..., Arena]) -> None:
    """Token records and their probability rows stay paired across wrap-around."""
    a = make_arena(n_workers=1, n_chan=1, ring_cap=4, sub_cap=4, max_prompt=16, n_slots=1)
    ch = a.channel(0)
    for i in range(4 * 10):
        ids = np.arange(i % MAX_PROBS + 1, dtype=np.int32) + i
        lps = -np.arange(len(ids), dtype=np.float32) / (i + 1)
        assert ch.push(77, 1000 + i, i, 0, -0.5 * i, (ids, lps))
        tk = ch.read(77, 0)
        assert tk is not None and tk.token == i and tk.t_ns == 1000 + i and tk.logprob == np.float32(-0.5 * i)
        assert tk.probs is not None and tk.probs.dtype == PROB
        np.testing.assert_array_equal(tk.probs["id"], ids)
        np.testing.assert_array_equal(tk.probs["logprob"], lps)
    assert ch.push(77, 1, 5, 0) and ch.read(77, 0).probs is None
    assert TOKEN.size == 40


class EagerProducer:
    """Stands in for a ring's ``space`` semaphore: each post of a unit lets
    the producer push its next record before the post returns, the earliest
    moment an engine on another CPU could reserve the freed slot and write
    its probability row (a reader preempted right after the post)."""

    def __init__(self, sem: object, push: Callable[[], object]) -> None:
        self.sem, self.push = sem, push

    @property
    def value(self) -> int:
        return self.sem.value

    def acquire(self, timeout: float | None = None) -> None:
        self.sem.acquire(timeout)

    def release(self) -> None:
        self.sem.release()
        self.push()


def test_probs_row_is_read_before_its_slot_is_freed(make_arena: Callable[..., Arena]) -> None:
    """The reader copies a record's probability row before it posts the
    slot's ``space`` unit: a producer that rewrites the slot the instant the
    unit is posted (ring full, as an engine paused on a slow reader) must not
    change the row the reader returns. Posting first gave each record the
    row of the record ring_cap later."""
    cap = 4
    a = make_arena(n_workers=1, n_chan=1, ring_cap=cap, sub_cap=4, max_prompt=16, n_slots=1)
    ch = a.channel(0)
    n, pushed = 6 * cap, [0]

    def push_next() -> None:
        k = pushed[0]
        if k < n:
            ids = np.full(3, k, np.int32)
            assert ch.push(5, k, k, 0, 0.0, (ids, np.full(3, -k, np.float32)))
            pushed[0] += 1

    for _ in range(cap):
        push_next()
    assert ch.ring.space.value == 0  # full: the next push needs the slot the reader frees
    real = ch.ring.space
    ch.ring.space = EagerProducer(real, push_next)
    try:
        for k in range(n):
            tk = ch.read(5, 0)
            assert tk is not None and tk.token == k
            assert tk.probs is not None and tk.probs["id"].tolist() == [k] * 3, (k, tk.probs)
            assert tk.probs["logprob"].tolist() == [-k] * 3
        assert pushed[0] == n and ch.read(5, 0) is None
    finally:
        ch.ring.space = real


def test_take_holds_the_slot_until_free(make_arena: Callable[..., Arena]) -> None:
    """``take`` reads the record (and counts it taken: tail moves) but keeps
    its slot, no ``space`` unit posted, until ``free``; ``pop`` is the two
    at once."""
    ring = make_arena(**GEOM).sub_ring(0)
    for i in range(CAP):
        assert ring.push(*sub_fields(i))
    rec = ring.take(0)
    assert rec == (0, *sub_fields(0))
    assert ring.space.value == 0 and ring.tail == 1 and ring.items.value == CAP - 1 and len(ring) == CAP - 1
    assert ring.push(*sub_fields(CAP)) is False  # the slot being read cannot be reserved
    ring.free()
    assert ring.space.value == 1
    assert ring.push(*sub_fields(CAP))
    assert [ring.pop(0)[0] for _ in range(CAP)] == list(range(1, CAP + 1))
    assert ring.take(0) is None and ring.space.value == CAP


def test_reset_recovers_a_half_done_pop(make_arena: Callable[..., Arena]) -> None:
    """A consumer killed between taking a unit and storing tail: reset puts
    the semaphores and counters back so the next owner starts clean."""
    ring = make_arena(**GEOM).sub_ring(0)
    for i in range(3):
        ring.push(*sub_fields(i))
    ring.items.acquire(0)  # the dead consumer took a unit, never advanced tail
    assert ring.reset() == 2
    assert ring.items.value == 0 and ring.space.value == CAP and len(ring) == 0
    for i in range(CAP):
        assert ring.push(*sub_fields(i))
    assert ring.push(*sub_fields(0)) is False
    assert ring.pop(0)[1] == 0


def test_reset_recovers_a_take_never_freed(make_arena: Callable[..., Arena]) -> None:
    """A consumer killed between ``take`` and ``free`` (mid row copy) left a
    slot neither readable nor reservable: reset gives it back."""
    ring = make_arena(**GEOM).sub_ring(0)
    for i in range(CAP):
        ring.push(*sub_fields(i))
    assert ring.take(0)[0] == 0  # never freed
    assert ring.reset() == CAP - 1
    assert ring.items.value == 0 and ring.space.value == CAP and len(ring) == 0
    for i in range(CAP):
        assert ring.push(*sub_fields(i))
    assert ring.push(*sub_fields(0)) is False


def test_attach_rejects_a_foreign_header(make_arena: Callable[..., Arena]) -> None:
    a = make_arena(**GEOM)
    r = a.sub_ring(0)
    try:
        Ring(a.segs["sub"].buf, 0, CAP + 1, r.rec, r.items, r.space)
    except ValueError:
        pass
    else:
        raise AssertionError("a ring of another capacity was accepted")


# ------------------------------------------------------------ model-based
class RingMachine(RuleBasedStateMachine):
    """The ring against a deque of bounded length."""

    ring: Ring

    def __init__(self) -> None:
        super().__init__()
        self.ring.reset()  # one arena for all examples; each starts empty
        self.model: deque = deque()
        self.pos = self.ring.head  # absolute position of the next push
        self.next = 0

    @rule()
    def push(self) -> None:
        ok = self.ring.push(*sub_fields(self.next))
        assert ok == (len(self.model) < CAP)
        if ok:
            self.model.append((self.pos, *sub_fields(self.next)))
            self.pos += 1
            self.next += 1

    @rule()
    def pop(self) -> None:
        rec = self.ring.pop(0)
        assert rec == (self.model.popleft() if self.model else None)

    @precondition(lambda self: 0 < len(self.model))
    @rule(data=st.data())
    def pop_with_timeout(self, data: st.DataObject) -> None:
        assert self.ring.pop(data.draw(st.sampled_from([0.01, None]))) == self.model.popleft()

    @rule(k=st.integers(1, 2 * CAP))
    def burst(self, k: int) -> None:
        for _ in range(k):
            self.push()

    @invariant()
    def lengths_agree(self) -> None:
        n = len(self.model)
        assert len(self.ring) == n
        assert self.ring.items.value == n and self.ring.space.value == CAP - n
        assert self.ring.head - self.ring.tail == n


def test_ring_state_machine(make_arena: Callable[..., Arena]) -> None:
    RingMachine.ring = make_arena(**GEOM).sub_ring(0)
    try:
        run_state_machine_as_test(RingMachine, settings=settings(max_examples=150, stateful_step_count=60,
                                                                  deadline=None))
    finally:
        del RingMachine.ring


# ------------------------------------------------------------ cross-process
N_STRESS = 1_000_000


def test_cross_process_stress(make_arena: Callable[..., Arena]) -> None:
    """10^6 checksummed records from one process to another, random pauses on
    both sides and a ring small enough to fill: nothing lost, duplicated or
    reordered, and the producer saw a full ring without ever blocking."""
    a = make_arena(n_workers=1, n_chan=1, ring_cap=8, sub_cap=64, max_prompt=16, n_slots=1)
    out = _procs.CTX.Queue()
    t = time.monotonic()
    procs = [_procs.start(_procs.stress_consumer, a.instance, N_STRESS, 7, out),
             _procs.start(_procs.stress_producer, a.instance, N_STRESS, 7, out)]
    try:
        res = {}
        for _ in procs:
            ev = out.get(timeout=120)
            res[ev[0]] = ev
    finally:
        _procs.stop(*procs)
    elapsed = time.monotonic() - t
    assert res["consumer"][2] == [], res["consumer"][2]
    assert res["consumer"][1] == N_STRESS and res["producer"][1] == N_STRESS
    assert res["producer"][2] > 0, "the ring never filled: the full path went untested"
    ring = a.sub_ring(0)
    assert ring.head == ring.tail == N_STRESS and ring.items.value == 0 and ring.space.value == 64
    assert elapsed < 90, f"stress run took {elapsed:.1f} s"
