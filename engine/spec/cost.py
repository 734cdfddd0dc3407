"""When drafting pays: a per-step decision from measured step costs.

A step's llama_decode time is modelled as ``a + b * n_gen + c * n_draft +
d * n_prompt`` (tokens of the generating slots, drafted tokens, prompt
tokens), fitted online by recursive least squares with forgetting from every
step's measured decode time (the tracer's decode phase, as engine/budget.py
learns its own figures). A drafted token costs more than a prompt token: it
has a logits row, and the output matrix is most of a small model's compute.

The choice, per step: the generating slots give ``N`` tokens for ``T = a +
b N`` seconds. A slot whose next draft has ``L`` tokens, each accepted with
probability ``p`` given the ones before it (the slot's measured rate), adds
``E(k) = p (1 - p^k) / (1 - p)`` expected tokens for ``k c`` seconds when
``k <= L`` of them are verified. Slots are taken best ``p`` first, each with
the ``k`` that most raises ``(N + sum E) / (T + sum k c)`` (tokens per second
of the whole batch), and only if it raises it: with the batch full of streams
``N / T`` is high and a draft rarely beats it, so nothing is drafted; alone, a
well-predicted draft nearly always does. Before enough steps were measured,
drafts are allowed up to ``PROBE`` tokens so that ``c`` gets measured at all.
"""
from __future__ import annotations

import numpy as np

LAMBDA = 0.98  # forgetting factor: the fit follows load changes over ~50 steps
PROBE = 8  # draft tokens per slot while the fit is young
MIN_OBS = 12  # steps with drafts before the fit decides
P0 = 0.6  # acceptance prior of a slot without history
DECAY = 0.7  # weight of a slot's past verifications in its acceptance rate


class StepCost:
    """Online fit of a step's decode seconds (module doc)."""

    __slots__ = ("theta", "P", "n_obs", "n_draft_obs")

    def __init__(self) -> None:
        self.theta = np.zeros(4)
        self.P = np.eye(4) * 1e3
        self.n_obs = 0
        self.n_draft_obs = 0

    def observe(self, n_gen: int, n_draft: int, n_prompt: int, seconds: float) -> None:
        x = np.array([1.0, n_gen, n_draft, n_prompt])
        Px = self.P @ x
        g = Px / (LAMBDA + x @ Px)
        self.theta += g * (seconds - x @ self.theta)
        self.P = self.P - np.outer(g, Px)
        if np.trace(self.P) < 1e4:  # no wind-up along directions the steps never vary (e.g. n_gen alone)
            self.P /= LAMBDA
        self.n_obs += 1
        self.n_draft_obs += n_draft > 0

    @property
    def ready(self) -> bool:
        return self.n_draft_obs >= MIN_OBS

    def base(self, n_gen: int) -> float:
        """Predicted seconds of a step of n_gen generating tokens, no drafts."""
        a, b = self.theta[0], self.theta[1]
        return max(a + b * n_gen, 1e-4)

    @property
    def per_draft(self) -> float:
        return max(float(self.theta[2]), 1e-5)


def expected(p: float, k: int) -> float:
    """Tokens gained by verifying k drafted tokens each accepted with p (given the previous)."""
    if k <= 0:
        return 0.0
    if p >= 0.999:
        return float(k)
    return p * (1.0 - p ** k) / (1.0 - p)


def choose(cost: StepCost, n_gen: int, offers: list[tuple[int, float, float]], cap: int) -> list[int]:
    """Draft tokens to verify for each offer (longest draft L, acceptance p,
    seconds per token spent making the draft: the draft model's), in offer
    order; ``cap``: drafted tokens the step may hold in all."""
    out = [0] * len(offers)
    if not offers or cap <= 0:
        return out
    if not cost.ready:
        for i, (L, _, _) in enumerate(offers):
            k = min(L, PROBE, cap)
            out[i], cap = k, cap - k
        return out
    N, T, c = float(n_gen), cost.base(n_gen), cost.per_draft
    for i in sorted(range(len(offers)), key=lambda i: -offers[i][1]):
        L, p, extra = offers[i]
        ck = c + extra
        best_k, best = 0, N / T
        for k in range(1, min(L, cap) + 1):
            r = (N + expected(p, k)) / (T + k * ck)
            if r > best:
                best_k, best = k, r
        if best_k:
            out[i] = best_k
            N += expected(p, best_k)
            T += best_k * ck
            cap -= best_k
    return out


class Rate:
    """A slot's acceptance probability per drafted token (decayed counts)."""

    __slots__ = ("acc", "tried")

    def __init__(self) -> None:
        self.acc, self.tried = P0, 1.0

    def update(self, n_draft: int, n_acc: int) -> None:
        tried = n_acc + (1 if n_acc < n_draft else 0)  # positions compared: the accepted ones and the first miss
        self.acc = DECAY * self.acc + n_acc
        self.tried = DECAY * self.tried + tried

    @property
    def p(self) -> float:
        return min(self.acc / self.tried, 0.999) if self.tried > 0 else P0
