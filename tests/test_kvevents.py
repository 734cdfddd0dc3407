"""KV events (engine/kvevents.py): vLLM's ZMQ stream of the prefix cache's
blocks, without a model: the hashing, the flag's parsing, the events a
prefix tree's changes produce, and the framing over ZMQ.

The subscriber here is llm-d's reader in miniature (tests/_kvevents_sub.py's
``Index``): it applies every event in order and fails on what llm-d would
skip or misfile. The truth is the tree itself, walked and hashed from
scratch (``truth``). Random registrations and removals, drained at random,
must always rebuild exactly the tree's blocks; a subscriber that stops
reading costs dropped messages, never a blocked loop. The real engine's
events are tests/test_kvevents_real.py's.
"""
from __future__ import annotations

import hashlib
import json
import random
import subprocess
import sys
import time

import numpy as np
import pytest

from engine.kvevents import BLOCK, CPU, GPU, BlockIndex, KvEvents, Settings, chain, parse
from engine.prefix import Entry, PrefixTree
from ipc.layout import CNT, N_COUNTERS

pytest.importorskip("zmq")  # without either the whole module is skipped
pytest.importorskip("msgpack")

from _kvevents_sub import Index, handshake, recv_all, subscriber, truth  # noqa: E402 (after the skips)


# ----------------------------------------------------------------- units
def test_chain_is_blake2b_over_parent_and_block():
    toks = np.arange(40, dtype=np.int32) + 1000
    hs = chain(toks)
    assert len(hs) == 2  # the 8 trailing tokens are no block
    h0 = int.from_bytes(hashlib.blake2b(bytes(8) + toks[:16].astype("<u4").tobytes(), digest_size=8).digest(), "big")
    h1 = int.from_bytes(hashlib.blake2b(h0.to_bytes(8, "big") + toks[16:32].astype("<u4").tobytes(),
                                        digest_size=8).digest(), "big")
    assert hs == [h0, h1] and chain(toks[16:32], parent=h0) == [h1]
    assert chain(toks, 8)[:2] != hs and len(chain(toks, 8)) == 5


def test_parse():
    assert parse("") is None and parse('{"enable_kv_cache_events": false, "endpoint": "tcp://*:1"}') is None
    assert parse('{"enable_kv_cache_events": true, "publisher": "null"}') is None
    s = parse('{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5557", "topic": "kv@p@m"}')
    assert s == Settings("tcp://*:5557", "kv@p@m") and s.block_size == BLOCK
    assert parse('{"enable_kv_cache_events": true, "endpoint": "ipc:///tmp/x", "block_size": 32}').block_size == 32
    for bad in ("{", "[]", '{"enable_kv_cache_events": true}', '{"enable_kv_cache_events": true, "publisher": "nats",'
                ' "endpoint": "tcp://*:1"}', '{"enable_kv_cache_events": 1, "endpoint": "tcp://*:1"}',
                '{"enable_kv_cache_events": true, "endpoint": "tcp://*:1", "color": "red"}',
                '{"enable_kv_cache_events": true, "endpoint": "tcp://*:1", "block_size": 0}'):
        with pytest.raises(ValueError):
            parse(bad)


@pytest.mark.parametrize("bad", ['{"enable_kv_cache_events": true, "publisher": "kafka", "endpoint": "tcp://*:1"}',
                                 '{"enable_kv_cache_events": true}', "not json"])
def test_cli_rejects_bad_config_naming_the_flag(bad):
    r = subprocess.run([sys.executable, "-c", "import sys; from frontends.process.cli import parse; "
                        "parse(['--kv-events-config', sys.argv[1]])", bad], capture_output=True, text=True)
    assert r.returncode == 2 and "--kv-events-config" in r.stderr, r.stderr


@pytest.mark.parametrize("other", ["--no-prefix-cache", "--embedding", "--reranking"])
def test_cli_rejects_events_without_a_prefix_cache(other):
    on = '{"enable_kv_cache_events": true, "endpoint": "tcp://127.0.0.1:1"}'
    r = subprocess.run([sys.executable, "-c", "import sys; from frontends.process.cli import parse; "
                        "parse(['--kv-events-config', sys.argv[1], sys.argv[2]])", on, other],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "--kv-events-config" in r.stderr and "prefix cache" in r.stderr, r.stderr


def test_default_engine_imports_neither_zmq_nor_msgpack():
    r = subprocess.run([sys.executable, "-c", "import sys, engine.loop, engine.kvcache, engine.__main__; "
                        "print(sorted(m for m in ('zmq', 'msgpack') if m in sys.modules))"],
                       capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "[]", (r.stdout, r.stderr)


def test_events_follow_entries_netted_per_drain():
    tree, ix = PrefixTree(), BlockIndex()
    tree.watch = ix
    a = np.arange(40, dtype=np.int32)
    b = np.concatenate([a[:20], np.arange(500, 520, dtype=np.int32)])
    ha, hb = chain(a), chain(b)
    assert ha[0] == hb[0] and ha[1] != hb[1]
    ea, eb = Entry(40, slot=0), Entry(40, slot=1)
    tree.insert(a, ea)
    assert ix.drain() == [["AllBlocksCleared"], ["BlockStored", ha, None, a[:32].tolist(), 16, None, GPU]]
    tree.insert(b, eb)
    assert ix.drain() == [["BlockStored", [hb[1]], ha[0], b[16:32].tolist(), 16, None, GPU]]
    tree.remove(ea)
    assert ix.drain() == [["BlockRemoved", [ha[1]], GPU]]
    tree.remove(eb)
    again = Entry(40, slot=1)
    tree.insert(b, again)  # gone and back within one step: nothing to say
    assert ix.drain() == []
    r = Entry(17, blob=np.zeros(1))
    tree.insert(b[:17], r)  # the RAM tier: its own medium
    assert ix.drain() == [["BlockStored", [hb[0]], None, b[:16].tolist(), 16, None, CPU]]
    tree.remove(again)
    tree.remove(r)
    assert ix.drain() == [["BlockRemoved", hb[::-1], GPU], ["BlockRemoved", [hb[0]], CPU]]
    assert ix.cnt == {GPU: {}, CPU: {}} and ix.ann == {GPU: set(), CPU: set()}


@pytest.mark.parametrize("seed", range(4))
def test_random_entries_rebuilt_from_events(seed):
    """Random registrations and removals over shared prefixes, drained at
    random: the events always rebuild exactly the tree's blocks."""
    rng = random.Random(seed)
    tree, ix, sub = PrefixTree(), BlockIndex(), Index()
    tree.watch = ix
    stems = [np.array([rng.randrange(1000) for _ in range(rng.randrange(8, 60))], np.int32) for _ in range(5)]
    live: list[Entry] = []
    for step in range(400):
        if live and rng.random() < 0.45:
            tree.remove(live.pop(rng.randrange(len(live))))
        else:
            s = stems[rng.randrange(len(stems))]
            tail = np.array([rng.randrange(4) for _ in range(rng.randrange(0, 50))], np.int32)
            toks = np.concatenate([s[:rng.randrange(1, len(s) + 1)], tail])
            e = Entry(len(toks), slot=rng.randrange(-1, 4), blob=np.zeros(1))
            tree.insert(toks, e)
            live.append(e)
        if rng.random() < 0.3:
            for ev in ix.drain():
                sub.apply(ev)
            assert sub.sets() == truth(tree), step
    for ev in ix.drain():
        sub.apply(ev)
    assert sub.sets() == truth(tree)
    assert sub.n["BlockRemoved"] > 10 and sub.n["BlockStored"] > 10


def test_framing_over_zmq(tmp_path):
    ep = f"ipc://{tmp_path}/kv.sock"
    cnt = np.zeros(N_COUNTERS)
    ev = KvEvents(parse(json.dumps({"enable_kv_cache_events": True, "endpoint": ep, "topic": "kv@pod@m"})), cnt)
    sock = subscriber(ep)
    try:
        handshake(ev, sock)
        tree = PrefixTree()
        tree.watch = ev
        toks = np.arange(35, dtype=np.int32)
        tree.insert(toks, Entry(35, slot=0))
        t0 = time.time()
        ev.flush()
        ev.flush()  # nothing new: no message
        ev.close()
        (s1, topic, batch), (s2, _, last) = recv_all(sock)
        assert topic == "kv@pod@m" and s2 == s1 + 1
        ts, events, dp = batch
        assert abs(ts - t0) < 5 and dp == 0
        assert events == [["BlockStored", chain(toks), None, toks[:32].tolist(), 16, None, "GPU"]]
        assert last[1] == [["AllBlocksCleared"]]
        assert cnt[CNT["kv_events_total"]] >= 2 and cnt[CNT["kv_events_dropped_total"]] == 0
    finally:
        sock.close()


def test_a_subscriber_that_never_reads_costs_drops_not_waits(tmp_path):
    """Sends never block the loop: with a subscriber that stops reading,
    once its queues are full each message is refused and counted."""
    ep = f"ipc://{tmp_path}/kv.sock"
    cnt = np.zeros(N_COUNTERS)
    ev = KvEvents(parse(json.dumps({"enable_kv_cache_events": True, "endpoint": ep, "hwm": 2, "topic": "kv@p@m"})), cnt)
    sock = subscriber(ep, hwm=1)
    try:
        handshake(ev, sock)
        tree = PrefixTree()
        tree.watch = ev
        toks = np.random.default_rng(0).integers(0, 260000, 4096).astype(np.int32)
        t0 = time.perf_counter()
        for k in range(300):  # ~20 KB a message
            e = Entry(len(toks), slot=0)
            tree.insert(toks + np.int32(k + 1), e)
            ev.flush()
            tree.remove(e)
        dt = time.perf_counter() - t0
        assert cnt[CNT["kv_events_dropped_total"]] > 100, cnt[CNT["kv_events_dropped_total"]]
        assert dt < 5, f"300 flushes took {dt:.1f} s"
    finally:
        ev.close()
        sock.close()
