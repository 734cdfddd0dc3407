"""The fast paths: Greedy and TopK, in numpy on the logits view.

For requests with neutral penalties and no grammar (engine/sampling/__init__.py
decides). TopK reproduces llama-server's default chain (top_k -> top_p ->
min_p -> temperature -> dist) on the k best logits with llama.cpp's float32
arithmetic and its RNG (`Rng`), so the same seed draws the same tokens.
Biases are written into the logits buffer in place and restored before
`pick` returns.
"""
from __future__ import annotations

import math
import os
from typing import Any, Optional

import numpy as np

from ipc.params import SEED_RANDOM as DEFAULT_SEED

from .base import Sampler
from .topk import top_idx

_TWO32 = 4294967296.0
_TWOM64 = 2.0**-64
_ONE_MINUS = math.nextafter(1.0, 0.0)


class Greedy(Sampler):
    """argmax; llama-server's chain reduces to it for temperature <= 0 (temp
    keeps only the max) or top_k == 1."""

    kind = "greedy"

    def pick(self, l: np.ndarray) -> int:
        self._l = l
        if self.bid is None:
            t = int(l.argmax())
        else:
            saved = l[self.bid]
            l[self.bid] += self.bval
            t = int(l.argmax())
            l[self.bid] = saved
        self.tok = t
        if self.post:
            self._post = (np.array([t], np.int32), np.ones(1, np.float32))
        return t


class Rng:
    """std::mt19937(seed) + uniform_real_distribution<double>(0, 1) as
    libstdc++ draws it: two 32-bit outputs a, b -> (a + b * 2^32) / 2^64."""

    def __init__(self, seed: int) -> None:
        seed = int(seed) & 0xFFFFFFFF
        if seed == DEFAULT_SEED:
            seed = int.from_bytes(os.urandom(4), "little")
        self.seed = seed
        self.bg = np.random.MT19937()
        self.bg._legacy_seeding(seed)  # init_genrand(seed), as std::mt19937(seed)

    def uniform(self) -> float:
        a, b = self.bg.random_raw(2).tolist()
        r = (float(a) + float(b) * _TWO32) * _TWOM64
        return r if r < 1.0 else _ONE_MINUS


class TopK(Sampler):
    """top_k -> top_p -> min_p -> temperature -> dist on the k best logits.

    Mirrors src/llama-sampler.cpp step by step: top_k sorts descending; top_p
    takes float32 softmax over the k, float32 running sum, keeps the
    shortest prefix reaching p; min_p keeps logits >= max + logf(min_p);
    temperature divides; dist takes expf(l - max), a double running sum, and
    the first index where it reaches sum * u."""

    kind = "topk"

    def __init__(self, model: Any, p: dict, ids: Optional[np.ndarray], vals: Optional[np.ndarray]) -> None:
        super().__init__(model, p, ids, vals)
        self.k = int(p["top_k"])
        self.top_p = np.float32(p["top_p"])
        self.log_min_p = np.log(np.float32(p["min_p"])) if p["min_p"] > 0 else None  # logf(min_p)
        self.temp = np.float32(p["temperature"])
        self.rng = Rng(p["seed"])

    def pick(self, l: np.ndarray) -> int:
        self._l = l
        saved = self._biased(l)
        idx = top_idx(l, self.k)
        v = l[idx]
        if saved is not None:
            l[self.bid] = saved
        o = np.argsort(-v, kind="stable")
        idx, v = idx[o], v[o]
        n = v.size
        if self.top_p < 1.0:
            e = np.exp(v - v[0])
            c = np.cumsum(e)
            c = np.cumsum(e / c[-1])
            hit = np.flatnonzero(c >= self.top_p)
            n = int(hit[0]) + 1 if hit.size else n
        if self.log_min_p is not None and n > 1:
            n = max(1, int(np.count_nonzero(v[:n] >= v[0] + self.log_min_p)))
        v = v[:n] / self.temp
        e = np.exp(v - v[0])
        c = np.cumsum(e, dtype=np.float64)
        u = self.rng.uniform()  # drawn even when n == 1, as llama.cpp does
        j = min(int(np.searchsorted(c, c[-1] * u, side="left")), n - 1)
        t = int(idx[j])
        self.tok = t
        if self.post:
            self._post = (idx[:n].astype(np.int32), (e / c[-1]).astype(np.float32))
        return t
