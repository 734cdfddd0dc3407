"""A fake of llama.cpp's per-slot streams, and a step driver over it, for
tests/test_prefix.py and tests/test_prefix_policy.py.

The fake keeps, per stream, which positions a sequence holds (cell
metadata, changed at once) and which token each position's KV was computed
from (buffer data). As in llama.cpp, a cross-stream `seq_cp` copies the
metadata at once and the buffer only at the next decode, `state_get` /
`state_set` touch buffers at once and `state_get` leaves out sliding-window
cells outside the window. `run` checks, after every decode, the property
both modules rely on: each slot's KV at positions [0, k) was computed from
exactly the request's prompt tokens (no cross-talk), with the
sliding-window cells before k present.
"""
from __future__ import annotations

import pickle

import numpy as np

from engine.kvcache import SlotCache
from engine.slots import Request, Slot
from ipc.layout import SLOT_GEN, SLOT_IDLE, SLOT_PROMPT


class FakeStreams:
    n_ctx_slot = 4096

    """Per-slot streams: meta[s] = {pos: in_swa} (what llama.cpp's cells say:
    the full-attention cache holds every position, the sliding-window cache
    those with in_swa), data[s] = {pos: token} (what the buffers hold)."""

    def __init__(self, n: int, n_swa: int = 0) -> None:
        self.n_swa = n_swa
        self.meta = [dict() for _ in range(n)]
        self.data = [dict() for _ in range(n)]
        self.pending: list[tuple[int, int]] = []

    def pos_min(self, s: int) -> int:  # as llama_kv_cache_iswa's: the sliding-window cache's
        w = [p for p, in_swa in self.meta[s].items() if in_swa]
        return min(w) if w else -1

    def pos_max(self, s: int) -> int:
        return max(self.meta[s]) if self.meta[s] else -1

    def seq_rm(self, s: int, p0: int = -1, p1: int = -1) -> bool:
        p0 = 0 if p0 < 0 else p0
        p1 = 1 << 30 if p1 < 0 else p1
        self.meta[s] = {p: t for p, t in self.meta[s].items() if not p0 <= p < p1}
        return True

    def seq_clear(self, s: int) -> None:
        self.meta[s] = {}

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        assert p0 < 0 and p1 < 0, "llama.cpp asserts on partial cross-stream copies"
        self.meta[dst] = dict(self.meta[src])
        self.pending.append((src, dst))

    def state_get(self, s: int, swa_only: bool = False) -> np.ndarray:
        top = max(self.meta[s])
        keep = {p: (self.data[s][p], sw and not (self.n_swa and top - p >= self.n_swa)) for p, sw in self.meta[s].items()}
        if swa_only:  # LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY: the sliding-window cache alone
            keep = {p: v for p, v in keep.items() if v[1]}
        return np.frombuffer(pickle.dumps((swa_only, keep)), np.uint8).copy()

    def state_size(self, s: int, swa_only: bool = False) -> int:  # never a read (a test may count state_get's)
        return FakeStreams.state_get(self, s, swa_only).nbytes

    def state_set(self, s: int, blob: np.ndarray, swa_only: bool = False) -> bool:
        partial, keep = pickle.loads(blob.tobytes())
        assert partial == swa_only
        if swa_only:  # the sliding-window cache replaced, the full-attention one kept
            self.meta[s] = {p: p in keep for p in self.meta[s]}
        else:
            self.meta[s] = {p: sw for p, (_, sw) in keep.items()}
        self.data[s].update({p: t for p, (t, _) in keep.items()})
        return True

    def decode(self, writes: list[tuple[int, int, np.ndarray]]) -> None:
        for src, dst in self.pending:  # in order, before the batch is computed
            self.data[dst] = dict(self.data[src])
        self.pending.clear()
        for s, p0, toks in writes:
            for i, t in enumerate(toks):
                self.meta[s][p0 + i] = True
                self.data[s][p0 + i] = int(t)


def make(n_slots: int = 3, n_swa: int = 0, ram: int = 64, sps: float = 0.1, streams: int = 0):
    kv = FakeStreams(n_slots + streams, n_swa)
    slots = [Slot(i, 4096) for i in range(n_slots)]
    cache = SlotCache(kv, slots, np.zeros(64), 2.0, ram, sps, streams)
    return kv, slots, cache


def req(prompt, rid: int = 0, id_slot: int = -1, cache_prompt: int = 1) -> Request:
    return Request(0, rid, prompt=np.asarray(prompt, np.int32), params={"cache_prompt": cache_prompt},
                   id_slot=id_slot)


def run(kv: FakeStreams, cache: SlotCache, reqs: list[Request], gen: int = 5, check_swa: bool = True) -> list[int]:
    """Start every request that gets a slot, decode their prompts in one
    step, check each slot's KV, generate ``gen`` tokens, release. Returns the
    prefixes attached."""
    started = []
    for r in reqs:
        got = cache.pick(r)
        if got is None:  # its slot is taken this step
            continue
        s, src, k = got
        k = cache.attach(s, r.prompt, src, k)
        s.req, s.state, s.n_past, s.n_prompt, s.n_cache = r, SLOT_PROMPT, k, len(r.prompt), k  # busy: pick skips it
        started.append((s, r, k))
    kv.decode([(s.id, k, r.prompt[k:]) for s, r, k in started])
    cache.stepped()
    for s, r, k in started:
        held = kv.meta[s.id]
        for p in range(k):  # the reused KV was computed from this prompt's own tokens
            assert kv.data[s.id].get(p) == r.prompt[p], (s.id, p)
        if check_swa and kv.n_swa:
            assert all(held.get(p) for p in range(max(0, k - kv.n_swa), k))
        s.cache[:len(r.prompt)] = r.prompt
        s.n_past = len(r.prompt)
        cache.prompt_done(s)
        s.state = SLOT_GEN
    for s, r, k in started:
        out = np.random.default_rng(r.rid).integers(1000, 2000, gen).astype(np.int32)
        kv.decode([(s.id, s.n_past, out)])
        s.cache[s.n_past:s.n_past + gen] = out
        s.n_past += gen
        s.state, s.req = SLOT_IDLE, None
        cache.release(s)
    return [k for _, _, k in started]
