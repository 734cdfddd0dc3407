"""engine/memtrace.py (issue 18): off without its variable; on, a signal makes
a process append its figures and the source lines that grew; and the worker
pool starts every thread at boot (no RSS steps when traffic first reaches a
new concurrency)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = """
import os, sys, time
from engine import memtrace
on = memtrace.install("probe")
print(on, flush=True)
if on:
    os.kill(os.getpid(), memtrace.SIGNAL)
    keep = [bytearray(1000) for _ in range(2000)]  # 2 MB kept between the dumps
    os.kill(os.getpid(), memtrace.SIGNAL)
"""


def run_child(env: dict) -> subprocess.CompletedProcess:
    e = dict(os.environ, PYTHONPATH=str(ROOT))
    e.pop("RINGSERVE_TRACEMALLOC", None)
    e.update(env)
    return subprocess.run([sys.executable, "-c", CHILD], cwd=ROOT, env=e, capture_output=True, text=True, timeout=60)


def test_off_without_the_variable() -> None:
    p = run_child({})
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "False"


def records(out: Path) -> list[dict]:
    [path] = out.glob("probe-*.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_signal_dumps_figures_and_growth(tmp_path: Path) -> None:
    p = run_child({"RINGSERVE_TRACEMALLOC": str(tmp_path)})
    assert p.returncode == 0, p.stderr
    recs = records(tmp_path)
    assert [r["why"] for r in recs] == ["signal", "signal", "exit"]
    a, b = recs[0], recs[1]
    for key in ("rss_kb", "anon_kb", "traced", "malloc_used", "malloc_free", "arenas", "threads"):
        assert key in b
    assert b["traced"] - a["traced"] > 1_900_000
    top = b["top"][0]
    assert top["where"] == "<string>:8" and top["size"] > 1_900_000 and top["count"] >= 2000, b["top"][:3]
    assert (tmp_path / f"probe-{b['pid']}-1.txt").read_text().count("<string>") >= 1


def test_malloc_only_leaves_tracemalloc_off(tmp_path: Path) -> None:
    p = run_child({"RINGSERVE_TRACEMALLOC": str(tmp_path), "RINGSERVE_TRACEMALLOC_FRAMES": "0"})
    assert p.returncode == 0, p.stderr
    a, b = records(tmp_path)[:2]
    assert b["traced"] == 0 and b["top"] == []
    assert b["malloc_used"] + b["anon_kb"] * 1024 > 0 and b["arenas"] >= 1


def test_worker_pool_starts_every_thread() -> None:
    from frontends.process.worker import DrainWorker

    class Cfg:
        threads = 12

    w = DrainWorker.__new__(DrainWorker)
    w.cfg = Cfg()
    before = threading.active_count()
    pool = w.get_thread_pool()
    try:
        assert len(pool._threads) == 12
        assert threading.active_count() - before == 12
    finally:
        pool.shutdown()
