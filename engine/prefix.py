"""The prefix tree: which cached KV holds which token prefix (issue 14).

Cached KV lives in two places (engine/kvcache.py): a slot's own llama.cpp
stream (per-slot streams), and blobs in host RAM (engine/ramcache.py). One
such copy is an ``Entry``: token ids [0, n) whose keys and values it holds
at positions 0..n-1, and where they are. The radix tree indexes every entry
by its tokens: each edge (``Node``) is a run of token ids at positions
[start, end), and an entry is registered on the node where its path ends.
So one lookup finds, for a new prompt, every entry and how many leading
tokens it shares with the prompt, wherever the KV sits: another slot's
conversation, a shared system prompt, a finished request evicted to RAM.

Invariants:

* an entry's path is exactly its tokens: a prompt shares c tokens with an
  entry only if they are equal token for token (no request ever receives KV
  of a prompt it does not share);
* a node without entries has at least two children (``remove`` prunes and
  merges the rest), so every edge boundary is where an entry ends or
  branches off (``splits``).
"""
from __future__ import annotations

import numpy as np


def common(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the common prefix of two token arrays."""
    m = min(len(a), len(b))
    if m == 0:
        return 0
    d = np.flatnonzero(a[:m] != b[:m])
    return int(d[0]) if len(d) else m


class Entry:
    """One cached copy of the KV of tokens [0, n).

    ``slot`` >= 0: the KV sits in that slot's stream; else ``blob`` holds it
    (llama_state_seq_get_data bytes). ``swa_lo``: the lowest position whose
    sliding-window cells the copy still has (0 for models without SWA), which
    bounds the prefix lengths it can give (engine/lookup.py ``usable``);
    ``ckpts``: (p, the sliding-window cache as it was at length p) pairs,
    each making the blob usable at exactly p as well; ``shared``: a blob cut
    where other prompts branch off it (a document's end), copied on a load,
    never moved (engine/kvcache.py _copy)."""

    __slots__ = ("slot", "blob", "n", "swa_lo", "ckpts", "node", "t_used", "blocks", "shared")

    def __init__(self, n: int, slot: int = -1, blob: np.ndarray | None = None, swa_lo: int = 0,
                 ckpts: list[tuple[int, np.ndarray]] | None = None) -> None:
        self.slot, self.blob, self.n, self.swa_lo = slot, blob, n, swa_lo
        self.ckpts = ckpts or []
        self.node: Node | None = None
        self.t_used = 0.0
        self.blocks: list[int] | None = None  # its block hashes while registered, with KV events on
        self.shared = False

    @property
    def nbytes(self) -> int:
        return (0 if self.blob is None else int(self.blob.nbytes)) + sum(int(b.nbytes) for _, b in self.ckpts)


class Node:
    __slots__ = ("tokens", "start", "parent", "children", "entries")

    def __init__(self, tokens: np.ndarray, start: int, parent: "Node | None") -> None:
        self.tokens = tokens  # int32 token ids at positions [start, start + len)
        self.start = start
        self.parent = parent
        self.children: dict[int, Node] = {}  # keyed by the child's first token
        self.entries: list[Entry] = []  # entries whose path ends here

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)


class PrefixTree:
    """The tree and its entries (see module doc)."""

    def __init__(self) -> None:
        self.root = Node(np.empty(0, np.int32), 0, None)
        self.n_entries = 0
        # told of every registration and removal (engine/kvevents.py BlockIndex; None: KV events off).
        # insert and remove are the only calls that change which entries exist, so it sees all of them
        self.watch = None

    # ------------------------------------------------------------- update
    def insert(self, tokens: np.ndarray, e: Entry) -> None:
        """Register ``e`` as holding ``tokens`` (len(tokens) == e.n > 0)."""
        assert e.node is None and len(tokens) == e.n > 0
        node, i, n = self.root, 0, len(tokens)
        while i < n:
            c = node.children.get(int(tokens[i]))
            if c is None:
                leaf = Node(np.array(tokens[i:n], np.int32), i, node)
                node.children[int(tokens[i])] = leaf
                node, i = leaf, n
                break
            k = common(c.tokens, tokens[i:])
            if k < len(c.tokens):
                c = self._split(c, k)
            node, i = c, i + k
        node.entries.append(e)
        e.node = node
        self.n_entries += 1
        if self.watch is not None:
            self.watch.held(tokens, e)

    def remove(self, e: Entry) -> None:
        """Unregister ``e``; nodes left with no entry and no child go."""
        node = e.node
        if node is None:
            return
        node.entries.remove(e)
        e.node = None
        self.n_entries -= 1
        if self.watch is not None:
            self.watch.gone(e)
        while node is not self.root and not node.entries and len(node.children) <= 1:
            p = node.parent
            if node.children:  # a split nothing ends at or branches from any more: merge it into its child
                (c,) = node.children.values()
                c.tokens = np.concatenate([node.tokens, c.tokens])
                c.start = node.start
                c.parent = p
                p.children[int(node.tokens[0])] = c
                node.parent = None
                return
            del p.children[int(node.tokens[0])]
            node.parent = None
            node = p

    @staticmethod
    def _split(c: Node, k: int) -> Node:
        """Cut edge ``c`` after k tokens; returns the new upper part."""
        top = Node(c.tokens[:k], c.start, c.parent)
        c.parent.children[int(c.tokens[0])] = top
        c.tokens = c.tokens[k:]
        c.start += k
        c.parent = top
        top.children[int(c.tokens[0])] = c
        return top

    # ------------------------------------------------------------- lookup
    def match(self, tokens: np.ndarray) -> int:
        """Length of the longest prefix of ``tokens`` some entry holds."""
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
        return i

    def shared(self, tokens: np.ndarray) -> list[tuple[int, Entry]]:
        """Every entry with the number of leading tokens it shares with
        ``tokens`` (> 0). An entry below the matched path shares up to where
        its path leaves it; one on it, its whole length."""
        out: list[tuple[int, Entry]] = []
        node, i, n = self.root, 0, len(tokens)
        while True:
            out.extend((i, e) for e in node.entries if i > 0)
            c = node.children.get(int(tokens[i])) if i < n else None
            if i > 0:
                for ch in node.children.values():
                    if ch is not c:
                        out.extend((i, e) for e in self._below(ch))
            if c is None:
                return out
            k = common(c.tokens, tokens[i:])
            if k < len(c.tokens):
                out.extend((i + k, e) for e in self._below(c))
                return out
            node, i = c, i + k

    @staticmethod
    def _below(node: Node) -> list[Entry]:
        out, stack = [], [node]
        while stack:
            x = stack.pop()
            out.extend(x.entries)
            stack.extend(x.children.values())
        return out

    def splits(self, tokens: np.ndarray) -> list[int]:
        """Where the path of ``tokens`` meets an edge boundary, i.e. where
        another entry ends or branches off (the tree splits only there)."""
        out, node, i, n = [], self.root, 0, len(tokens)
        while i < n:
            c = node.children.get(int(tokens[i]))
            if c is None or common(c.tokens, tokens[i:]) < len(c.tokens):
                break
            node, i = c, c.end
            out.append(i)
        return out

    def nodes(self) -> int:
        n, stack = 0, [self.root]
        while stack:
            x = stack.pop()
            n += 1
            stack.extend(x.children.values())
        return n - 1
