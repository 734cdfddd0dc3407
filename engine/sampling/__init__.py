"""The sampler: per-slot samplers with llama-server's semantics, fast where it is common.

This folder is the one place a sampling parameter's code lives (beside its
row in ipc/params.py and, for those with a server-wide default, its flag in
engine/config.py): ``make_sampler`` here picks the implementation, base.py is
the interface, fast.py and topk.py the numpy fast paths, chain.py llama.cpp's
chain on the host, ondevice.py the same chain in the decode graph, budget.py the
reasoning budget wrapped around any of them. It imports
engine.config, engine.vocab and ipc only; engine/loop.py imports it.

`make_sampler` picks the implementation for a request; the fast paths are in
engine/sampling/fast.py, the llama.cpp chain in engine/sampling/chain.py:

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
  grammar, DRY, XTC, dynamic temperature, mirostat, a request's own
  ``samplers`` order and DRY breakers, which ipc/chain.py's header carries
  first in the grammar area): a llama.cpp sampler chain as
  common/sampling.cpp builds it (logit_bias, penalties, dry, top_n_sigma,
  top_k, typical_p, top_p, min_p, xtc, temp_ext, dist; or temperature and
  mirostat), with llama-server's grammar handling (sample unconstrained,
  check the token against the grammar, re-sample with the grammar applied
  first only on a miss).
* OnDevice (engine/sampling/ondevice.py): with backend_sampling, a request whose
  chain can run in the decode graph gets the same Chain attached there.

In all paths top_p and min_p see the *unscaled* logits: temperature comes
last in the default chain. logit_bias and ignore_eos (-inf on every EOG id)
are applied before everything else. The fast paths apply them by writing the
few biased entries of the logits buffer in place and restoring them before
`sample` returns, so `probs()` sees the raw logits as llama-server's do.

The samplers' interface and its usage per slot: engine/sampling/base.py.
"""
from __future__ import annotations

import ctypes
from typing import Any, Mapping, Optional

import numpy as np

import llama_cpp as L

from engine.config import Config
from ipc.budget import unpack as unpack_budget
from ipc.chain import BREAKERS, ORDER, unpack as unpack_chain
from ipc.params import defaults

from . import budget
from .base import Sampler
from .chain import Chain, extra
from .fast import Greedy, TopK
from .ondevice import OnDevice, eligible

TOPK_MAX = 256  # larger top_k goes to the llama chain

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
                 seq: int = -1) -> Sampler:
    """The cheapest sampler that reproduces llama-server's chain for params.

    params: a dict or PARAMS record (missing fields take llama-server's
    defaults); grammar: GBNF bytes ("" = none; ValueError if invalid);
    bias: [(id, bias)] pairs or a BIAS-dtype array; seq: the slot's sequence
    id, which with params' backend_sampling (the request's field, else the
    server's --backend-sampling) lets an eligible request sample on the
    device (engine/sampling/ondevice.py)."""
    p = {k: _param(params, k) for k in DEFAULTS}
    if isinstance(grammar, str):
        grammar = grammar.encode()
    order, breakers = ORDER, BREAKERS
    hdr, grammar = unpack_chain(grammar)  # the request's own order or DRY breakers come first (ipc/chain.py)
    if hdr is not None:
        order, breakers = hdr
    return _make(model, p, grammar, bias, seq, order, breakers)


def _make(model: Any, p: dict, grammar: bytes, bias: Any, seq: int, order: str, breakers: tuple) -> Sampler:
    spec, grammar = unpack_budget(grammar)  # a reasoning budget rides ahead of the GBNF (budget.py)
    if spec is not None:
        s = _make(model, p, grammar, bias, -1, order, breakers)  # on the host: its choice may be replaced
        return budget.Budget(s, model, spec)
    neutral = p["repeat_last_n"] == 0 or (
        p["repeat_penalty"] == 1.0 and p["frequency_penalty"] == 0.0 and p["presence_penalty"] == 0.0
    )
    ids, vals = _bias(model, bias, bool(p["ignore_eos"]))
    if extra(p, order):  # a stage only the host's llama chain runs
        s: Sampler = Chain(model, p, grammar, ids, vals, order=order, breakers=breakers)
        model.samplers.add(s)
        return s
    plain = p["typical_p"] >= 1.0  # typical_p could drop the argmax before temp 0
    greedy = neutral and (p["top_k"] == 1 or (p["temperature"] <= 0 and plain))
    sigma = p["top_n_sigma"] > 0  # keeps the argmax, but only the host's llama chain applies it
    if seq >= 0 and p["backend_sampling"] and not sigma and eligible(p, grammar):
        s = OnDevice(model, p, ids, vals, seq, greedy and not grammar)
        model.samplers.add(s)
        return s
    if neutral and not grammar:
        if greedy:
            s = Greedy(model, p, ids, vals)
        elif 2 <= p["top_k"] <= TOPK_MAX and plain and not sigma and p["min_keep"] <= 1:  # (1 keeps 1: as 0)
            s = TopK(model, p, ids, vals)
        else:
            s = Chain(model, p, grammar, ids, vals)
    else:
        s = Chain(model, p, grammar, ids, vals)
    model.samplers.add(s)
    return s
