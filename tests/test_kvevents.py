"""KV events (engine/kvevents.py): vLLM's ZMQ stream of the prefix cache's blocks.

The subscriber here is llm-d's reader in miniature (``Index``): it applies
every event in order and fails on what llm-d would skip or misfile (a
parent never announced, a hash not chained over the token ids sent, a
removal of a block it never had, a block stored twice). The engine's truth
is its own prefix tree, walked by the test (``truth``): every entry's path,
hashed from scratch (no memo), per medium. The real-engine test runs the
Engine in this process (as engine/__main__.py does, in a thread) so the
tree can be walked once the loop has stopped, with no debug hook in the
engine.
"""
from __future__ import annotations

import hashlib
import json
import random
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from engine.config import Config
from engine.kvevents import BLOCK, CPU, GPU, BlockIndex, KvEvents, Settings, chain, parse
from engine.prefix import Entry, PrefixTree
from ipc.layout import CNT, N_COUNTERS

zmq = pytest.importorskip("zmq")
msgpack = pytest.importorskip("msgpack")


class Index:
    """The events applied in order, per medium: block hash -> parent (llm-d's view)."""

    def __init__(self, bs: int = BLOCK):
        self.bs = bs
        self.blocks = {GPU: {}, CPU: {}}
        self.n = {"BlockStored": 0, "BlockRemoved": 0, "AllBlocksCleared": 0}

    def apply(self, ev: list) -> None:
        tag = ev[0]
        self.n[tag] += 1
        if tag == "AllBlocksCleared":
            assert ev == ["AllBlocksCleared"]
            self.blocks = {GPU: {}, CPU: {}}
        elif tag == "BlockStored":
            hs, parent, toks, bs, lora, medium = ev[1:]
            assert bs == self.bs and lora is None and hs and len(toks) == bs * len(hs), ev[:3]
            assert chain(np.array(toks, np.int32), bs, parent or 0) == hs, "hashes not chained over token_ids"
            idx = self.blocks[medium]
            assert parent is None or parent in idx, "parent not announced on this medium"
            for h in hs:
                assert h not in idx, "block stored twice"
                idx[h] = parent
                parent = h
        elif tag == "BlockRemoved":
            hs, medium = ev[1:]
            idx = self.blocks[medium]
            for h in hs:
                assert h in idx, "removal of a block never stored"
                del idx[h]
        else:
            raise AssertionError(f"unknown event {ev!r}")

    def sets(self) -> dict[str, set[int]]:
        for idx in self.blocks.values():  # prefix-closed: every parent is held too
            assert all(p is None or p in idx for p in idx.values())
        return {m: set(idx) for m, idx in self.blocks.items()}


def truth(tree: PrefixTree, bs: int = BLOCK) -> dict[str, set[int]]:
    """Per medium, the blocks some entry of the tree holds, hashed from its path."""
    out = {GPU: set(), CPU: set()}
    stack = [(tree.root, np.empty(0, np.int32))]
    while stack:
        node, path = stack.pop()
        path = np.concatenate([path, node.tokens])
        for e in node.entries:
            assert len(path) == e.n
            out[GPU if e.slot >= 0 else CPU].update(chain(path, bs))
        stack.extend((c, path) for c in node.children.values())
    return out


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


def recv_all(sock, quiet: float = 0.3) -> list[list]:
    """Every message until none came for ``quiet`` seconds: (seq, topic, batch)."""
    out = []
    while sock.poll(int(quiet * 1000)):
        frames = sock.recv_multipart()
        assert len(frames) == 3, frames
        out.append((int.from_bytes(frames[1], "big"), frames[0].decode(), msgpack.unpackb(frames[2])))
    return out


def subscriber(endpoint: str, hwm: int = 1000):
    sock = zmq.Context.instance().socket(zmq.SUB)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVHWM, hwm)
    sock.setsockopt(zmq.SUBSCRIBE, b"kv@")
    sock.connect(endpoint)
    return sock


def handshake(ev: KvEvents, sock, timeout: float = 10.0) -> None:
    """ZMQ's slow joiner: AllBlocksCleared until the subscriber hears one (nothing held yet)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ev.reset()
        ev.flush()
        if sock.poll(50):
            recv_all(sock, 0.1)
            return
    raise AssertionError("the subscriber never received the publisher's messages")


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


# ---------------------------------------------------------- real engine
SYSTEMS = [3 * s for s in (  # ~60 tokens each: a few blocks shared by many prompts
    "You are a terse assistant for a bicycle shop. Answer in one short sentence and never use lists.\n",
    "You translate English into French. Keep names as they are and reply with the translation only.\n",
    "You are a pirate who answers every question about the weather, the tides and the stars.\n")]
TOPICS = ["gears", "brakes", "tyres", "saddles", "chains", "lights", "bells", "pumps", "locks", "baskets",
          "helmets", "pedals", "spokes", "frames", "mirrors", "racks"]


def test_real_engine_events_rebuild_its_tree(tmp_path):
    """A random workload on the real engine (2 slots, 1 parking stream, a
    RAM bound of ~2 blobs): shared system prompts, distinct questions,
    follow-up turns, evictions from slots, parking and RAM. The index
    rebuilt from the events equals the tree's blocks per medium, no message
    was lost (consecutive seq), and shutdown clears it."""
    from llama_cpp import Llama

    from engine.direct import generate
    from engine.loop import Engine
    from engine.model import Model
    from engine.process import create_arena, prepare
    from ipc.client import WorkerPort
    from ipc.server import EnginePort

    ep = f"ipc://{tmp_path}/kv.sock"
    kv = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": ep, "topic": "kv@test@gemma"}
    cfg = prepare(Config(parallel=2, ctx_size=2 * 512, threads=2, http_threads=8, workers=1, cache_ram=6,
                         cache_streams=1, kv_events_config=json.dumps(kv)))
    vocab = Llama(cfg.model, vocab_only=True, verbose=False)
    arena = create_arena(cfg)
    model = eng = sock = None
    stop, errors = threading.Event(), []
    try:
        port = EnginePort(arena, on_reclaim=lambda w, chans: None)
        model = Model(cfg)
        eng = Engine(cfg, port, model)
        sock = subscriber(ep)
        handshake(eng.kv.events, sock)
        port.ready()

        def loop():
            try:
                while not stop.is_set():
                    eng.step()
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        th = threading.Thread(target=loop, name="engine-loop")
        th.start()
        wport = WorkerPort(arena, 0)
        rng = random.Random(23)
        p = cfg.sampling(temperature=0.0, n_predict=4, ignore_eos=1)
        hist: dict[int, str] = {}

        def client(k: int) -> None:
            try:
                for _ in range(6):
                    i = rng.randrange(len(TOPICS))
                    if i in hist and rng.random() < 0.5:  # a follow-up turn extends its conversation
                        text = hist[i] + "User: And what else?\nAssistant:"
                    else:
                        text = f"{rng.choice(SYSTEMS)}User: Tell me about {TOPICS[i]} ({k}).\nAssistant:"
                    ids = vocab.tokenize(text.encode(), add_bos=True, special=True)
                    out = generate(wport, ids, p, timeout=60)
                    hist[i] = text + vocab.detokenize(out.tokens).decode("utf-8", "replace") + "\n"
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        ths = [threading.Thread(target=client, args=(k,)) for k in range(3)]
        for t in ths:
            t.start()
        for t in ths:
            t.join(90)
        assert not any(t.is_alive() for t in ths), "a client thread timed out"
        stop.set()
        th.join(30)
        assert not th.is_alive(), "the engine loop did not stop"
        assert not errors, errors
        eng.kv.publish()  # the loop's last changes (it flushes at the start of a step)
        msgs = recv_all(sock, 0.5)
        sub = Index()
        for _, topic, (ts, events, dp) in msgs:
            assert topic == "kv@test@gemma" and dp == 0
            for ev in events:
                sub.apply(ev)
        seqs = [s for s, _, _ in msgs]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), "a message was lost"
        want = truth(eng.kv.tree)
        got = sub.sets()
        assert got == want, {m: (len(got[m] - want[m]), len(want[m] - got[m])) for m in want}
        c = arena.counters
        assert want[GPU] and want[CPU], want
        assert sub.n["BlockRemoved"] >= 3 and c[CNT["cache_ram_saves_total"]] >= 2, sub.n
        assert c[CNT["cache_evictions_total"]] >= 1, "the RAM bound never dropped anything"
        assert c[CNT["kv_events_dropped_total"]] == 0 and c[CNT["kv_events_total"]] >= sum(sub.n.values())
        eng.shutdown()  # AllBlocksCleared, socket closed
        (_, _, (_, last, _)), = recv_all(sock, 1.0)
        assert last == [["AllBlocksCleared"]]
    finally:
        stop.set()
        if sock is not None:
            sock.close()
        if model is not None:
            model.close()
        vocab.close()
        arena.close()
        arena.unlink()


def test_engine_process_publishes_and_fails_loudly_on_bind():
    """The child engine (python -m engine) reads the flag: the blocks of a
    prompt arrive chained as computed here; a second engine on the same
    endpoint fails its start with the reason; a stopped engine's last
    message is AllBlocksCleared."""
    import dataclasses

    from llama_cpp import Llama

    from engine.direct import generate
    from engine.process import EngineProcess
    from frontends.testing import free_port
    from ipc.client import WorkerPort

    ep = f"tcp://127.0.0.1:{free_port()}"
    kv = json.dumps({"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": ep, "topic": "kv@p@m"})
    cfg = Config(parallel=2, ctx_size=1024, threads=2, http_threads=8, workers=1, kv_events_config=kv)
    vocab = Llama(cfg.model_path(), vocab_only=True, verbose=False)
    sock = subscriber(ep)
    try:
        with EngineProcess(cfg) as eng:
            port = WorkerPort(eng.arena, 0)
            p = cfg.sampling(temperature=0.0, n_predict=2, ignore_eos=1)
            for k in range(50):  # the slow joiner: requests (each a new block) until the subscriber hears one
                generate(port, vocab.tokenize(f"Warm-up request number {k}, a few words long. ".encode() * 3,
                                              add_bos=True), p)
                if sock.poll(200):
                    break
            else:
                raise AssertionError("no KV event reached the subscriber")
            recv_all(sock, 0.3)
            ids = vocab.tokenize(("The lighthouse keeper counted the ships passing in the night. " * 6).encode(),
                                 add_bos=True)
            generate(port, ids, p)
            stored = [ev for _, _, b in recv_all(sock, 0.5) for ev in b[1] if ev[0] == "BlockStored"]
            got = [h for ev in stored if ev[6] == GPU for h in ev[1]]
            want = chain(np.array(ids, np.int32))  # the prompt's whole blocks
            assert len(want) >= 3 and set(want) <= set(got), (len(want), len(got))
            with pytest.raises(RuntimeError, match="kv-events-config: cannot bind"):
                with EngineProcess(dataclasses.replace(cfg, arena="")):
                    pass
        msgs = recv_all(sock, 1.0)
        assert msgs and msgs[-1][2][1] == [["AllBlocksCleared"]], msgs
    finally:
        sock.close()
        vocab.close()
