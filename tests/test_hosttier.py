"""The host tier (engine/hosttier.py, --cache-host): the files alone, then two
real engines on one host handing each other a prompt's KV."""
from __future__ import annotations

import os
import stat
import subprocess
import threading

import numpy as np
import pytest

from engine.hosttier import HEAD, HostTier
from frontends.testing import wait_for
from ipc import shm

SWA = 512


def toks(*parts) -> np.ndarray:
    return np.concatenate([np.asarray(p, np.int32) for p in parts])


@pytest.fixture
def root(tmp_path):
    d = tmp_path / "host"
    yield str(d)
    assert not d.exists(), f"left behind: {list(d.rglob('*'))}"


def peer(root: str, pid: int, n_swa: int = SWA, mib: int = 64) -> HostTier:
    """A HostTier speaking for another live process (the test's parent), as a second instance would."""
    h = HostTier(root, "key", n_swa, mib)
    h.pid = pid
    return h


def test_an_entry_serves_its_prefixes_by_the_sliding_window_rule(root):
    a = HostTier(root, "key", SWA, 64)
    short = np.arange(300, dtype=np.int32)  # within one window: every cell kept, any prefix usable
    long = np.arange(1000, 1800, dtype=np.int32)  # past the window: only its whole length is exact
    assert a.publish(short, np.ones(4096, np.uint8), 0)
    assert a.publish(long, np.ones(8192, np.uint8), len(long) - SWA)
    probe = toks(short[:200], [7, 7, 7])
    assert a.best(probe, len(probe) - 1)[:3] == (200, a.mine[0][0], 300)
    assert a.best(toks(long[:700], [7]), 700)[0] == 0  # short of a long blob's end: not exact
    assert a.best(toks(long, [7, 7]), 801)[0] == 800  # its whole length: exact
    assert a.best(short, 120)[0] == 120  # never past what the caller may use (its last token is evaluated)
    blob = a.load(a.mine[1][0])
    assert blob is not None and blob.nbytes == 8192
    # a file under a known name that no longer holds the tokens looked up (a pid used again) is not loaded
    name = a.mine[0][0]
    with open(os.path.join(root, "key", name), "r+b") as f:
        f.seek(HEAD.size)
        f.write(np.int32(-5).tobytes())
    assert a.load(name) is None
    # without a sliding window any prefix of any entry serves
    b = HostTier(root, "other", 0, 64)
    assert b.publish(long, np.ones(8192, np.uint8), 0)
    assert b.best(toks(long[:700], [7]), 700)[0] == 700
    for f in os.listdir(os.path.join(root, "key")):
        assert stat.S_IMODE(os.stat(os.path.join(root, "key", f)).st_mode) == 0o600
    a.close()
    b.close()


def test_a_directory_others_can_read_is_refused(tmp_path):
    d = tmp_path / "open" / "key"
    d.mkdir(parents=True)
    d.chmod(0o755)
    with pytest.raises(PermissionError, match="mode 0700"):
        HostTier(str(tmp_path / "open"), "key", 0, 1)


def test_publish_skips_what_is_there_and_keeps_its_bound(root):
    a = HostTier(root, "key", 0, 1)  # 1 MiB of own entries
    t = np.arange(100, dtype=np.int32)
    assert a.publish(t, np.ones(400_000, np.uint8), 0)
    assert not a.publish(t[:80], np.ones(400_000, np.uint8), 0)  # an entry already gives all of it
    assert a.publish(toks(t, [1]), np.ones(400_000, np.uint8), 0)
    assert a.publish(toks(t, [2]), np.ones(400_000, np.uint8), 0)  # past 1 MiB: the oldest goes
    names = sorted(os.listdir(os.path.join(root, "key")))
    assert len(names) == 2 and a.mine[0][0] in names and a.nbytes == 800_000
    assert not a.publish(np.arange(5, dtype=np.int32), np.ones(2 << 20, np.uint8), 0)  # bigger than the bound
    a.close()


def test_claims_make_the_later_of_two_wait_and_vanish_with_their_owner(root):
    a = HostTier(root, "key", SWA, 64)
    b = peer(root, os.getppid())
    p = np.arange(300, dtype=np.int32)
    q = toks(p[:250], [9, 9, 9])
    assert not a.behind(("r1", 0), p, 64)  # the first claim: nobody older
    assert b.behind(("r2", 0), q, 64)  # a's claim is older and shares 250 tokens
    assert not b.behind(("r3", 0), toks([5] * 80), 64)  # nothing shared: b's own older claim is its own
    assert not a.behind(("r1", 0), p, 64)  # b's claims are younger
    a.unclaim(("r1", 0))
    assert not b.behind(("r4", 0), q, 64)
    # after an intake only the claims of requests that wait for a peer stay (no slot yet: no claim)
    assert b.behind(("r6", 0), q, 64) is False and ("r6", 0) in b.claims
    b.held.add(("r2", 0))
    b.settle()
    assert set(b.claims) == {("r2", 0)} and not b.held  # ("r3", 0), ("r4", 0), ("r6", 0) went
    # with a sliding window, a claim past one window whose entry could not give our prefix is not waited for
    long = np.arange(2000, 2700, dtype=np.int32)
    b.claim(("x", 1), long)
    assert not a.behind(("r7", 0), toks(long[:600], [1, 2]), 64)  # it would serve its whole 700 only
    assert a.behind(("r8", 0), toks(long, [1, 2]), 64)  # its whole length: worth waiting for
    # without a sliding window any shared prefix of an older claim is worth waiting for
    c0 = HostTier(root, "flat", 0, 64)
    c0.pid = os.getppid()
    d0 = HostTier(root, "flat", 0, 64)
    assert not c0.behind(("s1", 0), long, 64)
    assert d0.behind(("s2", 0), toks(long[:600], [1, 2]), 64)
    c0.pid = d0.pid
    c0.close()
    d0.close()
    # a moved claim follows its slot; a dead process's files go at the next look
    a.claim(("r5", 0), p)
    assert a.move(("r5", 0), 0) and not a.move(("r5", 0), 1) and 0 in a.claims
    dead = subprocess.Popen(["true"])
    dead.wait()
    zombie = subprocess.Popen(["true"])  # exited, not reaped yet: dead too (kill(pid, 0) said alive)
    wait_for(lambda: shm.proc_start(zombie.pid) == 0, 5, "the child to exit")
    gone = [os.path.join(root, "key", f"{pid}-1.kv") for pid in (dead.pid, zombie.pid)]
    for g in gone:
        with open(g, "wb") as f:
            f.write(b"x")
    a.best(p, 10)
    assert not any(os.path.exists(g) for g in gone)
    zombie.wait()
    b.pid = a.pid  # b's files are a's process's files here: close them through b, then a
    b.close()
    a.close()


# ---------------------------------------------------------------- the engines
def _two(path, **kw):
    from engine.config import Config
    from engine.process import EngineProcess

    cfg = Config(parallel=2, ctx_size=2048, threads=1, workers=1, cache_host=path, **kw)
    return cfg, EngineProcess(cfg), EngineProcess(cfg)


def test_two_engines_share_a_prompt_sequentially_and_at_once(gemma_vocab):
    """Engine B loads the prefix engine A evaluated; two prompts sharing a new
    prefix sent to both at once are evaluated once (one claims, the other
    waits for its entry). Everything goes when they stop."""

    from engine.direct import generate
    from ipc.client import WorkerPort
    from ipc.layout import CNT

    path = f"/dev/shm/ringserve-test-host-{os.getpid()}"
    cfg, a, b = _two(path)
    v = gemma_vocab

    def ids(text: str) -> list[int]:
        return v.tokenize(text.encode(), add_bos=True, special=True)

    system = "System: answer briefly. " + " ".join(f"rule {i} is kept" for i in range(60))
    with a, b:
        pa, pb = WorkerPort(a.arena, 0), WorkerPort(b.arena, 0)
        par = cfg.sampling(n_predict=4, temperature=0.0, cache_prompt=1)
        first = generate(pa, ids(system + "\nUser: one?"), par).result
        second = generate(pb, ids(system + "\nUser: and two?"), par).result
        assert first["n_cache"] == 0
        assert second["n_cache"] >= len(ids(system)) - 2 and second["n_eval"] < 16, second
        assert b.arena.counters[CNT["cache_host_loads_total"]] == 1
        assert a.arena.counters[CNT["cache_host_publishes_total"]] >= 1
        out: dict = {}

        def go(name, port, text):
            out[name] = generate(port, ids(text), par).result

        # Two claims whose writes cross (one written while the other's engine reads the directory,
        # the older one's rename landing after that read) both evaluate: a lost chance the design
        # accepts (docs/ARCHITECTURE.md, "At once"), seen once in ~10 suite runs on a loaded 2-core
        # VM. Up to three fresh prefixes: one of them must be evaluated once.
        tries = []
        for k in range(3):
            other = f"Another system line {k}. " + " ".join(f"item {i} listed" for i in range(60))
            ts = [threading.Thread(target=go, args=("a", pa, other + "\nUser: x")),
                  threading.Thread(target=go, args=("b", pb, other + "\nUser: y y"))]
            for t in ts:
                t.start()
            for t in ts:
                t.join(60)
            evals = sorted(r["n_eval"] for r in out.values())
            tries.append(out.copy())
            assert len(ids(other)) <= evals[1], out
            if evals[0] < 16:  # one evaluated it, the other loaded it
                break
        assert evals[0] < 16, tries
        waits = a.arena.counters[CNT["cache_host_waits_total"]] + b.arena.counters[CNT["cache_host_waits_total"]]
        assert waits >= 1
    assert not os.path.exists(path), os.listdir(path)


def test_the_host_tier_needs_the_prefix_cache(tmp_path):
    cfg, a, b = _two(str(tmp_path / "h"), prefix_cache=False)
    b.close()
    with pytest.raises(RuntimeError, match="cache-host"):
        with a:
            pass


def test_kv_moved_by_cache_reuse_is_never_published():
    """A prompt evaluated after --cache-reuse moved cached chunks into place
    (SmolLM2, no sliding window) holds KV no evaluation gives: it is not
    offered to the peers, though it evaluated 64 tokens and more itself."""
    from frontends import testing
    from frontends.testing import post
    from frontends.testing.http import metrics

    smol = testing.models.smollm2()
    if smol is None:
        pytest.skip("needs SmolLM2 (test extra)")
    path = f"/dev/shm/ringserve-test-reuse-{os.getpid()}"
    a = "You are a helpful assistant. Answer the question about the following documents carefully and briefly. "
    b = "Document one: The river flows north through the valley, past the old mill and the stone bridge, to the lake. "
    c = "Document two: The library opens at nine in the morning and closes at six in the evening, except on Sundays. "
    more = " ".join(f"Note {i}: the answer must name the day and the hour, and nothing else." for i in range(6))
    srv = testing.Server("-m", smol, "-t", "1", "-w", "1", "-c", "1024", "-np", "1", "--cache-reuse", "8",
                         "--metrics", "--cache-host", path, wait=False)
    try:
        srv.wait_ready()
        code, tok = post(srv.url("/tokenize"), {"content": a})
        assert code == 200, tok
        n_a = len(tok["tokens"])  # what the second prompt shares with the first before its moved chunk
        seen = []
        for prompt in (a + b + c + "Question: when?", a + c + more + " Question: when does it open?"):
            code, r = post(srv.url("/completion"), {"prompt": prompt, "n_predict": 4, "temperature": 0})
            assert code == 200, r
            seen.append(r["timings"])
        m = metrics(srv.url(""))
    finally:
        srv.stop()
        srv.cleanup()
    assert seen[1]["cache_n"] >= n_a + 16 and seen[1]["prompt_n"] >= 64, (n_a, seen)  # c moved, then 64+ evaluated
    assert m["ringserve:cache_host_publishes_total"] == 1, m  # the first prompt only
    assert not os.path.exists(path)


def test_a_peer_is_waited_for_as_long_as_evaluating_here_would_take():
    """SlotCache.peer_wait: 1.5x the tokens at the learned per-token cost,
    never under cache_wait; 4x cache_wait before the cost is learned (a
    fleet's first prompts: a fixed 2 s gave up on a peer 0.1-0.3 s before it
    published a 378-token system prompt on a 1-thread AVX2 instance)."""
    from types import SimpleNamespace

    from engine.kvcache import SlotCache

    def wait(per_tok: float, n: int) -> float:
        return SlotCache.peer_wait(SimpleNamespace(max_wait=2.0, per_tok=lambda: per_tok), n)

    assert wait(0.0, 378) == 8.0  # not learned yet
    assert wait(0.0055, 378) == 1.5 * 378 * 0.0055  # 3.1 s: that instance's 2.1-2.3 s, with room
    assert wait(0.001, 378) == 2.0  # a fast host: never under cache_wait
