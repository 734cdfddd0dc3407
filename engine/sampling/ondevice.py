"""On-device ("backend") sampling, llama-server's ``--backend-sampling``.

Why: on a GPU a decode step of 128 sequences takes a few milliseconds, and
copying 128 rows of 262k float logits to the host (~130 MB) and picking a
token from each there costs as much again. llama.cpp can append a sampler
chain per sequence to the decode graph (``llama_set_sampler``); the step then
returns one token id per sequence (``llama_get_sampled_token_ith``), and the
raw logits of a ubatch are copied to the host only when one of its outputs
belongs to a sequence without such a chain (llama_context::decode,
``needs_raw_logits``). Logits rows cannot be requested one by one: a host-
sampled slot in a ubatch brings every row of that ubatch to the host.

Semantics mirror tools/server (server-context.cpp ``launch_slot``): a slot's
chain is attached when its request starts and detached when it ends; a
request that needs the raw logits (n_probs, hence post_sampling_probs too),
a grammar, or typical_p < 1 (typical has no device kernel, so only a prefix
of the chain would run there) keeps the host samplers (engine/sampling/fast.py,
engine/sampling/chain.py); engine/sampling/__init__.py `make_sampler` decides. The chain is
the host Chain's (engine/sampling/chain.py: same order, same seed: dist draws its
uniform from the same std::mt19937 on the host per step), or logit_bias +
greedy for greedy requests. If the device cannot run part of the chain, llama.cpp runs
the supported prefix there and leaves the filtered candidates
(``llama_get_sampled_logits_ith``); ``sample`` then finishes on the host with
the same chain, whose apply skips its on-device prefix, as
common_sampler_sample does.

Lifetime: the context keeps a raw pointer to the chain: ``free`` detaches
before freeing (Model.close frees samplers before the context).
"""
from __future__ import annotations

import ctypes
from typing import Any, Optional

import numpy as np

import llama_cpp as L

from .chain import Chain

_lib = L.llama_cpp._lib
_i32, _u32, _vp = ctypes.c_int32, ctypes.c_uint32, ctypes.c_void_p
# Re-declared with bare pointers, as model.py's _logits_ith: one call per slot per step.
_token_ith = ctypes.CFUNCTYPE(_i32, _vp, _i32)(("llama_get_sampled_token_ith", _lib))
_logits_ith = ctypes.CFUNCTYPE(_vp, _vp, _i32)(("llama_get_sampled_logits_ith", _lib))
_logits_n = ctypes.CFUNCTYPE(_u32, _vp, _i32)(("llama_get_sampled_logits_count_ith", _lib))
_probs_ith = ctypes.CFUNCTYPE(_vp, _vp, _i32)(("llama_get_sampled_probs_ith", _lib))
_probs_n = ctypes.CFUNCTYPE(_u32, _vp, _i32)(("llama_get_sampled_probs_count_ith", _lib))
_cands_ith = ctypes.CFUNCTYPE(_vp, _vp, _i32)(("llama_get_sampled_candidates_ith", _lib))
_set_sampler = ctypes.CFUNCTYPE(ctypes.c_bool, _vp, _i32, _vp)(("llama_set_sampler", _lib))
TOKEN_NULL = -1  # LLAMA_TOKEN_NULL


TOP_K_MAX = 1024  # a larger top_k keeps the host samplers (eligible)


def eligible(p: dict, grammar: bytes) -> bool:
    """Whether a request's sampling can run on the device (see module doc).

    Also on the host: a top_k past TOP_K_MAX, because the device top_k is
    ggml_top_k, which asserts (GGML_ASSERT, the engine aborts) that k fits its
    row, and the row it gets can be shorter than the vocabulary (Gemma 3,
    262,144 tokens: top_k 150,000 aborted the engine, 131,072 did not), while
    the host sampler clamps; a request's field must never end the engine. And
    min_p >= 1, which the device's min_p (a strict ``logit > max + log(min_p)``
    step) turns into a mask of every token, the top one included, where the
    host keeps the top token (llama-sampler.cpp; seen: garbage text). And
    min_keep > 1, which the host's llama chain applies (its device kernels
    are not checked for it here)."""
    return (not grammar and int(p["n_probs"]) <= 0 and p["typical_p"] >= 1.0
            and int(p["top_k"]) <= TOP_K_MAX and p["min_p"] < 1.0 and int(p["min_keep"]) <= 1)


class OnDevice(Chain):
    """A Chain attached to sequence ``seq`` of the model's context.

    ``attached`` is False when llama.cpp refused the chain (e.g. tensor split
    mode); the sampler then works as a plain host Chain."""

    kind = "device"

    def __init__(self, model: Any, p: dict, ids: Optional[np.ndarray], vals: Optional[np.ndarray], seq: int,
                 greedy: bool) -> None:
        super().__init__(model, p, b"", ids, vals, greedy=greedy)
        self.ctx = model.ctx
        self.seq = seq
        self.attached = bool(_set_sampler(self.ctx, seq, self.chain))
        if not self.attached:
            _set_sampler(self.ctx, seq, None)
            self.kind = "chain"  # what it now is: the engine counts device tokens by kind

    def sample(self, model: Any, i: int) -> int:
        if not self.attached:
            return super().sample(model, i)
        t = _token_ith(self.ctx, i)
        if t != TOKEN_NULL:
            self.tok = t
            return t
        return self._finish_on_host(model, i)

    def _finish_on_host(self, model: Any, i: int) -> int:
        """The device ran only a prefix of the chain: apply the rest to the
        candidates it left (the chain's apply skips its device prefix)."""
        n = _logits_n(self.ctx, i)
        lp = _logits_ith(self.ctx, i)
        if not n or not lp:  # nothing ran there: the raw row was copied
            return self.pick(model.logits(i))
        buf = self._buffer()
        logits = np.frombuffer((ctypes.c_float * n).from_address(lp), np.float32)
        cp = _cands_ith(self.ctx, i)
        buf[:n, 0] = np.frombuffer((ctypes.c_int32 * n).from_address(cp), np.int32) if cp else self._ar[:n]
        buf[:n, 1] = logits.view(np.int32)
        pp, npr = _probs_ith(self.ctx, i), _probs_n(self.ctx, i)
        buf[:n, 2] = np.frombuffer((ctypes.c_int32 * n).from_address(pp), np.int32) if pp and npr == n else 0
        self._reset(n)
        L.llama_sampler_apply(self.chain, ctypes.byref(self.cur))
        self.tok = self._pick()
        return self.tok

    def free(self) -> None:
        if self.chain and self.attached:
            _set_sampler(self.ctx, self.seq, None)  # before the chain it points at is freed
            self.attached = False
        super().free()
