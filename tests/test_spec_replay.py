"""scripts/spec_replay.py: the engine's Speculator replayed over a recorded output (no model needed)."""
from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts"))

import spec_replay  # noqa: E402


def _record(seed: int = 0) -> dict:
    """A passage of 300 distinct-ish tokens, then its copy with a token changed every 40: a copy workload."""
    rng = np.random.default_rng(seed)
    passage = rng.integers(1000, 60000, 300).tolist()
    out = list(passage[20:])
    for i in range(30, len(out), 40):
        out[i] = 7  # an edit: no history position predicts it
    return {"prompt": [2] + passage + passage[:20], "output": out[:256]}


def test_replay_drafts_a_copy_and_the_oracle_bounds_it():
    recs = [_record(0), _record(1)]
    r = spec_replay.replay(recs, "ngram-map-k", spec_replay.CURVE)
    o = spec_replay.oracle(recs, spec_replay.CURVE)
    n = sum(len(x["output"]) - 1 for x in recs)  # tokens decoded after each first one
    assert r["steps"] + r["accepted"] == n and o["steps"] + o["accepted"] == n  # every token emitted once
    assert 0 < r["accepted"] <= r["drafted"] and r["speedup"] > 1.2  # the copy is drafted and pays
    assert o["steps"] <= r["steps"] and o["speedup"] >= r["speedup"]  # nothing beats hindsight
    assert o["bare"] >= 2 * len(range(30, 256, 40))  # each edit is unpredictable, and so is the token after it
    # after each edit ngram-map-k's 12-token key holds the edit for 12 steps: no draft, though the token
    # just sampled still has its continuation in the passage (what the oracle drafts there)
    assert 0 < r["missed"] <= r["bare"] and r["missed_tokens"] >= r["missed"]
    assert o["missed"] == 0


def _decoy(seed: int = 2) -> dict:
    """A passage, then its copy with a token changed every 13: the 12-token key matches again just
    before each change, so every draft ngram-map-k offers fails at its first token."""
    rng = np.random.default_rng(seed)
    passage = rng.integers(1000, 60000, 300).tolist()
    out = list(passage[20:])
    for i in range(12, len(out), 13):
        out[i] = 7 + i % 5
    return {"prompt": [2] + passage + passage[:20], "output": out[:256]}


def test_a_pooled_rate_that_fell_below_paying_does_not_stop_a_later_requests_drafts(monkeypatch):
    """The pool learns only from verifications: requests whose drafts failed bring it below the rate
    at which any draft pays, and a later request starting from it would never draft, nor would any
    after it. A request's prior is at least P_TRY, so a copy after the failures is drafted again."""
    import engine.spec as spec
    decoys = [_decoy(2), _decoy(3)]
    copy = _record(1)
    d = spec_replay.replay(decoys, "ngram-map-k", spec_replay.CURVE)
    assert d["drafted"] > 0 and d["accepted"] < 0.2 * d["drafted"]  # the decoys' drafts were tried and failed
    both = spec_replay.replay(decoys + [copy], "ngram-map-k", spec_replay.CURVE)
    assert both["accepted"] - d["accepted"] > 100  # the copy after them is drafted
    monkeypatch.setattr(spec, "P_TRY", 0.0)  # the pool alone, as before: nothing after the decoys drafts
    old = spec_replay.replay(decoys + [copy], "ngram-map-k", spec_replay.CURVE)
    assert old["accepted"] - spec_replay.replay(decoys, "ngram-map-k", spec_replay.CURVE)["accepted"] == 0
