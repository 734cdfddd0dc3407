"""scripts/bench_engine.py --quick: the benchmark runs end to end (timings
are not asserted here; the full run's figures are in docs/PERFORMANCE.md)."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_bench_engine_quick():
    out = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "bench_engine.py"), "--quick", "--json"],
                         capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = json.loads(out.stdout.strip().splitlines()[-1])["rows"]
    kinds = {(r["impl"], r["sampling"]) for r in rows}
    assert kinds == {("ceiling", "none"), ("engine", "greedy"), ("engine", "sampled"),
                     ("sequential", "greedy"), ("sequential", "sampled")}
    for r in rows:
        assert r["tokens_per_s"] > 0
        if r["impl"] == "engine":
            assert set(r["phases_ms_per_step"]) == {"intake", "build", "decode", "sample", "publish", "idle"}
            assert 0 <= r["host_share"] < 1
