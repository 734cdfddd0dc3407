"""The step loop: intake, assignment, one batch, decode, sample, publish.

One step = one llama_decode over a batch holding every generating slot's
last token plus prompt chunks within the step's token budget
(engine/budget.py), so a long prompt is split over several steps and never
stalls the streams for more than a bounded step. The loop handles token ids only and never
waits on a reader: a full ring pauses that one slot (it leaves the batch and
keeps its KV) and a slot paused longer than ``stall_timeout`` is cancelled.
It sleeps on the doorbell only when no slot has work. This module takes
requests in, decodes and samples each step; what goes into a step's batch
(and the express decode before it) is engine/batch.py, what goes out to the
readers (records, results, ends of requests) is engine/publish.py.
"""
from __future__ import annotations

import collections
import logging
import time

from ipc.channel import BadRequest
from ipc.layout import (
    CNT, F_FIRST, F_LAST, F_PROGRESS, SLOT_GEN, SLOT_PROMPT, STOP_CANCEL, STOP_CTX, STOP_EOS, STOP_ERROR,
    STOP_LIMIT, STOP_SHIFT, SUB_CANCEL, SUB_ERASE, SUB_SUBMIT,
)
from ipc.server import EnginePort

from .batch import Batcher
from .budget import StepBudget, quick
from .sampling.chain import GrammarDeadEnd
from .config import Config
from .hosttier import open_host
from .kvcache import SlotCache
from .kvevents import SetupError, open_events
from .preempt import Preempt
from .sampling import make_sampler
from .lookup import holds
from .shift import reuse_chunks
from .slotfile import KINDS as FILE_OPS, SlotFiles
from .slots import Request, Slot, pick
from .spec import Speculator, resolved as spec_types
from .spec.verify import cut
from .tracer import BUILD, DECODE, IDLE, INTAKE, PUBLISH, SAMPLE, Tracer

log = logging.getLogger("ringserve.engine")


class Engine(Batcher):
    """The decode loop over one model and one arena (single-threaded)."""

    def __init__(self, cfg: Config, port: EnginePort, model):
        self.cfg, self.port, self.model = cfg, port, model
        self.arena = a = port.arena
        port.on_reclaim = self.reclaim
        self.slots = [Slot(i, model.n_ctx_slot) for i in range(cfg.parallel)]
        self.queue: collections.deque[Request] = collections.deque()
        self.n_batch = model.n_batch  # min(n_ctx, batch_size): libllama aborts past it
        self.budget = StepBudget(cfg.step_tokens, self.n_batch, cfg.step_mult)
        self.n_gen = self.n_prompt = 0  # this step's batch: generating tokens (drafted ones included), prompt tokens
        self.n_spec = 0  # drafted tokens in this step's batch
        self.n_shift = 0  # slots whose context this step's build shifted
        # speculative decoding (engine/spec/): None when --spec-type / -md ask for none
        self.spec = Speculator(cfg, model, a.counters) if spec_types(cfg) != ["none"] and not cfg.embeddings else None
        self.cnt = a.counters
        self.tab = a.slots
        self.tr = Tracer(a.counters, a.hist)
        self.out: list[tuple[Slot, tuple]] = []  # records sampled this step
        self.n_task = 0
        self.files = SlotFiles(cfg.slot_save_path)  # /slots save|restore, run while the slot is idle
        # the prefix cache over every slot's stream and host RAM; None: each slot reuses its own KV only
        on = cfg.prefix_cache and not getattr(model, "unified", False) and not cfg.embeddings
        if cfg.cache_host and not on:
            raise SetupError("--cache-host shares the prefix cache's entries: it needs the prefix cache")
        self.kv = SlotCache(model, self.slots, a.counters, cfg.cache_wait, cfg.cache_ram,
                            cfg.slot_prompt_similarity, getattr(model, "n_park", 0),
                            open_events(cfg, a.counters), patient=cfg.admit != "fair",
                            host=open_host(cfg, model) if cfg.cache_host else None,
                            per_tok=lambda b=self.budget: b.per_tok) if on else None  # the budget, not self: no cycle
        # a pure decode step gives way to a cache hit that arrives during it (engine/preempt.py)
        self.preempt = Preempt(self) if self.kv is not None and cfg.preempt and cfg.express_tokens > 0 else None
        for s in self.slots:  # a restarted engine: clear the dead one's rows from /slots
            self.show(s)
        # KV shifting (engine/shift.py): llama-server disables both where the memory cannot shift
        self.can_shift = bool(getattr(model, "can_shift", False))
        self.ctx_shift = cfg.context_shift and self.can_shift
        if cfg.context_shift and not self.can_shift:
            log.warning("ctx_shift is not supported by this context, it will be disabled")
        if cfg.cache_reuse and not self.can_shift:
            log.warning("cache_reuse is not supported by this context, it will be disabled")

    def shutdown(self) -> None:
        super().shutdown()
        if self.kv is not None:
            self.kv.close()  # KV events: AllBlocksCleared
        if self.spec is not None:
            self.spec.close()

    # ------------------------------------------------------------------ step
    def step(self) -> None:
        """One turn of the loop, then its accounting settles (Publisher.settle:
        /metrics never shows a record whose accounting is not in)."""
        self._step()
        self.settle()

    def _step(self) -> None:
        tr = self.tr
        self.arena.ctl["heartbeat_ns"] = time.monotonic_ns()
        came = self.intake()
        tr.mark(INTAKE)
        active = [s for s in self.slots if not s.idle]
        if not active:  # nothing runs: the wait for work is not a phase (Tracer.drop)
            if came:
                tr.flush(False)
            else:
                tr.drop()
            # a request held back for a peer's prompt (the host tier) is looked at again soon
            self.port.wait(0.005 if self.queue else self.cfg.heartbeat_s)
            tr.drop()
            return
        self.unpause()
        if self.cfg.express_tokens > 0:
            self.express()
        n = self.build()
        tr.mark(BUILD)
        if n == 0:  # every busy slot waits for its reader
            self.port.wait(0.002)
            tr.mark(IDLE)
            tr.flush(False)
            return
        d_express = tr.acc[DECODE]  # the express decodes' share of this step's decode phase
        armed = self.preempt is not None and self.preempt.arm()
        ret = self.model.decode()
        if armed:
            self.preempt.disarm(ret)
        tr.mark(DECODE)
        if armed and ret == 2:  # a cache hit came: this step gives way to its express decode (engine/preempt.py)
            self.preempt.undo()
            self.kv.stepped()  # (the prefix cache's: preempt needs it) the pending stream copies ran before the graph
            tr.flush(True)
            return
        t_dec = tr.acc[DECODE] - d_express  # this batch's llama_decode alone: what the budget prices
        if self.spec is not None:
            # the budget learns draft-free step costs: the drafts' share (the measured cost curve's) is taken out
            t_dec = self.spec.observe(self.n_prompt, t_dec)
        self.budget.observe(self.n_gen - self.n_spec, self.n_prompt, t_dec)
        c = self.cnt
        c[CNT["n_decode_total"]] += 1
        c[CNT["steps_total"]] += 1
        c[CNT["batch_tokens_total"]] += n
        c[CNT["n_busy_slots_total"]] += len(active)
        if n > c[CNT["n_tokens_max"]]:
            c[CNT["n_tokens_max"]] = n
        if self.kv is not None and ret != -1:  # -1: refused before memory_update; else pending copies are done
            self.kv.stepped()
        if ret != 0:
            self.fail_batch(ret)
        else:
            self.sample()
        tr.mark(SAMPLE)
        self.publish()
        tr.mark(PUBLISH)
        tr.flush(True)

    # ---------------------------------------------------------------- intake
    def intake(self) -> bool:
        """Take the submissions queued now; True if any came (or file
        operations wait)."""
        subs = self.port.poll()
        for kind, channel, rid, arg in subs:
            if kind == SUB_SUBMIT:
                self.queue.append(Request(channel, rid))
            elif kind == SUB_CANCEL:
                self.cancel(channel, rid, STOP_CANCEL)
            elif kind == SUB_ERASE:
                s = self.slots[arg % len(self.slots)]
                s.erase = True
            elif kind in FILE_OPS:
                self.files.submit(kind, channel, rid, arg)
        for s in self.slots:
            if s.erase and s.idle:
                self.model.seq_rm(s.id, 0, -1)
                s.n_past = 0
                s.erase = False
                if self.kv is not None:
                    self.kv.sync(s)
                self.show(s)
            elif not s.idle and not self.port.owner_ok(s.req.channel, s.req.rid):
                self.finish(s, STOP_CANCEL)
        if self.files.pending:  # before assignment: an idle slot is saved before a queued request takes it
            self.files.run(self)
        if self.queue:
            self.assign()
        self.cnt[CNT["requests_deferred"]] = len(self.queue)
        if self.kv is not None:
            self.kv.settle()
            self.kv.publish()
        return bool(subs) or bool(self.files.pending)

    def assign(self) -> None:
        """Queued requests to idle slots, FIFO (a request naming a busy slot
        waits without holding up the ones behind it); with the prefix cache
        in its order (SlotCache.order: cached prefixes first, bounded wait)."""
        keep = collections.deque()
        ready = []
        while self.queue:
            req = self.queue.popleft()
            if not self.port.owner_ok(req.channel, req.rid):
                self.end(req, STOP_CANCEL)  # cancelled while queued: its end frees the channel (engine/publish.py)
                continue
            if req.prompt is None and not self.load(req):
                continue
            ready.append(req)
        kv = self.kv if any(s.idle for s in self.slots) else None
        if kv is not None:
            ready = kv.order(ready)
        for req in ready:
            if kv is not None:
                # later() before pick(): a pick may load a peer's blob from the host tier
                got = None if kv.defer(req) or self.later(req, req.n_match) else kv.pick(req)
            else:
                s = pick(self.slots, req, self.cfg.slot_prompt_similarity) if any(s.idle for s in self.slots) else None
                got = None if s is None else (s, None, -1)
            if got is None:
                keep.append(req)
                continue
            self.start(req, *got)
        self.queue = collections.deque(sorted(keep, key=lambda r: r.t_submit))

    def later(self, req: Request, k: int) -> bool:
        """Start ``req`` (a cache hit of ``k`` tokens: its prefix in the tree, as
        ordered) after the express decode of a short prompt already started,
        not before it: attaching a turn (a RAM load, the slot's old
        conversation saved) takes 4-11 ms, and a turn that came back with
        others waited for all their attaches before the first express decode
        (issue 24's chat: four turns come back in one intake). Express assigns
        again after each of its decodes (Batcher.express), so each turn is
        attached just before its own decode: later-turn TTFT p50 0.87x
        (4 rounds A B, docs/PERFORMANCE.md)."""
        most = self.cfg.express_tokens
        if most <= 0 or not quick(len(req.prompt) - k, k, most):
            return False
        return any(s.state == SLOT_PROMPT and quick(s.remaining, s.n_cache, most) for s in self.slots)

    def load(self, req: Request) -> bool:
        """Copy and validate a request from its channel; errors end it."""
        ch = self.arena.channel(req.channel)
        try:
            req.prompt, req.params, req.grammar, req.bias = ch.read_request(self.model.n_vocab)
        except BadRequest as e:
            self.reject(req, 400, str(e))
            return False
        n = len(req.prompt)
        if n >= self.model.n_ctx_slot:
            self.reject(req, 400, f"request ({n} tokens) exceeds the available context size "
                                  f"({self.model.n_ctx_slot} tokens), try increasing it")
            return False
        req.id_slot = int(req.params["id_slot"])
        return True

    def start(self, req: Request, s: Slot, src, k: int) -> None:
        """``req`` runs on ``s``; with the prefix cache it starts from the KV
        of prompt[:k] copied from ``src`` (None: the slot's own)."""
        p = req.params
        try:
            s.sampler = make_sampler(self.model, p, req.grammar, req.bias, seq=s.id)
            s.sampler.prime(req.prompt)  # the penalty window sees the prompt, as llama-server's
        except ValueError as e:
            self.reject(req, 400, f"Failed to initialize samplers: {e}")
            return
        except Exception as e:  # noqa: BLE001 -- a bug here ends this request, never the engine
            log.exception("sampler set-up failed")
            self.reject(req, 500, f"Failed to initialize samplers: {type(e).__name__}: {e}")
            return
        reuse = int(p["n_cache_reuse"]) if self.can_shift and p["cache_prompt"] else 0
        if self.kv is not None:
            keep = self.kv.attach(s, req.prompt, src, k, reuse, (req.channel, req.rid))
        else:
            keep = s.prefix(req.prompt) if p["cache_prompt"] else 0
            if reuse > 0:
                keep = reuse_chunks(self.model, s, req.prompt, keep, reuse)
            keep = min(keep, len(req.prompt) - 1)  # always evaluate the last prompt token
            self.model.seq_rm(s.id, keep, -1)
            if not holds(self.model, self.model.n_swa, s.id, keep):  # llama-server's pos_min check: a slot
                self.model.seq_clear(s.id)  # restored from a file holds the window of the file's end only
                keep = 0
        s.req, s.n_past, s.i_prompt, s.n_cache = req, keep, keep, keep
        s.n_decoded, s.last, s.held, s.i_batch, s.reported = 0, -1, None, -1, False
        s.t_first = 0.0
        n_predict = int(p["n_predict"])
        s.n_predict = n_predict if n_predict >= 0 else self.cfg.n_predict
        s.n_probs, s.ignore_eos = int(p["n_probs"]), bool(p["ignore_eos"])
        s.progress, s.fed = bool(p["return_progress"]), False
        s.state = SLOT_PROMPT
        s.t_start = time.perf_counter()
        if self.spec is not None:
            self.spec.begin(s, s.sampler, p)
        if s.progress:  # "started": the cached count (llama-server's 0% update)
            self.out.append((s, (req.rid, time.monotonic_ns(), keep, F_PROGRESS, 0.0, None)))
        self.n_task += 1
        s.id_task, s.n_prompt = self.n_task, len(req.prompt)
        self.show(s)

    # ---------------------------------------------------------------- sample
    def sample(self, slots: list[Slot] | None = None) -> None:
        m = self.model
        t_ns = time.monotonic_ns()
        now = time.perf_counter()
        n_dev = 0
        for s in self.slots if slots is None else slots:
            if s.fed:  # before its first token: the prompt is in the KV
                s.fed = False
                self.out.append((s, (s.req.rid, t_ns, s.n_past, F_PROGRESS, (now - s.t_start) * 1e3, None)))
            if s.i_batch < 0:
                continue
            first = s.state == SLOT_PROMPT
            # positions to sample: the last token's, then each drafted token's (engine/spec/); the
            # draft holds while the sampler agrees with it, as llama-server's sample_and_accept_n
            st = self.spec.state[s.id] if self.spec is not None else None
            draft = st.draft if st is not None else ()
            idx = [s.i_batch, *st.idx] if len(draft) else [s.i_batch]
            base = s.n_past - len(draft)  # n_past as the first position's logits saw it
            toks = []
            try:
                for j, bi in enumerate(idx):
                    n_dev += s.sampler.kind == "device"
                    tok = s.sampler.sample(m, bi)
                    s.sampler.accept(tok)
                    probs = s.sampler.probs() if s.n_probs else None
                    stop = self.stop_code(s, tok, s.n_decoded + j + 1, base + j)
                    toks.append((tok, probs, stop))
                    if stop or j == len(draft) or tok != draft[j]:
                        break
            except Exception as e:  # a sampler failure ends this request only
                if len(draft):
                    cut(m, s, base)
                self.finish(s, STOP_ERROR, 400 if isinstance(e, GrammarDeadEnd) else 500, f"sampling failed: {e}")
                continue
            if len(draft):  # keep the accepted prefix: the KV and cache[:n_past] lose the rejected tail
                if not cut(m, s, base + len(toks) - 1):
                    self.finish(s, STOP_ERROR, 500, "speculative decoding: the KV could not drop a rejected draft")
                    continue
                self.spec.verified(s, len(toks) - 1)
            if first:
                s.state = SLOT_GEN
                s.t_first = now
                if self.kv is not None:
                    self.kv.prompt_done(s)
            for j, (tok, probs, stop) in enumerate(toks):
                s.n_decoded += 1
                s.last = tok
                flags = (F_FIRST if first and j == 0 else 0) | ((F_LAST | stop << STOP_SHIFT) if stop else 0)
                lp = 0.0
                if probs is not None:
                    self.cnt[CNT["probs_total"]] += 1
                    ids, lps, lp = probs
                    probs = (ids, lps)
                self.out.append((s, (s.req.rid, t_ns, tok, flags, lp, probs)))
                if stop:
                    self.result(s, stop)
        if n_dev:
            self.cnt[CNT["device_samples_total"]] += n_dev

    def stop_code(self, s: Slot, tok: int, n_decoded: int, n_past: int) -> int:
        """Why ``tok`` ends the request (0: it does not), with n_decoded
        tokens emitted counting it and n_past tokens in the KV before it."""
        if not s.ignore_eos and self.model.is_eog(tok):
            return STOP_EOS
        if 0 <= s.n_predict <= n_decoded:
            return STOP_LIMIT
        if n_past + 1 >= s.n_ctx and not self.ctx_shift:  # with --context-shift, build() shifts instead
            return STOP_CTX
        return 0
