"""GET /metrics: llama-server's ``llamacpp:*`` names plus ``ringserve:*``,
and the ``vllm:*`` gauges gateways scrape.

Values are read from the arena at scrape time (the engine's counters and
histograms, the channel headers), so every worker renders the same numbers
without a multiprocess registry. Rendered with prometheus_client from a
per-app registry.

The rate gauges (``prompt_tokens_seconds``, ``predicted_tokens_seconds``)
are llama-server's per-scrape buckets: tokens (decode steps) over their
processing seconds since the previous /metrics call, 0 for an empty window.
Several workers serve /metrics, so the window's start cannot live in one of
them, and no lock is shared between processes: each worker writes, as a
seqlock, its own row of the arena's ``scrape`` table (the rate counters at
its last scrape; ipc/layout.py SCRAPE), and a scrape's window starts at the
latest row of all (the largest counters, which only grow). Consecutive
scrapes thus get disjoint, gapless windows whichever worker serves each;
two scrapes that two workers serve at the same instant may both report the
same window (llama-server serializes its scrapes on its task queue and would
split it); a worker's threads take turns on its row. While the
engine sleeps (--sleep-idle-seconds) every figure comes from the snapshot
it took before freeing the model (``arena.asleep``), as llama-server's
cached_metrics: the first scrape then reports the window up to the last
work, the next ones an empty window, and a wake-up reports nothing twice.

The ``vllm:*`` gauges are the Gateway API inference extension's Model
Server Protocol under vLLM's names, the EPP's default engine config (no
configuration needed): waiting and running requests and KV usage (0-1) from
the same ``Load`` snapshot as /v1/loads (load.py), and
``vllm:cache_config_info{block_size="B",num_gpu_blocks=N}`` with B the KV
events' block size (16, or ``--kv-events-config``'s ``block_size``) and N =
the KV cells running requests can fill / B (llama.cpp's KV has cells, not
blocks). Each has the served model's
name as ``model_name``, as vLLM's do.
"""
from __future__ import annotations

import threading
import time

import numpy as np
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from engine.tracer import PHASES
from ipc.layout import CH_LEASED, CHAN_HDR, CNT, HIST_NAMES, N_HIST, RATE_COUNTERS

from .load import Load, LoadReader

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

LLAMA_COUNTERS = (
    ("prompt_tokens_total", "Number of prompt tokens processed."),
    ("prompt_tokens_cached_total", "Number of prompt tokens reused from the cache"),
    ("prompt_seconds_total", "Prompt process time"),
    ("tokens_predicted_total", "Number of generation tokens processed."),
    ("tokens_predicted_seconds_total", "Predict process time"),
    ("n_decode_total", "Total number of llama_decode() calls"),
    ("spec_decode_num_draft_tokens_total", "Speculative: Total draft tokens generated"),
    ("spec_decode_num_accepted_tokens_total", "Speculative: Total draft tokens accepted by the target model"),
    ("spec_decode_num_drafts_total", "Speculative: Total speculative decoding verification steps"),
)
# llama-server types n_tokens_max a counter without the _total suffix, which
# prometheus_client's counters always add: rendered as a gauge, retyped in render()
N_TOKENS_MAX = ("n_tokens_max", "Largest observed n_tokens.")
LLAMA_GAUGES = (
    ("requests_deferred", "Number of requests deferred."),
)
OUR_COUNTERS = (
    ("prompt_tokens_cached_total", "Prompt tokens reused from a slot's KV cache."),
    ("requests_total", "Requests the engine accepted."),
    ("steps_total", "Engine decode-loop steps."),
    ("express_total", "Decodes of short prompts alone before a step's other rows (a cache hit's question)."),
    ("steps_preempted_total", "Decode steps aborted for a cache hit that arrived during them."),
    ("ring_pushes_total", "Token records published to channels."),
    ("ring_full_pauses_total", "Slot pauses because a reader's ring was full."),
    ("stall_cancels_total", "Requests cancelled after a stalled reader."),
    ("cancels_total", "Requests cancelled (client gone, stop string, reclaim)."),
    ("batch_tokens_total", "Tokens submitted to llama_decode."),
    ("cache_hits_total", "Requests that reused a cached prefix (prefix cache)."),
    ("cache_tokens_reused_total", "Prompt tokens reused from the prefix cache instead of evaluated."),
    ("cache_evictions_total", "Cached prefixes dropped (from a slot with no copy kept, or from RAM)."),
    ("cache_tokens_evicted_total", "Tokens of the cached prefixes dropped."),
    ("cache_copies_total", "Cached prefixes copied from another slot's KV."),
    ("cache_ram_saves_total", "Slot KV saved to host RAM before the slot was reused (--cache-ram)."),
    ("cache_ram_loads_total", "Cached prefixes restored from host RAM."),
    ("cache_parks_total", "Slot contents copied whole into a parking stream (--cache-streams)."),
    ("cache_host_loads_total", "Cached prefixes loaded from a peer instance on this host (--cache-host)."),
    ("cache_host_publishes_total", "Evaluated prompts offered to the peer instances (--cache-host)."),
    ("cache_host_waits_total", "Engine steps a request waited for a peer instance's prompt (--cache-host)."),
    ("cache_copy_seconds_total", "Engine-loop seconds spent copying KV (slot to slot, to and from RAM)."),
    ("kv_events_total", "KV events published (--kv-events-config: BlockStored, BlockRemoved, AllBlocksCleared)."),
    ("kv_events_dropped_total", "KV events dropped because the ZMQ send queue was full (--kv-events-config)."),
)
OUR_GAUGES = (
    ("cache_tokens_held", "Tokens whose KV the prefix cache holds now (slots and RAM)."),
    ("cache_nodes", "Cached prefixes (slot contents and RAM entries) held now."),
    ("cache_copy_ms_max", "Longest time one request's KV copies held the engine loop (ms)."),
    ("cache_ram_tokens", "Tokens whose KV sits in host RAM (--cache-ram)."),
    ("cache_ram_bytes", "Bytes of KV held in host RAM (--cache-ram)."),
    ("cache_ram_entries", "Cached prefixes held in host RAM."),
)


class ArenaCollector:
    """A prometheus_client collector over one arena's shared counters."""

    def __init__(self, arena, load: LoadReader, model: str, w=lambda: 0):
        self.arena, self.load, self.model = arena, load, model
        self.w = w  # this worker's index: its row of the scrape table (module doc); None: no row
        self._turn = threading.Lock()  # this process's threads, one at a time on its row
        g = arena.geom
        self.hdrs = np.ndarray((g.n_channels,), CHAN_HDR, buffer=arena.segs["ch"].buf, offset=0,
                               strides=(g.chan_size(),))

    def collect(self):
        a = self.arena
        # the flag, then the copy: the engine writes the copy before the flag (Sleeper.freeze)
        src = a.asleep if a.counters[CNT["sleeping"]] else settled(a.counters)
        c = {k: float(src[i]) for k, i in CNT.items()}
        d_prompt, t_prompt, d_steps, t_pred = self._window(c)
        for name, text in LLAMA_COUNTERS:
            yield CounterMetricFamily(f"llamacpp:{name}", text, value=c[name])
        # Busy slots come from the slot table, which the engine marks idle
        # before a reader can see its request's last record: no lag.
        ld = self.load.read()
        busy = float(ld.running)
        yield GaugeMetricFamily("llamacpp:requests_processing", "Number of requests processing.", value=busy)
        for name, text in (*LLAMA_GAUGES, N_TOKENS_MAX):
            yield GaugeMetricFamily(f"llamacpp:{name}", text, value=c[name])
        ratio = lambda n, d: n / d if d > 0 else 0.0  # noqa: E731
        yield GaugeMetricFamily("llamacpp:prompt_tokens_seconds", "Average prompt throughput in tokens/s.",
                                value=ratio(d_prompt, t_prompt))
        # llama-server's rate counts decode steps: a request's first token
        # comes with its prompt's logits, and its time is the prompt's
        yield GaugeMetricFamily("llamacpp:predicted_tokens_seconds", "Average generation throughput in tokens/s.",
                                value=ratio(d_steps, t_pred))
        yield GaugeMetricFamily("llamacpp:n_busy_slots_per_decode", "Average number of busy slots per llama_decode() call",
                                value=ratio(c["n_busy_slots_total"], c["n_decode_total"]))
        for name, text in OUR_COUNTERS:
            yield CounterMetricFamily(f"ringserve:{name}", text, value=c[name])
        for name, text in OUR_GAUGES:
            yield GaugeMetricFamily(f"ringserve:{name}", text, value=c[name])
        ph = CounterMetricFamily("ringserve:engine_phase_seconds", "Engine time per decode-loop phase.",
                                 labels=["phase"])
        for p in PHASES:
            ph.add_metric([p], c[f"t_{p}_s"])
        yield ph
        yield GaugeMetricFamily("ringserve:channels_leased", "Result channels leased by workers now.",
                                value=float(np.count_nonzero(self.hdrs["state"] == CH_LEASED)))
        yield GaugeMetricFamily("ringserve:slots_busy", "Slots not idle now.",
                                value=busy)
        yield GaugeMetricFamily("ringserve:engine_epoch", "Engine starts since the arena was created.",
                                value=float(a.get("epoch")))
        for i, name in enumerate(HIST_NAMES):
            yield self._hist(name, a.hist[i])
        yield from self._vllm(ld)

    def _window(self, c: dict[str, float]) -> list[float]:
        """This scrape's window of the RATE_COUNTERS (module doc): their
        growth since the latest scrape by any worker; this worker's row
        then holds them, the next window's start."""
        cur = np.array([c[k] for k in RATE_COUNTERS])
        with self._turn:
            d = cur - latest(self.arena.scrape)
            if (d < 0).any():  # the counters went back (an arena reused by a test): a window from zero
                d = cur
            w = self.w()
            if w is None:  # no worker index (it answers 503 elsewhere): it reports, the next scrape again
                return [float(x) for x in d]
            row = self.arena.scrape[w]
            # the seqlock's write: odd, the counters, even (x86-64 keeps stores in program order and
            # CPython issues them so; a writer killed mid-write leaves it odd, and the next one, this
            # worker's successor at the same index, goes on from there: | 1 keeps the parity right)
            seq = int(row["seq"]) | 1
            row["seq"] = seq
            row["counters"] = cur
            row["seq"] = seq + 1
        return [float(x) for x in d]

    def _vllm(self, ld: Load):
        m = [self.model]
        for name, text, v in (
            ("num_requests_running", "Number of requests in model execution batches.", ld.running),
            ("num_requests_waiting", "Number of requests waiting to be processed.", ld.waiting),
            ("kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", ld.token_usage),
        ):
            g = GaugeMetricFamily(f"vllm:{name}", text, labels=["model_name"])
            g.add_metric(m, float(v))
            yield g
        info = GaugeMetricFamily("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
                                 labels=["block_size", "num_gpu_blocks", "model_name"])
        info.add_metric([str(ld.block_size), str(ld.total_tokens // ld.block_size), self.model], 1.0)
        yield info

    @staticmethod
    def _hist(name: str, row) -> HistogramMetricFamily:
        """Bucket k counts events in [2^k, 2^(k+1)) microseconds (k=0: < 2 us;
        engine.tracer.bucket), so its upper bound ``le`` is 2^(k+1) us."""
        counts = [int(x) for x in row[:N_HIST]]
        buckets, acc = [], 0
        for k, n in enumerate(counts):
            acc += n
            buckets.append((str(float(2 ** (k + 1)) / 1e6), acc))
        buckets.append(("+Inf", acc))
        approx = sum(n * (1.5 * 2**k if k else 1.0) for k, n in enumerate(counts)) / 1e6
        return HistogramMetricFamily(f"ringserve:{name}_seconds", f"Engine {name} latency (power-of-two buckets).",
                                     buckets=buckets, sum_value=approx)


def settled(counters: np.ndarray, wait: float = 0.05) -> np.ndarray:
    """A copy of the engine's counters taken while ``settle_seq`` was even
    and unchanged (engine/publish.py settle: a reader that saw a request's
    LAST record then finds its release, the cache gauges and the step's
    phase times counted; llama.cpp's server test test_sleep's read-only
    scrape compares two such pictures). The odd window is the end of a step
    (well under a millisecond); past ``wait`` seconds (an engine stopped
    mid-step) the copy is returned as it is."""
    i = CNT["settle_seq"]
    end = time.monotonic() + wait
    while True:
        v = consistent(lambda: counters[i], lambda: counters.copy())
        if v is not None:
            return v
        if time.monotonic() > end:
            return counters.copy()
        time.sleep(0.0002)


def consistent(seq, copy) -> np.ndarray | None:
    """One seqlock read: the sequence, the copy, the sequence again (x86-64
    does not reorder loads with loads); the copy if the sequence was even
    and unchanged, else None (a writer was mid-write: read again)."""
    before = int(seq())
    v = copy()
    return v if not before & 1 and int(seq()) == before else None


def latest(rows, tries: int = 1000) -> np.ndarray:
    """The largest consistent counters of the scrape rows (the latest
    scrape's: the counters only grow). A row read mid-write (odd or changed
    ``seq``) is read again; one left odd by a writer that died is skipped
    after ``tries`` reads."""
    best = np.zeros(len(RATE_COUNTERS))
    for row in rows:
        for _ in range(tries):
            v = consistent(lambda: row["seq"], lambda: row["counters"].copy())
            if v is not None:
                if v.sum() > best.sum():
                    best = v
                break
    return best


def registry(arena, load: LoadReader, model: str, w=lambda: 0) -> CollectorRegistry:
    """``w()``: the worker's index (its row of the scrape table), None if it has none."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(ArenaCollector(arena, load, model, w))
    return reg


_GAUGE_LINE = f"# TYPE llamacpp:{N_TOKENS_MAX[0]} gauge\n".encode()


def render(reg: CollectorRegistry) -> bytes:
    """The exposition text, with llama-server's type for n_tokens_max."""
    return generate_latest(reg).replace(_GAUGE_LINE, _GAUGE_LINE.replace(b"gauge", b"counter"), 1)
