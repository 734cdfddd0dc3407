"""/metrics rate gauges over llama-server's per-scrape window, across workers,
the snapshot an asleep engine leaves, and a scrape that waits out a step's
unsettled end (frontends/api/metrics.py).

Two collectors over one arena stand for two gunicorn workers (each its own
Arena attachment, as a forked worker has); the counters are set by hand
where the engine would write them.
"""
from __future__ import annotations

import threading
import time
from types import SimpleNamespace

from engine.config import Config
from frontends.api.load import LoadReader
from frontends.api.metrics import registry, render, settled
from ipc.arena import Arena
from ipc.layout import CNT


def rates(reg) -> tuple[float, float]:
    text = render(reg).decode()
    get = lambda name: next(float(ln.split()[-1]) for ln in text.splitlines()  # noqa: E731
                            if ln.startswith(f"llamacpp:{name} "))
    return get("prompt_tokens_seconds"), get("predicted_tokens_seconds")


def worker(inst: str, w: int = 0):
    a = Arena.attach(inst)
    return a, registry(a, LoadReader(SimpleNamespace(arena=a, n_ctx_slot=256, cfg=Config())), "m", lambda: w)


def work(c, prompt: int, prompt_s: float, steps: int, pred_s: float) -> None:
    """What the engine adds when requests finish (engine/publish.py result)."""
    c[CNT["prompt_tokens_total"]] += prompt
    c[CNT["prompt_seconds_total"]] += prompt_s
    c[CNT["tokens_predicted_steps_total"]] += steps
    c[CNT["tokens_predicted_total"]] += steps + 1
    c[CNT["tokens_predicted_seconds_total"]] += pred_s


def test_each_scrape_reports_the_window_since_the_last_one_whichever_worker_serves_it(make_arena):
    eng = make_arena()
    (a1, r1), (a2, r2) = worker(eng.instance, 0), worker(eng.instance, 1)
    try:
        c = eng.counters
        assert rates(r1) == (0.0, 0.0)  # nothing yet: an empty window reads 0, as llama-server's
        work(c, 100, 0.5, 30, 1.0)
        assert rates(r1) == (200.0, 30.0)
        assert rates(r2) == (0.0, 0.0)  # the other worker's scrape: the window r1 already reported is gone
        work(c, 10, 1.0, 50, 0.5)
        work(c, 30, 1.0, 50, 1.5)  # two requests in one window: summed, not averaged per request
        assert rates(r2) == (20.0, 50.0)
        assert rates(r1) == (0.0, 0.0)
        assert list(a1.scrape[1]["counters"]) == list(a1.scrape[0]["counters"]) == [140, 2.5, 130, 3.0]
        assert a1.scrape[0]["seq"] % 2 == 0 and a1.scrape[0]["seq"] == 6  # three scrapes by worker 0
    finally:
        a1.close()
        a2.close()


def test_concurrent_scrapes_in_a_worker_split_the_work_without_counting_any_twice(make_arena):
    eng = make_arena()
    a, reg = worker(eng.instance)
    c = eng.counters
    seen: list[float] = []
    lock = threading.Lock()

    def scrape() -> None:
        for _ in range(50):
            text = render(reg).decode()
            with lock:
                seen.append(next(float(ln.split()[-1]) for ln in text.splitlines()
                                 if ln.startswith("llamacpp:predicted_tokens_seconds ")))

    try:
        work(c, 0, 0.0, 40, 1.0)
        ts = [threading.Thread(target=scrape) for _ in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert sorted(seen)[-1] == 40.0 and seen.count(40.0) == 1, "one scrape reports the window, once"
        assert sum(seen) == 40.0
    finally:
        a.close()


def test_a_row_left_mid_write_neither_hangs_nor_loses_the_window(make_arena):
    """A worker killed inside its seqlock write leaves its row odd: readers
    skip it, and the next worker at that index writes on with the parity right."""
    eng = make_arena()
    (a0, r0), (a1, r1) = worker(eng.instance, 0), worker(eng.instance, 1)
    try:
        c = eng.counters
        work(c, 100, 0.5, 30, 1.0)
        assert rates(r0) == (200.0, 30.0)
        a1.scrape[1]["seq"] += 1  # odd: killed mid-write, whatever its counters say
        a1.scrape[1]["counters"] = [1e9, 1e9, 1e9, 1e9]
        assert rates(r0) == (0.0, 0.0)  # the dead row is not the window's start
        work(c, 10, 1.0, 50, 0.5)
        assert rates(r1) == (10.0, 100.0)  # worker 1's successor: from worker 0's last scrape
        assert a1.scrape[1]["seq"] % 2 == 0
        assert rates(r0) == (0.0, 0.0)
    finally:
        a0.close()
        a1.close()


def test_asleep_engine_serves_its_snapshot_and_reports_each_window_once(make_arena):
    eng = make_arena()
    a, reg = worker(eng.instance)
    try:
        c = eng.counters
        work(c, 64, 0.25, 7, 0.5)
        c[CNT["t_decode_s"]] = 3.0
        eng.asleep[:] = c  # Sleeper.freeze, then the flag
        c[CNT["sleeping"]] = 1
        c[CNT["t_decode_s"]] = 99.0  # what an engine might still write after the snapshot: not shown
        text = render(reg).decode()
        assert 'ringserve:engine_phase_seconds_total{phase="decode"} 3.0' in text
        assert rates(reg) == (0.0, 0.0)  # the first scrape asleep took the window of the last work...
        assert "llamacpp:predicted_tokens_seconds 14.0" in text  # ...and reported it
        assert render(reg) == render(reg)  # asleep and idle: every scrape alike
        c[CNT["sleeping"]] = 0  # woken: nothing ran since, nothing is reported again
        assert rates(reg) == (0.0, 0.0)
    finally:
        a.close()


def test_a_scrape_waits_for_the_step_that_pushed_a_last_record_to_settle(make_arena):
    """The engine pushed a request's LAST record (settle_seq odd) and adds
    the cache gauges a moment later (engine/publish.py settle): a scrape in
    between returns the settled figures, not the ones before; an engine that
    never settles costs a scrape ``wait`` seconds, not a hang."""
    eng = make_arena()
    c, i = eng.counters, CNT["settle_seq"]
    c[CNT["cache_tokens_held"]] = 10
    assert settled(c)[CNT["cache_tokens_held"]] == 10  # even: at once
    c[i] += 1  # unsettle: a LAST record is out

    def finish():
        time.sleep(0.01)
        c[CNT["cache_tokens_held"]] = 42
        c[i] += 1

    t = threading.Thread(target=finish)
    t0 = time.monotonic()
    t.start()
    got = settled(c)
    t.join()
    assert got[CNT["cache_tokens_held"]] == 42 and int(got[i]) % 2 == 0
    assert time.monotonic() - t0 < 1.0
    c[i] += 1  # an engine stopped mid-step
    t0 = time.monotonic()
    assert settled(c, wait=0.02)[CNT["cache_tokens_held"]] == 42
    assert 0.02 <= time.monotonic() - t0 < 1.0
