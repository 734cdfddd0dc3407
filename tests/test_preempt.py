"""A pure decode step gives way to a cache hit that arrives during it
(engine/preempt.py): the submissions it takes early keep their order, the
aborted step is redone with nothing lost or changed, and a request that
would not be expressed never aborts a step."""
from __future__ import annotations

import threading
import time
from typing import Callable

import pytest

import _procs
from engine.config import Config
from engine.direct import generate
from engine.process import EngineProcess
from ipc.arena import Arena
from ipc.client import WorkerPort
from ipc.layout import CNT
from ipc.server import EnginePort


def registered(a: Arena) -> tuple[EnginePort, WorkerPort]:
    """An engine port in this process and worker index 0 registered with it."""
    ep = EnginePort(a, on_reclaim=lambda w, chans: None)
    ep.ready()
    wp = WorkerPort(a, 0)
    t = threading.Thread(target=wp.register, kwargs={"timeout": 5.0})
    t.start()
    while t.is_alive():
        ep.poll()
        time.sleep(0.001)
    return ep, wp


def test_peek_takes_early_and_poll_keeps_the_order(make_arena: Callable[..., Arena]) -> None:
    a = make_arena(**_procs.SMALL)
    ep, wp = registered(a)
    leases = [wp.lease() for _ in range(3)]
    assert not ep.pending()
    leases[0].submit([1], {})
    leases[1].submit([2], {})
    assert ep.pending()
    early = ep.peek()  # during a step: taken from the ring, kept for the intake
    assert [r[2] for r in early] == [leases[0].rid, leases[1].rid] and not ep.pending()
    leases[2].submit([3], {})
    assert [r[2] for r in ep.poll()] == [lz.rid for lz in leases]  # the early ones first, in their order
    assert ep.peek() == [] and ep.poll() == []
    # a worker index registering again: peek leaves its ring to poll (which resets it)
    leases[0].submit([4], {})
    a.workers[0]["req_seq"] = int(a.workers[0]["req_seq"]) + 1
    assert ep.peek() == [] and ep.pending()
    for lz in leases:
        lz.close()


# ------------------------------------------------------------ the real engine
DOC = ("A long shared document about lighthouses. " * 24).strip()
STREAM = "Here is a long story about a lighthouse keeper and the sea:"
N_STREAM = 120


@pytest.fixture(scope="module")
def engine():
    cfg = Config(parallel=3, ctx_size=3 * 512, threads=2, http_threads=8, workers=1, prefix_cache=True)
    with EngineProcess(cfg) as eng:
        yield eng, WorkerPort(eng.arena, 0)


def test_a_step_gives_way_to_a_cache_hit_and_streams_do_not_change(engine, gemma_vocab) -> None:
    """Two streams decode; questions after a cached document arrive one
    after another while they run. Some of their steps are aborted for them
    (the counter moves), yet each stream's tokens are those of the same
    stream run alone with no question at all, and every question is
    answered. A new prompt that is no cache hit aborts nothing."""
    eng, port = engine
    ids = lambda text: gemma_vocab.tokenize(text.encode(), add_bos=True, special=True)  # noqa: E731
    doc, stream = ids(DOC), ids(STREAM)
    questions = [doc + ids(f" Question {i}: how tall is lighthouse number {i}?")[1:] for i in range(24)]
    c = eng.arena.counters
    greedy = dict(temperature=0.0, ignore_eos=1)
    alone = generate(port, stream, eng.cfg.sampling(n_predict=N_STREAM, cache_prompt=0, **greedy)).tokens
    generate(port, doc, eng.cfg.sampling(n_predict=1, **greedy))  # the document, cached

    def run_stream(slot: int = 0) -> tuple[threading.Thread, dict]:
        """The stream again on ``slot``, on its own thread; back once it generates."""
        out: dict = {}
        t = threading.Thread(target=lambda: out.update(s=generate(
            port, stream, eng.cfg.sampling(n_predict=N_STREAM, cache_prompt=0, id_slot=slot, **greedy))))
        n0 = int(c[CNT["n_decode_total"]])
        t.start()
        while int(c[CNT["n_decode_total"]]) < n0 + 4:
            time.sleep(0.005)
        return t, out

    # two streams on slots 0 and 2: each step is two ubatches (split_equal takes consecutive sequence ids
    # only), so an abort in the second leaves the first's token in the KV, which undo must drop too; each
    # sequence alone in its ubatch computes as it does alone (the reference)
    before = int(c[CNT["steps_preempted_total"]])
    (t0, out0), (t2, out2) = run_stream(0), run_stream(2)
    for i, q in enumerate(questions):  # on slot 1, the idle one
        assert len(generate(port, q, eng.cfg.sampling(n_predict=1, **greedy)).tokens) == 1
        time.sleep(0.003 * (i % 8))  # land at another point of a step (and ubatch) each time
    t0.join(120)
    t2.join(120)
    assert int(c[CNT["steps_preempted_total"]]) > before, "no step gave way to a question"
    assert out0["s"].tokens == alone and out2["s"].tokens == alone  # (a KV left inconsistent ends them early)

    # a prompt that shares nothing cached: it waits for the step, which is never aborted for it
    before = int(c[CNT["steps_preempted_total"]])
    t, out = run_stream()
    for i in range(6):
        generate(port, [2] + [1000 + 37 * i + j for j in range(40)], eng.cfg.sampling(n_predict=1, **greedy))
    t.join(120)
    assert int(c[CNT["steps_preempted_total"]]) == before
    assert len(out["s"].tokens) == N_STREAM  # (they rode its steps: not compared, a batch's shape moves the bits)
