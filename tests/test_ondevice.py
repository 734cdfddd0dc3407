"""On-device sampling (--backend-sampling, engine/sampling/ondevice.py) on the CPU backend.

The CPU backend runs the same graph code as a GPU's (llama.cpp appends the
sampler chain to the decode graph either way, and copies raw logits to the
host only for ubatches that hold a host-sampled output), so these tests take
every Python path a GPU run takes: attaching and detaching chains, reading
sampled tokens, mixing device- and host-sampled slots in one batch.
"""
from __future__ import annotations

import threading

import numpy as np
import pytest

from engine.config import Config
from engine.direct import generate
from engine.process import EngineProcess
from ipc.client import WorkerPort

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Here is a short poem about the sea:"]
GREEDY = dict(temperature=0.0, n_predict=12, cache_prompt=0)
SAMPLED = dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, n_predict=12, cache_prompt=0, seed=1234)


def _cfg(backend: bool, parallel: int = 1) -> Config:
    # -b 16 -ub 1: one token per graph, so outputs do not depend on batch neighbours (frontends/testing);
    # -ngl 99 as on a GPU (a CPU build ignores it, the Python side takes the same path)
    return Config(parallel=parallel, ctx_size=256 * parallel, batch_size=16, ubatch_size=1, threads=2,
                  flash_attn="off", http_threads=4, workers=1, backend_sampling=backend, n_gpu_layers=99)


@pytest.fixture(scope="module")
def model():
    """One in-process model (two sequences)."""
    from engine.model import Model

    m = Model(_cfg(True, parallel=2))
    yield m
    m.close()


def _run(m, params: dict, seq: int, n: int = 10, backend: bool = True) -> tuple[str, list[int]]:
    """Prompt + n tokens on one sequence, token by token, as the engine does."""
    from engine.sampling import make_sampler

    ids = m.tokenize(PROMPTS[0])
    s = make_sampler(m, dict(params, backend_sampling=backend), seq=seq)
    s.prime(ids)
    m.seq_clear(seq)
    m.clear()
    i = m.add_many(ids, 0, seq, True)
    assert m.decode() == 0
    out, pos = [], len(ids)
    for _ in range(n):
        t = s.sample(m, i)
        s.accept(t)
        out.append(t)
        m.clear()
        i = m.add(t, pos, seq, True)
        pos += 1
        assert m.decode() == 0
    kind = s.kind
    s.free()
    return kind, out


def test_device_greedy_equals_host_greedy(model):
    kind, host = _run(model, GREEDY, 0, backend=False)
    assert kind == "greedy"
    for seq in (0, 1):
        kind, dev = _run(model, GREEDY, seq)
        assert kind == "device" and dev == host, (seq, dev, host)


def test_device_sampling_is_seeded_and_valid(model):
    a = _run(model, SAMPLED, 0)
    b = _run(model, SAMPLED, 1)
    c = _run(model, dict(SAMPLED, seed=99), 0)
    assert a[0] == "device" and a == b  # same seed, other sequence: same tokens
    assert all(0 <= t < model.n_vocab for t in a[1] + c[1])
    assert c[1] != a[1]  # another seed draws otherwise (12 draws from top-40)
    # penalties run on the device too (their window is fed on the host by accept)
    d = _run(model, dict(SAMPLED, repeat_penalty=1.5), 0)
    assert d[0] == "device" and all(0 <= t < model.n_vocab for t in d[1])


def test_requests_needing_host_logits_stay_on_host(model):
    from engine.sampling import make_sampler

    from engine.sampling.ondevice import eligible

    # a top_k past TOP_K_MAX stays on the host: on the device, top_k 150000 aborted the engine (ggml_top_k's
    # assert; here only the rule is checked: a sampler built for it would abort this process); min_p >= 1
    # (the device's min_p masks every token) too
    base = {"n_probs": 0, "typical_p": 1.0, "top_k": 40, "min_p": 0.05, "min_keep": 0}
    assert eligible(base, b"") and not eligible(dict(base, top_k=150000), b"")
    for params, grammar in ((dict(GREEDY, n_probs=3), b""), (dict(SAMPLED, typical_p=0.5), b""),
                            (SAMPLED, b'root ::= "a"'), (dict(SAMPLED, top_k=0, min_p=1.0), b"")):
        s = make_sampler(model, dict(params, backend_sampling=True), grammar, seq=0)
        try:
            assert s.kind != "device", params
        finally:
            s.free()
    for params, seq in ((dict(SAMPLED, backend_sampling=True), -1), (SAMPLED, 0)):
        s = make_sampler(model, params, seq=seq)  # no sequence, or not asked: the host
        assert s.kind == "topk"
        s.free()


@pytest.fixture(scope="module")
def device_engine():
    """One engine process with backend sampling (two slots) for the engine
    tests: their requests keep no prompt (cache_prompt 0), so neither sees
    what the other left; counters are read as differences."""
    with EngineProcess(_cfg(True, parallel=2)) as eng:
        yield eng


def test_engine_backend_sampling_greedy_equals_default(device_engine):
    """Through the engine process: greedy, one request at a time,
    --backend-sampling gives the default path's tokens, and the device
    counter says who sampled them."""
    outs = {}
    with EngineProcess(_cfg(False)) as host:
        for backend, eng in ((False, host), (True, device_engine)):
            port = WorkerPort(eng.arena, 0)
            ids = _tokens(eng)
            n0 = eng.arena.count("device_samples_total")
            outs[backend] = [generate(port, p, eng.cfg.sampling(**GREEDY)).tokens for p in ids]
            n_dev = eng.arena.count("device_samples_total") - n0
            assert n_dev == (sum(len(t) for t in outs[backend]) if backend else 0), n_dev
    assert outs[True] == outs[False]


def test_engine_mixes_device_and_host_slots_in_one_batch(device_engine):
    """Two slots, backend sampling on: a greedy request with n_probs (host
    logits) runs beside seeded sampled ones in the same steps; the n_probs
    request gets its rows, sampled repeats give the same text."""
    eng = device_engine
    port = WorkerPort(eng.arena, 0)
    ids = _tokens(eng)
    n_start = eng.arena.count("device_samples_total")
    box: dict[str, object] = {}

    def sampled(key: str) -> None:
        box[key] = generate(port, ids[1], eng.cfg.sampling(**dict(SAMPLED, n_predict=24)))

    for key in ("s1", "s2"):
        th = threading.Thread(target=sampled, args=(key,))
        th.start()
        probs = generate(port, ids[0], eng.cfg.sampling(**dict(GREEDY, n_probs=3)))
        th.join(60)
        assert not th.is_alive()
        box["p" + key[1]] = probs
    ref = generate(port, ids[0], eng.cfg.sampling(**GREEDY))
    n_dev = eng.arena.count("device_samples_total")
    host = generate(port, ids[1], eng.cfg.sampling(**dict(SAMPLED, n_predict=24, backend_sampling=0)))
    assert eng.arena.count("device_samples_total") == n_dev  # the request's field wins
    assert host.tokens == box["s1"].tokens  # and the host draws what the device drew
    for k in ("p1", "p2"):
        got = box[k]
        assert got.tokens == ref.tokens and len(got.probs) == len(got.tokens)
        assert all(row["id"][0] == t for row, t in zip(got.probs, got.tokens))
        assert all(np.all(np.diff(row["logprob"]) <= 0) for row in got.probs)
    s1, s2 = box["s1"], box["s2"]
    assert s1.tokens == s2.tokens and len(s1.tokens) == 24
    assert eng.arena.count("device_samples_total") - n_start >= 48  # the sampled ones, on the device


def _tokens(eng: EngineProcess) -> list[list[int]]:
    from engine.vocab import Vocab

    with Vocab.load(eng.cfg.model) as v:
        return [v.tokenize(p) for p in PROMPTS]


def test_vocab_only_load_asks_for_no_device():
    """Workers' and the master's vocabulary loads list no device, so on a GPU
    host they never create a CUDA context (engine/vocab.py vocab_params)."""
    import ctypes

    from engine.vocab import Vocab, vocab_params

    p = vocab_params()
    assert p.vocab_only and p.n_gpu_layers == 0 and p.devices
    assert ctypes.c_void_p.from_address(p.devices).value is None  # an empty, NULL-terminated list
    with Vocab.load(Config().model_path()) as v:
        assert v.n_vocab == 262144 and v.tokenize("Hello world") and v.info()["n_embd"] == 640
