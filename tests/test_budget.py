"""The step budget and fair prompt admission (engine/budget.py) on the real
Engine.build with a fake model: which tokens each step's batch holds is the
point here, not what llama.cpp computes from them (tests/test_engine.py has
the real-model check of step times)."""
from __future__ import annotations

import numpy as np
import pytest

from engine.budget import AGE_TOKENS_S, MIN_ROOM, QUANTUM, StepBudget, plan
from engine.config import Config
from engine.loop import Engine
from engine.slots import Request
from ipc.layout import CNT, CTL, HIST_NAMES, N_COUNTERS, N_HIST, SLOT, SLOT_GEN, SLOT_PROMPT


class FakeModel:
    """Records each batch as (seq, first pos, n tokens, logits on last)."""

    n_vocab = 100

    def __init__(self, n_ctx_slot: int = 16384, n_batch: int = 2048):
        self.n_ctx_slot, self.n_batch = n_ctx_slot, n_batch
        self.batch: list[tuple[int, int, int, bool]] = []

    def clear(self) -> None:
        self.batch = []

    def add(self, token: int, pos: int, seq: int, logits: bool) -> int:
        self.batch.append((seq, pos, 1, logits))
        return sum(b[2] for b in self.batch) - 1

    def add_many(self, tokens, pos0: int, seq: int, logits_last: bool) -> int:
        assert len(tokens) > 0
        self.batch.append((seq, pos0, len(tokens), logits_last))
        return sum(b[2] for b in self.batch) - 1

    def seq_rm(self, *a) -> bool:
        return True


class FakeArena:
    def __init__(self, n: int):
        self.counters = np.zeros(N_COUNTERS)
        self.hist = np.zeros((len(HIST_NAMES), N_HIST), np.uint64)
        self.slots = np.zeros(n, SLOT)
        self.ctl = np.zeros(1, CTL)


class FakePort:
    def __init__(self, n: int):
        self.arena = FakeArena(n)
        self.on_reclaim = None


def engine(parallel: int = 10, step_tokens: int = 64, n_batch: int = 2048, admit: str = "fair") -> Engine:
    cfg = Config(parallel=parallel, step_tokens=step_tokens, prefix_cache=False, admit=admit)  # the budget alone
    return Engine(cfg, FakePort(parallel), FakeModel(n_batch=n_batch))


def generating(eng: Engine, ids) -> None:
    for i in ids:
        s = eng.slots[i]
        s.req, s.state, s.last, s.n_past = Request(i, i), SLOT_GEN, 7, 20


def prompting(eng: Engine, i: int, n: int, t: float, cached: int = 0) -> None:
    s = eng.slots[i]
    s.req = Request(i, i)
    s.req.prompt = np.arange(n, dtype=np.int32) % 50
    s.state, s.t_start = SLOT_PROMPT, t
    s.i_prompt = s.n_past = s.n_cache = cached


def step(eng: Engine) -> dict[int, int]:
    """build() one batch, then what sample() would do to the slots' states;
    returns {slot: tokens in this batch}."""
    n = eng.build()
    got: dict[int, int] = {}
    for seq, _, k, _ in eng.model.batch:
        got[seq] = got.get(seq, 0) + k
    assert sum(got.values()) == n
    for s in eng.slots:
        if s.i_batch >= 0 and s.state == SLOT_PROMPT:
            s.state = SLOT_GEN
            s.last = 1
    return got


def test_generating_tokens_first_then_prompt_chunks_within_budget():
    eng = engine(step_tokens=64)
    generating(eng, range(8))
    prompting(eng, 8, 1000, t=1.0)
    steps = []
    while eng.slots[8].state == SLOT_PROMPT:
        got = step(eng)
        b = eng.model.batch
        assert [x[0] for x in b[:8]] == list(range(8)) and all(x[2] == 1 for x in b[:8])  # streams first
        assert sum(got.values()) <= 64
        steps.append(got.get(8, 0))
    assert sum(steps) == 1000 and steps[:-1] == [56] * (len(steps) - 1)
    assert eng.model.batch[-1][3] is True  # the last chunk asks for the logits
    pos = eng.slots[8].n_past
    assert pos == 1000 + 0  # every prompt token went into the KV once, in order


def test_batch_in_sequence_id_order_so_split_equal_keeps_the_streams_in_one_ubatch():
    """engine/batch.py: a prompting slot between generating ones takes its
    place in id order (llama.cpp's split_equal puts only consecutive ids in a
    ubatch), and each slot's i_batch still points at its own last token."""
    eng = engine(step_tokens=64)
    generating(eng, [0, 1, 2, 4, 5, 7])
    prompting(eng, 3, 10, t=1.0)
    prompting(eng, 6, 200, t=2.0)
    got = step(eng)
    b = eng.model.batch
    assert [x[0] for x in b] == list(range(8))
    assert got[3] == 10 and 0 < got[6] < 200 and all(got[i] == 1 for i in (0, 1, 2, 4, 5, 7))
    ends = np.cumsum([x[2] for x in b]) - 1
    assert [eng.slots[i].i_batch for i in (0, 1, 2, 3, 4, 5, 7)] == [int(ends[i]) for i in (0, 1, 2, 3, 4, 5, 7)]
    assert eng.slots[6].i_batch == -1 and b[3][3] and not b[6][3]  # logits: the finished prompt's last token only
    assert eng.n_gen == 6 and eng.n_prompt == got[3] + got[6]


def test_short_prompt_is_not_stuck_behind_a_long_one():
    eng = engine(step_tokens=200)
    generating(eng, range(8))
    prompting(eng, 8, 8000, t=1.0)
    step(eng)
    step(eng)
    prompting(eng, 9, 12, t=2.0)  # arrives while the 8k prompt is half way through nothing
    got = step(eng)
    assert got[9] == 12 and eng.slots[9].state == SLOT_GEN  # whole, in the first step it is there
    assert got[8] == 200 - 8 - 12  # the long one keeps the rest


def test_two_long_prompts_progress_together():
    eng = engine(step_tokens=208)
    generating(eng, range(8))
    prompting(eng, 8, 4000, t=1.0)
    prompting(eng, 9, 1000, t=2.0)  # younger and shorter: no reason to wait for the other
    got = step(eng)
    assert got[8] == got[9] == 100
    while eng.slots[9].state == SLOT_PROMPT:
        got = step(eng)
        assert got.get(9, 0) > 0 and got.get(8, 0) > 0
    assert eng.slots[8].state == SLOT_PROMPT  # the 4k one goes on alone, with all the room
    assert step(eng)[8] == 200 - 1  # slot 9 now generates one token


def test_only_uncached_tokens_count():
    eng = engine(step_tokens=64)
    generating(eng, range(8))
    prompting(eng, 8, 3000, t=1.0, cached=2990)  # a prefix-cache hit: 10 tokens left
    prompting(eng, 9, 3000, t=2.0)
    got = step(eng)
    assert got[8] == 10 and eng.slots[8].state == SLOT_GEN
    assert got[9] == 64 - 8 - 10
    assert eng.model.batch[8][:3] == (8, 2990, 10)  # its chunk starts past the cached prefix


def test_off_is_the_old_behaviour_and_n_batch_bounds_everything():
    eng = engine(step_tokens=-1, n_batch=2048)
    generating(eng, range(8))
    prompting(eng, 8, 5000, t=1.0)
    assert step(eng)[8] == 2040
    eng = engine(step_tokens=100000, n_batch=512)
    generating(eng, range(8))
    prompting(eng, 8, 5000, t=1.0)
    assert step(eng)[8] == 504


def test_a_prompt_progresses_even_when_streams_fill_the_budget():
    eng = engine(parallel=10, step_tokens=4)
    generating(eng, range(8))
    prompting(eng, 8, 100, t=1.0)
    assert step(eng)[8] == QUANTUM


def test_plan_many_short_prompts_oldest_then_smallest():
    class P:
        def __init__(self, i, n, t):
            self.id, self.remaining, self.t_start = i, n, t

    ps = [P(0, 5000, 0.0)] + [P(i, 12, float(i)) for i in range(1, 20)]
    got = dict((p.id, k) for p, k in plan(ps, 150))
    assert got[0] == QUANTUM  # scarce room: the oldest still moves
    assert sum(got.values()) == 150
    full = [i for i in range(1, 20) if got.get(i) == 12]
    assert full == list(range(1, len(full) + 1)) and len(full) == (150 - QUANTUM) // 12  # oldest of equals first
    assert plan(ps, 0) == []


def test_adaptive_room_follows_measured_step_times():
    b = StepBudget(0, 2048, 3.0)
    assert b.room(8) == MIN_ROOM  # nothing measured yet
    for _ in range(40):
        b.observe(8, 0, 0.045)  # pure decode steps of 45 ms
        b.observe(8, 100, 0.045 + 100 * 0.002)  # 2 ms a prompt token on top
    assert b.d_gen == pytest.approx(0.045) and b.per_tok == pytest.approx(0.002)
    assert b.room(8, longest=4000) == MIN_ROOM  # (3 - 1) * 45 ms / 2 ms = 45 tokens: the floor wins
    assert abs(b.room(8, longest=12) - 45) <= 1  # only short prompts wait: steps stay near 3 decode steps
    assert b.room(8, longest=12) >= QUANTUM
    for _ in range(40):
        b.observe(32, 0, 0.700)  # many streams: a long pure step leaves room above the floor
    assert abs(b.room(32) - 700) <= 2  # (3 - 1) * 700 ms / 2 ms
    b.observe(32, 5, 10.0)  # too few prompt tokens to say anything
    assert abs(b.room(32) - 700) <= 2
    for _ in range(40):
        b.observe(32, 100, 0.700 + 100 * 0.0010)  # a faster machine: more tokens in the same time
    assert abs(b.room(32) - 1400) <= 8
    assert StepBudget(0, 200, 3.0).room(8) == 192  # n_batch caps it all
    assert b.room(0, longest=4000) == 2048  # nothing generating: no stream waits, the whole batch (issue 24)
    assert StepBudget(64, 2048, 3.0).room(8) == 56 and StepBudget(-1, 2048, 3.0).room(8) == 2040


def test_fifo_finishes_the_oldest_of_equal_prompts_first():
    """A burst of equal long prompts: fair finishes all of them at the end,
    fifo the first after a quarter of the time (issue 24)."""
    done = {}
    for rule in ("fair", "fifo", "srf"):
        eng = engine(step_tokens=520, admit=rule)
        for i in range(4):
            prompting(eng, i, 2000, t=1.0 + i)
        n, first = 0, {}
        while any(eng.slots[i].state == SLOT_PROMPT for i in range(4)):
            got = step(eng)
            n += 1
            assert sum(got.values()) <= 520
            for i in range(4):
                if eng.slots[i].state == SLOT_GEN and i not in first:
                    first[i] = n
        done[rule] = first
    assert max(done["fair"].values()) - min(done["fair"].values()) <= 1  # all together, late
    assert done["fifo"][0] < done["fifo"][1] < done["fifo"][2] < done["fifo"][3]  # in arrival order
    assert done["fifo"][0] <= (2000 // 520) + 1 < done["fair"][0]
    assert sum(done["fifo"].values()) < sum(done["fair"].values())
    assert done["srf"] == done["fifo"]  # equal sizes: the one ahead stays ahead


def test_srf_short_first_but_ageing_lets_a_long_prompt_through():
    class P:
        def __init__(self, i, n, t):
            self.id, self.remaining, self.t_start = i, n, t

    long_, short = P(0, 4000, 0.0), P(1, 100, 0.5)
    got = dict((p.id, k) for p, k in plan([long_, short], 512, rule="srf", now=1.0))
    assert got == {1: 100, 0: 412}  # the short one whole, the long one the rest
    got = dict((p.id, k) for p, k in plan([long_, P(1, 600, 0.5)], 512, rule="srf", now=1.0))
    assert got == {1: 512}  # fewest left first
    late = 1.0 + (4000 - 600) / AGE_TOKENS_S
    got = dict((p.id, k) for p, k in plan([long_, P(1, 600, late)], 512, rule="srf", now=late))
    assert got == {0: 512}  # waited long enough: it goes ahead of a newcomer
    got = dict((p.id, k) for p, k in plan([long_, P(1, 600, 0.5)], 512, rule="fifo", now=1.0))
    assert got == {0: 512}
    assert plan([long_], 0, rule="srf") == [] and plan([], 100, rule="fifo") == []


class Five:
    """A host sampler that always picks token 5."""
    kind = "host"

    def sample(self, m, i):
        return 5

    def accept(self, tok):
        pass


def test_express_decodes_a_short_prompt_alone_before_the_step():
    """A cache hit's short question beside generating slots and an older
    long prompt (which fifo gives the step's room first) gets a decode of its
    own, is sampled in it, and rides the step as a generating row (issue 24);
    with nothing else in the step, or --express-tokens 0, there is none."""
    decoded = []
    eng = engine(step_tokens=64, admit="fifo")
    eng.model.decode = lambda: decoded.append(list(eng.model.batch)) or 0
    eng.model.is_eog = lambda tok: False
    eng.publish = lambda: eng.out.clear()
    generating(eng, [0, 2])
    prompting(eng, 1, 3000, t=1.0)  # older and long: fifo's room is its own
    prompting(eng, 3, 2000, t=2.0, cached=1990)  # 10 tokens left
    for i in (1, 3):
        eng.slots[i].sampler, eng.slots[i].n_predict = Five(), 16
    eng.express()
    assert decoded == [[(3, 1990, 10, True)]]  # alone, its logits asked
    s = eng.slots[3]
    assert s.state == SLOT_GEN and s.n_decoded == 1 and s.last == 5 and s.n_past == 2000
    assert eng.cnt[CNT["express_total"]] == 1
    got = step(eng)
    assert got[3] == 1 and got[0] == got[2] == 1 and got[1] == 64 - 3  # the step: it generates beside the rest
    decoded.clear()
    eng = engine(step_tokens=64, admit="fifo")
    eng.model.decode = lambda: decoded.append(list(eng.model.batch)) or 0
    eng.model.is_eog = lambda tok: False
    eng.publish = lambda: eng.out.clear()
    prompting(eng, 3, 2000, t=2.0, cached=1990)
    eng.slots[3].sampler, eng.slots[3].n_predict = Five(), 16
    eng.express()  # alone anyway: the step is its own
    assert decoded == [] and eng.slots[3].state == SLOT_PROMPT
    prompting(eng, 4, 500, t=3.0)  # more tokens left than --express-tokens: it waits for the step
    prompting(eng, 5, 12, t=3.0)  # a new short prompt, nothing reused: as before (plain decode unchanged)
    generating(eng, [0])
    eng.express()
    assert decoded == [[(3, 1990, 10, True)]] and eng.slots[4].state == eng.slots[5].state == SLOT_PROMPT


def test_express_decodes_several_cache_hits_one_after_the_other():
    """Three chat turns that came back together (bench_cache chat: the
    clients finish in one step) each get a decode of their own, oldest
    first, each sampled and published before the next: the first answer
    waits for its own tokens only, not for all three prompts' (issue 24)."""
    decoded, published = [], []
    eng = engine(step_tokens=64, admit="fifo")
    eng.model.decode = lambda: decoded.append(list(eng.model.batch)) or 0
    eng.model.is_eog = lambda tok: False
    eng.publish = lambda: published.append(sorted(s.id for s, _ in eng.out)) or eng.out.clear()
    generating(eng, [0])
    for i, t in ((3, 3.0), (1, 1.0), (2, 2.0)):
        prompting(eng, i, 500, t=t, cached=473)  # 27 tokens left, 473 reused
        eng.slots[i].sampler, eng.slots[i].n_predict = Five(), 16
    eng.express()
    assert decoded == [[(1, 473, 27, True)], [(2, 473, 27, True)], [(3, 473, 27, True)]]
    assert published == [[1], [2], [3]]  # each first token out before the next prompt's decode
    assert all(eng.slots[i].state == SLOT_GEN for i in (1, 2, 3)) and eng.cnt[CNT["express_total"]] == 3
    # the same turns on otherwise idle slots (every answer before them ended): still one decode each
    decoded.clear()
    published.clear()
    eng = engine(step_tokens=64, admit="fifo")
    eng.model.decode = lambda: decoded.append(list(eng.model.batch)) or 0
    eng.model.is_eog = lambda tok: False
    eng.publish = lambda: published.append(sorted(s.id for s, _ in eng.out)) or eng.out.clear()
    for i, t in ((2, 2.0), (1, 1.0)):
        prompting(eng, i, 500, t=t, cached=473)
        eng.slots[i].sampler, eng.slots[i].n_predict = Five(), 16
    eng.express()
    assert decoded == [[(1, 473, 27, True)], [(2, 473, 27, True)]] and published == [[1], [2]]



def test_step_prices_its_own_decode_not_the_express_decodes():
    """The budget learns what the step's batch cost, not the express decodes
    run before it (budget.express's rule: their fixed cost over a few prompt
    tokens would overstate a step's cost); batch_tokens_total counts both."""
    clock = [0.0]
    eng = engine(step_tokens=0, admit="fifo")
    eng.tr.clock = lambda: clock[0]
    eng.tr.t = 0.0

    def decode():
        alone = len(eng.model.batch) == 1 and eng.model.batch[0][0] == 3
        clock[0] += 0.5 if alone else 0.1  # the express decode 0.5 s, the step 0.1 s
        return 0

    eng.model.decode = decode
    eng.model.is_eog = lambda tok: False
    eng.intake = lambda: False
    eng.publish = lambda: eng.out.clear()
    generating(eng, [0, 2])
    for i in (0, 2):
        eng.slots[i].sampler, eng.slots[i].n_predict = Five(), 16
    prompting(eng, 3, 2000, t=2.0, cached=1990)  # a cache hit: 10 tokens left, decoded alone first
    eng.slots[3].sampler, eng.slots[3].n_predict = Five(), 16
    eng.step()
    assert eng.cnt[CNT["express_total"]] == 1
    assert eng.budget.d_gen == pytest.approx(0.1)  # the step's 3 generating rows, without the 0.5 s before
    assert eng.cnt[CNT["batch_tokens_total"]] == 10 + 3


def test_a_cache_hit_is_attached_just_before_its_own_express_decode():
    """Four chat turns that come back in one intake: the first is started, the
    others wait in the queue (Engine.later) and express assigns each after the
    decode before it, so a turn waits for the attaches of the turns before it
    only, not for all of them (issue 24: later-turn TTFT 0.87x)."""
    eng = engine(step_tokens=64, admit="fifo")
    q = Request(9, 9)
    q.prompt = np.arange(500, dtype=np.int32) % 50
    assert not eng.later(q, 473)  # nothing else to express: it starts now
    prompting(eng, 1, 500, t=1.0, cached=473)
    assert eng.later(q, 473)  # slot 1's express decode goes first
    assert not eng.later(q, 300)  # 200 tokens left: no express decode of its own, nothing to wait for
    eng.cfg.express_tokens = 0
    assert not eng.later(q, 473)
    eng.cfg.express_tokens = Config().express_tokens
    # the loop: decode slot 1, publish, assign (it starts the held turn on slot 2), decode slot 2
    trace = []
    eng.model.decode = lambda: trace.append(("decode", eng.model.batch[0][0])) or 0
    eng.model.is_eog = lambda tok: False
    eng.publish = lambda: trace.append(("publish",)) or eng.out.clear()
    eng.slots[1].sampler, eng.slots[1].n_predict = Five(), 16
    generating(eng, [0])
    eng.kv = type("KV", (), {"stepped": lambda self: None, "prompt_done": lambda self, s: None})()  # on; assign stubbed
    eng.queue.append(q)

    def assign():
        trace.append(("assign",))
        eng.queue.popleft()
        prompting(eng, 2, 500, t=2.0, cached=473)
        eng.slots[2].sampler, eng.slots[2].n_predict = Five(), 16

    eng.assign = assign
    eng.express()
    assert trace == [("decode", 1), ("publish",), ("assign",), ("decode", 2), ("publish",)]
    assert eng.slots[2].state == SLOT_GEN and not eng.queue
