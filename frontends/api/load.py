"""What the engine carries now, in the figures gateways balance on.

One snapshot of the engine, read from the arena's shared state (the slot
table, the engine's counters, the control block), never from this worker's
own requests: every gunicorn worker of an instance answers with the same
numbers, and /v1/loads (fleet.py) and the ``vllm:*`` gauges of /metrics
(metrics.py) are two renderings of one ``Load``, so smg and the Gateway API
inference extension see the same load.

The figures and where they come from:

* ``running``: slots not idle in the slot table (a request in a slot, from
  its first prompt chunk to its last record; the engine marks the row idle
  before the reader can see the end, so a finished request never lingers).
* ``waiting``: the ``requests_deferred`` counter, which the engine sets to
  the length of its queue after every intake (engine/loop.py): requests it
  has taken off the submission rings but not yet given a slot (no slot
  idle, a named slot busy, or waiting for a cached prefix). Requests still
  in a worker (tokenizing) or in a submission ring the engine has not read
  yet (inside a long step) are not counted; a gateway counts what it sent.
* ``used_tokens``: KV cells the running requests hold, the sum over busy
  slots of max(n_past, n_prompt): a slot that took a prompt fills its KV to
  the prompt's length within its prompt steps (the row's n_past is updated
  per published record only). Idle slots' cached prefixes are not counted:
  they are evictable, as vLLM's free prefix blocks and SGLang's evictable
  radix cache do not count as used.
* ``total_tokens``: the KV cells running requests can fill, slots x the
  slot context (n_ctx_slot); cache-only parking streams (--cache-streams)
  are left out for the same reason. ``token_usage`` = used / total, 0-1.
* ``gen_throughput``: generated tokens per second over this process's last
  window of at least WINDOW seconds (finished requests' tokens from the
  counters plus the busy slots' n_decoded), as SGLang reports its recent
  rate; 0 until a second sample exists. A request counted at the step its
  slot ends may count twice at one sample and is then corrected.
* ``cache_hit_rate``: prompt tokens reused from the KV / prompt tokens,
  over the engine's life (prompt_tokens_cached_total and
  prompt_tokens_total, which counts the evaluated ones).

Cheap by design (the EPP scrapes /metrics every 50 ms): one copy of the slot
table (a line per slot) and a few counters, no lock, no engine round trip.
The engine writes these concurrently; a reader may see one step's rows
half updated, which monitoring tolerates.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from engine import kvevents
from ipc.layout import CNT, SLOT_IDLE

from frontends.http.ctx import Ctx

WINDOW = 1.0  # seconds: the shortest window gen_throughput is measured over
BLOCK = kvevents.BLOCK  # tokens per KV block as gateways count them, unless --kv-events-config names another


@dataclass(frozen=True)
class Load:
    running: int
    waiting: int
    used_tokens: int
    total_tokens: int
    max_running: int  # slots: requests the engine runs at once
    gen_throughput: float
    cache_hit_rate: float
    block_size: int = BLOCK  # the KV events' block (--kv-events-config's block_size): vllm:cache_config_info

    @property
    def token_usage(self) -> float:
        return min(self.used_tokens / self.total_tokens, 1.0) if self.total_tokens > 0 else 0.0


class LoadReader:
    """``read()`` -> the engine's ``Load`` now. One per worker app
    (frontends/api/app.py), shared by /v1/loads and /metrics; its only state
    is the previous throughput sample."""

    def __init__(self, ctx: Ctx):
        self.ctx = ctx
        ev = kvevents.parse(ctx.cfg.kv_events_config)  # valid: the CLI parsed it at start
        self.block = ev.block_size if ev is not None else BLOCK
        self._t0 = self._n0 = 0.0
        self._rate = 0.0

    def read(self) -> Load:
        ctx = self.ctx
        a = ctx.arena
        rows = a.slots.copy()
        busy = rows["state"] != SLOT_IDLE
        held = np.maximum(rows["n_past"][busy], rows["n_prompt"][busy]).clip(0)
        c = a.counters
        generated = float(c[CNT["tokens_predicted_total"]]) + float(rows["n_decoded"][busy].clip(0).sum())
        evaluated, cached = float(c[CNT["prompt_tokens_total"]]), float(c[CNT["prompt_tokens_cached_total"]])
        n_slots = len(rows)
        return Load(running=int(busy.sum()), waiting=int(c[CNT["requests_deferred"]]),
                    used_tokens=int(held.sum()), total_tokens=n_slots * ctx.n_ctx_slot, max_running=n_slots,
                    gen_throughput=self._throughput(generated),
                    cache_hit_rate=cached / (evaluated + cached) if evaluated + cached > 0 else 0.0,
                    block_size=self.block)

    def _throughput(self, generated: float) -> float:
        now = time.monotonic()
        if self._t0 == 0.0 or generated < self._n0:  # first sample, or the counters went back (a new arena)
            self._t0, self._n0, self._rate = now, generated, 0.0
        elif now - self._t0 >= WINDOW:
            self._rate = (generated - self._n0) / (now - self._t0)
            self._t0, self._n0 = now, generated
        return self._rate
