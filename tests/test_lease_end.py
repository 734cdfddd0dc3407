"""A hang-up never reaches another request's channel (the --embedding race).

The case: client A's request is in the engine (its decode runs) when A hangs
up; its worker cancels and releases A's channel, and B, sent next on the same
worker, leases a channel and writes its prompt. As A's decode ends, the engine
wrote A's pooled vector over its channel's prompt area (engine/embed.py): with
the channel handed straight back to B (a LIFO free list) that was B's prompt,
and B got 400 "prompt token id out of vocabulary", or the vector of other
tokens. Now a channel released unfinished is leased again only after the
engine's end of its request (ipc/client.py module doc), and the engine writes
no vector for a request whose reader is gone (EmbedEngine.sample: owner_ok).

In one process, no model: the engine side is an EnginePort, and the real
EmbedEngine.sample / Publisher code on a stub without llama.cpp's model (its
write_vector makes the same store into the channel's vector area).
"""
from __future__ import annotations

import collections
import time
from typing import Callable

import numpy as np
import pytest

from engine.embed import EmbedEngine
from engine.slots import Request, Slot
from ipc.arena import Arena
from ipc.client import EngineUnavailable, NoChannel, WorkerPort
from ipc.layout import SLOT_PROMPT, STOP_CANCEL, STOP_EOS, SUB_CANCEL, SUB_SUBMIT
from ipc.server import EnginePort

from frontends.testing.fake_engine import register_polled as register

N_VOCAB = 1000
N_OUT = 8
GEOM = dict(n_workers=1, n_chan=2, ring_cap=8, sub_cap=16, max_prompt=32, n_slots=1)


def setup(make_arena: Callable[..., Arena], **geom: int) -> tuple[Arena, EnginePort, WorkerPort]:
    a = make_arena(**dict(GEOM, **geom))
    engine = EnginePort(a, lambda w, chans: None)
    engine.ready()
    port = WorkerPort(a, 0)
    register(port, engine)
    return a, engine, port


class StubEmbed(EmbedEngine):
    """EmbedEngine's sample and its Publisher on one slot, without a model."""

    def __init__(self, arena: Arena, port: EnginePort):  # not EmbedEngine's: that one needs a model
        self.arena, self.port, self.cnt, self.tab = arena, port, arena.counters, arena.slots
        self.kv = self.spec = self.model = None
        self.out, self.queue = [], collections.deque()
        self.slots = [Slot(0, arena.geom.max_prompt)]
        self.n_out = N_OUT

    def take(self, channel: int, rid: int) -> Slot:
        """The request's prompt copied out (Engine.load) and in the slot's decode (build)."""
        req = Request(channel, rid)
        req.prompt, req.params, _g, _b = self.arena.channel(channel).read_request(N_VOCAB)
        s = self.slots[0]
        s.req, s.state, s.i_batch, s.reported = req, SLOT_PROMPT, len(req.prompt) - 1, False
        s.t_start = time.perf_counter()
        return s

    def write_vector(self, s: Slot) -> int:  # llama_get_embeddings_seq's floats: the same store
        self.arena.channel(s.req.channel).vector[:N_OUT] = np.float32(0.5)
        return N_OUT


def test_hangup_during_decode_leaves_the_next_prompt_alone(make_arena: Callable[..., Arena]) -> None:
    """The reviewer's sequence, with the engine's write in the worst place:
    checked (A still wanted), A hangs up, B leases and submits, then the
    engine writes A's vector. B's prompt must reach the engine intact: B
    does not get A's channel while the engine may still write it."""
    a, engine, port = setup(make_arena)
    eng = StubEmbed(a, engine)
    prompt_a, prompt_b = [2] + [7] * 20, [2, 11, 12, 13]
    lease_a = port.lease()
    lease_a.submit(prompt_a, {})
    [(kind, ch_a, rid_a, _)] = engine.poll()
    assert kind == SUB_SUBMIT
    s = eng.take(ch_a, rid_a)
    assert engine.owner_ok(ch_a, rid_a)  # the engine's check, made before the hang-up
    lease_a.close()  # A hangs up: cancel, release
    lease_b = port.lease()
    lease_b.submit(prompt_b, {})
    eng.write_vector(s)  # the write the check let through, after B wrote its prompt
    subs = engine.poll()
    assert (SUB_SUBMIT, lease_b.channel.index, lease_b.rid, 0) in subs
    # before: BadRequest("prompt token id out of vocabulary"), A's floats read as ids
    prompt, _p, _g, _b = a.channel(lease_b.channel.index).read_request(N_VOCAB)
    assert prompt.tolist() == prompt_b
    assert lease_b.channel.index != ch_a, "B got the channel whose request the engine still holds"
    lease_b.close()


def test_cancelled_channel_waits_for_the_engines_end(make_arena: Callable[..., Arena]) -> None:
    """One channel: after A's hang-up the next lease waits (NoChannel past its
    wait) until the engine ends A; the engine, seeing A cancelled as its
    decode ends, writes no vector and publishes the end, and the channel is
    leased again with a prompt nothing overwrote."""
    a, engine, port = setup(make_arena, n_chan=1)
    eng = StubEmbed(a, engine)
    lease_a = port.lease()
    lease_a.submit([2] + [7] * 20, {})
    [(_k, ch, rid_a, _)] = engine.poll()
    s = eng.take(ch, rid_a)
    lease_a.close()
    assert port.leased == 0 and port.unended == 1
    t = time.monotonic()
    with pytest.raises(NoChannel):
        port.lease(wait=0.05)
    assert time.monotonic() - t >= 0.05
    assert engine.holds(ch, rid_a) and not engine.owner_ok(ch, rid_a)
    before = a.channel(ch).prompt.copy()
    eng.sample()  # A's decode ended: its reader is gone
    assert (a.channel(ch).prompt == before).all(), "a vector was written for a cancelled request"
    assert s.idle and eng.out == []
    assert engine.poll() == [(SUB_CANCEL, ch, rid_a, 0)]  # the cancel crossing the end: nothing more to do
    eng.cancel(ch, rid_a, STOP_CANCEL)
    lease_b = port.lease(wait=0.05)  # the end came: the channel is free again
    assert lease_b.channel.index == ch and port.unended == 0
    lease_b.submit([2, 11, 12], {})
    engine.poll()
    assert a.channel(ch).read_request(N_VOCAB)[0].tolist() == [2, 11, 12]
    lease_b.close()


def test_vector_of_a_wanted_request_is_delivered(make_arena: Callable[..., Arena]) -> None:
    """The guard costs the ordinary case nothing: the vector, its length and
    one LAST STOP_EOS record for its rid."""
    a, engine, port = setup(make_arena)
    eng = StubEmbed(a, engine)
    with port.lease() as lease:
        lease.submit([2, 5, 6], {})
        [(_k, ch, rid, _)] = engine.poll()
        eng.take(ch, rid)
        eng.sample()
        eng.publish()
        tok = lease.read(1.0)
        assert tok is not None and tok.last and tok.stop == STOP_EOS
        assert int(lease.channel.result[0]["n_embd"]) == N_OUT
        assert (lease.channel.vector[:N_OUT] == 0.5).all()


def test_queued_cancel_is_ended(make_arena: Callable[..., Arena]) -> None:
    """A request cancelled while still queued ends too (a LAST STOP_CANCEL
    record), by SUB_CANCEL (Publisher.cancel) or by the flag alone
    (Engine.assign's check): its worker waits for that end to lease the
    channel again, so a queued request dropped without one leaked it."""
    a, engine, port = setup(make_arena)
    eng = StubEmbed(a, engine)
    la, lb = port.lease(), port.lease()
    la.submit([2, 5], {})
    lb.submit([2, 6], {})
    for _kind, c, rid, _ in engine.poll():
        eng.queue.append(Request(c, rid))
    la.close(), lb.close()
    assert port.unended == 2
    with pytest.raises(NoChannel):
        port.lease(wait=0.02)
    cancels = engine.poll()
    assert [(k, r) for k, _c, r, _ in cancels] == [(SUB_CANCEL, la.rid), (SUB_CANCEL, lb.rid)]
    eng.cancel(cancels[0][1], la.rid, STOP_CANCEL)  # lb's SUB_CANCEL is lost: its flag alone remains
    assert [q.rid for q in eng.queue] == [lb.rid]
    eng.assign()
    assert not eng.queue
    x = port.lease(wait=0.05)
    y = port.lease(wait=0.05)
    assert port.unended == 0 and {x.channel.index, y.channel.index} == {0, 1}
    x.close(), y.close()


def test_a_dead_engines_lease_never_submits_to_its_successor(make_arena: Callable[..., Arena]) -> None:
    """A lease taken for one engine whose submit comes after the worker
    registered with the next one is refused (the new engine left that
    channel unreset: it must never be submitted there); its release then
    frees the channel at once, its ring reset."""
    a, engine, port = setup(make_arena)
    lease = port.lease()
    engine2 = EnginePort(a, lambda w, chans: None)  # the engine restarted: a new epoch
    engine2.ready()
    register(port, engine2)
    with pytest.raises(EngineUnavailable):
        lease.post(SUB_SUBMIT)
    assert engine2.poll() == []  # nothing reached the new engine
    lease.close()
    assert port.unended == 0 and port.lease() is not None
