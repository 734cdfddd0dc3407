"""The draft model (``-md/--spec-draft-model``, ``--spec-type draft-simple``).

A second, smaller llama_model with its own llama_context: one sequence per
slot (seq id = slot id, kv_unified off, a slot's context the target's), so
its KV per slot is private as the target's is. Its vocabulary must be the
target's as llama-server checks it (common_speculative_are_compatible: same
vocabulary type, the same BOS/EOS when added, sizes within 128 and the same
text for every token id from 5 on): else the server does not start.

Per slot, ``toks[slot]`` are the tokens whose KV the draft context holds
(the invariant of engine/slots.py, for the draft's own sequence). A draft
first syncs the sequence with the slot's history + the token just sampled:
the common prefix stays (accepted drafts included: they are the target's
history now), the rest is removed with seq_rm, and the missing tokens are
evaluated, at most ``CATCH_UP`` per step (a long prompt is caught up over
several steps, and the slot drafts nothing until then, so no step stalls
on the draft model). Then up to ``n_max`` tokens are drafted greedily, one
decode per drafted position for every drafting slot together, a slot
stopping early when its top token's probability falls below ``p_min``
(llama-server's --spec-draft-p-min).
"""
from __future__ import annotations

import ctypes
import os

import numpy as np

import llama_cpp as L

from engine.llbatch import Batch, _logits_ith
from engine.vocab import ModelError, init_backend, log_tail

CATCH_UP = 512  # draft-context tokens evaluated per slot per step while catching up
VOCAB_DIFF = 128  # SPEC_VOCAB_MAX_SIZE_DIFFERENCE
VOCAB_CHECK_FROM = 5  # SPEC_VOCAB_CHECK_START_TOKEN_ID


def compatible(tgt, dft) -> str:
    """"" if the vocabularies allow speculation, else why not (llama-server's checks)."""
    vt, vd = L.llama_model_get_vocab(tgt), L.llama_model_get_vocab(dft)
    if L.llama_vocab_type(vt) != L.llama_vocab_type(vd):
        return "draft model vocab type must match target model to use speculation"
    for add, tok, what in ((L.llama_vocab_get_add_bos, L.llama_vocab_bos, "bos"),
                           (L.llama_vocab_get_add_eos, L.llama_vocab_eos, "eos")):
        if add(vt) != add(vd) or (add(vt) and tok(vt) != tok(vd)):
            return f"draft model {what} tokens must match target model to use speculation"
    nt, nd = L.llama_vocab_n_tokens(vt), L.llama_vocab_n_tokens(vd)
    if abs(nt - nd) > VOCAB_DIFF:
        return (f"draft model vocab must closely match target model to use speculation but target vocab size "
                f"{nt} does not match draft vocab size {nd} - difference {abs(nt - nd)}, max allowed {VOCAB_DIFF}")
    for i in range(VOCAB_CHECK_FROM, min(nt, nd)):
        if L.llama_vocab_get_text(vt, i) != L.llama_vocab_get_text(vd, i):
            return f"draft model vocab must match target model to use speculation but token {i} content differs"
    return ""


class DraftModel:
    """A draft model's weights, context and per-slot token lists (module doc)."""

    name = "draft-simple"

    def __init__(self, cfg, target) -> None:
        init_backend()
        path = cfg.spec_draft_model
        if not os.path.exists(path):
            raise ModelError(f"draft model file not found: {path}")
        mp = L.llama_model_default_params()
        mp.n_gpu_layers = cfg.spec_draft_ngl
        self.model = L.llama_model_load_from_file(os.fsencode(path), mp)
        self.ctx = None
        if not self.model:
            raise ModelError(f"failed to load draft model {path!r}: {log_tail(4)}")
        why = compatible(target.model, self.model)
        if why:
            self.close()
            raise ModelError(why)
        n_seq = cfg.parallel
        cp = L.llama_context_default_params()
        cp.n_ctx = target.n_ctx_slot * n_seq
        cp.n_batch = target.n_batch
        cp.n_ubatch = target.n_ubatch
        cp.n_seq_max = n_seq
        n = cfg.spec_draft_threads if cfg.spec_draft_threads > 0 else cfg.n_threads
        cp.n_threads = cp.n_threads_batch = n
        cp.n_outputs_max = n_seq  # one drafted position per slot per decode
        cp.n_outputs_max_per_seq = 1
        cp.kv_unified = False
        cp.no_perf = True
        self.ctx = L.llama_init_from_model(self.model, cp)
        if not self.ctx:
            self.close()
            raise ModelError(f"failed to create the draft context: {log_tail(4)}")
        self.mem = L.llama_get_memory(self.ctx)
        self.n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(self.model))
        # compatible() allows the draft's vocabulary VOCAB_DIFF tokens past the target's: an id from there in
        # the target's batch makes llama_decode refuse the whole step ("invalid token"), every slot in it
        self.n_target = L.llama_vocab_n_tokens(L.llama_model_get_vocab(target.model))
        self.n_ctx_slot = L.llama_n_ctx_seq(self.ctx)
        self.batch = Batch(L.llama_n_batch(self.ctx), n_seq)
        self.toks = [np.empty(0, np.int32) for _ in range(n_seq)]
        self._farr = ctypes.c_float * self.n_vocab

    def reset(self, slot: int) -> None:
        L.llama_memory_seq_rm(self.mem, slot, -1, -1)
        self.toks[slot] = np.empty(0, np.int32)

    def _logits(self, i: int) -> np.ndarray:
        return np.frombuffer(self._farr.from_address(_logits_ith(self.ctx, i)), np.float32)

    def _decode(self) -> bool:
        return L.llama_decode(self.ctx, self.batch.view()) == 0

    def draft(self, want: list[tuple[int, np.ndarray, int, int, float]]) -> dict[int, np.ndarray]:
        """Drafts for (slot, history, sampled, n_max, p_min) (module doc);
        slots still catching up (or failing) get none."""
        b = self.batch
        b.clear()
        live: dict[int, tuple[int, int, float]] = {}  # slot -> (batch index, n_max, p_min)
        for slot, hist, sampled, n_max, p_min in want:
            full = np.append(hist, np.int32(sampled)).astype(np.int32)
            if len(full) + n_max >= self.n_ctx_slot:
                continue
            have = self.toks[slot]
            m = min(len(have), len(full) - 1)  # the last token is always evaluated: its logits draft
            c = int(np.flatnonzero(have[:m] != full[:m])[0]) if m and (have[:m] != full[:m]).any() else m
            if c < len(have):
                L.llama_memory_seq_rm(self.mem, slot, c, -1)
            todo = full[c:]
            room = b.cap - b.n
            if len(todo) > min(CATCH_UP, room):  # catch up now, draft in a later step
                k = min(CATCH_UP, room)
                if k > 0:
                    b.add_many(todo[:k], c, slot, False)
                    self.toks[slot] = full[:c + k]
                else:
                    self.toks[slot] = full[:c]
                continue
            i = b.add_many(todo, c, slot, True)
            self.toks[slot] = full
            live[slot] = (i, n_max, p_min)
        out: dict[int, list[int]] = {s: [] for s in live}
        if b.n == 0:
            return {}
        if not self._decode():
            for slot in list(live) + [w[0] for w in want]:
                self.reset(slot)
            return {}
        while live:
            b.clear()
            nxt = {}
            for slot, (i, n_max, p_min) in live.items():
                l = self._logits(i)
                t = int(l.argmax())
                if t >= self.n_target:  # a token the target does not have: the draft ends before it
                    continue
                if p_min > 0.0:
                    m = float(l[t])
                    if 1.0 / float(np.exp(l - m).sum(dtype=np.float64)) < p_min:
                        continue
                out[slot].append(t)
                if len(out[slot]) >= n_max:  # its KV need not hold the last draft: the target checks it
                    continue
                pos = len(self.toks[slot])
                nxt[slot] = (b.add(t, pos, slot, True), n_max, p_min)
                self.toks[slot] = np.append(self.toks[slot], np.int32(t))
            live = nxt
            if live and not self._decode():
                for slot in live:
                    self.reset(slot)
                break
        return {s: np.array(d, np.int32) for s, d in out.items() if d}

    def close(self) -> None:
        if self.ctx:
            L.llama_free(self.ctx)
            self.ctx = None
        if self.model:
            L.llama_model_free(self.model)
            self.model = None
