"""What the prefix cache's entries can give a prompt: the reuse rule.

A cached prefix is reusable only where its copy holds exactly the KV the
prefix needs, sliding-window cells included (engine/kvcache.py's module doc
has the rule and where it comes from). SlotCache (engine/kvcache.py) is a
Lookup: it chooses slots and copies with these answers, and where to keep
checkpoints (`_turn_start`). Read-only: nothing
here changes the tree, the streams or RAM.
"""
from __future__ import annotations

import numpy as np

from .prefix import Entry, PrefixTree
from .slots import Slot

TURN_TAIL = 8  # a line starting this close to the prompt's end is its answer cue ("Assistant:"), not a turn
TURN_SCAN = 512  # how far back from the prompt's end a turn start is looked for


def window_ok(n_swa: int, lo: int, k: int) -> bool:
    """A sequence whose lowest sliding-window position is ``lo`` (-1:
    empty) holds the window a prefix of length k needs: llama-server's
    rule, lo <= max(0, k - n_swa) (engine/kvcache.py's module doc); always,
    without SWA. The one rule for slots, RAM blobs and the host tier's files."""
    return 0 <= lo <= max(0, k - n_swa)


def holds(model, n_swa: int, seq: int, k: int) -> bool:
    """Does sequence ``seq`` hold exactly positions [0, k), with the
    sliding window a prefix of k needs (`window_ok`)? What a slot's KV must
    be before a request reuses k tokens of it, however they got there (a
    copy, a RAM blob, a restored slot file, chunks moved by cache reuse)."""
    return k == 0 or (model.pos_max(seq) == k - 1 and window_ok(n_swa, model.pos_min(seq), k))


class Lookup:
    """The prefix tree over every cached content, and the questions asked of it."""

    def __init__(self, model) -> None:
        self.m = model
        self.n_swa = model.n_swa
        self.tree = PrefixTree()
        self.newline: dict[int, bool] = {}  # token id -> its piece holds a line break (_turn_start)

    def window_ok(self, lo: int, k: int) -> bool:
        """`window_ok` for this model's window."""
        return window_ok(self.n_swa, lo, k)

    def usable(self, e: Entry, c: int) -> int:
        """How much of ``e``'s first c tokens a request can reuse exactly:
        c, or 0 where sliding-window cells before c are gone (engine/kvcache.py's
        module doc), or the longest checkpoint at or below c."""
        if c <= 0:
            return 0
        lo = self.m.pos_min(e.slot) if e.slot >= 0 else e.swa_lo
        if self.window_ok(lo, c):
            return c
        return max((p for p, _ in e.ckpts if p <= c), default=0)

    def _best(self, prompt: np.ndarray) -> tuple[int, Entry | None, dict[int, int]]:
        """(longest usable prefix, an entry giving it, each slot's own usable
        prefix). Ties: a slot before RAM (no copy out of RAM), then the most
        recently used."""
        best, src, own = 0, None, {}
        for c, e in self.tree.shared(prompt[:len(prompt) - 1]):
            u = self.usable(e, c)
            if e.slot >= 0:
                own[e.slot] = u
            if u > best or (u == best and src is not None and (e.slot >= 0, e.t_used) > (src.slot >= 0, src.t_used)):
                best, src = u, e
        return best, (src if best > 0 else None), own

    def _spare(self, s: Slot) -> bool:
        """Reusing ``s`` loses nothing: it holds nothing, or nothing another
        entry lacks."""
        e = s.entry
        return e is None or self._held(s.cache[:e.n], e)

    def _held(self, tokens: np.ndarray, but: Entry) -> bool:
        """An entry other than ``but`` can give all of ``tokens`` (`usable`)."""
        return self._held_len(tokens, but) >= len(tokens)

    def _held_len(self, tokens: np.ndarray, but: Entry) -> int:
        """The longest prefix of ``tokens`` an entry other than ``but`` can give."""
        return max((self.usable(e, c) for c, e in self.tree.shared(tokens) if e is not but), default=0)

    def _turn_start(self, tokens: np.ndarray, n_prompt: int, n_cache: int) -> int:
        """Where the last turn of the prompt in ``tokens[:n_prompt]`` starts
        (0: none worth a checkpoint): the last line start more than
        TURN_TAIL tokens before the prompt's end, found by the tokens'
        pieces. Templates and plain transcripts alike put the shared part
        (system message, document) before it, so another question about the
        same document branches there (issue 24). Not where the request
        continued its cached prefix by less than a window (a conversation's
        next turn after its cached history, whose next turn matches the blob
        whole: a checkpoint there would never be read); so only where it
        evaluated more than a window before the turn start itself (a new
        document), or where its cached prefix already reached past it (it
        copied a sibling question that began with the same words, 1,005
        tokens of a 1,001-token document: without this the blob ended at
        1,005 and a question sharing the document alone recomputed it; issue
        24's prefix workload). A sliding-window blob alone cannot serve such
        a point."""
        if not self.n_swa or not hasattr(self.m, "token_to_piece") or n_prompt > len(tokens):
            return 0
        for p in range(n_prompt - TURN_TAIL, max(n_prompt - TURN_SCAN, self.n_swa), -1):
            t = int(tokens[p - 1])
            nl = self.newline.get(t)
            if nl is None:
                nl = self.newline[t] = b"\n" in self.m.token_to_piece(t, True)
            if nl:
                return p if p < n_cache or p > n_cache + self.n_swa else 0
        return 0
