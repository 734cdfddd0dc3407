"""The interface every per-slot sampler implements, and the state they share.

engine/sampling/__init__.py `make_sampler` picks the implementation: Greedy or TopK
(engine/sampling/fast.py), Chain (engine/sampling/chain.py) or OnDevice (engine/sampling/ondevice.py).
Usage per slot: s = make_sampler(...); s.prime(prompt) ; loop { t =
s.sample(model, i); s.accept(t); s.probs() if s.n_probs }; s.free().
`probs()` reads the logits of the last `sample`: call it before the next
decode.
"""
from __future__ import annotations

import math
from typing import Any, Optional, Sequence

import numpy as np

from .topk import top_idx


class Sampler:
    """Common state: the params, the last logits view, the probs request."""

    kind = "base"

    def __init__(self, model: Any, p: dict, ids: Optional[np.ndarray], vals: Optional[np.ndarray]) -> None:
        self.p = p
        self.n_vocab = model.n_vocab
        self.n_probs = max(0, min(int(p["n_probs"]), self.n_vocab))
        self.post = bool(p["post_sampling_probs"])
        self.bid, self.bval = ids, vals
        self.tok = -1
        self._l: Optional[np.ndarray] = None  # logits view of the last sample()
        self._post: Optional[tuple[np.ndarray, np.ndarray]] = None  # (ids, p) after the chain

    def sample(self, model: Any, i: int) -> int:
        """Token for batch entry i of the last decode (its logits must exist)."""
        return self.pick(model.logits(i))

    def pick(self, l: np.ndarray) -> int:
        """Token for a float32[n_vocab] logits array (may be written in place
        temporarily; restored before returning)."""
        raise NotImplementedError

    def prime(self, tokens: Sequence[int]) -> None:
        """Feed prompt tokens to the penalty window (llama-server does); no-op
        for samplers without penalties."""

    def accept(self, token: int) -> None:
        """Record a generated token (penalty window, grammar state). Only pass
        tokens this sampler returned: llama.cpp aborts the process on a token
        the grammar cannot accept."""

    def _biased(self, l: np.ndarray) -> Optional[np.ndarray]:
        """Apply the biases in place; returns the saved originals."""
        if self.bid is None:
            return None
        saved = l[self.bid]
        l[self.bid] += self.bval
        return saved

    def probs(self) -> tuple[np.ndarray, np.ndarray, float]:
        """(ids int32[n], logprobs float32[n] descending, logprob of the sampled
        token) for n_probs > 0. Pre-sampling (default): softmax over all raw
        logits, as llama-server's get_token_probabilities. With
        post_sampling_probs: probabilities after the chain (temperature
        included), zero-probability candidates dropped, so n may be < n_probs."""
        n = self.n_probs or 1
        if self.post:
            assert self._post is not None, "probs() before sample()"
            ids, p = self._post
            top = top_idx(p, n)
            top = top[np.argsort(-p[top], kind="stable")]
            top = top[p[top] > 0]
            hit = np.flatnonzero(ids == self.tok)
            chosen = float(np.log(p[hit[0]])) if hit.size else 0.0
            with np.errstate(divide="ignore"):
                return ids[top].astype(np.int32), np.log(p[top]).astype(np.float32), chosen
        l = self._l
        assert l is not None, "probs() before sample()"
        top = top_idx(l, n)
        top = top[np.argsort(-l[top], kind="stable")]
        m = l[top[0]]
        lse = float(m) + math.log(float(np.exp(l - m).sum(dtype=np.float64)))
        return top.astype(np.int32), (l[top] - lse).astype(np.float32), float(l[self.tok]) - lse

    def free(self) -> None:
        """Release C objects (idempotent)."""
