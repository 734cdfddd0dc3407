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
