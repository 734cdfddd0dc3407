"""KV shifting: the context shift and cache reuse, as llama-server does them.

Both move cached KV to other positions (``llama_memory_seq_add``: llama.cpp
re-ropes the keys at the next decode). They need a KV cache that can shift
(``Model.can_shift``, llama_memory_can_shift: not a sliding-window cache
smaller than the full one); llama-server disables both with a warning where
it cannot, and so does the engine (loop.py).

* ``shift_context`` (--context-shift, server-context.cpp pre_decode): a
  generating slot whose KV is full keeps its first n_keep tokens (the
  request's ``n_keep``, -1 = the whole prompt, plus one for BOS, at most
  n_ctx - 4), drops ``n_discard`` after them (0: half of the rest) and moves
  the rest down. The response says ``truncated``.
* ``reuse_chunks`` (--cache-reuse N / ``n_cache_reuse``, server-context.cpp's
  n_cache_reuse loop): past the common prefix of a new prompt and the slot's
  cached tokens, every run of at least N cached tokens that matches the
  prompt at the current head is moved to the prompt's position instead of
  being evaluated again.

Exactness and the prefix cache: shifted KV is not what a from-scratch
evaluation of the same tokens gives (a moved token attended to tokens that
are gone, or at other distances), so nothing may offer it as a cached
prefix. The invariant: ``cache[:n_exact]`` (``n_exact`` < 0: all of
``cache[:n_past]``) is exact. ``shift_context`` sets ``n_exact`` to n_keep;
``reuse_chunks`` to the common prefix it started from; the prefix tree's
entry of the slot is cut to ``n_exact`` at once (kvcache.SlotCache.sync
through ``cut_entry``) so no queued request copies the moved part while this
one runs, and when the request ends the slot's KV itself is cut to
``n_exact`` (``settle``) before the slot's content becomes an entry again.
A slot whose stream is the source or destination of a pending copy
(``SlotCache.pending``: llama.cpp copies streams at the next decode) is not
shifted in that step: the copy must read the positions it was made for.
"""
from __future__ import annotations

import logging

import numpy as np

from .lookup import holds
from .slots import Slot

log = logging.getLogger("ringserve.engine")


def shift_context(model, s: Slot, n_keep_req: int, n_discard_req: int) -> int:
    """Shift ``s``'s KV (its cache[:n_past] is full); returns the tokens dropped."""
    n_prompt = len(s.req.prompt)
    n_keep = n_prompt if n_keep_req < 0 else n_keep_req
    if model.add_bos:
        n_keep += 1
    n_keep = min(s.n_ctx - 4, n_keep)
    n_left = s.n_past - n_keep
    n_discard = n_discard_req if n_discard_req else n_left // 2
    n_discard = max(0, min(n_discard, max(0, n_left - 1)))
    if n_discard == 0:
        return 0
    model.seq_rm(s.id, n_keep, n_keep + n_discard)
    model.seq_add(s.id, n_keep + n_discard, s.n_past, -n_discard)
    c = s.cache
    c[n_keep:s.n_past - n_discard] = c[n_keep + n_discard:s.n_past].copy()
    c[s.n_past - n_discard:s.n_past] = -1
    s.n_past -= n_discard
    s.n_discarded += n_discard
    s.n_exact = n_keep if s.n_exact < 0 else min(s.n_exact, n_keep)
    log.warning("slot %d: context shift, n_keep = %d, n_left = %d, n_discard = %d", s.id, n_keep, n_left, n_discard)
    return n_discard


def reuse_chunks(model, s: Slot, prompt: np.ndarray, n_past: int, n_min: int) -> int:
    """llama-server's n_cache_reuse loop over ``s``'s own KV: chunks of at
    least ``n_min`` cached tokens past ``n_past`` (the common prefix) that the
    prompt has at the current head are moved there. Returns the new n_past
    (prompt tokens whose KV is now in place); the slot's cache[:n_past] says
    them and its KV past them is gone.

    Only cells the sequence still holds are moved (a RAM save may have cut
    the slot's tail just before: chunks past it were once "moved" into a
    hole, and the next decode failed for the whole batch), and the result
    must hold the sliding window its length needs (`lookup.holds`: a slot
    restored from a blob has the window of the blob's end only; moved into
    place at another length it gave wrong text): else the moves are undone
    to the common prefix, or to nothing where that one fails the rule too."""
    cache, n_cached = s.cache, min(s.n_past, model.pos_max(s.id) + 1)
    head_c = head_p = n_start = n_past
    n_prompt = len(prompt)
    while head_c < n_cached and head_p < n_prompt:
        n = 0
        while head_c + n < n_cached and head_p + n < n_prompt and cache[head_c + n] == prompt[head_p + n]:
            n += 1
        if n >= n_min:
            model.seq_rm(s.id, head_p, head_c)
            model.seq_add(s.id, head_c, head_c + n, head_p - head_c)
            cache[head_p:head_p + n] = cache[head_c:head_c + n].copy()
            n_past += n
            head_c += n
            head_p += n
        else:
            head_c += 1
    if n_past >= n_prompt:  # the last prompt token is evaluated again: its logits are needed
        n_past = n_prompt - 1
    model.seq_rm(s.id, n_past, -1)  # what was not moved (llama-server cuts it before evaluating)
    if n_past > n_start and not holds(model, model.n_swa, s.id, n_past):
        model.seq_rm(s.id, n_start, -1)
        n_past = n_start
    if not holds(model, model.n_swa, s.id, n_past):
        model.seq_clear(s.id)
        return 0
    if n_past > n_start:
        s.n_exact = n_start
        log.info("slot %d: cache reuse, %d tokens moved into place after a common prefix of %d",
                 s.id, n_past - n_start, n_start)
    return n_past


def settle(model, s: Slot) -> None:
    """The request on ``s`` ended: keep only the exact prefix of its KV
    (module doc), so the slot's content may be cached and reused."""
    if s.n_exact >= 0:
        if s.n_exact < s.n_past:
            model.seq_rm(s.id, s.n_exact, -1)
            s.n_past = s.n_exact
        s.n_exact = -1
    s.n_discarded = 0
