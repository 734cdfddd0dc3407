"""KV events (engine/kvevents.py) from the real engine: what a subscriber
rebuilds from the stream equals the engine's prefix tree, per medium.

The subscriber is llm-d's reader in miniature (tests/_kvevents_sub.py's
``Index``), failing on what llm-d would skip or misfile; the engine's
truth is its own prefix tree, walked by the test (``truth``): every
entry's path, hashed from scratch (no memo), per medium. The first test
runs the Engine in this process (as engine/__main__.py does, in a thread)
so the tree can be walked once the loop has stopped, with no debug hook in
the engine; the second runs the child engine (python -m engine) as the
server does. The units (hashing, parsing, framing) are
tests/test_kvevents.py's.
"""
from __future__ import annotations

import json
import random
import threading

import numpy as np
import pytest

from engine.config import Config
from engine.kvevents import CPU, GPU, chain
from ipc.layout import CNT

pytest.importorskip("zmq")  # without either the whole module is skipped
pytest.importorskip("msgpack")

from _kvevents_sub import Index, handshake, recv_all, subscriber, truth  # noqa: E402 (after the skips)


# ---------------------------------------------------------- real engine
SYSTEMS = [3 * s for s in (  # ~60 tokens each: a few blocks shared by many prompts
    "You are a terse assistant for a bicycle shop. Answer in one short sentence and never use lists.\n",
    "You translate English into French. Keep names as they are and reply with the translation only.\n",
    "You are a pirate who answers every question about the weather, the tides and the stars.\n")]
TOPICS = ["gears", "brakes", "tyres", "saddles", "chains", "lights", "bells", "pumps", "locks", "baskets",
          "helmets", "pedals", "spokes", "frames", "mirrors", "racks"]


def test_real_engine_events_rebuild_its_tree(tmp_path, gemma_vocab):
    """A random workload on the real engine (2 slots, 1 parking stream, a
    RAM bound of ~2 blobs): shared system prompts, distinct questions,
    follow-up turns, evictions from slots, parking and RAM. The index
    rebuilt from the events equals the tree's blocks per medium, no message
    was lost (consecutive seq), and shutdown clears it."""

    from engine.direct import generate
    from engine.loop import Engine
    from engine.model import Model
    from engine.process import create_arena, prepare
    from ipc.client import WorkerPort
    from ipc.server import EnginePort

    ep = f"ipc://{tmp_path}/kv.sock"
    kv = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": ep, "topic": "kv@test@gemma"}
    cfg = prepare(Config(parallel=2, ctx_size=2 * 512, threads=1, http_threads=8, workers=1, cache_ram=6,
                         cache_streams=1, kv_events_config=json.dumps(kv)))
    vocab = gemma_vocab
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
        arena.close()
        arena.unlink()


def test_engine_process_publishes_and_fails_loudly_on_bind(gemma_vocab):
    """The child engine (python -m engine) reads the flag: the blocks of a
    prompt arrive chained as computed here; a second engine on the same
    endpoint fails its start with the reason; a stopped engine's last
    message is AllBlocksCleared."""
    import dataclasses

    from engine.direct import generate
    from engine.process import EngineProcess
    from frontends.testing import free_port
    from ipc.client import WorkerPort

    ep = f"tcp://127.0.0.1:{free_port()}"
    kv = json.dumps({"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": ep, "topic": "kv@p@m"})
    cfg = Config(parallel=2, ctx_size=1024, threads=1, http_threads=8, workers=1, kv_events_config=kv)
    vocab = gemma_vocab
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
        msgs = recv_all(sock, 0.5)  # the engine has exited: its last message was sent before
        assert msgs and msgs[-1][2][1] == [["AllBlocksCleared"]], msgs
    finally:
        sock.close()
