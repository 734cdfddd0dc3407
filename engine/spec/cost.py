"""When drafting pays: a per-step decision from measured step costs.

The cost curve. In a step that admits no prompt tokens every token of the
batch has a logits row (a generating slot's last token or a drafted one),
and the step's llama_decode time is a function ``T(R)`` of that row count
alone (the output matrix is most of a small model's compute; attention over
a few thousand positions is a small part). It is *not* linear: on this
machine (gemma-3-270m, 2 threads) one row takes ~13 ms, 2 rows ~24, 9 rows
~66, 17 ~108, 33 ~166, 48 ~211 (the matrix products get more efficient as
they widen), so a fit of ``a + c * rows`` on the short drafts a young fit
makes would price a long draft at twice its cost and never make one.
`StepCost` keeps the measured decode seconds per row count (a running mean,
then a moving average following load changes) from the steps the loop runs
without prompt tokens (drafts are only made in such steps: engine/loop.py),
and reads ``T(R)`` by linear interpolation between measured counts (beyond
the largest, the slope of the whole measured range). While it is young
(fewer than ``MIN_OBS`` steps with drafts) the drafts walk a ladder of
sizes (1, 2, 4 .. 64 rows in all) so the curve gets measured where a choice
may need it.

The choice, per step: the generating slots give ``N`` tokens for ``T(N)``
seconds. A slot whose draft has ``L`` tokens, each accepted with probability
``p`` given the ones before it (the slot's measured rate), adds ``E(k) = p
(1 - p^k) / (1 - p)`` expected tokens when ``k <= L`` of them are verified,
and the step then costs ``T(R + k)``. Slots are taken best ``p`` first, each
with the ``k`` that most raises the whole batch's tokens per second, and
only if it raises it: with the batch full of streams ``N / T(N)`` is high
and a draft rarely beats it, so nothing is drafted; alone, a well-predicted
draft nearly always does, and a long one when ``p`` is high.
"""
from __future__ import annotations

import numpy as np

WINDOW = 16  # a row count's figure: the mean of its first 16 steps, then a moving average over ~16
LADDER = (1, 2, 4, 8, 16, 32, 48, 64)  # drafted rows per step while the curve is young
MIN_OBS = 16  # steps with drafts before the curve decides (each rung measured twice)
P0 = 0.6  # acceptance prior of a slot without history
DECAY = 0.97  # weight kept per compared position of a slot's past verifications (~33 positions)


class StepCost:
    """Measured decode seconds of a prompt-free step per logits-row count (module doc)."""

    __slots__ = ("t", "w", "n_obs", "n_draft_obs", "_curve")

    def __init__(self, max_rows: int = 512) -> None:
        self.t = np.zeros(max_rows + 1)  # seconds per row count (valid where w > 0)
        self.w = np.zeros(max_rows + 1)  # steps measured per row count
        self.n_obs = 0
        self.n_draft_obs = 0
        self._curve: np.ndarray | None = None

    def observe(self, n_gen: int, n_draft: int, seconds: float) -> None:
        """A prompt-free step of n_gen generating and n_draft drafted tokens took ``seconds``."""
        r = min(n_gen + n_draft, len(self.t) - 1)
        w = self.w[r]
        self.t[r] = seconds if w == 0 else self.t[r] + (seconds - self.t[r]) / min(w + 1, WINDOW)
        self.w[r] = w + 1
        self.n_obs += 1
        self.n_draft_obs += n_draft > 0
        self._curve = None

    @property
    def ready(self) -> bool:
        return self.n_draft_obs >= MIN_OBS

    def curve(self) -> np.ndarray:
        """Predicted seconds of a prompt-free step of R rows, R = 0 .. max_rows."""
        if self._curve is None:
            rows = np.arange(len(self.t), dtype=float)
            xs = np.flatnonzero(self.w)
            if xs.size == 0:
                self._curve = rows * 1e-3
                return self._curve
            ys = self.t[xs]
            c = np.interp(rows, xs, ys)
            lo = rows < xs[0]  # below the smallest measured count: proportional (a low base drafts less)
            c[lo] = ys[0] * rows[lo] / xs[0]
            slope = (ys[-1] - ys[0]) / (xs[-1] - xs[0]) if xs.size > 1 else ys[0] / max(xs[0], 1)
            hi = rows > xs[-1]
            c[hi] = ys[-1] + max(slope, 0.0) * (rows[hi] - xs[-1])
            self._curve = np.maximum(c, 1e-4)
        return self._curve

    def base(self, n_gen: int) -> float:
        """Predicted seconds of a step of n_gen generating tokens, no drafts."""
        return float(self.curve()[min(n_gen, len(self.t) - 1)])

    def draft_free(self, n_gen: int, n_draft: int, seconds: float) -> float:
        """The part of a measured step's ``seconds`` its n_gen generating tokens
        would have taken without its n_draft drafted ones (for engine/budget.py)."""
        if n_draft <= 0 or not self.ready:
            return seconds
        c = self.curve()
        top = len(c) - 1
        return seconds * float(c[min(n_gen, top)] / c[min(n_gen + n_draft, top)])


def expected(p: float, k):
    """Tokens gained by verifying k drafted tokens each accepted with p (given the previous)."""
    k = np.asarray(k)
    if p >= 0.999:
        return k.astype(float)
    return np.where(k > 0, p * (1.0 - p ** k) / (1.0 - p), 0.0)


def choose(cost: StepCost, n_gen: int, offers: list[tuple[int, float, float]], cap: int) -> list[int]:
    """Draft tokens to verify for each offer (longest draft L, acceptance p,
    seconds per token spent making the draft: the draft model's), in offer
    order; ``cap``: drafted tokens the step may hold in all."""
    out = [0] * len(offers)
    if not offers or cap <= 0:
        return out
    if not cost.ready:  # the ladder: this step's drafted rows in all, offers in order
        left = min(LADDER[cost.n_draft_obs % len(LADDER)], cap)
        for i, (L, _, _) in enumerate(offers):
            k = min(L, left)
            out[i], left = k, left - k
        return out
    curve = cost.curve()
    top = len(curve) - 1
    rows, n_tok, extra_s = n_gen, float(n_gen), 0.0
    best = n_tok / curve[min(rows, top)]
    for i in sorted(range(len(offers)), key=lambda i: -offers[i][1]):
        L, p, extra = offers[i]
        kmax = min(L, cap, top - rows)
        if kmax <= 0:
            continue
        ks = np.arange(1, kmax + 1)
        e = expected(p, ks)
        rate = (n_tok + e) / (curve[rows + ks] + extra_s + ks * extra)
        j = int(np.argmax(rate))
        if rate[j] > best:
            k = int(ks[j])
            out[i] = k
            best = float(rate[j])
            n_tok += float(e[j])
            extra_s += k * extra
            rows += k
            cap -= k
    return out


class Rate:
    """An acceptance probability per drafted token (counts decayed per compared position).

    A slot's starts from the engine's pooled rate (every slot's recent
    verifications): a request of the kind just served (another file being
    copied) drafts from its first steps, with one position's weight of prior
    so that its own first verifications take over. A slot whose draft was
    declined (k = 0) relaxes toward the pooled rate, one step at a time: a
    low rate would otherwise stop its drafts for good, and with them the
    verifications that could raise it again when its text turns predictable.
    """

    __slots__ = ("acc", "tried")

    def __init__(self, prior: float = P0) -> None:
        self.acc, self.tried = prior, 1.0

    def relax(self, prior: float) -> None:
        """A step without a verification: one-``(1 - DECAY)``-position pull toward ``prior``."""
        self.acc = DECAY * self.acc + (1.0 - DECAY) * prior
        self.tried = DECAY * self.tried + (1.0 - DECAY)

    def update(self, n_draft: int, n_acc: int) -> None:
        tried = n_acc + (1 if n_acc < n_draft else 0)  # positions compared: the accepted ones and the first miss
        w = DECAY ** tried
        self.acc = w * self.acc + n_acc
        self.tried = w * self.tried + tried

    @property
    def p(self) -> float:
        return min(self.acc / self.tried, 0.999) if self.tried > 0 else P0
