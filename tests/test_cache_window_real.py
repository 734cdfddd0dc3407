"""KV reused only where the slot really holds it (found in review,
2026-12-07): cache reuse (``n_cache_reuse``) after a RAM save cut the slot,
cache reuse on a slot restored from a blob, and a slot file restored under
--no-prefix-cache, on Gemma 3's sliding window; and no step with a context
shift's K-shift is ever aborted. Each reused KV must hold positions [0, k)
with the window a prefix of k needs (engine/lookup.py ``holds``)."""
from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import numpy as np
import requests

from engine.config import Config
from engine.direct import generate
from engine.preempt import Preempt
from engine.process import EngineProcess
from frontends import testing as S
from ipc.client import WorkerPort
from ipc.layout import CNT

BOS = 2


def _toks(rng, n: int) -> list[int]:
    return [int(x) for x in rng.integers(1000, 20000, n)]


def test_cache_reuse_moves_only_what_the_slot_holds_with_its_window():
    """Two cases on one engine (2 slots, pinned).

    A RAM save cut the slot's tail as a request with n_cache_reuse took it:
    the chunks past the cut were "moved" into a hole and the next decode
    failed the whole batch, the bystander on the other slot included (500
    "Compute error").

    A slot loaded from P's RAM blob holds the window (512) of P's 700 tokens'
    end only: P[:600] + T may not reuse its first 600 tokens (cache reuse took
    them as a chunk moved by 0, and the answer differed from a cold one):
    nothing is reused, all of it is evaluated."""
    rng = np.random.default_rng(1)
    a, x, d, q = [BOS] + _toks(rng, 20), _toks(rng, 30), _toks(rng, 600), _toks(rng, 200)
    cfg = Config(parallel=2, ctx_size=4096, threads=2, workers=1, http_threads=4)
    with EngineProcess(cfg) as eng:
        port = WorkerPort(eng.arena, 0)
        p = cfg.sampling(temperature=0.0, n_predict=4, ignore_eos=1)
        assert generate(port, a + x + d, dict(p, id_slot=0)).stop == "limit"
        bg = {}
        t = threading.Thread(target=lambda: bg.setdefault(
            "out", generate(port, [BOS] + _toks(rng, 30), dict(p, id_slot=1, n_predict=80))))
        t.start()
        time.sleep(0.5)
        out = generate(port, a + d + q, dict(p, id_slot=0, n_cache_reuse=8))
        t.join()
        assert out.stop == "limit" and out.result["error_code"] == 0, out.result
        assert bg["out"].stop == "limit" and len(bg["out"].tokens) == 80, bg["out"].result

        p1, u, t2, t3 = [BOS] + _toks(rng, 699), [BOS] + _toks(rng, 40), _toks(rng, 20), _toks(rng, 20)
        for prompt in (p1, u, p1 + t2):  # the third loads P1's blob back from RAM into slot 0
            generate(port, prompt, dict(p, id_slot=0, n_cache_reuse=8))
        got = generate(port, p1[:600] + t3, dict(p, id_slot=0, n_cache_reuse=8))
        assert got.result["n_cache"] == 0 and got.result["n_eval"] == 620, got.result


def test_a_restored_slot_file_is_reused_only_where_its_window_holds(tmp_path):
    """--no-prefix-cache and /slots restore: the slot holds the file's 700
    tokens with the window (512) of their end; a prompt sharing 600 of them
    evaluates everything (llama-server's pos_min check; before, it reused 600
    and answered otherwise than a cold run)."""
    rng = np.random.default_rng(3)
    p1, t3 = [BOS] + _toks(rng, 699), _toks(rng, 20)
    srv = S.Server("-c", "2048", "-np", "1", "-t", "2", "-w", "1", "--no-prefix-cache",
                   "--slot-save-path", str(tmp_path))
    try:
        def comp(prompt, **kw):
            r = requests.post(srv.url("/completion"), timeout=120, json={
                "prompt": prompt, "n_predict": 4, "temperature": 0, "ignore_eos": True, "return_tokens": True, **kw})
            assert r.status_code == 200, r.text
            return r.json()

        comp(p1)
        for action in ("save", "restore"):
            r = requests.post(srv.url(f"/slots/0?action={action}"), json={"filename": "a.bin"}, timeout=60)
            assert r.status_code == 200, r.text
        got = comp(p1[:600] + t3)
        assert got["timings"]["cache_n"] == 0 and got["timings"]["prompt_n"] == 620, got["timings"]
    finally:
        rc, left = srv.finish()
        assert rc == 0 and left == []


def test_a_step_that_shifts_a_context_is_never_armed():
    """llama.cpp 0.3.36 keeps a K-shift's pending shifts when its graph is
    aborted and rotates the layers it had done again at the next decode: a
    step whose build shifted a slot's context runs whole."""
    e = SimpleNamespace(n_prompt=0, n_spec=0, n_shift=1, n_gen=1, slots=[SimpleNamespace(idle=True)],
                        budget=SimpleNamespace(d_gen=0.02), cnt={CNT["express_total"]: 0.0},
                        model=None)  # never reached: arming would set the callback on model.ctx
    pre = Preempt.__new__(Preempt)  # no callback object: arm must decline before it is needed
    pre.e, pre.gave, pre.cost = e, False, {}
    pre.x_seen, pre.t_express = 0.0, time.perf_counter()  # an express decode just ran
    assert not pre.arm()
