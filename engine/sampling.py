"""Per-slot samplers with llama-server's semantics, fast where it is common.

`make_sampler` picks one of three implementations for a request:

* Greedy: top_k == 1, or temperature <= 0 with typical_p == 1 (neutral
  penalties, no grammar):
  argmax of the logits view, ~20 us for 262k logits.
* TopK: 2 <= top_k <= TOPK_MAX, typical_p == 1 (neutral penalties, no grammar):
  llama-server's default chain (top_k -> top_p -> min_p -> temperature ->
  dist) on the k best logits only, with llama.cpp's float32 arithmetic and
  its RNG: std::mt19937(seed) drawn through libstdc++'s
  uniform_real_distribution<double>, replicated with numpy's MT19937. The
  same seed therefore draws the same tokens as llama-server.
* Chain: anything else (penalties, typical_p, top_k <= 0 or > TOPK_MAX,
  grammar): a llama.cpp sampler chain in the order common/sampling.cpp
  builds it (logit_bias, penalties, top_k, typical_p, top_p, min_p,
  temp_ext, dist), with llama-server's grammar handling (sample unconstrained,
  check the token against the grammar, re-sample with the grammar applied
  first only on a miss).

In all paths top_p and min_p see the *unscaled* logits: temperature comes
last in the default chain. logit_bias and ignore_eos (-inf on every EOG id)
are applied before everything else. The fast paths apply them by writing the
few biased entries of the logits buffer in place and restoring them before
`sample` returns, so `probs()` sees the raw logits as llama-server's do.

Usage per slot: s = make_sampler(...); s.prime(prompt) ; loop { t =
s.sample(model, i); s.accept(t); s.probs() if s.n_probs }; s.free().
`probs()` reads the logits of the last `sample`: call it before the next
decode.
"""
from __future__ import annotations

import ctypes
import math
import os
from typing import Any, Mapping, Optional, Sequence

import numpy as np

import llama_cpp as L

from engine.config import Config
from engine.topk import top_idx
from engine.vocab import log_mark, log_since
from ipc.params import SEED_RANDOM as DEFAULT_SEED, defaults

TOPK_MAX = 256  # larger top_k goes to the llama chain
_TWO32 = 4294967296.0
_TWOM64 = 2.0**-64
_ONE_MINUS = math.nextafter(1.0, 0.0)

DEFAULTS = defaults(Config())  # llama-server's defaults for fields a params mapping lacks (ipc/params.py)


def _param(params: Any, name: str) -> Any:
    """params[name] for a dict or a numpy record (ipc/layout.py PARAMS)."""
    try:
        v = params[name]
    except (KeyError, ValueError, IndexError):
        return DEFAULTS[name]
    return v.item() if hasattr(v, "item") else v


def _bias(model: Any, bias: Any, ignore_eos: bool) -> tuple[Optional[np.ndarray], Optional[np.ndarray]]:
    """(ids, values) with duplicate ids merged (biases add, as llama.cpp's
    logit_bias sampler applies each entry), out-of-vocab ids dropped, EOG
    ids at -inf for ignore_eos and the model's suppress tokens at -inf."""
    ids: list[np.ndarray] = []
    vals: list[np.ndarray] = []
    if bias is not None and len(bias):
        b = np.asarray(bias)
        if b.dtype.names:
            ids.append(b["id"].astype(np.int64))
            vals.append(b["bias"].astype(np.float32))
        else:
            b = b.reshape(-1, 2)
            ids.append(b[:, 0].astype(np.int64))
            vals.append(b[:, 1].astype(np.float32))
    if ignore_eos:
        eog = np.flatnonzero(model.eog_mask)
        ids.append(eog)
        vals.append(np.full(eog.size, -np.inf, np.float32))
    n = ctypes.c_int32(0)
    sup = L.llama_vocab_get_suppress_tokens(model.vocab.vocab, ctypes.byref(n))
    if sup and n.value > 0:
        ids.append(np.array(sup[: n.value], np.int64))
        vals.append(np.full(n.value, -np.inf, np.float32))
    if not ids:
        return None, None
    i = np.concatenate(ids)
    v = np.concatenate(vals)
    ok = (i >= 0) & (i < model.n_vocab)
    i, v = i[ok], v[ok]
    if i.size == 0:
        return None, None
    u, inv = np.unique(i, return_inverse=True)
    merged = np.zeros(u.size, np.float32)
    np.add.at(merged, inv, v)
    return u, merged


def make_sampler(model: Any, params: Mapping[str, Any] | Any, grammar: bytes = b"", bias: Any = None,
                 seq: int = -1) -> "Sampler":
    """The cheapest sampler that reproduces llama-server's chain for params.

    params: a dict or PARAMS record (missing fields take llama-server's
    defaults); grammar: GBNF bytes ("" = none; ValueError if invalid);
    bias: [(id, bias)] pairs or a BIAS-dtype array; seq: the slot's sequence
    id, which with params' backend_sampling (the request's field, else the
    server's --backend-sampling) lets an eligible request sample on the
    device (engine/ondevice.py)."""
    p = {k: _param(params, k) for k in DEFAULTS}
    if isinstance(grammar, str):
        grammar = grammar.encode()
    neutral = p["repeat_last_n"] == 0 or (
        p["repeat_penalty"] == 1.0 and p["frequency_penalty"] == 0.0 and p["presence_penalty"] == 0.0
    )
    ids, vals = _bias(model, bias, bool(p["ignore_eos"]))
    plain = p["typical_p"] >= 1.0  # typical_p could drop the argmax before temp 0
    greedy = neutral and (p["top_k"] == 1 or (p["temperature"] <= 0 and plain))
    sigma = p["top_n_sigma"] > 0  # keeps the argmax, but only the host's llama chain applies it
    if seq >= 0 and p["backend_sampling"] and not sigma:
        from engine.ondevice import OnDevice, eligible

        if eligible(p, grammar):
            s = OnDevice(model, p, ids, vals, seq, greedy and not grammar)
            model.samplers.add(s)
            return s
    if neutral and not grammar:
        if greedy:
            s: Sampler = Greedy(model, p, ids, vals)
        elif 2 <= p["top_k"] <= TOPK_MAX and plain and not sigma:
            s = TopK(model, p, ids, vals)
        else:
            s = Chain(model, p, grammar, ids, vals)
    else:
        s = Chain(model, p, grammar, ids, vals)
    model.samplers.add(s)
    return s


class Sampler:
    """Common state: the params, the last logits view, the probs request."""

    kind = "base"

    def __init__(self, model: Any, p: dict, ids: Optional[np.ndarray], vals: Optional[np.ndarray]) -> None:
        self.p = p
        self.n_vocab = model.n_vocab
        self.n_probs = max(0, min(int(p["n_probs"]), self.n_vocab))
        self.post = bool(p["post_sampling_probs"])
        self.bid, self.bval = ids, vals
        self.tok = -1
        self._l: Optional[np.ndarray] = None  # logits view of the last sample()
        self._post: Optional[tuple[np.ndarray, np.ndarray]] = None  # (ids, p) after the chain

    def sample(self, model: Any, i: int) -> int:
        """Token for batch entry i of the last decode (its logits must exist)."""
        return self.pick(model.logits(i))

    def pick(self, l: np.ndarray) -> int:
        """Token for a float32[n_vocab] logits array (may be written in place
        temporarily; restored before returning)."""
        raise NotImplementedError

    def prime(self, tokens: Sequence[int]) -> None:
        """Feed prompt tokens to the penalty window (llama-server does); no-op
        for samplers without penalties."""

    def accept(self, token: int) -> None:
        """Record a generated token (penalty window, grammar state). Only pass
        tokens this sampler returned: llama.cpp aborts the process on a token
        the grammar cannot accept."""

    def _biased(self, l: np.ndarray) -> Optional[np.ndarray]:
        """Apply the biases in place; returns the saved originals."""
        if self.bid is None:
            return None
        saved = l[self.bid]
        l[self.bid] += self.bval
        return saved

    def probs(self) -> tuple[np.ndarray, np.ndarray, float]:
        """(ids int32[n], logprobs float32[n] descending, logprob of the sampled
        token) for n_probs > 0. Pre-sampling (default): softmax over all raw
        logits, as llama-server's get_token_probabilities. With
        post_sampling_probs: probabilities after the chain (temperature
        included), zero-probability candidates dropped, so n may be < n_probs."""
        n = self.n_probs or 1
        if self.post:
            assert self._post is not None, "probs() before sample()"
            ids, p = self._post
            top = top_idx(p, n)
            top = top[np.argsort(-p[top], kind="stable")]
            top = top[p[top] > 0]
            hit = np.flatnonzero(ids == self.tok)
            chosen = float(np.log(p[hit[0]])) if hit.size else 0.0
            with np.errstate(divide="ignore"):
                return ids[top].astype(np.int32), np.log(p[top]).astype(np.float32), chosen
        l = self._l
        assert l is not None, "probs() before sample()"
        top = top_idx(l, n)
        top = top[np.argsort(-l[top], kind="stable")]
        m = l[top[0]]
        lse = float(m) + math.log(float(np.exp(l - m).sum(dtype=np.float64)))
        return top.astype(np.int32), (l[top] - lse).astype(np.float32), float(l[self.tok]) - lse

    def free(self) -> None:
        """Release C objects (idempotent)."""


class Greedy(Sampler):
    """argmax; llama-server's chain reduces to it for temperature <= 0 (temp
    keeps only the max) or top_k == 1."""

    kind = "greedy"

    def pick(self, l: np.ndarray) -> int:
        self._l = l
        if self.bid is None:
            t = int(l.argmax())
        else:
            saved = l[self.bid]
            l[self.bid] += self.bval
            t = int(l.argmax())
            l[self.bid] = saved
        self.tok = t
        if self.post:
            self._post = (np.array([t], np.int32), np.ones(1, np.float32))
        return t


class Rng:
    """std::mt19937(seed) + uniform_real_distribution<double>(0, 1) as
    libstdc++ draws it: two 32-bit outputs a, b -> (a + b * 2^32) / 2^64."""

    def __init__(self, seed: int) -> None:
        seed = int(seed) & 0xFFFFFFFF
        if seed == DEFAULT_SEED:
            seed = int.from_bytes(os.urandom(4), "little")
        self.seed = seed
        self.bg = np.random.MT19937()
        self.bg._legacy_seeding(seed)  # init_genrand(seed), as std::mt19937(seed)

    def uniform(self) -> float:
        a, b = self.bg.random_raw(2).tolist()
        r = (float(a) + float(b) * _TWO32) * _TWOM64
        return r if r < 1.0 else _ONE_MINUS


class TopK(Sampler):
    """top_k -> top_p -> min_p -> temperature -> dist on the k best logits.

    Mirrors src/llama-sampler.cpp step by step: top_k sorts descending; top_p
    takes float32 softmax over the k, float32 running sum, keeps the
    shortest prefix reaching p; min_p keeps logits >= max + logf(min_p);
    temperature divides; dist takes expf(l - max), a double running sum, and
    the first index where it reaches sum * u."""

    kind = "topk"

    def __init__(self, model: Any, p: dict, ids: Optional[np.ndarray], vals: Optional[np.ndarray]) -> None:
        super().__init__(model, p, ids, vals)
        self.k = int(p["top_k"])
        self.top_p = np.float32(p["top_p"])
        self.log_min_p = np.log(np.float32(p["min_p"])) if p["min_p"] > 0 else None  # logf(min_p)
        self.temp = np.float32(p["temperature"])
        self.rng = Rng(p["seed"])

    def pick(self, l: np.ndarray) -> int:
        self._l = l
        saved = self._biased(l)
        idx = top_idx(l, self.k)
        v = l[idx]
        if saved is not None:
            l[self.bid] = saved
        o = np.argsort(-v, kind="stable")
        idx, v = idx[o], v[o]
        n = v.size
        if self.top_p < 1.0:
            e = np.exp(v - v[0])
            c = np.cumsum(e)
            c = np.cumsum(e / c[-1])
            hit = np.flatnonzero(c >= self.top_p)
            n = int(hit[0]) + 1 if hit.size else n
        if self.log_min_p is not None and n > 1:
            n = max(1, int(np.count_nonzero(v[:n] >= v[0] + self.log_min_p)))
        v = v[:n] / self.temp
        e = np.exp(v - v[0])
        c = np.cumsum(e, dtype=np.float64)
        u = self.rng.uniform()  # drawn even when n == 1, as llama.cpp does
        j = min(int(np.searchsorted(c, c[-1] * u, side="left")), n - 1)
        t = int(idx[j])
        self.tok = t
        if self.post:
            self._post = (idx[:n].astype(np.int32), (e / c[-1]).astype(np.float32))
        return t


def build_chain(model: Any, p: dict, ids: Optional[np.ndarray], vals: Optional[np.ndarray],
                greedy: bool = False) -> tuple[Any, int, bool]:
    """A llama.cpp sampler chain in common/sampling.cpp's order (logit_bias,
    penalties, top_k, typical, top_p, min_p, temp_ext, dist), or logit_bias
    + greedy for ``greedy``. Returns (chain, penalty window, penalties on).
    Neutral stages are llama.cpp's empty samplers, which is what lets the
    whole chain run on the device (engine/ondevice.py) when typical_p is 1.
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
    add(L.llama_sampler_init_typical(p["typical_p"], 0))
    add(L.llama_sampler_init_top_p(p["top_p"], 0))
    add(L.llama_sampler_init_min_p(p["min_p"], 0))
    add(L.llama_sampler_init_temp_ext(p["temperature"], 0.0, 1.0))
    add(L.llama_sampler_init_dist(int(p["seed"]) & 0xFFFFFFFF))
    return chain, last_n, penalties


class GrammarDeadEnd(ValueError):
    """The grammar (with the bans: ignore_eos, logit_bias false) allows no
    token here. llama.cpp would throw from llama_sampler_accept, through
    ctypes, into std::terminate: the engine would abort. The request's fault."""


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
        vocab = model.vocab.vocab
        if grammar:
            mark = log_mark()
            g = L.llama_sampler_init_grammar(vocab, grammar, b"root")
            if not g:  # libllama logged why: quote it
                why = [s for s in log_since(mark) if s.strip() and s.strip() != "failed to parse grammar"]
                raise ValueError("failed to parse grammar" + (f": {why[0].strip()}" if why else ""))
            self.grammar = g
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
        if self.grammar is not None:
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
        if self.grammar is not None:
            L.llama_sampler_accept(self.grammar, token)
        L.llama_sampler_accept(self.chain, token)

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
