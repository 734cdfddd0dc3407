"""scripts/bench_serving.py --quick: the serving benchmark runs end to end.

Why completeness only: the test machine is shared and noisy, so speed is not
asserted here; what must hold anywhere is that the bench starts each server,
drives every request to its full length without an error, reports a row for
every (mode, concurrency, server) and stops what it started (the session
fixture in conftest.py fails the run on leftover processes or /dev/shm
objects).
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_quick_json_complete() -> None:
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_serving.py"), "--quick", "--json"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-4000:]
    doc = json.loads(p.stdout)
    assert doc["ok"] and not doc["problems"], doc["problems"]
    servers = doc["servers"]
    assert servers[0] == "ringserve"
    gen = doc["settings"]["gen"]
    assert gen == 8
    assert doc["cells"], "no cells"
    for cell in doc["cells"]:
        where = f"{cell['server']} {cell['mode']} c={cell['concurrency']}"
        assert not cell["errors"], (where, cell["errors"])
        assert cell["completed"] == cell["requests"] >= cell["concurrency"], where
        assert cell["output_tokens"] == gen * cell["requests"], where
        assert len(cell["md5"]) == cell["requests"], where
        assert cell["tok_per_s"] > 0 and cell["ttft_ms"][0] > 0, where
        if cell["server"] == "ringserve":
            ph = cell["phases"]
            assert ph and ph["steps"] >= gen - 1 and ph["seconds"]["decode"] > 0, (where, ph)
    want = {(m, c, s) for m in ("greedy", "sampled") for c in (1, 4) for s in servers}
    got = {(r["mode"], r["concurrency"], r["server"]) for r in doc["summary"]}
    assert got == want
    assert {(r["mode"], r["concurrency"]) for r in doc["phases"]} == {(m, c) for m, c, _ in want}
