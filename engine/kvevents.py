"""KV events: the prefix cache's index published as vLLM's ZMQ KV events (issue 23).

llm-d's precise prefix routing (and anything else reading vLLM's
``--kv-events-config`` stream) learns which token blocks each pod holds
from these events. Here they are derived from the prefix cache's own index
(engine/prefix.py): the tree calls ``held`` when an entry is registered and
``gone`` when it goes, and those are the only calls that change it, so the
published set is exactly what the index holds (the hooks' rule below).

Blocks. llama.cpp has no paged KV: a block is a logical run of BLOCK (16,
llm-d's default ``blockSizeTokens``; ``block_size`` in the JSON sets it)
token ids at positions [16 i, 16 i + 16) of a cached prefix. Only whole
blocks count: an entry of n tokens holds blocks 0 .. n // 16 - 1. A block's
hash chains its parent's: h_i = blake2b-64(h_{i-1} as 8 bytes big-endian,
its 16 token ids as u32 little-endian), h_{-1} = 0 (sent as parent None);
64-bit, deterministic across processes and runs (Python's ``hash`` is not).

Media. ``"GPU"``: KV in llama.cpp's streams (the slots and the parking
streams), the device tier even on a CPU-only host, where llama.cpp's KV
sits in host memory; ``"CPU"``: the host-RAM tier (--cache-ram blobs,
engine/ramcache.py). A block is Stored on a medium when the first entry on
that medium comes to hold it and Removed when the last one lets it go.
Every entry holds its whole prefix on its own medium, so each medium's set
is prefix-closed: a block's parent is always announced on that medium
before it (in an earlier message, or earlier in the same one).

Changes are netted per flush, once per engine step (SlotCache.publish): a
request that keeps its slot's prefix removes and re-registers the slot's
entry within the step, and neither shows. What the subscriber knows
(``ann``) equals, after every flush, the blocks some entry holds.

Wire format (vLLM's ZmqEventPublisher, read by llm-d's kvevents pool): a
PUB socket (an XPUB, see Cost) bound to ``endpoint``; one message per flush that has events,
three frames ``[topic utf-8, seq u64 big-endian, msgpack payload]``; the
payload is ``[ts float (unix s), [event, ...], dp_rank 0]`` and each event
a msgpack array (vLLM's array_like tagged form):

* ``["BlockStored", [h, ...], parent_h | None, [token ids of those blocks],
  block_size, None (lora_id), medium]``, blocks in chain order;
* ``["BlockRemoved", [h, ...], medium]``;
* ``["AllBlocksCleared"]``: at start (a restarted engine holds nothing) and
  at shutdown.

Sliding-window models (gemma 3: n_swa 512): a slot or parked prefix is
reusable at every block boundary, but a RAM blob longer than n_swa is
exact only at its full length and at its checkpoints (engine/kvcache.py).
Its blocks are all published, so the router's CPU-tier score is exact for
a prompt that extends the whole blob (a conversation's next turn, the
case the tier exists for) and an upper bound for one branching off inside
it, which the engine then recomputes from the longest usable prefix.

Cost. The loop never waits on the socket: sends are NOBLOCK into queues
bounded by ``hwm`` messages per subscriber (default 10000). The socket is
an XPUB with XPUB_NODROP (a PUB to every SUB), so a message a full queue
cannot take is refused rather than silently lost: it is dropped for every
subscriber and counted (``ringserve:kv_events_dropped_total``); the
subscriber then has a gap in ``seq``, as with vLLM's PUB. pyzmq and
msgpack are imported only when events are on.
"""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass

import numpy as np

from ipc.layout import CNT

from .prefix import Entry, common

BLOCK = 16  # llm-d's default block size (tokens)
GPU, CPU = "GPU", "CPU"  # vLLM's medium names: llama.cpp's streams, the host-RAM tier
HWM = 10_000  # messages queued for sending before a send is dropped
KNOWN = {"enable_kv_cache_events", "publisher", "endpoint", "topic", "hwm", "block_size", "replay_endpoint",
         "buffer_steps", "max_queue_size"}  # vLLM's KVEventsConfig fields (the last two: no meaning here)


class SetupError(ValueError):
    """The events cannot start (bad config, socket that cannot bind): the engine fails loudly."""


@dataclass(frozen=True)
class Settings:
    endpoint: str
    topic: str = ""
    hwm: int = HWM
    block_size: int = BLOCK


def parse(text: str) -> Settings | None:
    """``--kv-events-config`` JSON -> Settings, or None when events are off
    (empty, ``enable_kv_cache_events`` false, or publisher "null"). Raises
    SetupError (a ValueError: the CLI's usage error, exit 2) for malformed
    JSON, unknown fields, an unknown publisher or no endpoint."""
    if not text or not text.strip():
        return None
    try:
        d = json.loads(text)
    except ValueError as e:
        raise SetupError(f"not JSON: {e}") from None
    if not isinstance(d, dict):
        raise SetupError("expected a JSON object")
    unknown = sorted(set(d) - KNOWN)
    if unknown:
        raise SetupError(f"unknown field(s) {', '.join(unknown)} (known: {', '.join(sorted(KNOWN))})")
    on = d.get("enable_kv_cache_events", False)
    if not isinstance(on, bool):
        raise SetupError("enable_kv_cache_events must be true or false")
    pub = d.get("publisher", "zmq" if on else "null")
    if pub not in ("zmq", "null"):
        raise SetupError(f"unknown publisher {pub!r} (zmq or null)")
    if d.get("replay_endpoint"):
        raise SetupError("replay_endpoint is not supported")
    if not on or pub == "null":
        return None
    ep = d.get("endpoint")
    if not isinstance(ep, str) or "://" not in ep:
        raise SetupError("enable_kv_cache_events needs an endpoint such as tcp://*:5557")
    topic = d.get("topic", "")
    hwm = d.get("hwm", HWM)
    bs = d.get("block_size", BLOCK)
    if not isinstance(topic, str):
        raise SetupError("topic must be a string")
    for k, v in (("hwm", hwm), ("block_size", bs)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise SetupError(f"{k} must be a positive integer")
    return Settings(ep, topic, hwm, bs)


def chain(tokens: np.ndarray, bs: int = BLOCK, parent: int = 0) -> list[int]:
    """The hashes of the whole blocks of ``tokens``, chained from ``parent``
    (0: the first block of a sequence). Module doc has the definition."""
    nb = len(tokens) // bs
    data = np.ascontiguousarray(tokens[:nb * bs], dtype="<u4").tobytes()
    w, out, h = 4 * bs, [], parent
    for i in range(nb):
        h = int.from_bytes(hashlib.blake2b(h.to_bytes(8, "big") + data[i * w:(i + 1) * w], digest_size=8).digest(),
                           "big") or 1  # 0 means "no parent"
        out.append(h)
    return out


class BlockIndex:
    """Per medium: how many entries hold each block, what the subscriber
    was told, and the blocks touched since the last ``drain``. The prefix
    tree's watcher (PrefixTree.watch); the engine loop's thread only."""

    def __init__(self, bs: int = BLOCK) -> None:
        self.bs = bs
        self.cnt: dict[str, dict[int, int]] = {GPU: {}, CPU: {}}
        self.ann: dict[str, set[int]] = {GPU: set(), CPU: set()}
        # medium -> block -> (index in its sequence, parent, the sequence's block tokens) or None (decremented)
        self.touched: dict[str, dict[int, tuple | None]] = {GPU: {}, CPU: {}}
        self.memo: dict[int, tuple[np.ndarray, list[int]]] = {}  # sequence id -> its last tokens and hashes
        self.cleared = True  # AllBlocksCleared goes first: a (re)started engine holds nothing

    def hashes(self, tokens: np.ndarray, seq: int) -> tuple[np.ndarray, list[int]]:
        """(whole-block tokens copied, their chain). The longest block prefix
        any sequence's last hashes cover is reused: a slot's entry grows
        (prompt_done, release) and a blob is a slot content cut short, so
        most blocks are hashed once."""
        n = len(tokens) // self.bs * self.bs
        toks = np.array(tokens[:n], np.int32)
        best, base = 0, None
        for old, hs in self.memo.values():
            k = min(common(old, toks) // self.bs, len(hs))
            if k > best:
                best, base = k, hs
                if best * self.bs == n:
                    break
        out = base[:best] + chain(toks[best * self.bs:], self.bs, base[best - 1]) if best else chain(toks, self.bs)
        if seq >= 0:
            self.memo[seq] = (toks, out)
        return toks, out

    # ------------------------------------------------ the tree's watcher
    def held(self, tokens: np.ndarray, e: Entry) -> None:
        """``e`` (holding ``tokens``) was registered."""
        m = GPU if e.slot >= 0 else CPU
        toks, hs = self.hashes(tokens, e.slot)
        e.blocks = hs
        cnt, t = self.cnt[m], self.touched[m]
        parent = None
        for i, h in enumerate(hs):
            c = cnt.get(h, 0)
            cnt[h] = c + 1
            if c == 0 and t.get(h) is None:
                t[h] = (i, parent, toks)
            parent = h

    def gone(self, e: Entry) -> None:
        """``e`` was unregistered."""
        m = GPU if e.slot >= 0 else CPU
        cnt, t = self.cnt[m], self.touched[m]
        for h in reversed(e.blocks or ()):
            c = cnt[h] - 1
            if c:
                cnt[h] = c
            else:
                del cnt[h]
                t.setdefault(h, None)
        e.blocks = None

    def reset(self) -> None:
        """Forget everything (shutdown): the next drain starts with AllBlocksCleared."""
        BlockIndex.__init__(self, self.bs)

    def drain(self) -> list[list]:
        """The events since the last drain, netted: removals, then stores
        in chain order (parents first), one BlockStored per run of chained
        blocks. Afterwards ``ann`` holds exactly the blocks some entry holds."""
        out: list[list] = [["AllBlocksCleared"]] if self.cleared else []
        self.cleared = False
        bs = self.bs
        for m in (GPU, CPU):
            t = self.touched[m]
            if not t:
                continue
            cnt, ann = self.cnt[m], self.ann[m]
            gone = [h for h in t if h not in cnt and h in ann]
            # held now, not announced: touched by `held` since the last drain, so its info is there
            new = sorted(((info, h) for h, info in t.items() if h in cnt and h not in ann), key=lambda x: x[0][0])
            t.clear()
            if gone:
                out.append(["BlockRemoved", gone, m])
                ann.difference_update(gone)
            # each block extends the run ending at its parent (siblings: a new run); runs come in the
            # order of their first block's depth, so a parent is always announced before its children
            runs: list[tuple[int | None, list[int], list[np.ndarray]]] = []  # (parent, hashes, token blocks)
            ends: dict[int, tuple] = {}
            for (i, parent, toks), h in new:
                r = ends.pop(parent, None)
                if r is None:
                    r = (parent, [], [])
                    runs.append(r)
                r[1].append(h)
                r[2].append(toks[i * bs:(i + 1) * bs])
                ends[h] = r
                ann.add(h)
            for parent, hs, blocks in runs:
                out.append(["BlockStored", hs, parent, np.concatenate(blocks).tolist(), bs, None, m])
        return out


class KvEvents(BlockIndex):
    """The block index and its ZMQ PUB socket. ``flush`` once per step."""

    def __init__(self, s: Settings, counters: np.ndarray) -> None:
        super().__init__(s.block_size)
        import msgpack
        import zmq

        self.pack = msgpack.Packer().pack
        self.zmq = zmq
        self.zctx = zmq.Context.instance()
        # XPUB is PUB to every SUB, but with NODROP a full subscriber queue refuses the send (EAGAIN) instead of
        # dropping it silently, so drops are counted; the subscriptions it receives are read and discarded
        self.sock = self.zctx.socket(zmq.XPUB)
        self.sock.setsockopt(zmq.XPUB_NODROP, 1)
        self.sock.setsockopt(zmq.SNDHWM, s.hwm)
        self.sock.setsockopt(zmq.LINGER, 500)  # at close: half a second for the last AllBlocksCleared
        try:
            self.sock.bind(s.endpoint)
        except zmq.ZMQError as e:
            self.sock.close(0)
            raise SetupError(f"--kv-events-config: cannot bind {s.endpoint}: {e}") from None
        self.topic = s.topic.encode()
        self.seq = 0
        self.cnt_ = counters

    def flush(self) -> None:
        events = self.drain()
        if not events:
            return
        zmq = self.zmq
        try:
            while True:  # (un)subscriptions: a few bytes per subscriber connect or disconnect
                self.sock.recv(zmq.NOBLOCK)
        except zmq.Again:
            pass
        msg = [self.topic, self.seq.to_bytes(8, "big"), self.pack([time.time(), events, 0])]
        self.seq += 1
        try:
            self.sock.send_multipart(msg, zmq.NOBLOCK, copy=False)
            self.cnt_[CNT["kv_events_total"]] += len(events)
        except zmq.ZMQError:  # EAGAIN: a subscriber's queue is full (hwm); the loop never waits
            self.cnt_[CNT["kv_events_dropped_total"]] += len(events)

    def close(self) -> None:
        """Shutdown: AllBlocksCleared (the KV goes with the process), then the socket."""
        self.reset()
        self.flush()
        self.sock.close()


def open_events(cfg, counters: np.ndarray) -> KvEvents | None:
    """The engine's events per ``cfg.kv_events_config`` (None: off, nothing imported)."""
    s = parse(cfg.kv_events_config)
    return None if s is None else KvEvents(s, counters)
