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

- `NgramShort` (``ngram-short``, ringserve's own): ngram-map-k with a short
  key (4 tokens) and short drafts (16), meant to follow ngram-map-k in a
  chain (``--spec-type ngram-map-k,ngram-short``): after the output departs
  from the text it copies (a rewrapped line, a changed name), a 12-token
  key finds nothing until 12 tokens past the change, each of those steps
  one token; a 4-token key finds the copied text again after 4 (measured
  on bench_spec's copy outputs: 17% of the tokens undrafted instead of 25%).
  Short keys match by chance more often, so its drafts are short and the
  per-key accepted length (as map-k's) cuts the ones that failed.

- `NgramMod` (``ngram-mod``): llama.cpp's common_ngram_mod: one hash table
  shared by every slot (4 Mi entries, 16 MiB) from the hash of an
  ``n_match``-gram to the token that followed it, filled with each request's
  prompt and, in chunks of 32, its output; a draft chains lookups (up to
  ``n_max`` tokens) and is dropped when fewer than ``n_min`` were found. The
  table is emptied when it is a quarter full at a request's start or after
  5 drafts in a row with less than a quarter accepted.

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

    def accept(self, n_accepted: int, n_verified: int) -> None:
        """Of the last draft, ``n_verified`` tokens were put to the model and ``n_accepted`` held (unused here)."""


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
        self.last_len = 0  # and its length

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
        self.last, self.last_len = kb, k
        return history[j + n:j + n + k].astype(np.int32, copy=True)

    def accept(self, n_accepted: int, n_verified: int) -> None:
        """As llama.cpp's: the key drafts as many tokens next time as held this
        time; a draft cut short by the step's choice (engine/spec/cost.py) and
        verified whole says nothing about the rest, so its key keeps its length."""
        if self.last is not None:
            if n_accepted < n_verified or n_verified >= self.last_len:
                self.n_acc[self.last] = int(n_accepted)
            self.last = None


class NgramShort(NgramMapK):
    """ringserve's ngram-short: NgramMapK with a short key and draft (module doc)."""

    name = "ngram-short"


MOD_MUL = 6364136223846793005  # common_ngram_mod::idx: res = res * MOD_MUL + token (mod 2^64)
MASK = (1 << 64) - 1
EMPTY_TOKEN = -1


class ModTable:
    """common_ngram_mod: the hash table one engine's ngram-mod slots share."""

    def __init__(self, n: int, size: int = 4 * 1024 * 1024) -> None:
        self.n = max(int(n), 1)
        self.entries = np.full(size, EMPTY_TOKEN, np.int32)
        self.used = 0
        self.top = pow(MOD_MUL, self.n - 1, 1 << 64)  # the first token's weight in a window's hash

    def reset(self) -> None:
        self.entries.fill(EMPTY_TOKEN)
        self.used = 0

    def add_range(self, tokens: np.ndarray, i0: int, i1: int) -> None:
        """add(tokens + i) for i in [i0, i1): key tokens[i:i+n] -> value tokens[i+n] (later ones overwrite)."""
        if i1 <= i0:
            return
        n = self.n
        t = tokens[i0:i1 + n].astype(np.uint64)
        h = np.zeros(i1 - i0, np.uint64)
        mul = np.uint64(MOD_MUL)
        with np.errstate(over="ignore"):
            for j in range(n):
                h = h * mul + t[j:j + i1 - i0]
        idx = (h % np.uint64(len(self.entries))).astype(np.int64)
        self.used += int(np.unique(idx[self.entries[idx] == EMPTY_TOKEN]).size)
        self.entries[idx] = tokens[i0 + n:i1 + n]  # numpy assigns repeated indices in order: the last wins

    def hash(self, window) -> int:
        h = 0
        for t in window:
            h = (h * MOD_MUL + int(t)) & MASK
        return h


class NgramMod:
    """llama-server's ngram-mod for one slot, over the engine's shared `ModTable` (module doc)."""

    name = "ngram-mod"

    def __init__(self, table: ModTable, n_max: int = 64, n_min: int = 48) -> None:
        self.t, self.n_max, self.n_min = table, max(int(n_max), 0), max(int(n_min), 0)
        self.i_last = 0  # positions [.., i_last) of this request's history are in the table
        self.n_low = 0  # drafts in a row with under a quarter accepted

    def begin(self, prompt: np.ndarray) -> None:
        t, n = self.t, self.t.n
        self.i_last = self.n_low = 0
        if len(prompt) < n:
            return
        t.add_range(np.asarray(prompt, np.int32), 0, len(prompt) - n)
        self.i_last = len(prompt) - n
        if t.used / len(t.entries) > 0.25:
            t.reset()

    def draft(self, history: np.ndarray, sampled: int) -> np.ndarray:
        t, n = self.t, self.t.n
        cur = len(history)
        if cur < n:
            return EMPTY
        if self.i_last + 32 < cur:  # new n-grams in chunks
            t.add_range(history, self.i_last, cur - n)
            self.i_last = cur - n
        win = [*history[cur - n + 1:].tolist(), int(sampled)]
        h = t.hash(win)
        size, ent, top = len(t.entries), t.entries, t.top
        out = []
        for i in range(self.n_max):
            tok = int(ent[h % size])
            if tok == EMPTY_TOKEN:
                if i < self.n_min:
                    return EMPTY
                break
            out.append(tok)
            h = ((h - win[i] * top) * MOD_MUL + tok) & MASK  # the window slides by one token
            win.append(tok)
        return np.array(out, np.int32)

    def accept(self, n_accepted: int, n_verified: int) -> None:
        """Of ``n_verified`` drafted tokens put to the model, ``n_accepted`` held
        (llama.cpp divides by its whole draft: here the verified part is the draft)."""
        if n_verified <= 0:
            return
        if n_accepted / n_verified < 0.25:
            self.n_low += 1
            if self.n_low >= 5:
                self.t.reset()
                self.n_low = self.i_last = 0
        else:
            self.n_low = 0


KINDS = {"ngram-simple": NgramSimple, "ngram-map-k": NgramMapK, "ngram-short": NgramShort, "ngram-mod": NgramMod}
