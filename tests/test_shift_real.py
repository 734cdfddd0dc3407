"""KV shifting on the real engine (engine/shift.py): --context-shift / --keep
and --cache-reuse, on SmolLM2 (no sliding window), against llama-server
with the same flags and requests as the control: greedy, so the same
counts (prompt_n, cache_n, predicted_n, truncated) and the same text.

A moved chunk's KV is not a from-scratch evaluation's (it attended to other
tokens), so the control for the shifted output is llama-server doing the same
shift, not a cold request; what the prefix cache offers after a shift is
compared with a cold request (it must be exact).
"""
from __future__ import annotations

import os
import subprocess
import time

import pytest

from frontends import testing
from frontends.testing import post

LLAMA_SERVER = "/root/.cache/ringserve/llama.cpp-0.3.36/build/bin/llama-server"
SMOL = testing.models.smollm2()
pytestmark = pytest.mark.skipif(SMOL is None, reason="needs SmolLM2 (test extra)")

TEXT = ("Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt ut labore et "
        "dolore magna aliqua. Ut enim ad minim veniam, quis nostrud exercitation ullamco laboris nisi ut aliquip ex "
        "ea commodo consequat.")
A = "You are a helpful assistant. Answer the question about the following documents carefully and briefly. "
B = "Document one: The river flows north through the valley, past the old mill and the stone bridge, to the lake. "
C = "Document two: The library opens at nine in the morning and closes at six in the evening, except on Sundays. "
Q = "Question: when does the library open? Answer:"


def rows(url: str, bodies: list[dict]) -> list[tuple]:
    out = []
    for b in bodies:
        code, r = post(url + "/completion", b, timeout=120)
        assert code == 200, r
        t = r["timings"]
        out.append((t["prompt_n"], t.get("cache_n"), t["predicted_n"], r["truncated"], r["content"]))
    return out


def on_ringserve(flags: list[str], bodies: list[dict]) -> list[tuple]:
    with testing.Server("-m", SMOL, "-t", "1", "-w", "1", *flags) as s:
        return rows(s.url(""), bodies)


def on_llama_server(flags: list[str], bodies: list[dict]) -> list[tuple] | None:
    if not os.path.exists(LLAMA_SERVER):
        return None
    port = testing.free_port()
    p = subprocess.Popen([LLAMA_SERVER, "-m", SMOL, "-t", "1", "--port", str(port), *flags],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while testing.get(url + "/health", timeout=1.0)[0] != 200:
            assert p.poll() is None and time.monotonic() < deadline, "llama-server did not become ready in 60 s"
            time.sleep(0.2)
        return rows(url, bodies)
    finally:
        p.terminate()
        p.wait(10)


SHIFT = ["-c", "256", "-np", "2", "--context-shift"]
SHIFT_BODIES = [{"prompt": TEXT, "n_predict": 150, "temperature": 0},
                {"prompt": TEXT, "n_predict": 400, "temperature": 0, "ignore_eos": True, "n_keep": 10}]


def test_context_shift_as_llama_server():
    """400 tokens past a 256-token slot: two shifts (n_keep 10, half of the rest), truncated."""
    got = on_ringserve(SHIFT, SHIFT_BODIES)
    assert got[1][2] == 400 and got[1][3] is True, got
    assert got[0][3] is False, got
    want = on_llama_server(SHIFT, SHIFT_BODIES)
    if want is not None:
        assert got == want


def test_no_context_shift_stops_at_the_slot_end():
    got = on_ringserve(["-c", "256", "-np", "2"], SHIFT_BODIES[1:])
    n_prompt, n_gen = got[0][0], got[0][2]
    assert got[0][3] is True and 240 <= n_prompt + n_gen <= 256, got


def test_shifted_slot_offers_only_its_exact_prefix():
    """After a shifted request, the same prompt reuses only the kept n_keep
    tokens, and its text is a cold request's."""
    bodies = [SHIFT_BODIES[1],
              {"prompt": TEXT, "n_predict": 16, "temperature": 0},
              {"prompt": TEXT, "n_predict": 16, "temperature": 0, "cache_prompt": False}]
    got = on_ringserve(["-c", "256", "-np", "1", "--context-shift"], bodies)
    assert got[0][3] is True
    assert got[1][1] == 10, f"cached after a shift: {got[1][1]} tokens, want the 10 kept"
    assert got[1][4] == got[2][4]


REUSE_BODIES = [{"prompt": p, "n_predict": 12, "temperature": 0}
                for p in (A + B + C + Q, A + C + Q, A + B + C + Q, A + "Note: read both. " + B + C + Q)]


@pytest.mark.parametrize("prefix_cache", [True, False])
def test_cache_reuse_as_llama_server(prefix_cache):
    """A removed and an inserted chunk: the cached chunks after them are moved,
    not evaluated (fewer prompt tokens than without --cache-reuse), as llama-server does."""
    base = ["-c", "1024", "-np", "1"] + ([] if prefix_cache else ["--no-prefix-cache"])
    got = on_ringserve(base + ["--cache-reuse", "8"], REUSE_BODIES[:2])
    plain = on_ringserve(base, REUSE_BODIES[:2])
    assert got[1][0] < plain[1][0], (got, plain)
    assert got[1][0] + got[1][1] == plain[1][0] + plain[1][1]  # same prompt, split differently
    if prefix_cache:
        want = on_llama_server(["-c", "1024", "-np", "1", "--cache-reuse", "8"], REUSE_BODIES)
        if want is not None:
            assert on_ringserve(base + ["--cache-reuse", "8"], REUSE_BODIES) == want


def test_context_shift_on_gemma_sliding_window():
    """The default model (sliding window 512): ringserve keeps a full-size
    window cache (swa_full), so llama.cpp can shift it (llama_memory_can_shift,
    llama_kv_cache_iswa: both caches the same size) and a long generation shifts."""
    with testing.Server("-c", "512", "-np", "2", "-t", "1", "-w", "1", "--context-shift") as s:
        code, r = post(s.url("/completion"), {"prompt": TEXT, "n_predict": 300, "temperature": 0,
                                               "ignore_eos": True}, timeout=120)
    assert code == 200, r
    assert r["timings"]["predicted_n"] == 300 and r["truncated"] is True, r["timings"]
