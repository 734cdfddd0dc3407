"""A llama_batch over numpy buffers, and the logits pointer call (engine/model.py's decode I/O).

Why a module: the batch is the one structure the step loop writes per token
(engine/batch.py through Model.add/add_many) and the draft model fills too
(engine/spec/draft.py); it owns its arrays so that adding a token is a few
numpy stores, never a ctypes call per field.
"""
from __future__ import annotations

import ctypes

import numpy as np

import llama_cpp as L

# float* llama_get_logits_ith(ctx, i), re-declared to return the bare address:
# building a numpy view from an int is ~1 us, from a POINTER(c_float) ~10 us.
_logits_ith = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32)(
    ("llama_get_logits_ith", L.llama_cpp._lib)
)


class Batch:
    """A llama_batch whose arrays are numpy buffers we own.

    llama_batch_init mallocs seq_id[i] separately per token, so no single
    numpy view can write them; here seq_id[i] points at seq[i] of one int32
    array and n_seq_id is fixed at 1, making `add` a handful of numpy stores.
    Invariant: entries [0, n) are valid; the C struct sees n only in `view()`.

    """

    def __init__(self, cap: int, max_out: int) -> None:
        self.cap = cap  # llama_n_batch: more tokens per decode abort the process
        self.max_out = max_out  # n_outputs_max: likewise for logits rows
        self.n = 0
        self.n_out = 0
        self.token = np.zeros(cap, np.int32)
        self.pos = np.zeros(cap, np.int32)
        self.seq = np.zeros(cap, np.int32)
        self.out = np.zeros(cap, np.int8)
        self._nseq = np.ones(cap, np.int32)
        self._ptrs = (self.seq.ctypes.data + 4 * np.arange(cap + 1, dtype=np.uint64)).astype(np.uint64)
        self._ptrs[cap] = 0
        self._ar = np.arange(cap, dtype=np.int32)
        i32 = ctypes.POINTER(ctypes.c_int32)
        self.struct = L.llama_batch(
            n_tokens=0,
            token=self.token.ctypes.data_as(i32),
            embd=None,
            pos=self.pos.ctypes.data_as(i32),
            n_seq_id=self._nseq.ctypes.data_as(i32),
            seq_id=self._ptrs.ctypes.data_as(ctypes.POINTER(i32)),
            logits=self.out.ctypes.data_as(ctypes.POINTER(ctypes.c_int8)),
        )

    def clear(self) -> None:
        self.n = self.n_out = 0

    def add(self, token: int, pos: int, seq: int, logits: bool) -> int:
        """Append one token; returns its index in the batch (the logits index)."""
        i = self.n
        if i >= self.cap:
            raise IndexError(f"batch full ({self.cap} tokens)")
        if logits:
            if self.n_out >= self.max_out:
                raise IndexError(f"more than {self.max_out} logits rows in one batch")
            self.n_out += 1
        self.token[i] = token
        self.pos[i] = pos
        self.seq[i] = seq
        self.out[i] = logits
        self.n = i + 1
        return i

    def add_many(self, tokens: Sequence[int] | np.ndarray, pos0: int, seq: int, logits_last: bool) -> int:
        """Append a prompt chunk at positions pos0.. of `seq`; returns the index
        of its last token (the one whose logits are wanted if logits_last)."""
        k = len(tokens)
        i, j = self.n, self.n + k
        if k == 0:
            raise ValueError("empty chunk")
        if j > self.cap:
            raise IndexError(f"batch full ({self.n} + {k} > {self.cap})")
        if logits_last:
            if self.n_out >= self.max_out:
                raise IndexError(f"more than {self.max_out} logits rows in one batch")
            self.n_out += 1
        self.token[i:j] = tokens
        np.add(self._ar[:k], pos0, out=self.pos[i:j])
        self.seq[i:j] = seq
        self.out[i:j] = 0
        self.out[j - 1] = logits_last
        self.n = j
        return j - 1

    def view(self) -> L.llama_batch:
        self.struct.n_tokens = self.n
        return self.struct
