"""llama.cpp's sampler chain, run on the host over a candidate array we own.

What the fast paths (engine/sampling/fast.py) do not cover: penalties, typical_p,
top_n_sigma, top_k <= 0 or > TOPK_MAX, grammar, and the stages only this
chain runs (DRY, XTC, dynamic temperature, mirostat, adaptive_p, infill, a
request's own ``samplers`` order: ``extra``). The chain is built as
common/sampling.cpp builds it; the grammar is handled as llama-server
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
from ipc.chain import BREAKERS, ORDER
from ipc.layout import lazy_header

from .base import Sampler


def extra(p: dict, order: str = ORDER) -> bool:
    """Whether the request needs a stage the fast paths and the device chain
    do not run: DRY, XTC, dynamic temperature, mirostat, or an order other
    than llama-server's default (a stage left out, moved or added)."""
    return (order != ORDER or int(p["mirostat"]) != 0 or p["dynatemp_range"] > 0
            or (p["dry_multiplier"] != 0 and int(p["dry_penalty_last_n"]) > 0)
            or (p["xtc_probability"] > 0 and p["xtc_threshold"] <= 0.5))


def build_chain(model: Any, p: dict, ids: Optional[np.ndarray], vals: Optional[np.ndarray],
                greedy: bool = False, order: str = ORDER,
                breakers: Sequence[str] = BREAKERS) -> tuple[Any, int, bool]:
    """A llama.cpp sampler chain as common/sampling.cpp builds it: logit_bias,
    then the stages of ``order`` (ipc/chain.py chars; llama-server's default:
    penalties, dry, top_n_sigma, top_k, typical, top_p, min_p, xtc,
    temp_ext), then dist (adaptive_p where the order names it); with
    mirostat 1 or 2 only temperature and mirostat after the bias. Or
    logit_bias + greedy for ``greedy``. Returns (chain, the window of prompt
    tokens the stages must see, whether any must). Neutral stages of the
    default order are llama.cpp's empty samplers or absent (dry, xtc,
    top_n_sigma), which is what lets the whole chain run on the device
    (engine/sampling/ondevice.py) when typical_p is 1. The caller owns the
    chain (llama_sampler_free)."""
    cp = L.llama_sampler_chain_default_params()
    cp.no_perf = True
    chain = L.llama_sampler_chain_init(cp)
    add = lambda s: L.llama_sampler_chain_add(chain, s)  # noqa: E731  (chain owns s)
    n = model.n_vocab
    if ids is not None:
        lb = (L.llama_logit_bias * ids.size)(*[L.llama_logit_bias(int(a), float(b)) for a, b in zip(ids, vals)])
        add(L.llama_sampler_init_logit_bias(n, ids.size, lb))
    if greedy:
        add(L.llama_sampler_init_greedy())
        return chain, 0, False
    seed = int(p["seed"]) & 0xFFFFFFFF
    miro = int(p["mirostat"])
    if miro:  # common/sampling.cpp: the order, the penalties and dry are not used
        add(L.llama_sampler_init_temp(p["temperature"]))
        add(L.llama_sampler_init_mirostat(n, seed, p["mirostat_tau"], p["mirostat_eta"], 100) if miro == 1
            else L.llama_sampler_init_mirostat_v2(seed, p["mirostat_tau"], p["mirostat_eta"]))
        return chain, 0, False
    # A slot never holds more than n_ctx_slot tokens, so a longer window is the
    # same window; unclamped, llama.cpp allocates it (2^31 - 1: 8 GiB, 40 s).
    last_n = int(p["repeat_last_n"])
    last_n = model.n_ctx_slot if last_n < 0 else min(last_n, model.n_ctx_slot)
    penalties = "e" in order and last_n > 0 and not (
        p["repeat_penalty"] == 1.0 and p["frequency_penalty"] == 0.0 and p["presence_penalty"] == 0.0)
    dry_n = min(int(p["dry_penalty_last_n"]), model.n_ctx_slot)  # -1: off in the vendored llama.cpp (init_dry)
    dry = "d" in order and p["dry_multiplier"] != 0 and p["dry_base"] >= 1.0 and dry_n > 0
    window = max(last_n if penalties else 0, dry_n if dry else 0)
    keep = int(p["min_keep"])  # common/sampling.cpp passes the request's min_keep to these (and xtc)
    adaptive = False
    for c in order:
        if c == "e":
            add(L.llama_sampler_init_penalties(n, last_n, p["repeat_penalty"], p["frequency_penalty"],
                                               p["presence_penalty"]))
        elif c == "d" and dry:  # off: no stage (llama.cpp's would be empty), device chains as before
            raw = [b if isinstance(b, bytes) else b.encode() for b in breakers]
            arr = (ctypes.c_char_p * max(len(raw), 1))(*raw)
            add(L.llama_sampler_init_dry(model.vocab.vocab, p["dry_multiplier"], p["dry_base"],
                                         int(p["dry_allowed_length"]), dry_n, arr, len(raw)))
        elif c == "s" and p["top_n_sigma"] > 0:  # off: no stage
            add(L.llama_sampler_init_top_n_sigma(p["top_n_sigma"]))
        elif c == "k":
            add(L.llama_sampler_init_top_k(int(p["top_k"])))
        elif c == "y":
            add(L.llama_sampler_init_typical(p["typical_p"], keep))
        elif c == "p":
            add(L.llama_sampler_init_top_p(p["top_p"], keep))
        elif c == "m":
            add(L.llama_sampler_init_min_p(p["min_p"], keep))
        elif c == "x" and p["xtc_probability"] > 0 and p["xtc_threshold"] <= 0.5:  # off: no stage
            add(L.llama_sampler_init_xtc(p["xtc_probability"], p["xtc_threshold"], keep, seed))
        elif c == "t":
            add(L.llama_sampler_init_temp_ext(p["temperature"], p["dynatemp_range"], p["dynatemp_exponent"]))
        elif c == "i":
            add(L.llama_sampler_init_infill(model.vocab.vocab))
        elif c == "a":  # like dist, it picks the token: last, in dist's place
            adaptive = True
    add(L.llama_sampler_init_adaptive_p(p["adaptive_target"], p["adaptive_decay"], seed) if adaptive
        else L.llama_sampler_init_dist(seed))
    return chain, window, window > 0


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
                 greedy: bool = False, order: str = ORDER, breakers: Sequence[str] = BREAKERS) -> None:
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
        self.chain, self.last_n, self.penalties = build_chain(model, p, ids, vals, greedy, order, breakers)
        # a stage with state of its own, updated by every apply (mirostat's mu, adaptive_p's average)
        self.stateful = not greedy and (int(p["mirostat"]) != 0 or "a" in order)
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
            self._base = self.buf.ctypes.data
        return self.buf

    def _reset(self, n: int) -> None:
        """The candidate array is the buffer's first ``n`` rows again. A stage
        may move its start: XTC drops the top tokens by advancing ``data``
        (llama-sampler.cpp), so the pointer is set anew before every apply;
        left moved, the next fill's ``size`` would run past the buffer's end
        (seen: heap corruption, "double free")."""
        self.cur.data = ctypes.cast(self._base, L.llama_token_data_p)
        self.cur.size, self.cur.selected, self.cur.sorted = n, -1, False

    def _rows(self) -> np.ndarray:
        """The buffer's rows the candidate array now spans (after a stage moved its start)."""
        at = (ctypes.cast(self.cur.data, ctypes.c_void_p).value - self._base) // self.buf.strides[0]
        return self.buf[at:at + self.cur.size]

    def _fill(self, l: np.ndarray) -> None:
        buf = self._buffer()
        buf[:, 0] = self._ar
        buf[:, 1] = l.view(np.int32)
        buf[:, 2] = 0
        self._reset(self.n_vocab)

    def _pick(self) -> int:
        j = self.cur.selected
        if not 0 <= j < self.cur.size:
            raise RuntimeError("sampler chain selected no token (all candidates masked)")
        return int(self._rows()[j, 0])

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
                if not self._rows()[self.cur.selected:self.cur.selected + 1, 1].view(np.float32)[0] > -math.inf:
                    raise GrammarDeadEnd("the grammar allows no token here (a dead end, or only an "
                                         "end-of-generation token that ignore_eos or logit_bias bans)")
        self.tok = t
        self._keep_post()
        return t

    def _keep_post(self) -> None:
        """The candidates the chain left, for post_sampling_probs."""
        if self.post:
            rows = self._rows()
            self._post = (rows[:, 0].copy(), rows[:, 2].view(np.float32).copy())

    def force(self, model: Any, i: int, token: int) -> int:
        """The chain applied to ``token`` alone (a reasoning budget's forced
        token): llama.cpp runs the budget sampler first, every other token at
        -inf, so a stateful stage (mirostat, adaptive_p) updates from the
        forced token with p = 1, not from the token it would have drawn."""
        l = model.logits(i)
        self._l = l
        buf = self._buffer()
        buf[0, 0], buf[0, 1], buf[0, 2] = token, l[token:token + 1].view(np.int32)[0], 0
        self._reset(1)
        L.llama_sampler_apply(self.chain, ctypes.byref(self.cur))
        self.tok = token
        self._keep_post()
        return token

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
