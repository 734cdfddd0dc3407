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
from concurrent.futures import ThreadPoolExecutor

import pytest

from frontends import testing
from frontends.testing import post

LLAMA_SERVER = "/root/.cache/ringserve/llama.cpp-0.3.36/build/bin/llama-server"
SMOL = testing.models.smollm2()
pytestmark = pytest.mark.skipif(SMOL is None, reason="needs SmolLM2 (test extra)")

TEXT = ("Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt ut labore et "
        "dolore magna aliqua. Ut enim ad minim veniam, quis nostrud exercitation ullamco laboris nisi ut aliquip ex "
        "ea commodo consequat.")
# Prompts that nearly fill a 256-token slot (LONG: 235 SmolLM2 tokens; GEMMA_LONG: 216 Gemma
# ones), so a short generation reaches the slot's end: shifts within tens of tokens, not hundreds.
LONG = " ".join([TEXT] * 3)
GEMMA_LONG = " ".join([TEXT] * 5)
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


def ringserve(flags: list[str]) -> testing.Server:
    return testing.Server("-m", SMOL, "-t", "1", "-w", "1", *flags, wait=False)


def llama_server(flags: list[str]) -> testing.Proc | None:
    if not os.path.exists(LLAMA_SERVER):
        return None
    port = testing.free_port()
    return testing.Proc([LLAMA_SERVER, "-m", SMOL, "-t", "1", "--port", str(port), *flags], port,
                        wait=False, name="llama-server")


def serve(*runs: tuple[testing.Proc | None, list[dict]]) -> tuple[list, list[str]]:
    """Each (server, bodies): the bodies' rows on that fresh server (None for
    no server), and its log. The servers (one thread each: -t 1, two cores)
    start and answer side by side; they share nothing, so each one's rows are
    what it gives alone (greedy, one request at a time per server)."""
    procs = [p for p, _ in runs]

    def one(p: testing.Proc | None, bodies: list[dict]) -> tuple[list[tuple] | None, str]:
        if p is None:
            return None, ""
        p.wait_ready()  # raises with the server's log tail if it exits or is not ready in 60 s
        return rows(p.url(""), bodies), p.log()

    try:
        with ThreadPoolExecutor(len(runs)) as ex:
            futs = [ex.submit(one, p, b) for p, b in runs]
            out = [f.result() for f in futs]
    finally:
        for p in procs:
            if p is not None:
                p.stop()
                p.cleanup()
    return [r for r, _ in out], [log for _, log in out]


SHIFT = ["-c", "256", "-np", "2", "--context-shift"]
# LONG (235 tokens) + 64, n_keep 200: a shift at the 21st token (half of the 56 past n_keep go), the
# second at the 49th, a third would need 77
SHIFT_BODIES = [{"prompt": TEXT, "n_predict": 48, "temperature": 0},
                {"prompt": LONG, "n_predict": 64, "temperature": 0, "ignore_eos": True, "n_keep": 200}]


def test_context_shift_as_llama_server():
    """64 tokens past a 256-token slot holding a 235-token prompt: two shifts
    (n_keep 200, half of the rest), truncated."""
    (got, want), (log, _) = serve((ringserve(SHIFT), SHIFT_BODIES), (llama_server(SHIFT), SHIFT_BODIES))
    assert log.count("context shift") == 2, log[-3000:]
    assert got[1][2] == 64 and got[1][3] is True, got
    assert got[0][3] is False, got
    if want is not None:
        assert got == want


def test_no_context_shift_stops_at_the_slot_end():
    got = serve((ringserve(["-c", "256", "-np", "2"]), SHIFT_BODIES[1:]))[0][0]
    n_prompt, n_gen = got[0][0], got[0][2]
    assert got[0][3] is True and 240 <= n_prompt + n_gen <= 256, got


def test_shifted_slot_offers_only_its_exact_prefix():
    """After a shifted request, the same prompt reuses only the kept n_keep
    tokens, and its text is a cold request's."""
    bodies = [{"prompt": LONG, "n_predict": 40, "temperature": 0, "ignore_eos": True, "n_keep": 10},  # a shift at 21
              {"prompt": TEXT, "n_predict": 16, "temperature": 0},
              {"prompt": TEXT, "n_predict": 16, "temperature": 0, "cache_prompt": False}]
    (got,), (log,) = serve((ringserve(["-c", "256", "-np", "1", "--context-shift"]), bodies))
    assert "context shift" in log, log[-3000:]
    assert got[0][3] is True
    assert got[1][1] == 10, f"cached after a shift: {got[1][1]} tokens, want the 10 kept"
    assert got[1][4] == got[2][4]


REUSE_BODIES = [{"prompt": p, "n_predict": 12, "temperature": 0}
                for p in (A + B + C + Q, A + C + Q, A + B + C + Q, A + "Note: read both. " + B + C + Q)]


@pytest.mark.parametrize("prefix_cache", [True, False])
def test_cache_reuse_as_llama_server(prefix_cache):
    """A removed and an inserted chunk: the cached chunks after them are moved,
    not evaluated (fewer prompt tokens than without --cache-reuse), as llama-server does.
    The --cache-reuse server's first two rows are what a server given only those two
    gives (fresh server, one request at a time, greedy), so one run serves both checks."""
    base = ["-c", "1024", "-np", "1"] + ([] if prefix_cache else ["--no-prefix-cache"])
    reuse = REUSE_BODIES if prefix_cache else REUSE_BODIES[:2]
    ref = llama_server(["-c", "1024", "-np", "1", "--cache-reuse", "8"]) if prefix_cache else None
    (full, plain, want), _ = serve((ringserve(base + ["--cache-reuse", "8"]), reuse),
                                   (ringserve(base), REUSE_BODIES[:2]), (ref, REUSE_BODIES))
    got = full[:2]
    assert got[1][0] < plain[1][0], (got, plain)
    assert got[1][0] + got[1][1] == plain[1][0] + plain[1][1]  # same prompt, split differently
    if want is not None:
        assert full == want


def test_context_shift_on_gemma_sliding_window():
    """The default model (sliding window 512): ringserve keeps a full-size
    window cache (swa_full), so llama.cpp can shift it (llama_memory_can_shift,
    llama_kv_cache_iswa: both caches the same size) and a generation past the
    slot's end shifts (GEMMA_LONG is 216 of the slot's 256 tokens: a shift at the 40th)."""
    with testing.Server("-c", "512", "-np", "2", "-t", "1", "-w", "1", "--context-shift") as s:
        code, r = post(s.url("/completion"), {"prompt": GEMMA_LONG, "n_predict": 80, "temperature": 0,
                                               "ignore_eos": True}, timeout=120)
        log = s.log()
    assert code == 200, r
    assert r["timings"]["predicted_n"] == 80 and r["truncated"] is True, r["timings"]
    assert "context shift" in log, log[-3000:]
