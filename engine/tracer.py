"""Phase tracer: where each step's time goes, phase by phase (as the upstream change measured it).

Per step: intake, batch build, llama_decode, sampling, publish, idle. Running
totals go to the control block counters (t_*_s), step and host-time
histograms to ``arena.hist`` (power-of-two microsecond buckets), so /metrics
and scripts/bench_engine.py read them without asking the engine anything.
The engine is the only writer of these (single-writer counters, read
approximately by the others).
"""
from __future__ import annotations

import time

import numpy as np

from ipc.layout import CNT, HIST_NAMES, N_HIST

PHASES = ("intake", "build", "decode", "sample", "publish", "idle")
_IDX = np.array([CNT[f"t_{p}_s"] for p in PHASES])
_H_STEP, _H_HOST, _H_WAKE = (HIST_NAMES.index(n) for n in ("step", "host", "wake"))


def bucket(us: float) -> int:
    """Histogram bucket of a duration: floor(log2(us)) clamped to the table."""
    return min(max(int(us).bit_length() - 1, 0), N_HIST - 1)


class Tracer:
    """Accumulates one step's phase times, then flushes them in one go."""

    __slots__ = ("counters", "hist", "t", "acc", "clock")

    def __init__(self, counters: np.ndarray, hist: np.ndarray):
        self.counters, self.hist = counters, hist
        self.acc = np.zeros(len(PHASES))
        self.clock = time.perf_counter
        self.t = self.clock()

    def mark(self, phase: int) -> None:
        """Charge the time since the previous mark to ``phase``."""
        now = self.clock()
        self.acc[phase] += now - self.t
        self.t = now

    def drop(self) -> None:
        """Forget this turn's marks: a loop turn that found nothing to do
        (no submission, no busy slot) is not engine time. Why: the totals
        then stand still while the server idles, as llama-server's do, so
        /metrics reads the same between two idle scrapes and an asleep
        server's snapshot equals the last awake scrape (its test_sleep)."""
        self.acc[:] = 0.0
        self.t = self.clock()

    def flush(self, decoded: bool) -> None:
        """End of a step: add to the shared totals and histograms."""
        acc = self.acc
        self.counters[_IDX] += acc
        if decoded:
            step = acc[:5].sum()
            host = step - acc[2]
            self.hist[_H_STEP, bucket(step * 1e6)] += 1
            self.hist[_H_HOST, bucket(host * 1e6)] += 1
        acc[:] = 0.0


INTAKE, BUILD, DECODE, SAMPLE, PUBLISH, IDLE = range(len(PHASES))
