"""Slots and the requests waiting for them.

A slot is one llama.cpp sequence (seq id = slot id) with its own region of
the KV cache (n_ctx_slot tokens). Invariant: ``cache[:n_past]`` are exactly
the tokens whose keys and values sit in the slot's KV, so the common prefix
of a new prompt with ``cache`` is reusable as is.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from ipc.layout import SLOT_GEN, SLOT_IDLE, SLOT_PAUSED, SLOT_PROMPT


@dataclass(slots=True)
class Request:
    """A submission the engine accepted, before and after it gets a slot."""

    channel: int
    rid: int
    t_submit: float = field(default_factory=time.perf_counter)
    id_slot: int = -1
    prompt: np.ndarray | None = None
    params: dict | None = None
    grammar: bytes = b""
    bias: np.ndarray | None = None
    n_match: int = 0  # cached prefix length when last ordered (engine/kvcache.py)


@dataclass(slots=True)
class Slot:
    id: int
    n_ctx: int
    cache: np.ndarray = None  # token ids in this slot's KV, [:n_past] valid
    n_past: int = 0
    state: int = SLOT_IDLE
    req: Request | None = None
    sampler: object = None
    i_prompt: int = 0  # next prompt position to evaluate
    n_cache: int = 0  # prompt tokens reused from the KV
    n_decoded: int = 0
    n_predict: int = -1
    last: int = -1  # sampled, published, not yet in the KV
    i_batch: int = -1  # batch index whose logits this slot samples this step
    held: tuple | None = None  # a record the ring had no room for (paused)
    t_start: float = 0.0
    t_first: float = 0.0
    t_used: float = 0.0  # for least-recently-used assignment
    t_paused: float = 0.0
    erase: bool = False  # erase the KV once idle
    n_probs: int = 0
    ignore_eos: bool = False
    id_task: int = -1  # kept after release: /slots shows a used slot's last task
    n_prompt: int = 0  # prompt length of the last task (kept after release)
    reported: bool = False  # result area written and counted
    progress: bool = False  # the request wants F_PROGRESS records
    fed: bool = False  # a prompt chunk of this slot is in this step's batch
    entry: object = None  # its content's entry in the prefix tree (engine/kvcache.py), or None
    # context shifts of the running request (engine/shift.py): tokens dropped, and the prefix whose KV is still
    # what a from-scratch evaluation gives (cache[:n_exact]; -1: all of cache[:n_past])
    n_discarded: int = 0
    n_exact: int = -1

    def __post_init__(self) -> None:
        self.cache = np.full(self.n_ctx, -1, np.int32)

    @property
    def idle(self) -> bool:
        return self.state == SLOT_IDLE

    @property
    def generating(self) -> bool:
        return self.state == SLOT_GEN

    @property
    def paused(self) -> bool:
        return self.state == SLOT_PAUSED

    @property
    def prompting(self) -> bool:
        return self.state == SLOT_PROMPT

    @property
    def remaining(self) -> int:
        """Prompt tokens still to evaluate (cached ones never count)."""
        return 0 if self.req is None else len(self.req.prompt) - self.i_prompt

    def prefix(self, prompt: np.ndarray) -> int:
        """Length of the common prefix of ``prompt`` and the cached tokens."""
        m = min(self.n_past, len(prompt))
        if m == 0:
            return 0
        diff = np.flatnonzero(self.cache[:m] != prompt[:m])
        return int(diff[0]) if len(diff) else m


def runs(slots: list[Slot], s: Slot) -> int:
    """How the step's runs of consecutive busy sequence ids change if idle
    slot ``s`` starts a request: -1 it joins two runs, 0 it extends one,
    +1 it starts a new one.

    Why it matters: over the per-slot KV streams llama.cpp splits a batch
    into ubatches of consecutive sequence ids (split_equal(sequential);
    engine/spec/plan.py), each a pass over the weights, so 31 streams in two
    runs decode in ~215 ms where 32 in one take ~120 (bench_spec plain/32,
    2 threads). Least-recently-used alone scatters new requests over the ids
    once earlier requests ended out of order (with speculation: 4-5 runs
    while 32 prompts were admitted, each such step 30-60% dearer)."""
    i = s.id
    left = i > 0 and not slots[i - 1].idle
    right = i + 1 < len(slots) and not slots[i + 1].idle
    return 1 - int(left) - int(right)


def fresh(slots: list[Slot], idle: list[Slot]) -> Slot:
    """The idle slot for a request that reuses nothing: the one that keeps
    busy ids together (`runs`), then the least recently used."""
    return min(idle, key=lambda s: (runs(slots, s), s.t_used))


def pick(slots: list[Slot], req: Request, similarity: float = 0.10) -> Slot | None:
    """The slot a request goes to, as llama-server's get_available_slot: its
    id_slot if idle; else the idle slot sharing the longest prefix with its
    prompt, if that prefix is more than ``similarity`` of the prompt; else
    the idle one that keeps busy sequence ids together (`runs`), then the
    least recently used (so a shared BOS or system line alone does not
    pull every conversation onto one slot's cache). None: wait (FIFO) for
    a slot to free."""
    if req.id_slot >= 0:
        s = slots[req.id_slot % len(slots)]
        return s if s.idle else None
    idle = [s for s in slots if s.idle]
    if not idle:
        return None
    best = max(idle, key=lambda s: (s.prefix(req.prompt), -s.t_used))
    n = best.prefix(req.prompt)
    if n > 0 and n > similarity * len(req.prompt):
        return best
    return fresh(slots, idle)
