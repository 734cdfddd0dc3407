"""When drafting pays: a per-step decision from measured step costs.

The cost curve. In a step that admits no prompt tokens every token of the
batch has a logits row (a generating slot's last token or a drafted one),
and the step's llama_decode time is a function ``T(S, R)`` of that row
count and of how many sequences S (generating slots) hold them. It is *not*
linear in R: on this
machine (gemma-3-270m, 2 threads) one row takes ~13 ms, 2 rows ~24, 9 rows
~66, 17 ~108, 33 ~166, 48 ~211 (the matrix products get more efficient as
they widen), so a fit of ``a + c * rows`` on the short drafts a young fit
makes would price a long draft at twice its cost and never make one.
And the same rows cost more spread over many sequences (measured: drafts
priced with one stream's curve slowed 32 streams by 10%). `StepCost` keeps
the measured decode seconds per (S, R) (a running mean, then a moving
average following load changes) from the steps the loop runs without
prompt tokens (drafts are only made in such steps: engine/loop.py), and
reads ``T(S, S + k)`` as this S's measured base plus the draft increments
of the nearest measured shape within a quarter of S (linear interpolation
between measured row counts; beyond the largest, the chord slope of the
measured range). A shape with no such neighbour is unmeasured: its drafts
walk a ladder of sizes (1, 2, 4 .. 64 rows in all, up to 64 / S but at
least 8: `ladder`), a step each, so its curve gets measured where a choice
may need it.

The choice, per step: the generating slots give ``N`` tokens for ``T(N, N)``
seconds. A slot whose draft has ``L`` tokens, each accepted with probability
``p`` given the ones before it (the slot's measured rate), adds ``E(k) = p
(1 - p^k) / (1 - p)`` expected tokens when ``k <= L`` of them are verified,
and the step then costs ``T(N, R + k)``. Slots are taken best ``p`` first, each
with the ``k`` that most raises the whole batch's tokens per second, and
only if it raises it; with several generating slots only the first that
drafts does (one drafting slot per step: over ringserve's per-slot KV
streams llama.cpp splits a batch into ubatches of equal tokens per
sequence, so a second slot drafting another length costs another pass
over the weights, and the step's cost would no longer be the curve's).
With the batch full of streams ``N / T(N, N)`` is high and a draft rarely
beats it, so nothing is drafted; alone, a well-predicted draft nearly
always does, and a long one when ``p`` is high.
"""
from __future__ import annotations

import numpy as np

WINDOW = 16  # a row count's figure: the mean of its first 16 steps, then a moving average over ~16
LADDER = (1, 2, 4, 8, 16, 32, 48, 64)  # drafted rows per step while a batch shape is unmeasured


def ladder(n_gen: int) -> tuple[int, ...]:
    """The ladder at n_gen generating slots: up to max(8, 64 / n_gen) rows (long
    drafts are measured where they can pay; a full batch's extra rows are
    priced from its first few and the chord slope, without slow probe steps)."""
    return tuple(r for r in LADDER if r <= max(8, 64 // max(n_gen, 1)))


P0 = 0.6  # acceptance prior of a slot without history
DECAY = 0.97  # weight kept per compared position of a slot's past verifications (~33 positions)


class StepCost:
    """Measured decode seconds of a prompt-free step per (generating slots,
    logits rows) (module doc)."""

    __slots__ = ("t", "w", "n_draft_obs", "_rows")

    def __init__(self, max_rows: int = 512, max_seqs: int = 64) -> None:
        self.t = np.zeros((max_seqs + 1, max_rows + 1))  # seconds per (n_gen, rows) (valid where w > 0)
        self.w = np.zeros((max_seqs + 1, max_rows + 1))  # steps measured there
        self.n_draft_obs = np.zeros(max_seqs + 1, np.int64)  # steps with drafts per n_gen
        self._rows: dict[int, np.ndarray] = {}  # n_gen -> interpolated seconds per row count

    def observe(self, n_gen: int, n_draft: int, seconds: float) -> None:
        """A prompt-free step of n_gen generating and n_draft drafted tokens took ``seconds``."""
        g = min(n_gen, self.t.shape[0] - 1)
        r = min(n_gen + n_draft, self.t.shape[1] - 1)
        w = self.w[g, r]
        self.t[g, r] = seconds if w == 0 else self.t[g, r] + (seconds - self.t[g, r]) / min(w + 1, WINDOW)
        self.w[g, r] = w + 1
        self.n_draft_obs[g] += n_draft > 0
        self._rows.pop(g, None)

    def source(self, n_gen: int) -> int | None:
        """The batch shape whose measured drafts price this one's: itself once
        measured, else the nearest measured one within a quarter of it (a few
        sequences more or fewer cost alike; 4 and 32 do not); None: unmeasured."""
        g = min(n_gen, self.t.shape[0] - 1)
        if self.n_draft_obs[g] >= len(ladder(g)):
            return g
        near = max(1, g // 4)
        ok = [h for h in range(max(g - near, 1), min(g + near, self.t.shape[0] - 1) + 1)
              if self.n_draft_obs[h] >= len(ladder(h))]
        return min(ok, key=lambda h: abs(h - g)) if ok else None

    def ready(self, n_gen: int) -> bool:
        return self.source(n_gen) is not None

    def _row(self, g: int) -> np.ndarray:
        """Seconds per row count R = 0 .. max_rows + max_seqs at n_gen = g: linear
        interpolation between measured counts, proportional below the smallest,
        the chord slope of the measured range beyond the largest."""
        c = self._rows.get(g)
        if c is None:
            rows = np.arange(self.t.shape[1] + self.t.shape[0], dtype=float)
            xs = np.flatnonzero(self.w[g])
            if xs.size == 0:
                c = rows * 1e-3
            else:
                ys = self.t[g, xs]
                c = np.interp(rows, xs, ys)
                lo = rows < xs[0]
                c[lo] = ys[0] * rows[lo] / xs[0]
                slope = (ys[-1] - ys[0]) / (xs[-1] - xs[0]) if xs.size > 1 else ys[0] / max(xs[0], 1)
                hi = rows > xs[-1]
                c[hi] = ys[-1] + max(slope, 0.0) * (rows[hi] - xs[-1])
            c = np.maximum(c, 1e-4)
            self._rows[g] = c
        return c

    def curve(self, n_gen: int) -> np.ndarray | None:
        """Predicted seconds of a prompt-free step of n_gen generating tokens
        and k drafted ones, k = 0 .. max_rows - n_gen (None: unmeasured): the
        source shape's draft increments on this shape's own measured base."""
        h = self.source(n_gen)
        if h is None:
            return None
        g = min(n_gen, self.t.shape[0] - 1)
        k = self.t.shape[1] - 1 - n_gen
        src = self._row(h)
        inc = src[h:h + k + 1] - src[h]
        base = self._row(g)[n_gen] if self.w[g].any() else src[h]
        return np.maximum(base + inc, 1e-4)

    def base(self, n_gen: int) -> float:
        """Predicted seconds of a step of n_gen generating tokens, no drafts."""
        g = min(n_gen, self.t.shape[0] - 1)
        return float(self._row(g)[n_gen])

    def draft_free(self, n_gen: int, n_draft: int, seconds: float) -> float:
        """The part of a measured step's ``seconds`` its n_gen generating tokens
        would have taken without its n_draft drafted ones (for engine/budget.py)."""
        c = self.curve(n_gen) if n_draft > 0 else None
        if c is None or n_draft >= len(c):
            return seconds
        return seconds * float(c[0] / c[n_draft])


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
    curve = cost.curve(n_gen)
    if curve is None:  # the ladder: this step's drafted rows in all, offers in order
        rungs = ladder(n_gen)
        left = min(rungs[int(cost.n_draft_obs[min(n_gen, len(cost.n_draft_obs) - 1)]) % len(rungs)], cap)
        for i, (L, _, _) in enumerate(offers):
            k = min(L, left)
            out[i], left = k, left - k
            if k and n_gen > 1:
                break  # one drafting slot per step (below)
        return out
    top = len(curve) - 1  # drafted rows the curve covers
    drafted, n_tok, extra_s = 0, float(n_gen), 0.0
    best = n_tok / curve[0]
    for i in sorted(range(len(offers)), key=lambda i: -offers[i][1]):
        L, p, extra = offers[i]
        kmax = min(L, cap, top - drafted)
        if kmax <= 0:
            continue
        ks = np.arange(1, kmax + 1)
        e = expected(p, ks)
        rate = (n_tok + e) / (curve[drafted + ks] + extra_s + ks * extra)
        j = int(np.argmax(rate))
        if rate[j] > best:
            k = int(ks[j])
            out[i] = k
            best = float(rate[j])
            n_tok += float(e[j])
            extra_s += k * extra
            drafted += k
            cap -= k
            if n_gen > 1:
                # one drafting slot per step: llama.cpp splits a batch over per-slot KV streams with
                # split_equal (equal tokens per sequence in a ubatch, consecutive ids), so every slot
                # drafting another length adds a pass over the weights; with one, a step's cost is a
                # function of (slots, rows), what the curve measures
                break
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
