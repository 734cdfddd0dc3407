"""The prefix cache: one radix tree over every token whose KV the pool holds.

Each edge (``Node``) is a run of token ids at positions [start, end) of every
sequence passing through it. KV lives in llama.cpp's unified pool
(engine/model.py), tagged with sequence ids; the tree never copies KV, it
only moves tags (``seq_cp`` adds a sequence to cells, ``seq_rm`` removes it;
a cell with no sequence left is free).

Invariants:

* every leaf owns one *holder* sequence whose cells are exactly the leaf's
  path [0, leaf.end); an inner node's cells are held by the holders of the
  leaves below it, so any of them can lend the path to a new request
  (``attach``: seq_cp(holder, slot, 0, m), no copy);
* with a keeper sequence (``keeper`` >= 0, used with sliding-window
  models), every cell of the tree also carries the keeper: a cell tagged by
  one sequence only may be overwritten by llama.cpp's find_slot once it
  falls outside that sequence's sliding window, which would silently drop
  KV another request attaching at a shorter length still needs;
* ``held`` = the number of cells the tree holds (edges never share cells);
* a node pinned by a running request (``ref`` > 0) is never evicted, nor are
  its ancestors (only leaves are evicted, and a pinned node's ancestors are
  not leaves). Least recently used unpinned leaves go first.

No request ever receives KV of a prompt it does not share: a path is
matched token for token, and a holder's cells are exactly its path.
"""
from __future__ import annotations

from typing import Protocol

import numpy as np


class KV(Protocol):
    """What the tree needs of the model (engine.model.Model has these)."""

    def seq_rm(self, seq: int, p0: int = -1, p1: int = -1) -> bool: ...

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None: ...


class Node:
    __slots__ = ("tokens", "start", "parent", "children", "holder", "ref", "t_used")

    def __init__(self, tokens: np.ndarray, start: int, parent: "Node | None") -> None:
        self.tokens = tokens  # int32 token ids at positions [start, start + len)
        self.start = start
        self.parent = parent
        self.children: dict[int, Node] = {}  # keyed by the child's first token
        self.holder = -1  # sequence holding [0, end) (leaves only)
        self.ref = 0  # running requests pinning this node
        self.t_used = 0

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)


def common(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the common prefix of two token arrays."""
    m = min(len(a), len(b))
    if m == 0:
        return 0
    d = np.flatnonzero(a[:m] != b[:m])
    return int(d[0]) if len(d) else m


class PrefixCache:
    """The tree, its holder sequence ids and its counters (see module doc)."""

    def __init__(self, kv: KV, holders: range, keeper: int = -1) -> None:
        self.kv = kv
        self.keeper = keeper
        self.root = Node(np.empty(0, np.int32), 0, None)
        self.free = list(reversed(holders))  # holder ids not in use
        self.leaves: dict[int, Node] = {}  # holder -> leaf
        self.held = 0
        self.tick = 0
        self.hits = self.reused = self.evictions = self.evicted_tokens = 0

    # ------------------------------------------------------------- lookup
    def match(self, tokens: np.ndarray) -> tuple[int, Node]:
        """Longest cached prefix of ``tokens``: (its length, the node holding
        its last token; the root when nothing matches)."""
        node, i, n = self.root, 0, len(tokens)
        while i < n:
            c = node.children.get(int(tokens[i]))
            if c is None:
                break
            k = common(c.tokens, tokens[i:])
            i += k
            node = c
            if k < len(c.tokens):
                break
        return i, node

    def holder_of(self, node: Node) -> int:
        """A sequence holding ``node``'s whole path (any leaf below it)."""
        while node.holder < 0:
            node = next(iter(node.children.values()))
        return node.holder

    def touch(self, node: Node) -> None:
        self.tick += 1
        while node is not None:
            node.t_used = self.tick
            node = node.parent

    def attach(self, tokens: np.ndarray, seqs: tuple[int, ...]) -> tuple[int, Node | None]:
        """Give ``seqs`` (empty sequences) the KV of the longest cached prefix
        of ``tokens`` and pin its node; (length, pinned node or None)."""
        m, node = self.match(tokens)
        if m == 0:
            return 0, None
        h = self.holder_of(node)
        for s in seqs:
            self.kv.seq_cp(h, s, 0, m)
        node.ref += 1
        self.touch(node)
        self.hits += 1
        self.reused += m
        return m, node

    @staticmethod
    def unpin(node: Node | None) -> None:
        if node is not None:
            node.ref -= 1

    # ------------------------------------------------------------- insert
    def insert(self, tokens: np.ndarray, src: int) -> Node | None:
        """Cache ``tokens`` (positions 0.., whose KV sequence ``src`` holds):
        the part not in the tree yet becomes a new leaf. Returns the node
        whose path ends at len(tokens), or None (nothing to insert, or no
        holder id left even after evicting)."""
        n = len(tokens)
        node, i = self.root, 0
        while i < n:
            c = node.children.get(int(tokens[i]))
            if c is None:
                break
            k = common(c.tokens, tokens[i:])
            if k < len(c.tokens):
                c = self._split(c, k)
            node, i = c, i + k
        if i == n:
            if node is self.root:
                return None
            self.touch(node)
            return node
        kv = self.kv
        node.ref += 1  # not evicted while we make room
        while node.holder < 0 and not self.free and self.evict_one():
            pass  # (an eviction may also turn `node` into a leaf)
        node.ref -= 1
        if node.holder >= 0:  # a leaf grows: its holder extends to the new leaf's path
            h = node.holder
            del self.leaves[h]
            node.holder = -1
        else:
            if not self.free:
                return None
            h = self.free.pop()
            if i > 0:
                kv.seq_cp(self.holder_of(node), h, 0, i)
        kv.seq_cp(src, h, i, n)
        if self.keeper >= 0:
            kv.seq_cp(src, self.keeper, i, n)
        leaf = Node(np.array(tokens[i:n], np.int32), i, node)
        leaf.holder = h
        node.children[int(tokens[i])] = leaf
        self.leaves[h] = leaf
        self.held += n - i
        self.touch(leaf)
        return leaf

    def _split(self, c: Node, k: int) -> Node:
        """Cut edge ``c`` after k tokens; returns the new upper part. Pins
        stay on the lower part (it keeps its ancestors, the upper part
        included, from being evicted)."""
        top = Node(c.tokens[:k], c.start, c.parent)
        top.t_used = c.t_used
        c.parent.children[int(c.tokens[0])] = top
        c.tokens = c.tokens[k:]
        c.start += k
        c.parent = top
        top.children[int(c.tokens[0])] = c
        return top

    # ----------------------------------------------------------- eviction
    def evict_one(self) -> bool:
        """Drop the least recently used unpinned leaf; False if none."""
        best = None
        for leaf in self.leaves.values():
            if leaf.ref == 0 and (best is None or leaf.t_used < best.t_used):
                best = leaf
        if best is None:
            return False
        self.drop(best)
        return True

    def drop(self, leaf: Node) -> None:
        """Evict one unpinned leaf: its cells lose every tag and are freed."""
        assert leaf.ref == 0 and leaf.holder >= 0
        kv, h, p = self.kv, leaf.holder, leaf.parent
        a, b = leaf.start, leaf.end
        kv.seq_rm(h, a, -1)  # h now holds exactly the parent's path
        del p.children[int(leaf.tokens[0])]
        del self.leaves[h]
        leaf.holder = -1
        leaf.parent = None
        self.held -= b - a
        if p is not self.root and not p.children:
            p.holder = h  # the parent became a leaf: h is its holder
            self.leaves[h] = p
        else:
            kv.seq_rm(h, 0, -1)  # the parent's path is held by its other leaves
            self.free.append(h)
        if self.keeper >= 0:
            # seq_rm(keeper, a, b) also untags other branches' cells at these
            # positions: tag them again from their holders
            kv.seq_rm(self.keeper, a, b)
            for other in self.leaves.values():
                if other.end > a:
                    kv.seq_cp(other.holder, self.keeper, a, b)
        self.evictions += 1
        self.evicted_tokens += b - a

    def evict_until(self, room: int, need: int) -> int:
        """Evict LRU leaves until ``room`` (free cells, growing as ``held``
        shrinks) reaches ``need``; returns the room reached."""
        while room < need:
            before = self.held
            if not self.evict_one():
                break
            room += before - self.held
        return room

    def clear(self) -> None:
        """Forget everything (pins included): the caller cleared the KV."""
        for h in list(self.leaves):
            self.free.append(h)
        self.leaves.clear()
        self.root = Node(np.empty(0, np.int32), 0, None)
        self.held = 0

    def nodes(self) -> int:
        n, stack = 0, [self.root]
        while stack:
            x = stack.pop()
            n += 1
            stack.extend(x.children.values())
        return n - 1
