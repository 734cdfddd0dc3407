"""Memory of a server's process tree: PSS and RSS summed over its processes,
and the peak of both sampled in a thread (scripts/bench_cache.py,
scripts/mem_breakdown.py).

Why PSS is the figure to compare: ringserve is several processes (launcher,
engine, gunicorn master, workers) that map the same pages: the arena's
shared memory, shared libraries, and the gunicorn master's pages (the
vocabulary above all) that its forked workers share copy-on-write. RSS
counts such a page once in every process that maps it, so a sum of RSS
overstates what the tree takes from the machine. PSS (proportional set size)
charges a page shared by n processes 1/n to each: the sum over a tree counts
each of its pages once. For llama-server, one process, PSS is its RSS less
the part of its shared libraries that other processes on the host also map
(the same discount every ringserve process gets).
"""
from __future__ import annotations

import threading

import psutil

from frontends.testing import procs

MiB = 2**20
ROLLUP = ("Rss", "Pss", "Private_Clean", "Private_Dirty", "Shared_Clean", "Shared_Dirty", "Anonymous", "Swap")


def rollup(pid: int) -> dict[str, int]:
    """/proc/PID/smaps_rollup in bytes, plus Uss (Private_Clean + Private_Dirty:
    what the process alone holds). Raises OSError once the process is gone."""
    out: dict[str, int] = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ROLLUP:
                out[k] = int(v.split()[0]) * 1024
    out["Uss"] = out.get("Private_Clean", 0) + out.get("Private_Dirty", 0)
    return out


def tree_mem(pid: int) -> tuple[float, float]:
    """(PSS sum, RSS sum) in MiB over ``pid`` and every process under it."""
    pss = rss = 0
    for p in procs.tree(pid):
        try:
            r = rollup(p.pid)
        except (OSError, psutil.Error):  # a process that just ended
            continue
        pss += r.get("Pss", 0)
        rss += r.get("Rss", 0)
    return pss / MiB, rss / MiB


class MemPeak:
    """Peaks (MiB) of a process tree's summed PSS and summed RSS, sampled every
    ``every`` seconds in a thread until ``stop()``. The two peaks are taken
    separately (each the largest sample of its own sum)."""

    def __init__(self, pid: int, every: float = 0.25):
        self.pid, self.every = pid, every
        self.pss = self.rss = 0.0
        self._halt = threading.Event()
        self._th = threading.Thread(target=self._loop, daemon=True)
        self._th.start()

    def _loop(self) -> None:
        while not self._halt.is_set():
            pss, rss = tree_mem(self.pid)
            self.pss, self.rss = max(self.pss, pss), max(self.rss, rss)
            self._halt.wait(self.every)

    def stop(self) -> tuple[float, float]:
        """Stop sampling, after one last sample; returns (PSS peak, RSS peak)."""
        self._halt.set()
        self._th.join()
        pss, rss = tree_mem(self.pid)
        self.pss, self.rss = max(self.pss, pss), max(self.rss, rss)
        return self.pss, self.rss
