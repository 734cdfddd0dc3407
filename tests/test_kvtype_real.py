"""-ctk/-ctv q8_0 with the real model, over HTTP: the prefix cache's RAM
tier holds the type llama.cpp made (bytes per token in /metrics shrink with
it, cache_ram_bytes / cache_ram_tokens), /props reports the smaller KV, and
a hit restored from RAM is exact for that type: the same first-token
distribution, bit for bit, as a hit from the slot itself (same KV bytes, same
batch of one), and within the cross-batch-shape drift of a from-scratch run
(the control scripts/cache_probe.py uses)."""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from frontends.testing import Server, get, metrics, post

# 233 Gemma tokens (the RAM tier's bytes per token need > 100 of them, a header is noise there);
# OTHER (55 tokens) only has to differ from the start to send DOC's KV to RAM
DOC = "Report. " + " ".join(f"Item {i} ships on day {i % 7}." for i in range(24))
OTHER = "Unrelated. " + "Cats sleep a lot. " * 10
DRIFT = 0.5  # logprob change allowed between cached and from-scratch evaluation (tests/test_prefix_real.py)


def _ask(srv: Server, prompt: str, **kw) -> dict:
    body = {"prompt": prompt, "n_predict": 4, "temperature": 0, "n_probs": 5, "ignore_eos": True, **kw}
    status, r = post(srv.url("/completion"), body)
    assert status == 200, r
    return r


def _first(r: dict) -> dict:
    return {t["id"]: t["logprob"] for t in r["completion_probabilities"][0]["top_logprobs"]}


def _run(srv: Server) -> dict:
    srv.wait_ready()
    props = json.loads(get(srv.url("/props"))[1])
    q = DOC + "\nQuestion: Which item ships first?\nAnswer:"
    _ask(srv, q, n_predict=1)  # in the slot
    slot_hit = _ask(srv, q)
    assert slot_hit["timings"]["cache_n"] > 0, slot_hit["timings"]
    _ask(srv, OTHER, n_predict=1)  # q's KV goes to host RAM
    m = metrics(srv.url(""))
    ram = {k: m[f"ringserve:{k}"] for k in ("cache_ram_bytes", "cache_ram_tokens", "cache_ram_saves_total")}
    ram_hit = _ask(srv, q)
    m2 = metrics(srv.url(""))
    cold = _ask(srv, q, cache_prompt=False)
    return {"props": props, "ram": ram, "loads": m2["ringserve:cache_ram_loads_total"], "slot": slot_hit,
            "hit": ram_hit, "cold": cold}


@pytest.fixture(scope="module")
def runs():
    """Both servers at once, one thread each (two cores): they share nothing."""
    kvs = ("f16", "q8_0")
    srvs = [Server("-np", "1", "-c", "2048", "-t", "1", "-w", "1", "--threads-http", "4", "-fa", "on",
                   "-ctk", kv, "-ctv", kv, "--metrics", wait=False) for kv in kvs]
    try:
        with ThreadPoolExecutor(len(srvs)) as ex:
            return dict(zip(kvs, ex.map(_run, srvs)))
    finally:
        for s in srvs:
            s.stop()
            s.cleanup()


def test_ram_tier_and_props_follow_the_kv_type(runs):
    per_tok = {}
    for kv, r in runs.items():
        assert r["ram"]["cache_ram_saves_total"] >= 1 and r["ram"]["cache_ram_tokens"] > 100, (kv, r["ram"])
        per_tok[kv] = r["ram"]["cache_ram_bytes"] / r["ram"]["cache_ram_tokens"]
        assert r["props"]["kv_cache"]["type_k"] == r["props"]["kv_cache"]["type_v"] == kv
    ratio = per_tok["q8_0"] / per_tok["f16"]
    kv_ratio = runs["q8_0"]["props"]["kv_cache"]["bytes"] / runs["f16"]["props"]["kv_cache"]["bytes"]
    print(f"RAM tier bytes/token: f16 {per_tok['f16']:.0f}, q8_0 {per_tok['q8_0']:.0f} ({ratio:.3f}); "
          f"KV {kv_ratio:.3f}")
    assert ratio == pytest.approx(34 / 64, abs=0.02), per_tok  # q8_0: 34 bytes per 32 elements, f16 64
    assert kv_ratio == pytest.approx(34 / 64, abs=0.01)


@pytest.mark.parametrize("kv", ["f16", "q8_0"])
def test_ram_hit_is_exact_for_the_type(runs, kv):
    r = runs[kv]
    assert r["loads"] >= 1 and r["hit"]["timings"]["cache_n"] == r["slot"]["timings"]["cache_n"], r["hit"]["timings"]
    assert r["hit"]["completion_probabilities"] == r["slot"]["completion_probabilities"]  # bit for bit
    assert r["hit"]["content"] == r["slot"]["content"]
    x, y = _first(r["hit"]), _first(r["cold"])
    top = max(y, key=y.get)
    assert top in x and abs(x[top] - y[top]) < DRIFT, (x, y)
