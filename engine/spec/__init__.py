"""Speculative decoding in the step loop (``--spec-type``, ``-md``; issue 27).

Several tokens per step for one stream: a generating slot's step carries its
last sampled token plus k drafted ones (logits on for each), in the same
batch as every other slot's tokens; the slot's own sampler then samples at
each position and the draft is accepted while it agrees (llama-server's
common_sampler_sample_and_accept_n: verification by the request's sampler,
not the speculative-sampling acceptance rule). So a request's output is the
one it would have had without speculation: greedy exactly, sampled with the
same RNG draws (one per emitted token, as without), so a seed still repeats
its text. The accepted prefix plus the first token that disagreed are
emitted; the rejected tail leaves the KV with seq_rm (engine/spec/verify.py).

What lives here: `Speculator` (the loop's hooks: begin, draft, verified,
observe; the counters), the drafters (ngram.py: ngram-simple, the cached
ngram-map-k and ngram-mod; draft.py: a draft model), the choice of how
much to draft (cost.py: per step, from the measured cost of a ubatch per
row count, a step priced as the ubatches llama.cpp splits it into, plan.py,
and each slot's acceptance rate; never in a step that admits prompt tokens) and the verification (verify.py). It imports engine/
modules below the loop (model, vocab) and ipc/, never the loop.

Rules kept with drafted tokens in flight (each has a test):
- the prefix cache: ``cache[:n_past]`` stays exactly the slot's KV, so a
  rejected draft never enters the prefix tree (verify.py sets n_past to the
  kept tokens before anything can read it);
- sliding windows (Gemma 3): removing the tail [p, end) is always legal in
  llama.cpp's SWA cache: cells it reuses during a decode are the ones
  outside the window of the sequence's position *before* the decode, which
  stay outside the window of every later position (llama_kv_cache::find_slot,
  is_masked_swa), and ringserve keeps the full-size SWA cache (swa_full)
  anyway; recurrent and hybrid models cannot cut a tail (seq_rm refuses):
  speculation is off for them, with a warning;
- ring backpressure: a slot drafts at most the free room of its reader's
  ring minus one, so every record of a step fits and none is held out of
  order; the step budget counts drafted tokens as generating tokens;
- cancel: a cancelled slot is ended between steps, when its KV holds only
  verified tokens.
"""
from __future__ import annotations

import logging
import time

import numpy as np

import llama_cpp as L

from ipc.layout import CNT

from .cost import P_TRY, Rate, StepCost, choose
from .plan import ubatches
from .draft import DraftModel
from .ngram import KINDS as NGRAMS, ModTable

log = logging.getLogger("ringserve.engine")

TYPES = ("none", *NGRAMS, "draft-simple")  # --spec-type values ringserve runs
MAX_ROWS = 64  # drafted tokens (logits rows) one step may hold in all: bounds the logits buffer


def spec_types(v: str) -> str:
    """--spec-type: a comma-separated list of TYPES (checked at start, a usage error otherwise)."""
    names = [x.strip() for x in v.split(",") if x.strip()] or ["none"]
    bad = [x for x in names if x not in TYPES]
    if bad:
        raise ValueError(f"unsupported speculative type(s) {', '.join(bad)}: ringserve runs {', '.join(TYPES)}")
    return ",".join(names)


def n_rows(cfg) -> int:
    """Logits rows per decode past one per slot (engine/model.py sizes the context with them)."""
    return 0 if resolved(cfg) == ["none"] else min(MAX_ROWS, cfg.parallel * per_slot(cfg))


def resolved(cfg) -> list[str]:
    """The drafters to chain, in order; -md alone means draft-simple (llama-server's default with a draft model)."""
    names = [x for x in spec_types(cfg.spec_type).split(",") if x != "none"]
    if cfg.spec_draft_model and "draft-simple" not in names:
        names.append("draft-simple")
    return names or ["none"]


def per_slot(cfg) -> int:
    """Most tokens one slot drafts in a step (the types' own maxima)."""
    m = 0
    for name in resolved(cfg):
        if name == "ngram-simple":
            m = max(m, cfg.spec_ngram_simple_size_m)
        elif name == "ngram-map-k":
            m = max(m, cfg.spec_ngram_map_k_size_m)
        elif name == "ngram-short":
            m = max(m, cfg.spec_ngram_short_size_m)
        elif name == "ngram-mod":
            m = max(m, cfg.spec_ngram_mod_n_max)
        elif name == "draft-simple":
            m = max(m, cfg.spec_draft_n_max)
    return max(m, 1)


class SlotSpec:
    """One slot's speculation state for its current request."""

    __slots__ = ("on", "ngrams", "rate", "n_max", "n_min", "p_min", "used", "draft", "idx", "n_draft", "n_acc")

    def __init__(self) -> None:
        self.on = False
        self.ngrams: list = []
        self.rate = Rate()
        self.n_max, self.n_min, self.p_min = 0, 0, 0.0
        self.used = None  # the drafter of this step's draft (its accept() learns)
        self.draft = np.empty(0, np.int32)  # this step's drafted tokens, in the batch after the last token
        self.idx: list[int] = []  # their batch indices
        self.n_draft = self.n_acc = 0  # this request's totals (timings draft_n / draft_n_accepted)


class Speculator:
    """The loop's speculation hooks (package doc); one per engine."""

    def __init__(self, cfg, model, counters: np.ndarray) -> None:
        self.cfg, self.m, self.cnt = cfg, model, counters
        self.names = resolved(cfg)
        self.cost = StepCost(cfg.parallel + MAX_ROWS, getattr(model, "n_ubatch", 512))
        self.pool = Rate()  # every slot's verifications: a new request's prior, at least P_TRY (cost.Rate)
        self.state = [SlotSpec() for _ in range(cfg.parallel)]
        self.dm: DraftModel | None = None
        self.t_draft = 0.0  # seconds per drafted token in the draft model (moving average)
        self.step_ids: list[int] = []  # this step's generating slots (sequence ids, ascending) ..
        self.step_counts: list[int] = []  # .. and their tokens in the batch (1 + drafted)
        if "draft-simple" in self.names:
            self.dm = DraftModel(cfg, model)
        # ngram-mod's one table for every slot, as llama.cpp's (engine/spec/ngram.py)
        self.mod = ModTable(cfg.spec_ngram_mod_n_match) if "ngram-mod" in self.names else None
        tgt = getattr(model, "model", None)
        if tgt is not None and (L.llama_model_is_recurrent(tgt) or L.llama_model_is_hybrid(tgt)):
            log.warning("speculative decoding is off: a recurrent model's state cannot drop a rejected draft")
            self.names = ["none"]

    @property
    def on(self) -> bool:
        return self.names != ["none"]

    def close(self) -> None:
        if self.dm is not None:
            self.dm.close()
            self.dm = None

    # ------------------------------------------------------------ per request
    def begin(self, s, sampler, params) -> None:
        """A request starts on slot ``s``: fresh drafters and rate; host
        samplers only (a chain in the decode graph samples one row per sequence)."""
        st = self.state[s.id]
        st.on = self.on and sampler.kind != "device" and int(params["speculative.n_max"]) > 0
        st.n_max = int(params["speculative.n_max"])
        st.n_min = int(params["speculative.n_min"])
        st.p_min = float(params["speculative.p_min"])
        # at least P_TRY: a pooled rate that earlier requests brought below what pays would otherwise
        # decline this request's drafts before its own text was tried, and every later request's
        # (the pool learns only from verifications); one position's weight, so a first miss ends it
        st.rate = Rate(max(self.pool.p, P_TRY))
        st.n_draft = st.n_acc = 0
        st.draft, st.idx, st.used = st.draft[:0], [], None
        st.ngrams = []
        c = self.cfg
        for name in self.names:
            if name == "ngram-simple":
                st.ngrams.append(NGRAMS[name](c.spec_ngram_simple_size_n, c.spec_ngram_simple_size_m))
            elif name == "ngram-map-k":
                st.ngrams.append(NGRAMS[name](c.spec_ngram_map_k_size_n, c.spec_ngram_map_k_size_m,
                                              c.spec_ngram_map_k_min_hits))
            elif name == "ngram-short":
                st.ngrams.append(NGRAMS[name](c.spec_ngram_short_size_n, c.spec_ngram_short_size_m, 1))
            elif name == "ngram-mod":
                st.ngrams.append(NGRAMS[name](self.mod, c.spec_ngram_mod_n_max, c.spec_ngram_mod_n_min))
        for d in st.ngrams:
            d.begin(s.req.prompt)

    # ------------------------------------------------------------ per step
    def draft(self, slots, n_gen: int, room: int, ring_room) -> int:
        """Add drafted tokens after each generating slot's last token (already
        in the batch at position n_past - 1); returns how many were added.
        ``slots``: the generating slots in sequence-id order (the batch's);
        ``room``: batch entries left; ``ring_room(s)``: free records in s's ring."""
        ids = [s.id for s in slots]
        self.step_ids, self.step_counts = ids, [1] * len(ids)
        for s in slots:
            st = self.state[s.id]
            st.draft, st.idx, st.used = st.draft[:0], [], None
        c = self.cost
        cap = min(room, MAX_ROWS, self.m.batch.max_out - self.m.batch.n_out)
        on = [s for s in slots if self.state[s.id].on]
        # no lookup at all when even the best slot's rate on every row could not pay (cost.bound)
        if not on or not c.bound(ids, max(self.state[s.id].rate.p for s in on), cap):
            for s in on:
                self.state[s.id].rate.relax(self.pool.p)
            return 0
        offers = []  # (slot, its index in ids, draft or None for the draft model, longest k)
        for i, s in enumerate(slots):
            st = self.state[s.id]
            if not st.on:
                continue
            # llama-server's get_n_draft_max: context left (minus 2) and tokens left to predict (minus 1)
            lim = min(s.n_ctx - s.n_past - 2, ring_room(s) - 1)
            if s.n_predict >= 0:
                lim = min(lim, s.n_predict - s.n_decoded - 1)
            if lim <= 0 or lim < st.n_min:
                continue
            hist = s.cache[:s.n_past - 1]
            got = None
            for d in st.ngrams:  # chained as llama-server's: the first drafter with a draft wins
                t = d.draft(hist, s.last)
                if len(t):
                    got, st.used = t, d
                    break
            longest = min(len(got), lim) if got is not None else min(st.n_max, lim) if self.dm is not None else 0
            # llama-server's n_draft_max < n_min -> no draft; what choose() picks below n_min is 0 there too,
            # so the draft model is never asked for a draft that would be thrown away
            if longest < max(st.n_min, 1):
                st.used = None
                continue
            offers.append((s, i, got, longest))
        if not offers:
            return 0
        # a draft model's drafts cost its own time too (measured per drafted token)
        ks = choose(c, ids, [(i, k, self.state[s.id].rate.p, self.t_draft if d is None else 0.0)
                             for s, i, d, k in offers], cap, [self.state[s.id].n_min for s, _, _, _ in offers])
        want = [(s.id, s.cache[:s.n_past - 1], s.last, k, self.state[s.id].p_min)
                for (s, _, d, _), k in zip(offers, ks) if d is None and k > 0]
        drafted = {}
        if want:
            t0 = time.perf_counter()
            drafted = self.dm.draft(want)
            n = sum(len(x) for x in drafted.values())
            if n:
                dt = (time.perf_counter() - t0) / n
                self.t_draft = dt if self.t_draft <= 0.0 else self.t_draft + 0.2 * (dt - self.t_draft)
        added = 0
        m = self.m
        for (s, i, d, _), k in zip(offers, ks):
            st = self.state[s.id]
            if k == 0:
                st.rate.relax(self.pool.p)
            if d is None:
                d = drafted.get(s.id)
                if d is None:
                    continue
                st.used = self.dm
            d = d[:k]
            if len(d) == 0 or len(d) < st.n_min:
                st.used = None
                continue
            st.draft = d
            st.idx = []
            for t in d.tolist():
                s.cache[s.n_past] = t
                st.idx.append(m.add(t, s.n_past, s.id, True))
                s.n_past += 1
            st.n_draft += len(d)
            self.step_counts[i] += len(d)
            added += len(d)
        if added:
            self.cnt[CNT["spec_decode_num_draft_tokens_total"]] += added
        return added

    def verified(self, s, n_acc: int) -> None:
        """Slot ``s``'s draft of this step had ``n_acc`` tokens accepted."""
        st = self.state[s.id]
        n = len(st.draft)
        st.rate.update(n, n_acc)
        self.pool.update(n, n_acc)
        st.n_acc += n_acc
        if st.used is not None and st.used is not self.dm:
            st.used.accept(n_acc, n)
        st.draft, st.idx, st.used = st.draft[:0], [], None
        self.cnt[CNT["spec_decode_num_accepted_tokens_total"]] += n_acc
        self.cnt[CNT["spec_decode_num_drafts_total"]] += 1

    def observe(self, n_prompt: int, seconds: float) -> float:
        """A step's measured decode time; the cost curve learns from prompt-free
        steps only, as the ubatches they ran as (cost.py, plan.py). Returns the
        part of ``seconds`` its generating tokens would have taken without the
        drafted ones (the step budget's figure)."""
        ids, counts = self.step_ids, self.step_counts
        self.step_ids, self.step_counts = [], []
        if n_prompt or not ids:
            return seconds
        self.cost.calibrate(ids, counts, seconds)  # first: the prices this step was chosen on
        self.cost.observe(ubatches(ids, counts, self.cost.n_ubatch), seconds)
        return self.cost.draft_free(ids, counts, seconds)

    def totals(self, s) -> tuple[int, int]:
        st = self.state[s.id]
        return st.n_draft, st.n_acc

    def end(self, s) -> None:
        """The request on ``s`` ended (its drafts, if any, were never verified)."""
        st = self.state[s.id]
        st.on = False
        st.draft, st.idx, st.used = st.draft[:0], [], None
