"""scripts/gpu_check.sh: syntax, report tables, and the CPU dry run.

Why a dry run in the suite: the script is meant to run once, unattended, on a
lent GPU machine with minutes of budget; every step that does not need CUDA
(model, ceiling parsing, four servers, both loads, metrics diffs, tables) is
exercised here so that a GPU call fails only for GPU reasons.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"
CEILING = """|    PP |     TG |    B |   N_KV |   T_PP s | S_PP t/s |   T_TG s | S_TG t/s |      T s |    S t/s |
|-------|--------|------|--------|----------|----------|----------|----------|----------|----------|
|    16 |    128 |    8 |   1152 |    0.020 |  6400.00 |    0.216 |  4736.00 |    0.236 |  4881.36 |
|    16 |    128 |   32 |   4608 |    0.050 | 10240.00 |    0.351 | 11657.00 |    0.401 | 11491.27 |
"""


def test_syntax_and_help_text() -> None:
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0
    text = SCRIPT.read_text()
    for knob in ("KIT", "SKIP_BUILD", "BIN", "NGL", "CONCS", "NREQ", "NPRED", "OUT", "--backend-sampling"):
        assert knob in text


def test_report_tables(tmp_path: Path) -> None:
    (tmp_path / "ceiling.txt").write_text(CEILING)
    ph = {"steps": 100, "tokens_per_step": 8.0, "host_share": 0.05,
          "ms_per_step": {"intake": 0.01, "build": 0.02, "decode": 1.9, "sample": 0.05, "publish": 0.02, "idle": 0}}
    rows = [{"server": "ringserve", "mode": "greedy", "c": 8, "tok_per_s": 3788.8, "requests": 16, "errors": 0,
             "ttft_p50_ms": 12.0, "phases": ph},
            {"server": "llama-server", "mode": "sampled", "c": 32, "tok_per_s": 788.0, "requests": 32, "errors": 0,
             "ttft_p50_ms": 40.0}]
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "report", str(tmp_path)],
                         capture_output=True, text=True, check=True).stdout
    assert "| ringserve | greedy | 8 | 3788.8 | 0.80 | 4736.0 |" in out, out
    assert "| llama-server | sampled | 32 | 788.0 | 0.07 | 11657.0 |" in out, out
    assert "| ringserve | greedy | 8 | 100 | 8.0 | 0.010 | 0.020 | 1.900 | 0.050 | 0.020 | 0.000 | 5.0% |" in out, out


def _cpu_bin() -> str:
    d = Path(os.environ.get("RINGSERVE_CACHE", Path.home() / ".cache" / "ringserve")) / "llama.cpp-0.3.36" / "build" / "bin"
    return str(d) if (d / "llama-server").exists() and (d / "llama-batched-bench").exists() else ""


@pytest.mark.skipif(not _cpu_bin(), reason="no CPU llama-server build (sh scripts/build_llama_server.sh)")
def test_cpu_dry_run(tmp_path: Path) -> None:
    """The dry run of docs/PERFORMANCE.md (gpu_check.sh), with the default model instead of the kit's
    random one (same code paths, 10 s less): both tables, every server up,
    every load complete, ringserve's phases present."""
    from engine.config import Config

    env = dict(os.environ, SKIP_BUILD="1", BIN=_cpu_bin(), NGL="0", CONCS="2", NREQ="2", NPRED="8", THREADS="2",
               OUT=str(tmp_path), MODEL=Config().model_path(), PYTHON=sys.executable)
    p = subprocess.run(["bash", str(SCRIPT)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    rows = [json.loads(x) for x in (tmp_path / "results.jsonl").read_text().splitlines() if x.strip()]
    names = {(r["server"], r["mode"]) for r in rows}
    assert names == {(s, m) for s in ("ringserve", "ringserve-bs", "llama-server", "llama-server-bs")
                     for m in ("greedy", "sampled")}, rows
    assert all(r["errors"] == 0 and r["requests"] == 2 and r["tokens"] == 16 for r in rows), rows
    assert all(r.get("phases") for r in rows if r["server"].startswith("ringserve")), rows
    assert "throughput" in p.stdout and "ringserve engine phases" in p.stdout
    assert "| ringserve-bs | sampled | 2 |" in p.stdout, p.stdout[-3000:]
