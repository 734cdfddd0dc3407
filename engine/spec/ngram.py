"""N-gram drafters: the continuation of the last n tokens where they occurred before.

Both look the current n-gram (the last ``size_n - 1`` tokens of the slot's
KV plus the token just sampled) up in the request's own history (prompt and
output: ``cache[:n_past]``) and propose the ``size_m`` tokens that followed
it there, as llama-server's (common/ngram-map.cpp):

- `NgramSimple` (``--spec-type ngram-simple``): a backward scan for the most
  recent earlier occurrence on every call; nothing kept between calls. A
  draft shorter than ``size_n`` is dropped (common_ngram_simple_draft).
- `NgramMapK` (``ngram-map-k``): the cached variant. A hash map from every
  key n-gram to its most recent position, extended incrementally as the
  history grows (the history of a request only grows: rejected draft tokens
  never enter it, engine/spec/verify.py), so a lookup costs O(1) instead of a
  scan of the whole context. As llama.cpp's key-only mode, the draft after a
  key is cut to the number of tokens accepted the last time that key drafted.

Invariant: a drafter sees ``history`` = tokens in the slot's KV and
``sampled`` = the next token (not yet in the KV); it returns int32 tokens to
place after ``sampled``, possibly none. Drafters never touch the model.
"""
from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

EMPTY = np.empty(0, np.int32)


class NgramSimple:
    """llama-server's ngram-simple (module doc)."""

    name = "ngram-simple"

    def __init__(self, size_n: int = 12, size_m: int = 48) -> None:
        self.n, self.m = max(int(size_n), 1), max(int(size_m), 1)

    def begin(self, prompt: np.ndarray) -> None:
        """A new request on this slot (nothing kept)."""

    def draft(self, history: np.ndarray, sampled: int) -> np.ndarray:
        n, m = self.n, self.m
        cur = len(history)
        if cur <= n + m + 1:
            return EMPTY
        pat = np.empty(n, np.int32)
        pat[:n - 1] = history[cur - n + 1:]
        pat[n - 1] = sampled
        # candidates j in [1, cur - n - 1], most recent first (j = 0 means "no match" upstream)
        hi = cur - n - 1
        cand = np.flatnonzero(history[1:hi + 1] == pat[0]) + 1
        if cand.size == 0:
            return EMPTY
        win = sliding_window_view(history[:hi + n], n)
        ok = cand[(win[cand] == pat).all(axis=1)]
        if ok.size == 0:
            return EMPTY
        j = int(ok[-1])
        k = min(m, cur - (j + n))
        if k < n:
            return EMPTY
        return history[j + n:j + n + k].astype(np.int32, copy=True)

    def accept(self, n_accepted: int) -> None:
        """The last draft had ``n_accepted`` tokens accepted (unused here)."""


class NgramMapK:
    """llama-server's ngram-map-k, key-only mode (module doc)."""

    name = "ngram-map-k"

    def __init__(self, size_n: int = 12, size_m: int = 48, min_hits: int = 1) -> None:
        self.n, self.m, self.min_hits = max(int(size_n), 1), max(int(size_m), 1), max(int(min_hits), 1)
        self.pos: dict[bytes, int] = {}  # key n-gram -> its most recent indexed position
        self.hits: dict[bytes, int] = {}  # key n-gram -> times it was looked up
        self.n_acc: dict[bytes, int] = {}  # key n-gram -> tokens accepted when it last drafted
        self.done = 0  # positions [1, done) are indexed
        self.last: bytes | None = None  # the key of the last draft

    def begin(self, prompt: np.ndarray) -> None:
        """A new request: the map is rebuilt from its history (a slot's
        previous request may have had another one)."""
        self.pos.clear()
        self.hits.clear()
        self.n_acc.clear()
        self.done = 1
        self.last = None

    def _index(self, history: np.ndarray) -> None:
        """Add every key at j in [done, cur - n - m - 1]: as llama.cpp's map,
        a key is indexed once m tokens of continuation exist after it."""
        n, m = self.n, self.m
        top = len(history) - n - m  # exclusive
        if top <= self.done:
            return
        h = np.ascontiguousarray(history[:top + n - 1], dtype=np.int32)
        pos = self.pos
        for j in range(self.done, top):
            pos[h[j:j + n].tobytes()] = j  # later positions overwrite: the most recent wins
        self.done = top

    def draft(self, history: np.ndarray, sampled: int) -> np.ndarray:
        n, m = self.n, self.m
        cur = len(history)
        self.last = None
        if cur < 2 * n + m:
            return EMPTY
        self._index(history)
        key = np.empty(n, np.int32)
        key[:n - 1] = history[cur - n + 1:]
        key[n - 1] = sampled
        kb = key.tobytes()
        j = self.pos.get(kb)
        if j is None:
            return EMPTY
        hits = self.hits.get(kb, 0) + 1
        self.hits[kb] = hits
        if hits < self.min_hits:
            return EMPTY
        k = min(m, self.n_acc.get(kb, m), cur - (j + n))
        if k <= 0:
            return EMPTY
        self.last = kb
        return history[j + n:j + n + k].astype(np.int32, copy=True)

    def accept(self, n_accepted: int) -> None:
        if self.last is not None:
            self.n_acc[self.last] = int(n_accepted)
            self.last = None


KINDS = {"ngram-simple": NgramSimple, "ngram-map-k": NgramMapK}
