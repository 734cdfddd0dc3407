"""scripts/bench_ipc.py --quick --json: every token of every implementation
arrives, and the output has the shape the docs and plots rely on. Timings are
not asserted (a shared 2-core CI box cannot hold them)."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KEYS = {"impl", "n", "producer_us_per_token", "wake_p50_us", "wake_p99_us", "tokens_per_s"}


def test_bench_quick_json_is_complete() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_ipc.py"), "--quick", "--json"],
                          cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = json.loads(proc.stdout)  # exactly one JSON object on stdout
    assert set(out) == {"rows"}
    rows = out["rows"]
    impls = {r["impl"] for r in rows}
    assert {"ring", "notify_all", "mp_queue"} <= impls and len(impls & {"dirty", "unix_socket"}) == 1
    ns = sorted({r["n"] for r in rows})
    assert len(ns) >= 2 and len(rows) == len(impls) * len(ns)
    for r in rows:
        assert KEYS <= set(r), r
        assert isinstance(r["impl"], str) and isinstance(r["n"], int)
        for k in KEYS - {"impl", "n"}:
            assert isinstance(r[k], float) and math.isfinite(r[k]) and r[k] >= 0, (k, r)
        assert r["wake_p50_us"] <= r["wake_p99_us"]
        assert r["complete"] and r["delivered"] == r["expected"] == r["steps"] * r["n"] > 0, r
