"""Nobody let in (issue 6, item 6), beyond tests/test_frontends_auth.py and
tests/test_channels.py: every served path behind the key, constant-time
comparison, shared memory another user cannot open, and the REAL engine
refusing garbage written straight into a leased channel (test_channels does
this against a fake engine; here the model, its samplers and grammar parser
see it too).
"""
from __future__ import annotations

import os
import re
import stat
import time
from typing import Callable

import numpy as np
import posix_ipc
import pytest

from frontends import testing as S
from test_channels import GARBAGE, scribble

from ipc import shm
from ipc.arena import Arena
from ipc.layout import BIAS, MAX_BIAS, PARAMS, STOP_ERROR, SUB_SUBMIT

KEY = "k-" + "7" * 30
DENIED = {"error": {"code": 401, "message": "Invalid API Key", "type": "authentication_error"}}
NAME = re.compile(r"^(sem\.)?rs_[0-9a-f]{16}_[a-z]+\d*$")


def test_every_path_but_health_needs_the_key() -> None:
    """In-process (testing.TestClient: the worker's app, a real arena, the
    fake engine in a thread): every route of /openapi.json and then some."""
    with S.TestClient("--api-key", KEY, "--metrics") as c:
        assert c.simulate_get("/openapi.json").status_code == 401
        auth = {"Authorization": f"Bearer {KEY}"}
        spec = c.simulate_get("/openapi.json", headers=auth).json
        ops = [(m, p.replace("{id_slot}", "0") + ("?action=erase" if "{" in p else ""))
               for p, d in spec["paths"].items() for m in d]
        ops += [("get", "/openapi.json"), ("get", "/nope"), ("post", "/v1/embeddings"), ("delete", "/slots")]
        assert len(ops) >= 20
        tried = 0
        body = {"prompt": "a", "n_predict": 1}
        for method, path in ops:
            public = path in ("/health", "/v1/health")
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"X-Api-Key": "wrong"},
                            {"Authorization": f"Bearer {KEY}x"}, {"X-Api-Key": KEY[:-1]}):
                r = c.simulate_request(method.upper(), path, json=body, headers=headers)
                tried += 1
                if public:
                    assert r.status_code == 200, (method, path, headers)
                else:
                    assert r.status_code == 401 and r.json == DENIED, (method, path, headers, r.text)
            for good in (auth, {"X-Api-Key": KEY}):
                r = c.simulate_request(method.upper(), path, json=body, headers=good)
                assert r.status_code != 401, (method, path, good)
        print(f"{tried} unauthenticated requests over {len(ops)} endpoints: all 401 but /health")
        # the live instance's objects: private, unguessable names
        entries = shm.instance_entries(c.arena.instance)
        assert entries and all(NAME.match(e) for e in entries)
        assert all(stat.S_IMODE(os.stat(os.path.join(shm.SHM_DIR, e)).st_mode) == 0o600 for e in entries)


def test_key_is_compared_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every configured key is compared, with hmac.compare_digest, whether
    the first, the last or none matches: timing cannot tell which."""
    from frontends.api import auth

    calls: list[tuple[bytes, bytes]] = []
    real = auth.hmac.compare_digest
    monkeypatch.setattr(auth.hmac, "compare_digest", lambda a, b: calls.append((a, b)) or real(a, b))
    keys = [b"alpha-key", b"bravo-key", b"charlie-key"]
    for given, want in (("alpha-key", True), ("charlie-key", True), ("alpha-kez", False), ("", False)):
        calls.clear()
        assert auth.key_ok(given, keys) is want
        assert [k for _, k in calls] == keys


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to switch to another user id")
def test_another_user_cannot_open_the_arena(make_arena: Callable[..., Arena]) -> None:
    a = make_arena(n_workers=2, n_chan=2, ring_cap=8, max_prompt=16, n_slots=2)
    b = make_arena(n_workers=2, n_chan=2, ring_cap=8, max_prompt=16, n_slots=2)
    assert a.instance != b.instance
    entries = shm.instance_entries(a.instance)
    assert len(entries) > 10 and all(NAME.match(e) for e in entries)
    for e in entries:
        st = os.stat(os.path.join(shm.SHM_DIR, e))
        assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == 0, (e, oct(st.st_mode))
    pid = os.fork()
    if pid == 0:  # the child: become nobody, try every object
        code = 0
        try:
            os.setgid(65534)
            os.setuid(65534)
            for e in entries:
                try:
                    if e.startswith("sem."):
                        posix_ipc.Semaphore("/" + e[4:])
                    else:
                        posix_ipc.SharedMemory("/" + e)
                    code = 1  # opened: a leak of access
                except (posix_ipc.PermissionsError, posix_ipc.ExistentialError):
                    pass
        except BaseException:
            code = 2
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "uid 65534 opened an arena object (or the probe failed)"


def deep_scribble(lease, rng: np.random.Generator, n_vocab: int) -> None:
    """Plausible lengths, garbage everywhere else: reaches the samplers."""
    ch = lease.channel
    ch.params.view(np.uint8)[:] = rng.integers(0, 256, PARAMS.itemsize, dtype=np.uint8)
    n = int(rng.integers(1, 16))
    ch.prompt[:n] = rng.integers(0, n_vocab, n)
    ch.params["n_prompt"] = n
    ch.params["n_probs"] = rng.integers(0, 21)
    ng = int(rng.integers(0, 64)) if rng.random() < 0.5 else 0
    ch.grammar[:ng] = rng.integers(32, 127, ng, dtype=np.uint8)
    ch.params["n_grammar"] = ng
    nb = int(rng.integers(0, 8))
    ch.bias[:nb] = np.array([(int(rng.integers(0, n_vocab)), rng.choice([np.nan, np.inf, -np.inf, 1e30, 3.0]))
                             for _ in range(nb)], BIAS) if nb else ch.bias[:0]
    ch.params["n_bias"] = nb if rng.random() < 0.8 else MAX_BIAS + int(rng.integers(1, 1000))


def test_real_engine_survives_garbage_in_a_leased_channel() -> None:
    from engine.config import Config
    from engine.direct import generate
    from engine.process import EngineProcess
    from ipc.client import WorkerPort

    cfg = Config(parallel=2, ctx_size=512, threads=2, http_threads=4, workers=1, flash_attn="off")
    with EngineProcess(cfg) as eng:
        port = WorkerPort(eng.arena, 0)
        port.register()
        n_vocab = int(eng.arena.get("n_vocab"))
        greedy = cfg.sampling(n_predict=8, temperature=0.0, cache_prompt=0)
        before = generate(port, [2, 818, 5279, 529, 7001, 563], greedy).tokens
        pid = eng.proc.pid
        rng = np.random.default_rng(6)
        errors = ran = 0
        t0 = time.monotonic()
        # GARBAGE's limits are the small test arena's: restate the two that
        # depend on the arena and the vocabulary for this engine
        named = dict(GARBAGE, **{"prompt too long": {"n_prompt": eng.arena.geom.max_prompt + 1},
                                 "token out of vocab": {"n_prompt": 2, "prompt": [1, n_vocab]}})
        refused: dict[str, bool] = {}
        cases = [(name, spec) for name, spec in named.items()] + [("deep", None)] * 40
        for kind, spec in cases:
            with port.lease() as lease:
                if kind == "deep":
                    deep_scribble(lease, rng, n_vocab)
                else:
                    scribble(lease, spec, rng)
                lease.post(SUB_SUBMIT)
                for i in range(64):  # a request that happens to be valid may run: stop it after a few tokens
                    tk = lease.read(timeout=30.0)
                    assert tk is not None, f"no record for a {kind} garbage request"
                    if tk.last:
                        errors += tk.stop == STOP_ERROR
                        if kind != "deep":
                            refused[kind] = tk.stop == STOP_ERROR
                        break
                    if i == 4:
                        lease.cancel()
                ran += 1
            assert eng.proc.poll() is None and eng.arena.ready(), "the engine died on garbage"
        # a penalty window llama.cpp would allocate as asked (2^31 - 1 tokens: 8 GiB and 40 s of a
        # stalled engine before the fix) is the slot's context
        rss = S.rss_kb(pid)
        t1 = time.monotonic()
        out = generate(port, [2, 818, 5279], cfg.sampling(n_predict=2, repeat_last_n=2**31 - 1, repeat_penalty=1.1))
        assert len(out.tokens) == 2 and time.monotonic() - t1 < 10 and S.rss_kb(pid) - rss < 200_000
        after = generate(port, [2, 818, 5279, 529, 7001, 563], greedy).tokens
        print(f"{ran} garbage requests in {time.monotonic() - t0:.1f} s: {errors} refused with an error record")
        assert eng.proc.pid == pid and after == before
        assert errors >= len(GARBAGE)
        # every named case on its own, not only in the total ("random bytes" may by chance be valid)
        assert all(ok for name, ok in refused.items() if name != "random bytes"), refused
        assert len(refused) == len(named), refused


def test_a_requests_grammar_is_never_read_as_a_lazy_one() -> None:
    """A grammar whose first line is the workers' own lazy-grammar header
    (a GBNF comment, ipc/layout.py LAZY_GRAMMAR) used to reach the engine as
    one: trigger regexes llama.cpp compiles, whose exceptions abort the
    engine (a pattern that is not a string, a bad regex, a trigger the
    grammar then refuses), every other request with it. Now it is the
    request's GBNF with a comment on its first line: answered under it, and
    a stream beside it does not notice."""
    import threading

    import requests

    srv = S.Server("-c", "1024", "-np", "2", "-t", "2", "-w", "1")
    try:
        pid = srv.engine_pid
        side = {}
        t = threading.Thread(target=lambda: side.setdefault("r", requests.post(srv.url("/completion"), json={
            "prompt": "Once upon a time", "n_predict": 48, "ignore_eos": True, "temperature": 0}, timeout=120)))
        t.start()
        for patterns, want in (('["a", 1]', "a"), ('["("]', "a"), ('[".*"]', "zzzz")):
            body = {"prompt": "Hello", "n_predict": 4,
                    "grammar": f'# lazy: {{"patterns": {patterns}}}\nroot ::= "{want}"'}
            r = requests.post(srv.url("/completion"), json=body, timeout=60)
            assert r.status_code == 200 and r.json()["content"] == want, r.text
            assert r.json()["generation_settings"]["grammar_lazy"] is False
        t.join()
        assert side["r"].status_code == 200 and side["r"].json()["tokens_predicted"] == 48, side["r"].text
        assert srv.engine_pid == pid, srv.log_tail()
    finally:
        rc, left = srv.finish()
        assert rc == 0 and left == []


@pytest.mark.parametrize("header", [b'[1]', b'{"patterns": 5}', b'{"patterns": ["a", 1]}', b'{bad'])
def test_the_engine_refuses_a_lazy_header_of_another_shape(header: bytes) -> None:
    """Written into a channel by the workers' tool formats only; the engine
    checks its shape anyway (a ValueError, the request's 400), so nothing
    else reaches llama.cpp or raises out of the step loop."""
    from engine.sampling.chain import lazy_grammar
    from ipc.layout import LAZY_GRAMMAR

    with pytest.raises(ValueError, match="lazy-grammar header"):
        lazy_grammar(LAZY_GRAMMAR + header + b'\nroot ::= "a"')
    assert lazy_grammar(LAZY_GRAMMAR + b'{"patterns": ["a"]}\nroot ::= "a"')[0] == {"patterns": ["a"]}
