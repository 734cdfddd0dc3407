"""scripts/bench_fleet.py --quick runs end to end: two real instances behind
nginx least_conn (deploy/nginx.conf) and behind smg cache_aware with the
recommended flags, tiny chat and unique workloads, and the kill scenario
behind smg (nginx's is tests/test_nginx.py's); one fleet per gateway for
both workloads and then the kill (--share-fleet, as --quick sets it).

What must hold on any machine: every request answered through both
gateways; the instances' own counters add up (evaluated tokens at or above
the floor, every request accounted to an instance, both instances used);
later chat turns reuse the shared prefix (evaluated well under what the
prompts hold); the tables are printed; a SIGKILLed instance costs only the
requests open on it, and smg marks it unhealthy within a few of its
1 s health-check intervals.

nginx (as tests/test_nginx.py finds it) and smg (the `smg` package's entry
point, on PATH or beside this interpreter) are needed; without either the
module is skipped, except under CI (CI=true), where it fails: a skip there
would hide a broken install.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from test_nginx import NGINX

ROOT = Path(__file__).resolve().parents[1]
SMG = os.environ.get("SMG") or shutil.which("smg") or shutil.which("smg", path=os.path.dirname(sys.executable))


@pytest.fixture(autouse=True, scope="module")
def _gateways_present() -> None:
    missing = [n for n, p in (("nginx", NGINX), ("smg", SMG)) if not p]
    if missing:
        why = (f"{' and '.join(missing)} not found: apt-get install -y nginx-light; "
               "pip install -c constraints.txt smg (or set $NGINX / $SMG)")
        if os.environ.get("CI"):
            pytest.fail(why + " -- CI must install them", pytrace=False)
        pytest.skip(why)


def test_bench_fleet_quick() -> None:
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_fleet.py"), "--quick", "--json",
                        "--fronts", "nginx,smg", "--kill", "smg"], cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stderr[-4000:]
    doc = json.loads(p.stdout)
    assert doc["ok"] and not doc["problems"], doc["problems"]
    assert {(r["workload"], r["front"]) for r in doc["runs"]} == {
        (w, f) for w in ("chat", "unique") for f in ("nginx", "smg")}
    for r in doc["runs"]:
        who = (r["workload"], r["front"])
        assert r["ok"] == r["requests"] > 0, who
        per = r["per_instance"]
        assert len(per) == 2 and sum(x["requests"] for x in per) == r["requests"], (who, per)
        assert r["evaluated"] >= r["floor"] > 0, who
        assert r["out_tok_s"] > 0 and r["wall_s"] > 0, who
        if r["workload"] == "chat":  # turn 1 resends turn 0's prompt and answer: mostly cached
            assert set(r["ttft_by_turn"]) == {"0", "1"}, who
            assert r["evaluated"] < 0.8 * r["prompt_tokens"], who
        if r["front"] == "nginx" or r["workload"] == "unique":  # nothing to stick to: both instances work
            assert all(x["requests"] > 0 for x in per), (who, per)
    kills = {k["front"]: k for k in doc["kills"]}
    assert set(kills) == {"smg"}  # nginx's: tests/test_nginx.py
    for k in kills.values():
        assert k["after_kill_ok"] >= 3, k  # the survivor serves
        assert k["failed_sent_after_kill"] == 0, k
        assert k["failed"] <= max(k["inflight_on_killed"], k["inflight_metrics"]), k
    assert kills["smg"]["unhealthy_after_s"] <= 3 * kills["smg"]["health_interval_s"] + 1, kills["smg"]
    err = p.stderr
    assert "eval÷floor" in err and "requests per instance" in err and "last sent s" in err
