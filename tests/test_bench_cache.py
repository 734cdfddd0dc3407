"""scripts/bench_cache.py, mem_breakdown.py and cache_probe.py --quick run end to end.

bench_cache: tiny versions of every workload on ringserve (``--servers
ringserve``, the suite's time: llama-server's side of scripts/bench_servers.py
runs in test_bench_serving and test_gpu_check), the workloads of one slot
count on one server start
(--share-server: the floor counts everything that start was sent); what must hold on any machine: every request answered, token
accounting (each request's prompt_n + cache_n is its prompt's length,
counted with the model's tokenizer), nothing evaluated below the floor,
multi-turn chat reusing the shared prefix, zero cross-talk between the two
agents. cache_probe: every prompt's second request hits the cache.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(script: str, *args: str) -> tuple[dict, str]:
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / script), "--quick", "--json", *args],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-4000:]
    return json.loads(p.stdout), p.stderr


def test_bench_cache_quick_accounting() -> None:
    doc, err = _run("bench_cache.py", "--servers", "ringserve")
    assert doc["ok"] and not doc["problems"], doc["problems"]
    assert doc["servers"] == ["ringserve"]
    names = {r["workload"] for r in doc["runs"]}
    assert names == {"chat", "prefix", "docs", "agents", "unique"}  # docs: over /v1/chat/completions
    for r in doc["runs"]:
        who = (r["workload"], r["server"])
        assert r["ok"] == r["requests"] > 0, who
        assert r["accounting_errors"] == 0, who
        assert r["prompt_tokens"] == r["evaluated"] + r["reused"], who
        assert r["evaluated"] >= r["floor"] > 0, who
        assert r["crosstalk"] == r["overclaimed"] == 0, who
        assert r["rss_peak_mib"] > 50 and r["wall_s"] > 0, who
        # PSS divides shared pages among their processes: never above RSS, and
        # below it for ringserve's several processes that share the arena and the vocabulary
        assert 50 < r["pss_peak_mib"] <= r["rss_peak_mib"] * 1.001, who
        assert r["pss_peak_mib"] < 0.95 * r["rss_peak_mib"], who
        if r["workload"] == "chat":  # later turns resend a history that starts with a cached prompt
            assert r["reused"] > 0 and set(r["ttft_by_turn"]) == {"0", "1"}, who
        assert len(r["itl_ms"]) == 2 and r["itl_ms"][0] > 0, who  # the streams' gaps (issue 24)
    # cache hits with a few tokens left beside another slot's stream are decoded alone first (issue 24)
    assert sum(r["cache_metrics"].get("ringserve:express_total", 0) for r in doc["runs"]) > 0
    assert "prompt evaluated" in err and "eval÷floor" in err and "mem MiB (PSS sum)" in err


def test_mem_breakdown_quick() -> None:
    """ringserve's tree, idle and at a quick chat's peak: every role found;
    PSS never above RSS in a process, and the tree's PSS sum well below its
    RSS sum (the vocabulary the worker shares with the master counts once)."""
    doc, err = _run("mem_breakdown.py", "--servers", "ringserve", "--workload", "chat")
    assert doc["ok"], err[-2000:]
    (run,) = doc["runs"]
    for rows in (run["idle"], run["peak"]):
        assert sorted(r["role"] for r in rows) == ["engine", "gunicorn master", "launcher", "worker"], rows
        for r in rows:
            assert 0 < r["Uss"] <= r["Pss"] <= r["Rss"], r
        assert sum(r["Pss"] for r in rows) < 0.9 * sum(r["Rss"] for r in rows)
    assert "model file (mmap)" in run["peak_kinds"] and "| **sum** |" in err


def test_cache_probe_quick() -> None:
    doc, err = _run("cache_probe.py", "--servers", "ringserve")
    assert doc["ok"], doc["problems"]
    assert [(r["server"], r["mode"]) for r in doc["rows"]] == [("ringserve", "greedy"), ("ringserve", "seeded")]
    for r in doc["rows"]:
        assert r["prompts"] == 4 and r["hits"] == 4 and 0 <= r["agree"] <= 4
    assert "A == C" in err
