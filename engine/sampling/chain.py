"""llama.cpp's sampler chain, run on the host over a candidate array we own.

What the fast paths (engine/sampling/fast.py) do not cover: penalties, typical_p,
top_n_sigma, top_k <= 0 or > TOPK_MAX, grammar. The chain is built in the
order common/sampling.cpp builds it; the grammar is handled as llama-server
does (sample unconstrained, check the token against the grammar, re-sample
with the grammar applied first only on a miss). engine/sampling/ondevice.py attaches
the same chain to the decode graph.
"""
from __future__ import annotations

import ctypes
import math
from typing import Any, Optional, Sequence

import numpy as np

import llama_cpp as L

from engine.vocab import log_mark, log_since
from ipc.layout import lazy_header

from .base import Sampler


def build_chain(model: Any, p: dict, ids: Optional[np.ndarray], vals: Optional[np.ndarray],
                greedy: bool = False) -> tuple[Any, int, bool]:
    """A llama.cpp sampler chain in common/sampling.cpp's order (logit_bias,
    penalties, top_k, typical, top_p, min_p, temp_ext, dist), or logit_bias
    + greedy for ``greedy``. Returns (chain, penalty window, penalties on).
    Neutral stages are llama.cpp's empty samplers, which is what lets the
    whole chain run on the device (engine/sampling/ondevice.py) when typical_p is 1.
    The caller owns the chain (llama_sampler_free)."""
    cp = L.llama_sampler_chain_default_params()
    cp.no_perf = True
    chain = L.llama_sampler_chain_init(cp)
    add = lambda s: L.llama_sampler_chain_add(chain, s)  # noqa: E731  (chain owns s)
    n = model.n_vocab
    if ids is not None:
        lb = (L.llama_logit_bias * ids.size)(*[L.llama_logit_bias(int(a), float(b)) for a, b in zip(ids, vals)])
        add(L.llama_sampler_init_logit_bias(n, ids.size, lb))
    last_n = int(p["repeat_last_n"])
    # A slot never holds more than n_ctx_slot tokens, so a longer window is the
    # same window; unclamped, llama.cpp allocates it (2^31 - 1: 8 GiB, 40 s).
    last_n = model.n_ctx_slot if last_n < 0 else min(last_n, model.n_ctx_slot)
    penalties = last_n > 0 and not (
        p["repeat_penalty"] == 1.0 and p["frequency_penalty"] == 0.0 and p["presence_penalty"] == 0.0
    )
    if greedy:
        add(L.llama_sampler_init_greedy())
        return chain, last_n, False
    add(L.llama_sampler_init_penalties(n, last_n, p["repeat_penalty"], p["frequency_penalty"], p["presence_penalty"]))
    if p["top_n_sigma"] > 0:  # common/sampling.cpp's order: after the penalties (off: no stage, device chains as before)
        add(L.llama_sampler_init_top_n_sigma(p["top_n_sigma"]))
    add(L.llama_sampler_init_top_k(int(p["top_k"])))
    keep = int(p["min_keep"])  # common/sampling.cpp passes the request's min_keep to these three (and xtc)
    add(L.llama_sampler_init_typical(p["typical_p"], keep))
    add(L.llama_sampler_init_top_p(p["top_p"], keep))
    add(L.llama_sampler_init_min_p(p["min_p"], keep))
    add(L.llama_sampler_init_temp_ext(p["temperature"], 0.0, 1.0))
    add(L.llama_sampler_init_dist(int(p["seed"]) & 0xFFFFFFFF))
    return chain, last_n, penalties


class GrammarDeadEnd(ValueError):
    """The grammar (with the bans: ignore_eos, logit_bias false) allows no
    token here. llama.cpp would throw from llama_sampler_accept, through
    ctypes, into std::terminate: the engine would abort. The request's fault."""


def lazy_grammar(grammar: bytes) -> tuple[dict | None, bytes]:
    """(a lazy grammar's settings, or None; the GBNF): ipc/layout.py
    LAZY_GRAMMAR. Only the workers' own tool-call grammars carry the header
    (frontends/text/params.py moves a request's look-alike a line down);
    its shape is checked all the same, a ValueError (400), not an engine
    exception: a dict whose "patterns" is a list of strings."""
    try:
        lazy, gbnf = lazy_header(grammar)
    except ValueError:
        raise ValueError("failed to parse grammar: a bad lazy-grammar header") from None
    pats = lazy.get("patterns", []) if isinstance(lazy, dict) else None
    if lazy is not None and not (isinstance(pats, list) and all(isinstance(x, str) for x in pats)):
        raise ValueError("failed to parse grammar: a bad lazy-grammar header")
    return lazy, gbnf


class Chain(Sampler):
    """A llama.cpp sampler chain applied to a candidate array we own.

    llama_sampler_sample(chain, ctx, i) would do the same but hides the
    candidates (needed for post_sampling_probs and the grammar check) and
    calls llama_sampler_accept itself: calling accept() after it would count
    every token twice in the penalties."""

    kind = "chain"

    def __init__(self, model: Any, p: dict, grammar: bytes, ids: Optional[np.ndarray], vals: Optional[np.ndarray],
                 greedy: bool = False) -> None:
        super().__init__(model, p, ids, vals)
        self.chain = None
        self.grammar = None
        self.lazy = False  # the grammar waits for a trigger (native tool calls)
        # the grammar is held off (neither applied nor fed): a reasoning budget sets it while the
        # model thinks, so a lazy grammar's trigger inside the thoughts starts nothing (budget.py)
        self.hold = False
        vocab = model.vocab.vocab
        if grammar:
            mark = log_mark()
            lazy, grammar = lazy_grammar(grammar)
            if lazy is None:
                g = L.llama_sampler_init_grammar(vocab, grammar, b"root")
            else:  # off until a trigger pattern matches the generated text (native tool calls)
                pats = [x.encode() for x in lazy.get("patterns", [])]
                arr = (ctypes.c_char_p * max(len(pats), 1))(*pats)
                toks = (L.llama_token * 1)()
                g = L.llama_sampler_init_grammar_lazy_patterns(vocab, grammar, b"root", arr, len(pats), toks, 0)
            if not g:  # libllama logged why: quote it
                why = [s for s in log_since(mark) if s.strip() and s.strip() != "failed to parse grammar"]
                raise ValueError("failed to parse grammar" + (f": {why[0].strip()}" if why else ""))
            self.grammar, self.lazy = g, lazy is not None
        self.chain, self.last_n, self.penalties = build_chain(model, p, ids, vals, greedy)
        self.seed = L.llama_sampler_get_seed(self.chain)
        self.buf: Optional[np.ndarray] = None  # llama_token_data {id, logit, p} x n_vocab, on first use
        self.cur = L.llama_token_data_array(data=None, size=0, selected=-1, sorted=False)
        self._one = (L.llama_token_data * 1)()
        self._one_arr = L.llama_token_data_array(data=self._one, size=1, selected=-1, sorted=False)

    def _buffer(self) -> np.ndarray:
        """The candidate array (3 MiB for 262k ids): allocated on the first
        host-side pick, so an on-device sampler that never needs it never pays."""
        if self.buf is None:
            self.buf = np.zeros((self.n_vocab, 3), np.int32)
            self._ar = np.arange(self.n_vocab, dtype=np.int32)
            self.cur.data = ctypes.cast(self.buf.ctypes.data, L.llama_token_data_p)
        return self.buf

    def _fill(self, l: np.ndarray) -> None:
        buf = self._buffer()
        buf[:, 0] = self._ar
        buf[:, 1] = l.view(np.int32)
        buf[:, 2] = 0
        self.cur.size = self.n_vocab
        self.cur.selected = -1
        self.cur.sorted = False

    def _pick(self) -> int:
        j = self.cur.selected
        if not 0 <= j < self.cur.size:
            raise RuntimeError("sampler chain selected no token (all candidates masked)")
        return int(self.buf[j, 0])

    def pick(self, l: np.ndarray) -> int:
        self._l = l
        cur = ctypes.byref(self.cur)
        self._fill(l)
        L.llama_sampler_apply(self.chain, cur)
        t = self._pick()
        if self.grammar is not None and not self.hold:
            self._one[0].id, self._one[0].logit, self._one[0].p = t, 1.0, 0.0
            self._one_arr.size, self._one_arr.selected, self._one_arr.sorted = 1, -1, False
            L.llama_sampler_apply(self.grammar, ctypes.byref(self._one_arr))
            if self._one[0].logit == -math.inf:  # rejected: grammar first, then the chain
                self._fill(l)
                L.llama_sampler_apply(self.grammar, cur)
                L.llama_sampler_apply(self.chain, cur)
                t = self._pick()
                # every candidate masked: the chain still "selects" one, which the grammar cannot accept
                if not self.buf[self.cur.selected:self.cur.selected + 1, 1].view(np.float32)[0] > -math.inf:
                    raise GrammarDeadEnd("the grammar allows no token here (a dead end, or only an "
                                         "end-of-generation token that ignore_eos or logit_bias bans)")
        self.tok = t
        if self.post:
            m = self.cur.size
            self._post = (self.buf[:m, 0].copy(), self.buf[:m, 2].view(np.float32).copy())
        return t

    def prime(self, tokens: Sequence[int]) -> None:
        if self.penalties:
            for t in list(tokens)[-self.last_n:]:
                L.llama_sampler_accept(self.chain, int(t))

    def accept(self, token: int) -> None:
        if self.grammar is not None and not self.hold:
            L.llama_sampler_accept(self.grammar, token)
        L.llama_sampler_accept(self.chain, token)

    def feed_grammar(self, tokens: Sequence[int]) -> None:
        """The grammar alone sees ``tokens`` (the thinking's end marker,
        replayed when a held-off grammar comes back on: it may hold a trigger)."""
        if self.grammar is not None:
            for t in tokens:
                L.llama_sampler_accept(self.grammar, int(t))

    def free(self) -> None:
        if self.chain:
            L.llama_sampler_free(self.chain)
            self.chain = None
        if self.grammar:
            L.llama_sampler_free(self.grammar)
            self.grammar = None

    def __del__(self) -> None:
        try:
            self.free()
        except Exception:  # noqa: BLE001 - interpreter shutdown: the library may be gone
            pass
