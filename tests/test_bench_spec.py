"""scripts/bench_spec.py --quick: the speculative decoding benchmark runs end to end.

Completeness only (the machine is shared and noisy): ringserve runs off and
with a --spec-type (``--servers ringserve``, the suite's time: llama-server's
side of scripts/bench_servers.py runs in test_bench_serving and
test_gpu_check), every cell has its figures, the copy workload was drafted
and accepted (timings draft_n / draft_n_accepted), and the bench stops what
it started (conftest's session fixture checks for leftovers).
"""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_quick_json_complete() -> None:
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_spec.py"), "--quick", "--json",
                        "--servers", "ringserve"], cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert p.returncode == 0, p.stderr[-4000:]
    doc = json.loads(p.stdout)
    assert not doc["problems"], doc["problems"]
    assert doc["best"]["ringserve"] == "ngram-simple"
    rows = {(r["server"], r["spec"], r["cell"]): r for r in doc["rows"]}
    for key, r in rows.items():
        assert r["tok_s"] > 0 and r["dec_tok_s"] > 0 and math.isfinite(r["ttft_p50"]), key
    assert rows[("ringserve", "ngram-simple", "copy/1")]["accept"] > 0.5  # drafted, and mostly accepted
    assert "ringserve best / off" in p.stderr and "| goal (tok/s, TTFT included) |" in p.stderr


def test_quick_draft_model_over_http() -> None:
    """``--draft``: -md reaches the server, the draft-model path drafts over
    HTTP (the ladder probes it in the first request) and SmolLM2 drafting for
    itself is accepted (greedy: the draft is the target's own choice; a
    near tie flipped by the verification batch may reject one)."""
    from frontends import testing

    m = str(testing.models.smollm2())
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_spec.py"), "--quick", "--json", "-m", m,
                        "--draft", m, "--types", "draft-simple", "--servers", "ringserve"],
                       cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert p.returncode == 0, p.stderr[-4000:]
    doc = json.loads(p.stdout)
    assert not doc["problems"], doc["problems"]
    r = {(r["spec"], r["cell"]): r for r in doc["rows"]}[("draft-simple", "copy/1")]
    assert r["accept"] is not None and r["accept"] > 0.9, r  # None: nothing was drafted


def test_quick_aa() -> None:
    """``--aa``: two identical ringserve servers through the same turns; every cell has a finite
    B / A ratio and one pair per round, and both servers are stopped."""
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_spec.py"), "--quick", "--json", "--aa",
                        "--servers", "ringserve"], cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert p.returncode == 0, p.stderr[-4000:]
    doc = json.loads(p.stdout)
    assert not doc["problems"], doc["problems"]
    assert set(doc["aa"]) == {"copy/1", "plain/1"}, doc["aa"]
    for key, r in doc["aa"].items():
        assert math.isfinite(r["ratio"]) and r["ratio"] > 0 and len(r["pairs"]) == 1, (key, r)
    assert "A/A: ringserve off against an identical ringserve-B off" in p.stderr
