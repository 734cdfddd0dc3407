"""scripts/bench_mixed.py --quick: the mixed-load benchmark runs end to end.

Completeness only (the machine is shared and noisy): ringserve streams,
every long prompt is answered, the tables' figures exist, and the bench
stops what it started (conftest's session fixture checks for leftovers).
ringserve only (the suite's time: a timed run of each server); the
llama-server side of scripts/bench_servers.py runs in test_bench_serving
and test_gpu_check.
"""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_quick_json_complete() -> None:
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_mixed.py"), "--quick", "--json",
                        "--servers", "ringserve"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-4000:]
    doc = json.loads(p.stdout)
    assert doc["ok"] and not doc["problems"], doc["problems"]
    assert doc["servers"][0] == "ringserve"
    assert len(doc["runs"]) == len(doc["servers"])
    for run in doc["runs"]:
        assert run["long_done"] == run["long_sent"] == 2, run["server"]
        assert run["n_gaps"] > 10 and math.isfinite(run["itl_ms"]["p99"]), run["server"]
        assert set(run["long_ttft_ms"]) == {"300", "600"} and all(run["long_ttft_ms"].values()), run
        if run["server"] == "ringserve":
            assert run["phases"]["steps"] > 0 and run["longest_step_ms"] > 0
    assert [r["server"] for r in doc["summary"]] == doc["servers"]
    assert "ITL max" in p.stderr and "long TTFT p50" in p.stderr
