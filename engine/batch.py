"""What goes into a step's batch: the generating rows, the prompt chunks the
step budget admits, drafted tokens, and the express decode before it.

The Engine (engine/loop.py) is a Batcher: these methods run on its thread
at the start of each step and use the state it sets up (cfg, model,
slots, budget, spec, kv, tr, cnt). Invariant: after ``build`` every slot
with a token in the batch has ``i_batch`` >= 0 where its logits are read
(its last token), -1 otherwise, and ``n_gen + n_prompt`` is the batch size.
"""
from __future__ import annotations

import time

from ipc.layout import CNT, SLOT_GEN, SLOT_PROMPT, STOP_ERROR

from .budget import express, plan
from .publish import Publisher
from .shift import shift_context
from .slots import Slot
from .tracer import BUILD, DECODE, INTAKE, PUBLISH, SAMPLE


class Batcher(Publisher):
    """The loop's input side of a step (see module doc); Engine's base class."""

    def build(self) -> int:
        """Fill the batch: generating slots' tokens (and drafts after them
        in steps without prompts), prompt chunks in the room the step
        budget leaves, split by ``--admit`` (budget.plan); every slot's
        tokens are added in sequence-id order.

        Why that order: over per-slot KV streams llama.cpp splits a batch
        with split_equal(sequential), whose ubatch takes only sequences
        with consecutive ids, scanning the batch from its first unused
        token (engine/spec/plan.py); each ubatch is one more pass over the
        weights. Generating tokens first, then prompts (llama-server's
        order) cut the run of generating sequences at every prompting slot
        between them: 8 sequences with one prompting in the middle decode
        in 274 ms, in id order in 241; 32 with five prompting, 870 against
        717 ms (scripts/step_cost.py --order, 2 threads, docs/PERFORMANCE.md)."""
        m = self.model
        m.clear()
        prompting, gen = [], []
        self.n_shift = 0
        for s in self.slots:
            s.i_batch = -1
            if s.state == SLOT_GEN and s.n_past + 1 >= s.n_ctx and self.ctx_shift:
                if self.kv is not None and self.kv.pending(s.id):
                    continue  # a stream copy made for the current positions runs at this decode: shift next step
                p = s.req.params
                self.n_shift += 1  # its seq_add is applied by this decode's K-shift graph: never aborted (preempt.py)
                shift_context(m, s, int(p["n_keep"]), int(p["n_discard"]))
                if self.kv is not None:
                    self.kv.sync(s)  # the entry shrinks to the exact prefix at once
            if s.state == SLOT_GEN:
                gen.append(s)
            elif s.state == SLOT_PROMPT:
                prompting.append(s)
        n = len(gen)
        chunks: dict[int, int] = {}
        if prompting:
            room = self.budget.room(n, max(s.remaining for s in prompting))
            chunks = {s.id: k for s, k in plan(prompting, room, rule=self.cfg.admit, now=time.perf_counter())}
        ids = {s.id for s in gen}
        for s in self.slots:
            if s.id in ids:
                s.cache[s.n_past] = s.last
                s.i_batch = m.add(s.last, s.n_past, s.id, True)
                s.n_past += 1
            elif s.id in chunks:
                self.feed(s, chunks[s.id])
        self.n_spec = 0
        # drafted tokens after each generating slot's last (engine/spec/), only in steps that admit no
        # prompt: there a drafted row would take a prompt token's room and lengthen the step that
        # carries prompt chunks (TTFT and every stream's ITL), for a gain of one stream
        if self.spec is not None and gen and not prompting:
            self.n_spec = self.spec.draft(gen, n, m.batch.cap - n,
                                          lambda s: self.arena.channel(s.req.channel).ring.space.value)
        self.n_gen = n + self.n_spec
        self.n_prompt = sum(chunks.values())
        return self.n_gen + self.n_prompt

    def feed(self, s: Slot, k: int) -> None:
        """Add the next k tokens of ``s``'s prompt to the batch; the last
        prompt token asks for logits, and ``i_batch`` then points at it."""
        end = s.i_prompt + k
        chunk = s.req.prompt[s.i_prompt:end]
        s.cache[s.n_past:s.n_past + k] = chunk
        idx = self.model.add_many(chunk, s.n_past, s.id, end == len(s.req.prompt))
        s.n_past += k
        s.i_prompt = end
        s.fed = s.progress
        if end == len(s.req.prompt):
            s.i_batch = idx

    def express(self) -> None:
        """Short prompts that would share this step with other rows are
        decoded, sampled and published first, each alone, one after the
        other, oldest first (budget.express); the step then carries them as
        generating rows. One decode each, not one for all: on the CPU a
        prompt's decode costs about the sum of its tokens, so three chat
        turns of ~27 tokens decoded together each waited for all 81 (~200
        ms here), where one after the other the first is out after ~70 ms,
        the second after ~140, the third after ~210 (bench_cache chat,
        docs/ARCHITECTURE.md). Not fed to the budget's cost model: its fixed
        cost spread over a few prompt tokens would overstate what a prompt
        token adds to a step."""
        m, tr = self.model, self.tr
        while True:
            prompting = [s for s in self.slots if s.state == SLOT_PROMPT]
            quick = express(prompting, self.cfg.express_tokens, self.n_batch)
            # only where the step has other rows: generating ones, or another prompt (expressed or not: two chat
            # turns that came back to idle slots together would otherwise each wait for both; issue 23's fleet)
            if not quick or not (len(prompting) > 1 or any(s.state == SLOT_GEN for s in self.slots)):
                return
            q = quick[0]
            m.clear()
            for s in self.slots:
                s.i_batch = -1
            self.cnt[CNT["batch_tokens_total"]] += q.remaining
            self.feed(q, q.remaining)
            tr.mark(BUILD)
            ret = m.decode()
            tr.mark(DECODE)
            self.cnt[CNT["n_decode_total"]] += 1
            self.cnt[CNT["express_total"]] += 1
            if self.kv is not None and ret != -1:
                self.kv.stepped()
            if ret != 0:
                self.fail_batch(ret, [q])
            else:
                self.sample([q])
            tr.mark(SAMPLE)
            self.publish()
            tr.mark(PUBLISH)
            if self.queue and self.kv is not None:  # a cache hit held back for this decode (Engine.later)
                if self.files.pending:  # as intake: an idle slot is saved before a queued request takes it
                    self.files.run(self)
                self.assign()
                tr.mark(INTAKE)

    def fail_batch(self, ret: int, slots: list[Slot] | None = None) -> None:
        msg = "Context size has been exceeded." if ret == 1 else "Compute error."
        for s in self.slots if slots is None else slots:
            if s.i_batch >= 0 or s.state == SLOT_PROMPT:
                self.model.seq_rm(s.id, 0, -1)
                s.n_past = 0
                self.finish(s, STOP_ERROR, 500, msg)

