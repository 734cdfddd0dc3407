"""Speculative decoding's drafters (engine/spec/ngram.py) against
llama-server's, and the --spec-type flag: no model, no engine
(tests/test_spec.py runs the real engine with drafts in flight)."""
from __future__ import annotations

import numpy as np
import pytest

from engine.spec import spec_types
from engine.spec.ngram import ModTable, NgramMapK, NgramMod, NgramShort, NgramSimple


def _simple_ref(tokens: list[int], sampled: int, n: int, m: int) -> list[int]:
    """common_ngram_simple_draft, line by line."""
    cur = len(tokens)
    if cur <= n + m + 1:
        return []
    pattern = tokens[cur - n + 1:] + [sampled]
    match = 0
    for j in range(cur - n - 1, 0, -1):
        if tokens[j:j + n] == pattern:
            match = j
            break
    if match == 0:
        return []
    k = min(m, cur - (match + n))
    if k < n:
        return []
    return tokens[match + n:match + n + k]


def test_ngram_simple_is_llama_servers():
    rng = np.random.default_rng(1)
    for trial in range(300):
        base = rng.integers(0, 6, rng.integers(5, 120)).tolist()  # a small alphabet: many repeats
        toks = base + base[: rng.integers(0, len(base))]
        n, m = int(rng.integers(1, 5)), int(rng.integers(1, 12))
        sampled = int(rng.integers(0, 6))
        got = NgramSimple(n, m).draft(np.array(toks, np.int32), sampled).tolist()
        assert got == _simple_ref(toks, sampled, n, m), (trial, n, m)


def test_ngram_map_k_drafts_the_continuation_and_learns_the_accepted_length():
    text = list(range(100, 160))
    hist = np.array(text + text[:20], np.int32)  # the text again, 20 tokens into it
    d = NgramMapK(4, 8)
    d.begin(hist)
    got = d.draft(hist, text[20])
    assert got.tolist() == text[21:29]  # the 8 tokens after the key where it occurred before
    d.accept(3, 8)
    assert d.draft(hist, text[20]).tolist() == text[21:24]  # cut to what was accepted last time
    assert d.draft(hist, 7).size == 0  # an unseen key
    # after the output departs from the copied text, a 12-token key finds it again only 12 tokens later;
    # ringserve's ngram-short (a 4-token key) 4 tokens later
    out = text[:30] + [7, 8] + text[32:36]  # two tokens changed, then the copy goes on
    hist = np.array(text + out[:-1], np.int32)
    long, short = NgramMapK(12, 48), NgramShort(4, 16)
    long.begin(hist), short.begin(hist)
    assert long.draft(hist, out[-1]).size == 0
    assert short.draft(hist, out[-1]).tolist() == text[36:52]


class _ModRef:
    """common_ngram_mod + common_speculative_impl_ngram_mod::draft_one/begin, line by line (one sequence)."""

    def __init__(self, n, size, n_max, n_min):
        self.n, self.e, self.n_max, self.n_min, self.i_last = n, [-1] * size, n_max, n_min, 0

    def idx(self, toks):
        res = 0
        for t in toks[:self.n]:
            res = (res * 6364136223846793005 + t) % (1 << 64)
        return res % len(self.e)

    def add(self, toks):
        self.e[self.idx(toks)] = toks[self.n]

    def begin(self, prompt):
        for i in range(len(prompt) - self.n):
            self.add(prompt[i:])
        self.i_last = len(prompt) - self.n
        if sum(x != -1 for x in self.e) / len(self.e) > 0.25:  # occupancy over a quarter: reset
            self.e = [-1] * len(self.e)

    def draft(self, prompt, last):
        n, cur = self.n, len(prompt)
        if cur < n:
            return []
        if self.i_last + 32 < cur:
            for i in range(self.i_last, cur - n):
                self.add(prompt[i:])
            self.i_last = cur - n
        res = prompt[cur - n + 1:] + [last]
        for i in range(self.n_max):
            tok = self.e[self.idx(res[i:])]
            if tok == -1:
                if i < self.n_min:
                    return []
                break
            res.append(tok)
        return res[n:]


def test_ngram_mod_is_llama_servers():
    rng = np.random.default_rng(2)
    for trial in range(40):
        n, n_max, n_min, size = int(rng.integers(1, 6)), int(rng.integers(1, 20)), int(rng.integers(0, 8)), 257
        base = rng.integers(0, 5, rng.integers(10, 80)).tolist()
        prompt = base + base[: rng.integers(0, len(base))]
        ref, got = _ModRef(n, size, n_max, n_min), NgramMod(ModTable(n, size), n_max, n_min)
        ref.begin(prompt)
        got.begin(np.array(prompt, np.int32))
        hist = list(prompt)
        for step in range(60):  # the history grows as output would, drafts are taken at every step
            last = int(rng.integers(0, 5))
            want = ref.draft(list(hist), last)
            assert got.draft(np.array(hist, np.int32), last).tolist() == want, (trial, step)
            hist.append(last)


def test_spec_types_flag():
    assert spec_types("ngram-simple") == "ngram-simple"
    assert spec_types("ngram-map-k, ngram-simple") == "ngram-map-k,ngram-simple"
    assert spec_types("ngram-mod") == "ngram-mod"
    assert spec_types("ngram-map-k,ngram-short") == "ngram-map-k,ngram-short"
    with pytest.raises(ValueError, match="ngram-cache"):
        spec_types("ngram-cache")
    from frontends.process.cli import parse

    cfg, _ = parse(["-md", "draft.gguf", "--spec-type", "ngram-simple", "--spec-draft-n-max", "5",
                    "--spec-draft-p-min", "0.5", "-ngld", "0"])
    assert (cfg.spec_draft_model, cfg.spec_type, cfg.spec_draft_n_max, cfg.spec_draft_p_min, cfg.model) == \
        ("draft.gguf", "ngram-simple", 5, 0.5, "")  # -md is the draft model, not "-m d"
