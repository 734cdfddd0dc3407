"""scripts/bench_admit.py and bench_drop.py --quick end to end (issue 24):
every rule answers every request of its workloads; dropped streams leave
ringserve's RAM tier empty (their answers are abandoned, nothing is kept)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(script: str, *args: str) -> dict:
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / script), "--quick", "--json", *args],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-4000:]
    return json.loads(p.stdout)


def test_bench_admit_quick() -> None:
    """Two rules through the burst (bench_mixed's path); the prefix and chat
    workloads are bench_cache's own runs (tests/test_bench_cache.py), and
    each rule's choices are tests/test_budget.py's: here only the script's
    plumbing (the suite's time: two server starts fewer)."""
    doc = _run("bench_admit.py", "--workloads", "burst", "--rules", "fair,fifo")
    assert doc["ok"], doc["problems"]
    got = {(r["workload"], r["rule"]) for r in doc["rows"]}
    assert got == {("burst", r) for r in ("fair", "fifo")}
    for r in doc["rows"]:
        assert r["ttft_p50"] > 0 and r["wall"] > 0, r


def test_bench_drop_quick() -> None:
    doc = _run("bench_drop.py", "--servers", "ringserve")
    (run,) = doc["runs"]
    assert run["server"] == "ringserve" and len(run["samples"]) >= 3
    assert run["ram_entries_end"] == 0  # every stream was dropped: nothing of theirs in RAM
