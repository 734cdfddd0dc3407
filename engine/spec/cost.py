"""When drafting pays: a per-step decision from measured ubatch costs.

The cost. In a step that admits no prompt tokens every token of the batch
has a logits row (a generating slot's last token or a drafted one), and
llama.cpp runs the batch as ubatches (engine/spec/plan.py: over the
per-slot KV streams, split_equal makes each ubatch a run of consecutive
sequence ids with equal tokens each), one pass over the weights apiece. So a
step costs the sum of its ubatches' costs, and a ubatch of R rows costs
``A(R)``: not linear in R (measured here, gemma-3-270m, 2 threads: 1 row
13 ms, 2 rows 24, 9 rows 66, 17 rows 108, 33 rows 166, 48 rows 211: the
262k-token output matrix's products get more efficient as they widen), and
nearly the same whether the R rows are one sequence's drafted tokens or R
sequences' last tokens (scripts/step_cost.py --steps; docs/ARCHITECTURE.md).
`StepCost` keeps the measured ``A(R)`` (the mean of a row count's first 16
measurements, then a moving average following load changes) from the steps
the loop runs without prompt tokens: a one-ubatch step measures its A(R)
directly; a step of several ubatches shares its time among them in
proportion to their current estimates. A is a sawtooth, not a
smooth curve: ggml's CPU matrix kernels for repacked weights take the
activations in blocks of 4 rows and the rest one row at a time (AVX-512,
2026-12-05, ms: 4 rows 29.5, 5 rows 47.3, 6 rows 49.3, 8 rows 43.1; 16 rows
67.0, 17 rows 93.4; 32 rows 114.5, 33 rows 149.9), so a 16-token draft
(17 rows) cost 39% more than a 15-token one. Hence the curve is four
interleaved ones, one per row count mod `ALIGN`: between two measured row
counts of the same class A is interpolated linearly within the class,
beyond its largest it follows the class's last slope (A is concave: that
slope is never below the true one); where a class has fewer than two
measurements, or below its smallest, the interpolation over every measured
row count stands in (proportional below the smallest). Where the kernels
have no such blocks (a GPU) the classes agree and this is the plain curve.
Until a few long drafts were measured, drafts walk a ladder of lengths
(`LADDER`: both sides of the 4-row blocks, up to 63 tokens, one step each),
so the ubatches a choice may need get measured; only in steps of at most
`LADDER_SLOTS` generating slots (nothing is drafted before).

The choice, per step: the generating slots give ``S`` tokens for the cost
of their draft-free ubatches. A slot whose draft has ``L`` tokens, each
accepted with probability ``p`` given the ones before it (the slot's
measured rate), adds ``E(k) = p (1 - p^k) / (1 - p)`` expected tokens when
``k <= L`` of them are verified. Candidates: the ``m`` slots of highest p
(m = 1 .. all) each drafting up to the same k (so that they share
ubatches: ``k`` from `KS`, which holds lengths on both sides of each 4-row block: a
lone slot's ubatch is 1 + k rows, a drafting slot beside others gets a ubatch
of its k drafted rows, plan.py); each is priced as the ubatches it becomes, and
the one with the most expected tokens per second is taken if it beats the
draft-free step by `MARGIN` (12%: the prices are ~10% off at times, and a
draft that promises less can cost more than it saves). With the batch full of streams ``S / T`` is high and a
draft rarely beats it, so nothing is drafted; alone, a well-predicted
draft nearly always does, and a long one when ``p`` is high. `bound` tells
before any n-gram lookup whether any draft could pay at all (the best
slot's p on every row, each row priced at the cheapest marginal cost the
curve allows); when it cannot, no slot looks anything up this step. Beside
more than `LADDER_SLOTS` streams the drafted rows' price is multiplied by
``wide``, their measured cost over their priced cost in such steps
(`StepCost.calibrate`): the curve was measured on lone slots, and a 64-token
draft beside 31 streams cost about twice its price.
"""
from __future__ import annotations

import numpy as np

from .plan import ubatches

WINDOW = 16  # a row count's figure: the mean of its first 16 measurements, then a moving average over ~16
ALIGN = 4  # rows per block of ggml's CPU gemm kernels for repacked weights: the curve's period (module doc)
# drafted tokens of the probing slot, a step each, while young: a lone slot's ubatch is 1 + k rows, so these
# measure rows 2, 3, 4, 5, 8, 16, 17, 32, 48, 64 (each 4-row class at least twice)
LADDER = (1, 2, 3, 4, 7, 15, 16, 31, 47, 63)
# the ladder runs only in steps of at most this many generating slots: a probe step beside 32 streams
# costs all of them its extra passes (~8% of an engine-level plain/32 cell whose engine started there),
# and with many streams drafts rarely pay; such an engine drafts once a step of few streams measured it
LADDER_SLOTS = 4
# draft lengths a step's choice tries: 4n - 1 fills a lone slot's ubatch (1 + k rows) to a block, 4n the
# drafted-rows ubatch of a slot beside others; the curve prices each (the sawtooth, module doc)
KS = (1, 2, 3, 4, 6, 7, 8, 11, 12, 15, 16, 23, 24, 31, 32, 47, 48, 63, 64)
# a draft must promise this much more than the draft-free step: the priced ubatches are measured and
# interpolated (extrapolated past the longest), ~10% off at times (32 x 3 rows: 800 ms priced, 873 measured);
# at 32 streams the best drafts promised +2..8% and cost the full bench run 25% (plain/32 0.75x)
MARGIN = 1.12
MS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)  # how many of the best slots draft together
# beside more than LADDER_SLOTS streams the curve's price of drafted rows is an extrapolation from lone-slot
# ubatches, and it was far off there: one slot's 64-token draft beside 31 streams priced ~250 ms, measured
# ~480 (bench_spec plain/32 and copy/32 tails, docs/PERFORMANCE.md); StepCost.wide learns the ratio from
# such steps (its first measurement, then this weight) and relaxes toward 1 by WIDE_DECAY a step without
# drafts beside as many streams, so a spike does not stop those drafts for good
WIDE_ALPHA = 0.25
WIDE_DECAY = 0.99
P0 = 0.6  # the pooled rate before any verification (a request's own prior is at least P_TRY)
P_TRY = 0.8  # a request's prior at least: above the rate one lone stream needs to draft (0.77 here; Speculator.begin)
DECAY = 0.97  # weight kept per compared position of a slot's past verifications (~33 positions)


class StepCost:
    """Measured seconds of one all-logits ubatch per row count (module doc)."""

    __slots__ = ("t", "w", "n_probe", "n_ubatch", "_c", "wide", "n_wide")

    def __init__(self, max_rows: int = 512, n_ubatch: int = 512) -> None:
        self.t = np.zeros(max_rows + 1)  # seconds per ubatch of R rows (valid where w > 0)
        self.w = np.zeros(max_rows + 1)  # measurements there
        self.n_probe = 0  # ladder steps taken
        self.n_ubatch = n_ubatch
        self._c: np.ndarray | None = None  # the interpolated curve, rebuilt after a measurement
        self.wide = 1.0  # measured / priced cost of drafted rows beside > LADDER_SLOTS streams (>= 1)
        self.n_wide = 0  # such steps measured

    @property
    def ready(self) -> bool:
        """The ladder is done: long ubatches were measured once."""
        return self.n_probe >= len(LADDER)

    def _put(self, r: int, seconds: float) -> None:
        r = min(r, len(self.t) - 1)
        w = self.w[r]
        self.t[r] = seconds if w == 0 else self.t[r] + (seconds - self.t[r]) / min(w + 1, WINDOW)
        self.w[r] = w + 1

    def observe(self, plan: list[int], seconds: float) -> None:
        """A prompt-free step ran as ubatches of ``plan`` rows and took ``seconds``."""
        if not plan:
            return
        if len(plan) == 1:
            self._put(plan[0], seconds)
        elif self.w.any():
            c = self.curve()
            pred = [float(c[min(r, len(c) - 1)]) for r in plan]
            scale = seconds / sum(pred)
            for r, x in zip(plan, pred):
                self._put(r, x * scale)
        else:
            return
        self._c = None

    def calibrate(self, ids: list[int], counts: list[int], seconds: float) -> None:
        """A prompt-free step beside more than LADDER_SLOTS streams ran in
        ``seconds``: with drafts, learn how its drafted rows' cost (the
        measured time less the draft-free price) compares with their price
        (``wide``, never below 1: the curve is trusted to be no dearer than
        measured); without, relax ``wide`` toward 1. Call before ``observe``
        moves the curve, so the prices are the ones the step was chosen on."""
        if len(ids) <= LADDER_SLOTS:
            return
        if sum(counts) == len(counts):
            self.wide = 1.0 + (self.wide - 1.0) * WIDE_DECAY
            return
        base = self.price(ids, [1] * len(ids))
        extra = self.price(ids, counts) - base
        if extra <= 0.0:
            return
        r = max((seconds - base) / extra, 1.0)
        self.wide = r if self.n_wide == 0 else self.wide + WIDE_ALPHA * (r - self.wide)
        self.n_wide += 1

    def scale(self, n: int) -> float:
        """What the drafted rows' price is multiplied by in a step of ``n`` generating slots."""
        return self.wide if n > LADDER_SLOTS else 1.0

    def curve(self) -> np.ndarray:
        """Predicted seconds of a ubatch of R rows, R = 0 .. max_rows (module doc)."""
        c = self._c
        if c is None:
            rows = np.arange(len(self.t), dtype=float)
            xs = np.flatnonzero(self.w)
            if xs.size == 0:
                c = 0.009 + 0.004 * rows  # nothing measured yet: a guess of this machine's shape
            else:
                c = _interp(rows, xs, self.t[xs], proportional=True)
                for q in range(ALIGN):  # the sawtooth: each class of rows mod ALIGN on its own points
                    xq = xs[xs % ALIGN == q]
                    if xq.size < 2:
                        continue
                    at = slice(int(xq[0]), None, ALIGN)  # the class's rows from its smallest measured one
                    c[at] = _interp(rows[at], xq, self.t[xq])
            c = np.maximum(c, 1e-4)
            c[0] = 0.0
            self._c = c
        return c

    def price(self, ids: list[int], counts: list[int]) -> float:
        """Predicted seconds of a step whose sequences ``ids`` hold ``counts`` tokens."""
        c = self.curve()
        top = len(c) - 1
        return float(sum(c[min(r, top)] for r in ubatches(ids, counts, self.n_ubatch)))

    def draft_free(self, ids: list[int], counts: list[int], seconds: float) -> float:
        """The part of a measured step's ``seconds`` its generating tokens would
        have taken without the drafted ones (for engine/budget.py)."""
        if sum(counts) == len(counts):
            return seconds
        base = self.price(ids, [1] * len(ids))
        return seconds * base / (base + self.scale(len(ids)) * (self.price(ids, counts) - base))

    def bound(self, ids: list[int], p: float, cap: int) -> bool:
        """Could any draft of up to ``cap`` rows, each accepted with ``p`` at most, beat the draft-free step?"""
        if cap <= 0 or p <= 0.0:
            return False
        if not self.ready:  # the ladder probes where long drafts can pay: a few streams (choose)
            return len(ids) <= LADDER_SLOTS
        c = self.curve()
        base_plan = ubatches(ids, [1] * len(ids), self.n_ubatch)
        base = float(sum(c[r] for r in base_plan))
        r0 = max(base_plan)  # the cheapest rows to add: widening the widest ubatch (A is concave)
        x = np.arange(1, min(cap, len(c) - 1 - r0) + 1)
        if x.size == 0:
            return False
        n = len(ids)
        return bool(np.max((n + p * x) / (base + self.scale(n) * (c[r0 + x] - c[r0]))) > MARGIN * n / base)


def _interp(rows: np.ndarray, xs: np.ndarray, ys: np.ndarray, proportional: bool = False) -> np.ndarray:
    """Linear between measured points, the last segment's slope (never below 0) past the largest;
    below the smallest proportional (``proportional``) or, for a class, never asked (curve)."""
    c = np.interp(rows, xs, ys)
    if proportional:
        lo = rows < xs[0]
        c[lo] = ys[0] * rows[lo] / xs[0]
    slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]) if xs.size > 1 else ys[0] / max(xs[0], 1)
    hi = rows > xs[-1]
    c[hi] = ys[-1] + max(slope, 0.0) * (rows[hi] - xs[-1])
    return c


def expected(p: float, k):
    """Tokens gained by verifying k drafted tokens each accepted with p (given the previous)."""
    k = np.asarray(k)
    if p >= 0.999:
        return k.astype(float)
    return np.where(k > 0, p * (1.0 - p ** k) / (1.0 - p), 0.0)


def _e(p: float, k: int) -> float:
    return float(k) if p >= 0.999 else p * (1.0 - p ** k) / (1.0 - p)


def choose(cost: StepCost, ids: list[int], offers: list[tuple[int, int, float, float]], cap: int,
           n_min: list[int] | None = None) -> list[int]:
    """Draft tokens to verify for each offer (index of its slot in ``ids``,
    the generating slots' sequence ids ascending; longest draft L; acceptance
    p; seconds per token spent making the draft: the draft model's), in offer
    order; ``cap``: drafted tokens the step may hold in all; ``n_min``: each
    offer's shortest draft worth verifying (its request's speculative.n_min),
    a shorter choice is 0 for it (priced as none: it would be made, then
    thrown away)."""
    out = [0] * len(offers)
    if not offers or cap <= 0:
        return out
    lo = n_min or [0] * len(offers)
    order = sorted(range(len(offers)), key=lambda j: -offers[j][2])
    if not cost.ready:  # the ladder: the best slot drafts the next length, with a few streams only
        if len(ids) > LADDER_SLOTS:
            return out
        j = order[0]
        k = min(offers[j][1], LADDER[cost.n_probe], cap)
        out[j] = k if k >= lo[j] else 0
        cost.n_probe += 1
        return out
    n = len(ids)
    ones = [1] * n
    base = cost.price(ids, ones)
    best, pick = MARGIN * n / base, None
    c = cost.curve()
    widest = max(ubatches(ids, ones, cost.n_ubatch))
    w = cost.scale(n)  # drafted rows beside many streams: their measured cost over the curve's (calibrate)
    for m in MS:
        if m > len(order):
            m = len(order)
        grp = order[:m]
        for k in KS:
            ks = [kk if (kk := min(k, offers[j][1])) >= lo[j] else 0 for j in grp]
            x = sum(ks)
            if x > cap:
                break
            e = sum(_e(offers[j][2], kk) for j, kk in zip(grp, ks))
            extra = sum(kk * offers[j][3] for j, kk in zip(grp, ks))
            # a lower bound of the cost first (the rows widen the widest ubatch), then the real ubatches
            top = min(widest + x, len(c) - 1)
            if (n + e) / (base + w * (c[top] - c[widest]) + extra) <= best:
                continue
            counts = ones.copy()
            for j, kk in zip(grp, ks):
                counts[offers[j][0]] += kk
            rate = (n + e) / (base + w * (cost.price(ids, counts) - base) + extra)
            if rate > best:
                best, pick = rate, (grp, ks)
            if k >= max(offers[j][1] for j in grp):
                break  # longer k changes nothing
        if m == len(order):
            break
    if pick is not None:
        for j, kk in zip(*pick):
            out[j] = kk
    return out


class Rate:
    """An acceptance probability per drafted token (counts decayed per compared position).

    A slot's starts from the engine's pooled rate (every slot's recent
    verifications), or P_TRY where the pool is lower: a request of the kind
    just served (another file being copied) drafts from its first steps,
    with one position's weight of prior so that its own first verifications
    take over. The floor: the pool learns only from verifications, so once
    failed drafts brought it below the rate at which any draft pays, no
    later request would draft again, however predictable its text
    (tests/test_spec_replay.py). A slot whose draft was declined (k = 0)
    relaxes toward the pooled rate, one step at a time: a low rate would
    otherwise stop its drafts for good, and with them the verifications
    that could raise it again when its text turns predictable.
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
