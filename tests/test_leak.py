"""No memory growth per channel lifecycle (the seed's 56-bytes-per-disconnect
leak): runs scripts/leak_channels.py in a fresh interpreter so the suite's own
allocations do not blur the figure. 10,000 lifecycles: the seed's 56 bytes each
would be 560 kB, over twice the 256 kB bound."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_channel_lifecycles_do_not_grow_rss() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "leak_channels.py"), "10000"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    last = proc.stdout.strip().splitlines()[-1]
    m = re.fullmatch(r"rss_growth_kb=(-?\d+)", last)
    assert m, f"unexpected last line: {last!r}"
    assert "submits=10000 cancels=10000 pushed=10000 discarded_by_release=10000" in proc.stdout
    assert int(m.group(1)) < 256, proc.stdout
