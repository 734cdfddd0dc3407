"""The --quick variants of the issue 6 scripts, as tests.

Each script runs in its own interpreter (as a user would run it), prints its
table, and exits non-zero when a figure misses its goal; the quick goals are
generous where timing matters (a noisy 2-core box), exact where it does not
(completions, md5s, error shapes, exit codes, /dev/shm). The strict figures
belong to the full runs (see each script's docstring).
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("script", ["fault_storm.py", "soak.py", "fuzz.py", "churn.py"])
def test_quick(script: str) -> None:
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / script), "--quick"], cwd=ROOT, capture_output=True,
                       text=True, timeout=900)
    print(p.stdout)
    assert p.returncode == 0, p.stdout[-6000:] + p.stderr[-6000:]
    assert "PASS" in p.stdout
