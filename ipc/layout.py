"""Every shared-memory record layout of ringserve, declared once.

All processes (launcher, engine, workers, tests, scripts) import the formats
from here; nothing else in the tree spells a byte offset of a shared record.
Little-endian, explicit padding, every hot field 8-byte aligned so that a
single ``memoryview.cast('Q')`` load or store is one aligned 8-byte access.
"""
from __future__ import annotations

import json
import struct

import numpy as np

from .params import MAX_PROBS, RECORD

LINE = 64  # cache line; producer and consumer counters never share one
MAGIC = 0x52494E4753525631  # "RINGSRV1"
VERSION = 7  # 2: the control block no longer carries the config (RINGSERVE_CONFIG does);
# 3: counters appended (decode steps, prefix cache), SUB_SAVE/SUB_RESTORE, F_PROGRESS, RESULT.n_embd;
# 4: prefix-cache copy and host-RAM counters appended; 5: the /metrics scrape window and the asleep snapshot;
# 6: CTL.ready_pid; 7: PARAMS.min_keep

# --- ring header: line 0 = (magic, capacity, record size), line 1 = head, line 2 = tail
RING_HDR = struct.Struct("<QQQ")
RING_HEAD_OFF = LINE  # u64, written only by the producer, only increases
RING_TAIL_OFF = 2 * LINE  # u64, written only by the consumer, only increases
RING_DATA_OFF = 3 * LINE


def ring_bytes(capacity: int, record_size: int) -> int:
    """Bytes one ring of `capacity` records takes, rounded up to whole lines."""
    n = RING_DATA_OFF + capacity * record_size
    return (n + LINE - 1) // LINE * LINE


# --- token record (engine -> reader), one per generated token or final event.
# seq: absolute ring position (a debugging and recovery check);
# rid: request id of the lease it belongs to (a reader drops every other rid);
# t_ns: engine CLOCK_MONOTONIC time of publication; token: id or -1 (final event
# without a token); flags: FIRST/LAST + stop reason << 8; n_probs: how many
# entries this record's probs row holds; logprob: of the sampled token.
# Token records per channel by default: how far a reader may fall behind
# before its slot pauses (~1.5-6 s of one slot's tokens; a reading client's
# backlog is 0-2 records).
RING_CAP = 64
TOKEN = struct.Struct("<QQqiHHf4x")
assert TOKEN.size == 40

F_FIRST = 1
F_LAST = 2
# A prompt-progress record (only for requests whose return_progress row is
# set): token = prompt tokens in the slot's KV so far, cached ones included;
# logprob = ms since the request took its slot. The first one, published
# when it takes the slot, carries the cached count; then one per evaluated
# chunk, the last (= the prompt's length) just before the first token.
# Best effort: a full ring drops it and never pauses the slot.
F_PROGRESS = 4
STOP_SHIFT = 8
# Engine-side stop reasons (word stops belong to the worker).
STOP_NONE, STOP_EOS, STOP_LIMIT, STOP_CTX, STOP_CANCEL, STOP_ERROR, STOP_SHUTDOWN, STOP_STALL = range(8)
STOP_NAMES = ("none", "eos", "limit", "ctx", "cancel", "error", "shutdown", "stall")

# Top-n probabilities live beside the records, row i belonging to ring slot i:
# MAX_PROBS x (token id, logprob). Written only when the request asked for them.
PROB = np.dtype([("id", "<i4"), ("logprob", "<f4")])

# --- submission record (worker -> engine)
SUB = struct.Struct("<QQIHHq")  # seq, rid, channel, kind, pad, arg
assert SUB.size == 32
SUB_SUBMIT, SUB_CANCEL, SUB_ERASE = 1, 2, 3
# /slots save and restore: the channel's grammar area holds the file name (engine/slotfile.py)
SUB_SAVE, SUB_RESTORE = 4, 5

# --- channel header and areas (one channel per in-flight request)
# Line 0: lease state written by the owning worker.
CHAN_HDR = np.dtype(
    [
        ("state", "<u4"),  # CH_FREE / CH_LEASED
        ("worker", "<u4"),  # worker index that owns the channel's range
        ("owner_pid", "<i8"),
        ("generation", "<u8"),  # the owning worker's registration generation
        ("rid", "<u8"),  # request id of the current lease (0 = none)
        ("cancel", "<u4"),  # set by the reader; polled by the engine each step
        ("end_stop", "<u4"),  # engine: stop reason of a request it ended without
        ("end_rid", "<u8"),  # room for the LAST record (see Lease.read)
        ("_pad2", "<u8", 2),
    ]
)
assert CHAN_HDR.itemsize == LINE
CH_FREE, CH_LEASED = 0, 1



def _params_dtype() -> np.dtype:
    """Sampling parameters, written by the worker before SUB_SUBMIT (the
    submission ring's semaphore post orders these stores before the engine's
    read). Built from ipc/params.py's table: n_prompt, the 4-byte rows, the
    1-byte rows (table order within each), padding to 4, the grammar and
    bias lengths, padding to whole lines. With today's table the layout is
    the hand-written one of VERSION 1 byte for byte (tests/test_params.py)."""
    rows = [("n_prompt", "<u4")]
    rows += [(p.name, p.code) for p in RECORD if np.dtype(p.code).itemsize == 4]
    small = [(p.name, p.code) for p in RECORD if np.dtype(p.code).itemsize == 1]
    rows += small
    if len(small) % 4:
        rows.append(("_pad", "u1") if len(small) % 4 == 3 else ("_pad", "u1", (4 - len(small) % 4,)))
    rows += [("n_grammar", "<u4"), ("n_bias", "<u4")]  # bytes of GBNF in the grammar area; logit-bias entries
    n = sum(np.dtype([r]).itemsize for r in rows)
    size = max(2 * LINE, (n + LINE - 1) // LINE * LINE)
    rows.append(("_pad2", "<u4", ((size - n) // 4,)))
    return np.dtype(rows)


PARAMS = _params_dtype()
assert PARAMS.itemsize % LINE == 0
MAX_GRAMMAR = 16384
# A lazy grammar (native tool calls, frontends/text/toolfmt/grammar.py): the grammar area's
# first line is this GBNF comment + JSON {"patterns": [regex, ...]}; the sampler stays off
# until one pattern matches the generated text (llama_sampler_init_grammar_lazy_patterns).
LAZY_GRAMMAR = b"# lazy: "


def lazy_header(area: bytes) -> tuple[dict | None, bytes]:
    """(a lazy grammar's settings, or None; the GBNF after its header line).
    ValueError: the header's JSON is bad."""
    if not area.startswith(LAZY_GRAMMAR):
        return None, area
    line, _, rest = area.partition(b"\n")
    return json.loads(line[len(LAZY_GRAMMAR):]), rest


MAX_BIAS = 512
BIAS = np.dtype([("id", "<i4"), ("bias", "<f4")])

# Written by the engine before it publishes the LAST record (ordered by that post).
RESULT = np.dtype(
    [
        ("id_slot", "<i4"),
        ("n_prompt", "<i4"),  # prompt tokens of the request
        ("n_cache", "<i4"),  # tokens reused from the slot's KV cache
        ("n_eval", "<i4"),  # prompt tokens evaluated
        ("n_decoded", "<i4"),
        ("n_ctx_used", "<i4"),  # tokens in the slot's KV at finish (tokens_cached)
        ("prompt_ms", "<f8"),
        ("predicted_ms", "<f8"),
        ("error_code", "<i4"),  # HTTP-like code for STOP_ERROR
        ("n_embd", "<i4"),  # --embedding: floats of the vector written over the prompt area (Channel.vector)
        ("n_discarded", "<i4"),  # tokens dropped by context shifts (--context-shift): > 0 = truncated
        ("error", "S200"),
        ("draft_n", "<i4"),  # speculative decoding: tokens drafted for this request (engine/spec/)
        ("draft_n_accepted", "<i4"),  # ... and accepted by its sampler
    ]
)


def chan_layout(max_prompt: int, ring_cap: int) -> dict[str, int]:
    """Offsets of one channel's areas; every area starts on a line.

    Under --embedding the prompt area doubles as the vector area (float32,
    ``RESULT.n_embd`` of them): the engine copies the prompt out at intake
    (read_request), writes the pooled vector there and then the result
    before the LAST record's post, which orders both for the reader; the
    arena is sized so that max_prompt >= n_embd (engine/process.py)."""
    up = lambda n: (n + LINE - 1) // LINE * LINE  # noqa: E731
    off = {"hdr": 0, "params": LINE}
    off["result"] = off["params"] + PARAMS.itemsize
    off["prompt"] = off["result"] + up(RESULT.itemsize)
    off["grammar"] = off["prompt"] + up(4 * max_prompt)
    off["bias"] = off["grammar"] + MAX_GRAMMAR
    off["ring"] = off["bias"] + up(BIAS.itemsize * MAX_BIAS)
    off["probs"] = off["ring"] + ring_bytes(ring_cap, TOKEN.size)
    off["size"] = off["probs"] + up(ring_cap * MAX_PROBS * PROB.itemsize)
    return off


# --- control block
ST_LOADING, ST_READY, ST_FAILED, ST_STOPPING, ST_DOWN = range(5)
STATE_NAMES = ("loading", "ready", "failed", "stopping", "down")

# Arena geometry and model facts, written once by the launcher (geometry) and
# the engine (model facts) and read by everyone.
CTL = np.dtype(
    [
        ("magic", "<u8"),
        ("version", "<u4"),
        ("state", "<u4"),
        ("launcher_pid", "<i8"),
        ("launcher_start", "<u8"),  # /proc start time, guards against pid reuse
        ("engine_pid", "<i8"),
        # the last engine to reach READY, never cleared: whether an engine that died was ever ready,
        # whatever state it left (an exception's DOWN) and however soon (frontends/process/procs.py died)
        ("ready_pid", "<i8"),
        ("epoch", "<u8"),  # incremented by every engine start
        ("heartbeat_ns", "<u8"),
        # geometry
        ("n_workers", "<u4"),  # worker indices (2x gunicorn workers: HUP overlap)
        ("n_chan", "<u4"),  # channels per worker index
        ("ring_cap", "<u4"),  # token records per channel
        ("sub_cap", "<u4"),  # submission records per worker
        ("max_prompt", "<u4"),  # prompt ids per channel (= slot context)
        ("n_slots", "<u4"),
        # model facts (engine)
        ("n_ctx", "<u4"),
        ("n_ctx_slot", "<u4"),
        ("n_vocab", "<u4"),
        ("n_ctx_train", "<u4"),
        ("kv_bytes", "<u8"),
        ("swa_full", "<u4"),
        ("draining", "<u4"),  # set by the launcher on SIGTERM: /health answers 503
        ("reason", "S256"),  # why ST_FAILED
    ]
)

# Engine counters for /metrics, one float64 each, written only by the engine.
COUNTERS = (
    "prompt_tokens_total",
    "prompt_tokens_cached_total",
    "prompt_seconds_total",
    "tokens_predicted_total",
    "tokens_predicted_seconds_total",
    "n_decode_total",
    "n_busy_slots_total",
    "n_tokens_max",
    "requests_deferred",
    "requests_total",
    "steps_total",
    "express_total",  # short prompts' decodes of their own before a step (engine/loop.py express)
    "steps_preempted_total",  # pure decode steps aborted for a cache hit that came (engine/preempt.py)
    "ring_pushes_total",
    "ring_full_pauses_total",
    "stall_cancels_total",
    "cancels_total",
    "t_intake_s",
    "t_build_s",
    "t_decode_s",
    "t_sample_s",
    "t_publish_s",
    "t_idle_s",
    "batch_tokens_total",
    "probs_total",  # tokens whose top-n probabilities were computed
    "device_samples_total",  # tokens sampled by a chain in the decode graph (--backend-sampling)
    "tokens_predicted_steps_total",  # generated tokens but each request's first (it comes with the prompt)
    # prefix cache (engine/kvcache.py): totals, and gauges of what the tree holds now
    "cache_hits_total",
    "cache_tokens_reused_total",
    "cache_tokens_held",
    "cache_nodes",
    "cache_evictions_total",
    "cache_tokens_evicted_total",
    "cache_copies_total",  # prefixes copied from another slot's stream
    "cache_ram_saves_total",  # slot KV saved to host RAM before it was overwritten
    "cache_ram_loads_total",  # prefixes restored from host RAM
    "cache_copy_seconds_total",  # loop time spent copying KV (slot to slot, to and from RAM)
    "cache_copy_ms_max",  # the longest one request's copies held the loop
    "cache_parks_total",  # slot contents copied whole into a parking stream (--cache-streams)
    "cache_ram_tokens",
    "cache_ram_bytes",
    "cache_ram_entries",
    "cache_host_loads_total",  # prefixes loaded from a peer instance's entry (--cache-host)
    "cache_host_publishes_total",  # evaluated prompts offered to the peers (--cache-host)
    "cache_host_waits_total",  # steps a request waited for a peer's prompt instead of evaluating it
    # KV events (engine/kvevents.py, --kv-events-config)
    "kv_events_total",  # events sent (BlockStored, BlockRemoved, AllBlocksCleared)
    "kv_events_dropped_total",  # events of messages dropped because the send queue was full
    # speculative decoding (engine/spec/), llama-server's llamacpp:spec_decode_* names
    "spec_decode_num_draft_tokens_total",  # tokens drafted and added to a step's batch
    "spec_decode_num_accepted_tokens_total",  # drafted tokens the slot's sampler accepted
    "spec_decode_num_drafts_total",  # verification steps (one per slot with a draft in a step)
    # --sleep-idle-seconds (engine/sleep.py): 1 while the model is unloaded; the workers' wake-up calls
    "sleeping",
    "sleeps_total",
    # odd while a step's records are out and its accounting is not (the slot's release into the prefix
    # tree, the cache gauges, the step's phase times): /metrics waits for even (engine/publish.py settle)
    "settle_seq",
)
CNT = {name: i for i, name in enumerate(COUNTERS)}
N_COUNTERS = 64

# Per worker index, one line: who holds it and the registration handshake.
WORKER = np.dtype(
    [
        ("pid", "<i8"),
        ("generation", "<u8"),  # CLOCK_MONOTONIC ns at registration: only increases
        ("req_seq", "<u8"),  # bumped by the worker to ask for a (re)registration
        ("ack_seq", "<u8"),  # set by the engine once the index is reset for it
        ("epoch", "<u8"),  # engine epoch that acked
        ("_pad", "<u8", 3),
    ]
)
assert WORKER.itemsize == LINE

# Per slot, one line for /slots, written by the engine (monitoring only).
SLOT = np.dtype(
    [
        ("state", "<i4"),  # 0 idle, 1 prompt, 2 generating, 3 paused
        ("channel", "<i4"),
        ("rid", "<u8"),
        ("n_prompt", "<i4"),
        ("n_cache", "<i4"),
        ("n_decoded", "<i4"),
        ("n_past", "<i4"),  # tokens in the slot's KV
        ("n_predict", "<i4"),
        ("id_task", "<i4"),
        ("_pad", "<u8", 3),
    ]
)
assert SLOT.itemsize == LINE
SLOT_IDLE, SLOT_PROMPT, SLOT_GEN, SLOT_PAUSED = range(4)

N_HIST = 32  # histogram buckets (power-of-two microseconds)
HIST_NAMES = ("step", "host", "wake")

# The /metrics rate window (llama-server's per-scrape buckets, frontends/api/metrics.py):
# one row per worker, the rate counters' values at that worker's last scrape.
# Each row has one writer (its worker, one thread at a time) and is a seqlock:
# ``seq`` is odd while the counters are written; a reader retries until it
# reads the same even ``seq`` before and after copying them. No lock is shared:
# the window starts at the latest row (the largest counters: they only grow).
SCRAPE = np.dtype([("seq", "<u8"), ("counters", "<f8", (4,)), ("_pad", "<u8", 3)])
assert SCRAPE.itemsize == LINE
# the counters a window spans: (tokens, seconds) of prompts, (decode steps, seconds) of generation
RATE_COUNTERS = ("prompt_tokens_total", "prompt_seconds_total", "tokens_predicted_steps_total",
                 "tokens_predicted_seconds_total")


def ctl_layout(n_workers: int, n_slots: int) -> dict[str, int]:
    """Offsets inside the control segment."""
    up = lambda n: (n + LINE - 1) // LINE * LINE  # noqa: E731
    off = {"ctl": 0}
    off["counters"] = up(CTL.itemsize)
    off["hist"] = off["counters"] + 8 * N_COUNTERS
    # the engine's copy of the counters taken as it falls asleep (engine/sleep.py):
    # /metrics renders it while the ``sleeping`` counter is set, as llama-server
    # serves the snapshot it took on entering sleep
    off["asleep"] = up(off["hist"] + 8 * N_HIST * len(HIST_NAMES))
    off["scrape"] = off["asleep"] + 8 * N_COUNTERS
    off["workers"] = off["scrape"] + SCRAPE.itemsize * n_workers
    off["slots"] = off["workers"] + WORKER.itemsize * n_workers
    off["size"] = off["slots"] + SLOT.itemsize * max(n_slots, 1)
    return off
