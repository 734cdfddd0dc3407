"""Speculative decoding's per-step choice (engine/spec/cost.py) and the
ubatches a step becomes (engine/spec/plan.py, llama.cpp's split_equal
replayed). No model: fast."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

from engine.spec.cost import ALIGN, StepCost, choose, expected

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts"))
import spec_replay  # noqa: E402


def _split_equal_ref(seqs: list[int], n_ubatch: int) -> list[int]:
    """llama_batch_allocr::split_equal(n_ubatch, sequential=true) over a batch whose token i belongs to
    sequence seqs[i] (one sequence per token), transcribed loop for loop; the rows of each ubatch."""
    used = [False] * len(seqs)
    per_seq: dict[int, list[int]] = {}
    for i, q in enumerate(seqs):
        per_seq.setdefault(q, []).append(i)
    out = []
    while not all(used):
        cur, last = [], -1
        for i, q in enumerate(seqs):
            if used[i] or q in cur:
                continue
            if not cur or q == last + 1:
                cur.append(q)
                last = q
                if len(cur) > n_ubatch:
                    break
        idx = [0] * len(cur)
        for s_, q in enumerate(cur):
            while used[per_seq[q][idx[s_]]]:
                idx[s_] += 1
        n = 0
        while all(idx[s_] < len(per_seq[q]) for s_, q in enumerate(cur)):
            for s_, q in enumerate(cur):
                used[per_seq[q][idx[s_]]] = True
                idx[s_] += 1
            n += 1
            if (n + 1) * len(cur) > n_ubatch:
                break
        out.append(n * len(cur))
    return out


def test_ubatch_plan_is_split_equal():
    """engine/spec/plan.py replays llama.cpp's split_equal for the loop's batch order (every
    generating slot's last token by id, then each drafting slot's tokens by id)."""
    from engine.spec.plan import ubatches

    rng = np.random.default_rng(3)
    for trial in range(400):
        n = int(rng.integers(1, 12))
        ids = sorted(rng.choice(40, n, replace=False).tolist()) if trial % 2 else list(range(n))
        counts = [1 + (int(rng.integers(0, 9)) if rng.random() < 0.5 else 0) for _ in ids]
        batch = ids + [q for q, c in zip(ids, counts) for _ in range(c - 1)]
        nub = int(rng.choice([512, 16, 7]))
        assert ubatches(ids, counts, nub) == _split_equal_ref(batch, nub), (ids, counts, nub)
    assert ubatches([0, 1, 2, 3], [1, 9, 1, 1]) == [4, 8]  # one drafting slot: a second pass
    assert ubatches([0, 1, 2, 3], [9, 9, 9, 9]) == [36]  # all drafting the same length: one pass
    assert ubatches([0, 1, 3], [1, 1, 1]) == [2, 1]  # a gap between generating slots: two passes


def _fitted(t, n: int = 128) -> StepCost:
    """A cost model fed one-ubatch steps of t(rows) seconds, past its ladder."""
    cost = StepCost(n)
    for r in range(1, n + 1):
        for _ in range(2):
            cost.observe([r], t(r))
    cost.n_probe = 99
    return cost


# ms per ubatch of R rows, one slot, measured on this project's 2-core VM before the sawtooth was seen
CONCAVE = {1: 13, 2: 24, 3: 27, 4: 33, 5: 50, 7: 57, 9: 66, 13: 81, 17: 108, 25: 132, 33: 166, 41: 201, 48: 211,
           65: 270, 97: 380, 128: 480}


def _concave() -> StepCost:
    xs = sorted(CONCAVE)
    return _fitted(lambda r: 1e-3 * float(np.interp(r, xs, [CONCAVE[x] for x in xs])))


def test_cost_curve_and_choice():
    lin = _fitted(lambda r: 0.009 + 0.004 * r)
    assert abs(lin.price([0], [1]) - 0.013) < 1e-6
    assert lin.price([0, 1, 3], [1, 1, 1]) == pytest.approx(0.017 + 0.013)  # priced as its two ubatches
    # alone with a well-predicted draft: draft it (nearly) all
    assert choose(lin, [0], [(0, 16, 0.95, 0.0)], 64)[0] >= 8
    # a poor draft is not worth a step's time
    assert choose(lin, [0], [(0, 16, 0.1, 0.0)], 64) == [0]
    # a batch full of streams: S / T is high, nothing is drafted, and no lookup is needed to know it
    ids = list(range(32))
    assert choose(lin, ids, [(i, 16, 0.7, 0.0) for i in ids], 64) == [0] * 32
    assert not lin.bound(ids, 0.7, 64) and lin.bound([0], 0.7, 64)
    # a draft model's own time per token makes its drafts shorter
    assert choose(lin, [0], [(0, 16, 0.8, 0.02)], 64)[0] < choose(lin, [0], [(0, 16, 0.8, 0.0)], 64)[0]
    assert float(expected(0.5, 2)) == pytest.approx(0.75)
    # this machine's concave curve (ms per ubatch rows, measured): long drafts when acceptance is high
    conc = _concave()
    assert choose(conc, [0], [(0, 47, 0.98, 0.0)], 64)[0] >= 20  # a linear fit through 1-9 rows: 8
    assert choose(conc, [0], [(0, 47, 0.6, 0.0)], 64)[0] <= 4
    # the budget's draft-free share follows the curve
    assert conc.draft_free([0], [48], 0.211) == pytest.approx(0.013, rel=0.05)
    # four streams, all well predicted: they draft together, the same length, so the step stays one or two
    # passes (a different length per slot would be a pass each)
    got = choose(conc, [0, 1, 2, 3], [(i, 47, 0.99, 0.0) for i in range(4)], 64)
    assert sum(k > 0 for k in got) >= 2 and len({k for k in got if k}) == 1
    # one of them poorly predicted: it does not draft
    got = choose(conc, [0, 1, 2, 3], [(i, 47, 0.99 if i else 0.2, 0.0) for i in range(4)], 64)
    assert got[0] == 0
    # the ladder: a young curve probes one slot's draft of the next length, a step each
    young = StepCost(128)
    assert choose(young, [0, 1, 2, 3], [(i, 47, 0.9, 0.0) for i in range(4)], 64) == [1, 0, 0, 0]
    assert choose(young, [0, 1, 2, 3], [(i, 47, 0.9, 0.0) for i in range(4)], 64) == [2, 0, 0, 0]
    # .. only beside a few streams: a probe step beside 32 costs all of them its passes
    assert choose(young, ids, [(i, 47, 0.9, 0.0) for i in ids], 64) == [0] * 32 and not young.bound(ids, 0.9, 64)
    # speculative.n_min: a length below it is none (it was picked, drafted, then thrown away every step)
    assert choose(conc, [0], [(0, 47, 0.9, 0.0)], 64) == [3]
    for lo in (4, 16):  # the best length at or past it, or none
        got = choose(conc, [0], [(0, 47, 0.9, 0.0)], 64, [lo])[0]
        assert got == 0 or got >= lo, (lo, got)
    assert choose(conc, [0], [(0, 5, 0.99, 0.0)], 64, [6]) == [0]  # its longest is below n_min
    assert choose(StepCost(128), [0], [(0, 47, 0.9, 0.0)], 64, [2]) == [0]  # the ladder's first probe is 1
    # a multi-ubatch step's time is shared among its ubatches in proportion to their estimates
    c2 = _fitted(lambda r: 0.009 + 0.004 * r)
    c2.observe([4, 8], 2 * (0.025 + 0.041))
    assert c2.curve()[8] > 0.041


def test_drafts_beside_many_streams_are_priced_as_measured():
    """Beside more than LADDER_SLOTS streams the curve (measured on lone
    slots) priced one slot's long draft to pay, and such a step cost about
    twice its price (bench_spec's 32-stream tails): the measured ratio
    (``wide``) multiplies the drafted rows' price there, so the next such
    draft is declined; a few streams keep the curve's prices, and steps
    without drafts relax the ratio back toward 1 (issue 27)."""
    cost = _concave()
    ids = list(range(31))
    offer = [(0, 63, 0.999, 0.0)]
    assert choose(cost, ids, offer, 64) == [63]  # on the curve's prices it pays
    counts = [64] + [1] * 30
    base, priced = cost.price(ids, [1] * 31), cost.price(ids, counts)
    assert cost.draft_free(ids, counts, priced) == pytest.approx(base)
    cost.calibrate(ids, counts, base + 2.0 * (priced - base))  # measured: the drafted rows cost twice their price
    assert cost.wide == pytest.approx(2.0)
    assert choose(cost, ids, offer, 64) == [0] and not cost.bound(ids, 0.999, 64)
    assert cost.draft_free(ids, counts, base + 2.0 * (priced - base)) == pytest.approx(base)
    assert choose(cost, [0, 1, 2, 3], [(0, 63, 0.999, 0.0)], 64)[0] > 0  # a few streams: the curve's own prices
    cost.calibrate(ids, counts, base)  # a step cheaper than its price does not make drafts look cheaper
    assert cost.wide >= 1.0
    for _ in range(400):
        cost.calibrate(ids, [1] * 31, base)  # steps without drafts beside as many streams
    assert cost.wide == pytest.approx(1.0, abs=0.05) and choose(cost, ids, offer, 64) == [63]


# one-slot steps of R rows measured on an AVX-512 VM: a sawtooth (ggml's repacked-weight kernels take 4 rows
# a block and the rest one by one); the table lives with the replay that prices steps on it
SAW = spec_replay.CURVE


def test_a_sawtooth_curve_is_priced_per_block_class_and_drafts_fill_blocks():
    cost = spec_replay.measured(SAW, StepCost(96))
    cost.n_probe = 99
    c = 1e3 * cost.curve()
    # between measured row counts of one class mod ALIGN, the class's own line: 21 rows between 17 and 25
    # (93.4, 122.8), not between 20 and 24 (79.8, 91.2) as one curve through every point would have it
    assert c[21] == pytest.approx((93.4 + 122.8) / 2)
    assert c[36] == pytest.approx((114.5 + 143.3) / 2)  # class 0 between 32 and 40
    # a lone slot's well-predicted draft fills its ubatch to a block (1 + k rows, a multiple of ALIGN)
    for p in (0.9, 0.95, 0.98):
        k = choose(cost, [0], [(0, 47, p, 0.0)], 64)[0]
        assert k > 0 and (1 + k) % ALIGN == 0, (p, k)


def test_the_draft_model_is_not_asked_for_a_draft_below_n_min() -> None:
    """Speculator.draft with a draft model and speculative.n_min 3: every
    length the step's choice would verify is below it (or none), so the
    draft model is never asked (it was, every step, and its draft was then
    thrown away); with n_min 0 it is asked."""
    from types import SimpleNamespace as NS

    from engine.config import Config
    from engine.spec import Speculator
    from engine.spec.cost import LADDER, Rate
    from ipc.layout import CNT

    asked = []

    class DM:
        def draft(self, want):
            asked.append([(w[0], w[3]) for w in want])
            return {w[0]: np.arange(w[3], dtype=np.int32) + 100 for w in want}

    class Model:
        batch = NS(max_out=64, n_out=1)
        n_ubatch = 512

        def add(self, *a):
            return 0

    for n_min, want_asked in ((3, False), (0, True)):
        asked.clear()
        sp = Speculator(Config(parallel=1, spec_type="ngram-simple"), Model(), np.zeros(len(CNT) + 8))
        sp.dm, sp.t_draft = DM(), 0.001
        sp.cost.n_probe = len(LADDER)  # past the ladder: a curve where 1-2 rows pay and 3 do not
        for r, t in ((1, .012), (2, .013), (3, .030), (4, .045)):
            sp.cost.t[r], sp.cost.w[r] = t, 16
        st = sp.state[0]
        st.on, st.ngrams, st.n_max, st.n_min, st.p_min = True, [], 3, n_min, 0.0
        st.rate = Rate(0.9)
        s = NS(id=0, n_ctx=1024, n_past=100, n_predict=-1, n_decoded=10, cache=np.zeros(1024, np.int32), last=5)
        for _ in range(3):
            sp.draft([s], 1, 60, lambda s: 100)
            s.n_past = 100
        assert bool(asked) == want_asked, (n_min, asked)


def test_a_draft_ends_before_a_token_the_target_does_not_have() -> None:
    """compatible() lets a draft model's vocabulary run VOCAB_DIFF tokens past
    the target's: a draft of such an id reached the target's batch, whose
    llama_decode then refused the whole step (every slot in it failed). The
    draft ends before it. (No such model pair is installed: the draft model's
    decode and logits are stubbed, the drafting loop is the real one.)"""
    from engine.llbatch import Batch
    from engine.spec.draft import DraftModel

    dm = DraftModel.__new__(DraftModel)
    dm.n_ctx_slot, dm.batch, dm.toks, dm.mem, dm.n_target = 1024, Batch(64, 1), [np.empty(0, np.int32)], None, 100
    picks = iter([50, 60, 150, 70])  # the draft's argmax at each position; 150 is past the target's 100 tokens

    def logits(i: int) -> np.ndarray:
        v = np.zeros(200, np.float32)
        v[next(picks)] = 1.0
        return v

    dm._decode, dm._logits = (lambda: True), logits
    got = dm.draft([(0, np.arange(5, dtype=np.int32), 7, 8, 0.0)])
    assert got[0].tolist() == [50, 60], got
