"""The subscriber side of tests/test_kvevents.py and
tests/test_kvevents_real.py: llm-d's reader in miniature (``Index``), the
engine's truth (``truth``), and a ZMQ SUB socket with its slow-joiner
handshake.

``Index`` applies every event in order and fails on what llm-d would skip
or misfile (a parent never announced, a hash not chained over the token
ids sent, a removal of a block it never had, a block stored twice).
``truth`` walks the engine's own prefix tree: every entry's path, hashed
from scratch (no memo), per medium. The two must agree after any drain.
"""
from __future__ import annotations

import time

import numpy as np
import pytest

from engine.kvevents import BLOCK, CPU, GPU, KvEvents, chain
from engine.prefix import PrefixTree

zmq = pytest.importorskip("zmq")
msgpack = pytest.importorskip("msgpack")


class Index:
    """The events applied in order, per medium: block hash -> parent (llm-d's view)."""

    def __init__(self, bs: int = BLOCK):
        self.bs = bs
        self.blocks = {GPU: {}, CPU: {}}
        self.n = {"BlockStored": 0, "BlockRemoved": 0, "AllBlocksCleared": 0}

    def apply(self, ev: list) -> None:
        tag = ev[0]
        self.n[tag] += 1
        if tag == "AllBlocksCleared":
            assert ev == ["AllBlocksCleared"]
            self.blocks = {GPU: {}, CPU: {}}
        elif tag == "BlockStored":
            hs, parent, toks, bs, lora, medium = ev[1:]
            assert bs == self.bs and lora is None and hs and len(toks) == bs * len(hs), ev[:3]
            assert chain(np.array(toks, np.int32), bs, parent or 0) == hs, "hashes not chained over token_ids"
            idx = self.blocks[medium]
            assert parent is None or parent in idx, "parent not announced on this medium"
            for h in hs:
                assert h not in idx, "block stored twice"
                idx[h] = parent
                parent = h
        elif tag == "BlockRemoved":
            hs, medium = ev[1:]
            idx = self.blocks[medium]
            for h in hs:
                assert h in idx, "removal of a block never stored"
                del idx[h]
        else:
            raise AssertionError(f"unknown event {ev!r}")

    def sets(self) -> dict[str, set[int]]:
        for idx in self.blocks.values():  # prefix-closed: every parent is held too
            assert all(p is None or p in idx for p in idx.values())
        return {m: set(idx) for m, idx in self.blocks.items()}


def truth(tree: PrefixTree, bs: int = BLOCK) -> dict[str, set[int]]:
    """Per medium, the blocks some entry of the tree holds, hashed from its path."""
    out = {GPU: set(), CPU: set()}
    stack = [(tree.root, np.empty(0, np.int32))]
    while stack:
        node, path = stack.pop()
        path = np.concatenate([path, node.tokens])
        for e in node.entries:
            assert len(path) == e.n
            out[GPU if e.slot >= 0 else CPU].update(chain(path, bs))
        stack.extend((c, path) for c in node.children.values())
    return out


def recv_all(sock, quiet: float = 0.3) -> list[list]:
    """Every message until none came for ``quiet`` seconds: (seq, topic, batch)."""
    out = []
    while sock.poll(int(quiet * 1000)):
        frames = sock.recv_multipart()
        assert len(frames) == 3, frames
        out.append((int.from_bytes(frames[1], "big"), frames[0].decode(), msgpack.unpackb(frames[2])))
    return out


def subscriber(endpoint: str, hwm: int = 1000):
    sock = zmq.Context.instance().socket(zmq.SUB)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVHWM, hwm)
    sock.setsockopt(zmq.SUBSCRIBE, b"kv@")
    sock.connect(endpoint)
    return sock


def handshake(ev: KvEvents, sock, timeout: float = 10.0) -> None:
    """ZMQ's slow joiner: AllBlocksCleared until the subscriber hears one (nothing held yet)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ev.reset()
        ev.flush()
        if sock.poll(50):
            recv_all(sock, 0.1)
            return
    raise AssertionError("the subscriber never received the publisher's messages")
