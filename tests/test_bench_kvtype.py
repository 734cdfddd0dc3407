"""scripts/bench_kvtype.py --quick: the KV-type benchmark runs end to end.

Completeness, not speed (the machine is shared): every KV type's cell
finishes all its requests, reports decode and prompt tok/s and a PSS, the
KV size follows the type (q8_0: 34 bytes per 32 elements, f16: 64), and
the ratios table has its rows. ringserve only (``--servers ringserve``, the
suite's time: two server starts and their loads fewer); the llama-server
side of scripts/bench_servers.py runs in test_bench_serving and
test_gpu_check.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_quick_json_complete() -> None:
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_kvtype.py"), "--quick", "--json",
                        "--servers", "ringserve"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-4000:]
    doc = json.loads(p.stdout)
    assert doc["ok"] and not doc["problems"], doc["problems"]
    assert doc["servers"] == ["ringserve"] and doc["kv"] == ["f16", "q8_0"]
    for cell in doc["cells"]:
        where = f"{cell['server']} {cell['kv']} c={cell['concurrency']}"
        assert cell["completed"] == cell["requests"] == cell["concurrency"] and not cell["errors"], where
        assert cell["decode_tok_s"] > 0 and cell["prompt_tok_s"] > 0 and cell["pss_mib"] > 50, where
        assert cell["prompt_tokens"] >= 40 * cell["concurrency"], where
    assert {(c["server"], c["kv"]) for c in doc["cells"]} == {(s, k) for s in doc["servers"] for k in doc["kv"]}
    for s in doc["servers"]:
        kv = {r["kv"]: r["kv_mib"] for r in doc["summary"] if r["server"] == s}
        assert kv["q8_0"] / kv["f16"] == pytest.approx(34 / 64, abs=0.01), (s, kv)
    assert any(r["what"] == "ringserve: q8_0 / f16" for r in doc["ratios"])
